"""Overhead of ``leafwatch run`` on a plain training loop: the loop's own time, with and without.

Runs ``train_mlp.py`` alternately as ``python train_mlp.py`` and ``python -m leafwatch.runner
train_mlp.py`` (interleaved, so that a busy machine slows both alike) and prints the median loop
time of each and the overhead in percent. The loop times itself, so interpreter start-up and
imports are not counted; leafwatch's own set-up at the first steps is.

Usage: python benchmarks/run_overhead.py [pairs] [steps] [width]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def loop_seconds(command: list[str]) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    steps, width = (sys.argv[2] if len(sys.argv) > 2 else "300"), (sys.argv[3] if len(sys.argv) > 3 else "256")
    script = [str(HERE / "train_mlp.py"), steps, width]
    plain, watched = [], []
    for _ in range(pairs):
        plain.append(loop_seconds([sys.executable, *script]))
        watched.append(loop_seconds([sys.executable, "-m", "leafwatch.runner", *script]))
    p, w = statistics.median(plain), statistics.median(watched)
    print(json.dumps({
        "pairs": pairs, "steps": int(steps), "width": int(width),
        "plain_median_s": round(p, 4), "leafwatch_run_median_s": round(w, 4),
        "per_step_ms": {"plain": round(1000 * p / int(steps), 3), "leafwatch_run": round(1000 * w / int(steps), 3)},
        "overhead_percent": round(100 * (w - p) / p, 2),
    }))


if __name__ == "__main__":
    main()

"""Overhead of ``leafwatch run`` on a plain training loop: the loop's own time, with and without.

Runs ``train_mlp.py`` alternately as ``python train_mlp.py`` and ``python -m leafwatch run
train_mlp.py`` (interleaved, so that a busy machine slows both alike) and prints the median loop
time of each and the overhead in percent. The loop times itself, so interpreter start-up and
imports are not counted; leafwatch's own set-up at the first steps is.

``--in-process`` measures the same inside one process instead: blocks of steps alternately
plain and under a fresh ``leafwatch.integrations.runner.Session`` (its hooks, its Monitor, its set-up at the
first steps), which is far less noisy on a shared machine than whole processes.

Usage: python benchmarks/run_overhead.py [--in-process] [pairs] [steps] [width]
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


def in_process(pairs: int, steps: int, width: int) -> dict[str, object]:
    import time

    import torch
    from torch import nn

    from leafwatch.integrations.runner import Session

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))

    def block() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        return time.perf_counter() - start

    block()  # warm-up
    plain, watched = [], []
    with open(os.devnull, "w") as devnull:
        for _ in range(pairs):
            plain.append(block())
            session = Session(stream=devnull)
            session.install()
            try:
                watched.append(block())
            finally:
                session.close()
    p, w = statistics.median(plain), statistics.median(watched)
    return {"mode": "in-process", "pairs": pairs, "steps": steps, "width": width,
            "plain_median_s": round(p, 4), "leafwatch_run_median_s": round(w, 4),
            "per_step_us_added": round(1e6 * (w - p) / steps, 1),
            "overhead_percent": round(100 * (w - p) / p, 2)}


def main() -> None:
    if "--in-process" in sys.argv:
        args = [a for a in sys.argv[1:] if a != "--in-process"]
        pairs, steps, width = (int(args[i]) if len(args) > i else d for i, d in enumerate((15, 300, 256)))
        print(json.dumps(in_process(pairs, steps, width)))
        return
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    steps, width = (sys.argv[2] if len(sys.argv) > 2 else "300"), (sys.argv[3] if len(sys.argv) > 3 else "256")
    script = [str(HERE / "train_mlp.py"), steps, width]
    plain, watched = [], []
    for _ in range(pairs):
        plain.append(loop_seconds([sys.executable, *script]))
        watched.append(loop_seconds([sys.executable, "-m", "leafwatch", "run", *script]))
    p, w = statistics.median(plain), statistics.median(watched)
    print(json.dumps({
        "pairs": pairs, "steps": int(steps), "width": int(width),
        "plain_median_s": round(p, 4), "leafwatch_run_median_s": round(w, 4),
        "per_step_ms": {"plain": round(1000 * p / int(steps), 3), "leafwatch_run": round(1000 * w / int(steps), 3)},
        "overhead_percent": round(100 * (w - p) / p, 2),
    }))


if __name__ == "__main__":
    main()

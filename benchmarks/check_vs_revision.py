"""The fixed cost of ``Monitor.check()`` against an earlier revision, in one process.

Extracts ``leafwatch/`` at a git revision into a temporary folder as the package
``leafwatch_before`` (the package imports itself relatively), builds the same model twice (3 wide
linear layers, value checks off, as ``bench.py --shapes wide``), one Monitor of each version, and
alternates their training steps, timing only the check. Both versions see the same machine load
at the same moments, so the ratio of the medians holds on a busy machine where two separate runs
drift by 10% or more. An A/A run (``--against HEAD``) shows the noise: a ratio near 1.00.

Usage: python benchmarks/check_vs_revision.py [--against REV] [--steps N] [--width W]
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent


def _extract(revision: str, folder: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "leafwatch"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "leafwatch").rename(folder / "leafwatch_before")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="8d6b670", help="the earlier revision (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=3000, help="steps of each version (default: %(default)s)")
    parser.add_argument("--width", type=int, default=1024, help="the layers' width (default: %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        _extract(args.against, Path(tmp))
        sys.path[:0] = [tmp, str(ROOT)]
        import leafwatch
        import leafwatch_before

        x = torch.randn(32, args.width)
        sides = {}
        for name, package in (("before", leafwatch_before), ("now", leafwatch)):
            torch.manual_seed(0)
            model = nn.Sequential(*(nn.Linear(args.width, args.width) for _ in range(3)))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
            sides[name] = (model, optimizer, package.Monitor(model, optimizer, check_values_every_n_steps=0), [])
        for i in range(args.steps):
            for name in ("before", "now") if i % 2 else ("now", "before"):
                model, optimizer, monitor, times = sides[name]
                optimizer.zero_grad()
                model(x).sum().backward()
                start = time.perf_counter()
                monitor.check()
                times.append(time.perf_counter() - start)
                optimizer.step()
        warm = args.steps // 20  # the first checks read the structure and arm hooks
        before, now = (statistics.median(sides[n][3][warm:]) * 1e6 for n in ("before", "now"))
        print(f"Monitor.check(), 3 layers of {args.width}, value checks off, {args.steps} alternated steps each: "
              f"{args.against} {before:.1f} µs, now {now:.1f} µs per check (median), ratio {now / before:.3f}")


if __name__ == "__main__":
    main()

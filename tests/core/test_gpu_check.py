"""``benchmarks/gpu_check.py``: skips cleanly without CUDA, and its benchmark runs end to end on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _requirements import require_module

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def _run(*args: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run for real")
def test_without_cuda_it_says_so_and_exits_zero(tmp_path):
    done = _run(out=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "gpu_check: no CUDA device here" in done.stdout
    assert "the GPU figures are not measured" in done.stdout
    assert json.loads((tmp_path / "gpu_check.json").read_text())["status"] == "skipped"
    assert not (tmp_path / "cuda-tests.txt").exists()


@pytest.mark.slow
def test_the_benchmark_row_runs_on_the_cpu_and_writes_its_figures(tmp_path):
    require_module("pytorch_lightning")  # the row times a Lightning Trainer too
    done = _run("--device", "cpu", "--skip-tests", "--rounds", "1", "--steps", "3", "--warmup", "1", out=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (figures["status"], figures["device"], figures["benchmark"]["precision"]) == ("measured", "cpu", "bf16-mixed")
    for row in ("lightning", "plain_loop"):
        assert len(figures["benchmark"][row]["ratios"]) == 1
        assert figures["benchmark"][row]["ratio_median"] > 0
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| Lightning Trainer + LeafWatch |" in table
    assert "| plain loop + Monitor.attach() |" in table
    assert "tests" not in figures

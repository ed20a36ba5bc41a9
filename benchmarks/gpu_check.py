"""One command for the GPU: the CUDA tests and one GPU benchmark row, figures written to a folder.

On a machine with CUDA (under 8 minutes on one GPU):

1. the CUDA tests: ``tests/core/test_cuda.py`` (the seed table's ``.cuda()`` rows on a real device, the
   device cases), the no-sync check under ``torch.cuda.set_sync_debug_mode("error")``
   (``tests/core/test_performance_budget.py``), the deferred CUDA value checks
   (``tests/core/test_reliability.py``) and the demo with its ``.to("cuda")`` temperature; with two or
   more GPUs, the NCCL variants of ``tests/integrations/test_distributed.py``;
2. one benchmark row: a bf16 (``precision="bf16-mixed"``) small-transformer training step in a
   Lightning ``Trainer`` with and without the ``LeafWatch`` callback, and the same step in a plain
   loop with and without ``Monitor(...).attach()``. As in ``benchmarks/bench.py``: the variants run
   interleaved, in a freshly shuffled order each round, and the figure is the median over rounds
   of the step-time ratio measured in the same round. Step times are taken over a steady window
   bracketed by ``torch.cuda.synchronize()``, so the GPU's queue is included.

Without CUDA it says so and exits 0 (``--device cpu`` runs the benchmark on the CPU instead, to
try the script itself). The figures go to ``OUT/gpu_check.json`` and ``OUT/gpu_check.md``; the
test logs to ``OUT/cuda-tests.txt`` and ``OUT/cuda-tests.xml``.

Usage (from the repository root, with leafwatch installed or ``PYTHONPATH=$PWD``)::

    bash benchmarks/gpu_check.sh                       # the same as the line below
    python benchmarks/gpu_check.py --out gpu-check     # tests + benchmark on cuda
    python benchmarks/gpu_check.py --device cpu --skip-tests --rounds 1 --steps 6   # try it on a CPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
#: The CUDA tests, by node id (pytest runs them in one process).
CUDA_TESTS = [
    "tests/core/test_cuda.py",
    "tests/core/test_performance_budget.py::test_monitor_never_synchronizes_with_the_device_on_cuda",
    "tests/core/test_reliability.py::test_deferred_cuda_value_checks_stay_bounded_and_keep_no_gradient_alive",
    "tests/integrations/test_demo.py::test_lightning_demo_train_finds_the_bugs_and_nothing_when_clean",
]
#: Run only with two GPUs or more.
NCCL_TESTS = ["tests/integrations/test_distributed.py::test_ddp_on_nccl_gathers_over_a_gloo_side_group"]
#: The limit for the test run, in seconds (the whole check must stay under 8 minutes).
TESTS_TIMEOUT_S = 300


# -- the workload ----------------------------------------------------------------------------
class SmallTransformer(nn.Module):
    """A small transformer encoder with an input projection and a head (GPU-sized)."""

    def __init__(self, d_model: int, layers: int, features: int = 64) -> None:
        super().__init__()
        self.proj = nn.Linear(features, d_model)
        block = nn.TransformerEncoderLayer(d_model, nhead=8, dim_feedforward=4 * d_model,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(block, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.proj(x)))


def _sizes(device: str) -> dict[str, int]:
    if device == "cuda":
        return {"d_model": 512, "layers": 6, "batch": 32, "seq": 256, "features": 64}
    return {"d_model": 64, "layers": 2, "batch": 8, "seq": 32, "features": 64}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# -- tests -----------------------------------------------------------------------------------
def run_tests(out: Path, gpus: int) -> dict[str, Any]:
    """Run the CUDA tests (and the NCCL ones with two GPUs) in a pytest subprocess."""
    selected = CUDA_TESTS + (NCCL_TESTS if gpus >= 2 else [])
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
               f"--junitxml={out / 'cuda-tests.xml'}", *selected]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=TESTS_TIMEOUT_S)
        code, log = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code = -1
        log = f"timed out after {TESTS_TIMEOUT_S} s\n{expired.stdout or ''}{expired.stderr or ''}"
    (out / "cuda-tests.txt").write_text(log)
    summary = next((line for line in reversed(log.splitlines()) if " in " in line and "=" in line), "")
    return {"selected": selected, "nccl": gpus >= 2, "exit_code": code, "summary": summary.strip("= "),
            "seconds": round(time.perf_counter() - started, 1)}


# -- benchmark -------------------------------------------------------------------------------
def _lightning() -> Any:
    from leafwatch import LeafWatch

    bases = {c.__module__.split(".")[0] for c in LeafWatch.__mro__}
    if "pytorch_lightning" in bases:
        import pytorch_lightning as pl
    else:
        import lightning.pytorch as pl
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # keep the output to the figures
    return pl


def lightning_fit(device: str, sizes: dict[str, int], steps: int, warmup: int, with_callback: bool) -> float:
    """One ``fit``; the mean step time over the steps after ``warmup``, in seconds."""
    import leafwatch

    pl = _lightning()
    marks: list[float] = []

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = SmallTransformer(sizes["d_model"], sizes["layers"], sizes["features"])
            self.register_buffer("x", torch.randn(sizes["batch"], sizes["seq"], sizes["features"]), persistent=False)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(self.x).float().square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> Any:
            return [0] * (steps + warmup)

    class Clock(pl.Callback):
        """The time at the start of the first timed batch and at the end of training, both synced."""

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == warmup:
                _sync(device)
                marks.append(time.perf_counter())

        def on_train_end(self, trainer: Any, module: Any) -> None:
            _sync(device)
            marks.append(time.perf_counter())

    callbacks: list[Any] = [Clock()]
    if with_callback:
        callbacks.append(leafwatch.LeafWatch(verbose=False))
    trainer = pl.Trainer(max_steps=steps + warmup, accelerator="gpu" if device == "cuda" else "cpu", devices=1,
                         precision="bf16-mixed", logger=False, callbacks=callbacks, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Module())
    return (marks[1] - marks[0]) / steps


def plain_loop(device: str, sizes: dict[str, int], steps: int, warmup: int, with_monitor: bool) -> float:
    """The same step in a plain bf16-autocast loop; the mean step time after ``warmup``, in seconds."""
    import leafwatch

    torch.manual_seed(0)
    model = SmallTransformer(sizes["d_model"], sizes["layers"], sizes["features"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(sizes["batch"], sizes["seq"], sizes["features"], device=device)
    monitor = leafwatch.Monitor(model, opt).attach() if with_monitor else None
    start = 0.0
    try:
        for i in range(steps + warmup):
            if i == warmup:
                _sync(device)
                start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = model(x).float().square().mean()
            loss.backward()
            opt.step()
        _sync(device)
        return (time.perf_counter() - start) / steps
    finally:
        if monitor is not None:
            monitor.close()


def interleaved(run: Callable[[bool], float], rounds: int, rng: random.Random) -> dict[str, Any]:
    """``run(False)`` and ``run(True)`` once per round in a shuffled order (round 0 warms up)."""
    ratios: list[float] = []
    base_times: list[float] = []
    for round_index in range(rounds + 1):
        order = [False, True]
        rng.shuffle(order)
        result = {flag: run(flag) for flag in order}
        if round_index == 0:
            continue
        ratios.append(result[True] / result[False])
        base_times.append(result[False])
    return {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ratios": [round(r, 4) for r in ratios], "step_ms_without": round(statistics.median(base_times) * 1e3, 3)}


def run_benchmark(device: str, rounds: int, steps: int, warmup: int, seed: int = 0) -> dict[str, Any]:
    sizes = _sizes(device)
    rng = random.Random(seed)
    rows: dict[str, Any] = {"sizes": sizes, "rounds": rounds, "steps": steps, "warmup": warmup,
                            "precision": "bf16-mixed"}
    try:
        _lightning()
    except ImportError as error:
        rows["lightning"] = {"skipped": f"Lightning not available: {error}"}
    else:
        rows["lightning"] = interleaved(lambda flag: lightning_fit(device, sizes, steps, warmup, flag), rounds, rng)
    rows["plain_loop"] = interleaved(lambda flag: plain_loop(device, sizes, steps, warmup, flag), rounds, rng)
    return rows


# -- output ----------------------------------------------------------------------------------
def _pct(ratio: float) -> str:
    return f"{(ratio - 1.0) * 100.0:+.1f}%"


def markdown(figures: dict[str, Any]) -> str:
    lines = [f"#### leafwatch on {figures['device_name']} ({figures['date']}; torch {figures['torch']}, "
             f"CUDA {figures['cuda']}, Python {figures['python']})", ""]
    tests = figures.get("tests")
    if tests is not None:
        lines += [f"CUDA tests ({'with' if tests['nccl'] else 'without'} the NCCL variants): "
                  f"{tests['summary'] or 'no summary'} (exit code {tests['exit_code']}, {tests['seconds']} s).", ""]
    bench = figures.get("benchmark")
    if bench is not None:
        s = bench["sizes"]
        lines += [f"bf16 small transformer (d_model {s['d_model']}, {s['layers']} layers, batch {s['batch']} x "
                  f"{s['seq']} tokens), {bench['steps']} timed steps per run, {bench['rounds']} rounds:", "",
                  "| variant | step time vs the same without leafwatch: median (min … max over rounds) | step without |",
                  "|---|---|---|"]
        for key, title in (("lightning", "Lightning Trainer + LeafWatch"), ("plain_loop", "plain loop + Monitor.attach()")):
            row = bench[key]
            if "skipped" in row:
                lines.append(f"| {title} | skipped ({row['skipped']}) | |")
            else:
                lines.append(f"| {title} | {_pct(row['ratio_median'])} ({_pct(row['ratio_min'])} … "
                             f"{_pct(row['ratio_max'])}) | {row['step_ms_without']} ms |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-check", help="folder for the figures and logs (default: gpu-check)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default); cpu runs the benchmark on the CPU to try the script")
    parser.add_argument("--rounds", type=int, default=5, help="benchmark rounds (default: 5)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per run (default: 50)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps at the start of each run (default: 5)")
    parser.add_argument("--skip-tests", action="store_true", help="only the benchmark")
    parser.add_argument("--skip-benchmark", action="store_true", help="only the tests")
    args = parser.parse_args(argv)
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        message = (f"gpu_check: no CUDA device here (torch {torch.__version__}, torch.cuda.is_available() is False): "
                   "nothing was checked and the GPU figures are not measured. Run this on a machine with a GPU "
                   "(or pass --device cpu to try the benchmark on the CPU).")
        print(message)
        (out / "gpu_check.json").write_text(json.dumps({"status": "skipped", "reason": message}, indent=2) + "\n")
        return 0

    started = time.perf_counter()
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    figures: dict[str, Any] = {
        "status": "measured",
        "date": datetime.date.today().isoformat(),
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({platform.processor() or platform.machine()})",
        "gpus": gpus,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    if not args.skip_tests:
        print(f"gpu_check: running the CUDA tests{' and the NCCL variants' if gpus >= 2 else ''} ...", flush=True)
        figures["tests"] = run_tests(out, gpus)
        print(f"gpu_check: tests: {figures['tests']['summary']}", flush=True)
    if not args.skip_benchmark:
        print(f"gpu_check: benchmark ({args.rounds} rounds of {args.steps} steps) ...", flush=True)
        figures["benchmark"] = run_benchmark(args.device, args.rounds, args.steps, args.warmup)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    (out / "gpu_check.json").write_text(json.dumps(figures, indent=2) + "\n")
    table = markdown(figures)
    (out / "gpu_check.md").write_text(table)
    print(table)
    print(f"gpu_check: figures in {out / 'gpu_check.json'} and {out / 'gpu_check.md'} ({figures['seconds']} s)")
    tests = figures.get("tests")
    return 1 if tests is not None and tests["exit_code"] != 0 else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    raise SystemExit(main())

"""How much a training step pays for leafwatch, next to the tools people already leave on.

One process, three model shapes, every variant interleaved with the plain training loop:
each round runs every variant for a few steps in a freshly shuffled order, and the table
shows the median over rounds of each variant's step time divided by the plain loop's step
time in the same round. Ratios survive a noisy, shared machine far better than absolute
times do. Next to the ratio, the time spent inside the check itself (timed around the call,
in the training step, right after ``backward()``) is given as a share of the plain step.

Shapes:
    many-small   1,000 small parameter tensors (Python-bound: the cost per tensor shows)
    transformer  a small ``nn.TransformerEncoder``
    wide         a few wide linear layers (bandwidth-bound: the cost per element shows)

Variants: the plain loop; the bare ``p.grad`` loop (the floor for any per-step check);
``Monitor`` with value checks off, by default (every ``DEFAULT_VALUE_CHECK_EVERY`` steps) and
every step; a Lightning ``Trainer`` with and without the ``LeafWatch`` callback; and anchors:
a naive check with one ``.item()`` per tensor, DDP (single-process gloo group) with and
without ``find_unused_parameters``, anomaly mode and per-step gradient histograms.

The budgets (see ``BUDGETS``) are checked at the end; the exit status is 1 when one is missed.

Usage::

    python benchmarks/bench.py                    # the full run (the table in docs/performance.md)
    python benchmarks/bench.py --quick            # fewer rounds and steps, for CI
    python benchmarks/bench.py --markdown out.md  # also write the table to a file
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import leafwatch
from leafwatch import monitor as monitor_module
from leafwatch.observe import structure as structure_module

#: Budgets: what "cheap enough to leave on" means. The check per tensor is met when either the
#: absolute bound or the bound relative to the bare ``p.grad`` loop holds (the absolute one is
#: tied to the machine; the relative one is not).
BUDGETS = {
    "check_us_per_tensor": 0.5,
    "check_vs_grad_loop": 3.0,
    "values_amortized_fraction": 0.01,
    "lightning_fraction": 0.01,
    "half_missing_vs_healthy": 2.0,
}


# -- workloads -------------------------------------------------------------------------------
class ManySmall(nn.Module):
    """500 tiny linear layers in a chain: 1,000 parameter tensors."""

    def __init__(self, layers: int = 500, width: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class HalfMissing(nn.Module):
    """A chain of 250 small layers and its deep copy: half the tensors never get a gradient.

    With ``ema`` the copy is a BYOL target network (run under ``no_grad``, in the optimizer,
    updated by ``.data`` assignment after every step, as lightning-bolts does); without it the
    copy is never called (500 open ``missing_grad`` errors).
    """

    def __init__(self, ema: bool) -> None:
        super().__init__()
        self.online = ManySmall(250)
        self.target = copy.deepcopy(self.online)
        self.ema = ema

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.online(x)
        if self.ema:
            with torch.no_grad():
                target = self.target(x)
            out = out - target
        return out

    def after_step(self) -> None:
        if self.ema:
            for o, t in zip(self.online.parameters(), self.target.parameters()):
                t.data = 0.99 * t.data + 0.01 * o.data


class SmallTransformer(nn.Module):
    """A small transformer encoder with an input projection and a head."""

    def __init__(self, d_model: int = 64, layers: int = 4) -> None:
        super().__init__()
        self.proj = nn.Linear(16, d_model)
        block = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(block, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.proj(x)))


class Wide(nn.Module):
    """Three wide linear layers: few tensors, many elements."""

    def __init__(self, width: int = 2048) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width // 2, width), nn.ReLU(), nn.Linear(width, width),
                                 nn.ReLU(), nn.Linear(width, width // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@dataclass
class Shape:
    key: str
    title: str
    build: Callable[[], nn.Module]
    batch: Callable[[], torch.Tensor]


SHAPES = {
    "many-small": Shape("many-small", "1,000 small tensors", ManySmall, lambda: torch.randn(16, 8)),
    "transformer": Shape("transformer", "transformer encoder", SmallTransformer, lambda: torch.randn(8, 32, 16)),
    "wide": Shape("wide", "3 wide layers", Wide, lambda: torch.randn(32, 1024)),
}


class Workload:
    """A model, its SGD optimizer and one fixed batch; ``step(between)`` is one training step."""

    def __init__(self, shape: Shape, model: nn.Module | None = None) -> None:
        torch.manual_seed(0)
        self.shape = shape
        self.model = model if model is not None else shape.build()
        self.inner = self.model.module if hasattr(self.model, "module") else self.model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.x = shape.batch()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.after_step: Callable[[], None] | None = getattr(self.inner, "after_step", None)

    def step(self, between: Callable[[], None] | None = None) -> float:
        """One training step; returns the seconds spent in ``between`` (called after backward)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model(self.x).square().mean()
        loss.backward()
        spent = 0.0
        if between is not None:
            start = time.perf_counter()
            between()
            spent = time.perf_counter() - start
        self.optimizer.step()
        if self.after_step is not None:
            self.after_step()
        return spent


# -- variants --------------------------------------------------------------------------------
@dataclass
class Variant:
    """One way to run a training step; ``step()`` returns the seconds spent in the check."""

    name: str
    step: Callable[[], float]
    steps_divisor: int = 1  # slow anchors run fewer steps per round
    close: Callable[[], None] = lambda: None
    note: str = ""


def _grad_loop(params: list[torch.Tensor]) -> Callable[[], None]:
    def loop() -> None:
        [p for p in params if p.grad is None]  # noqa: B018 - the read is the point

    return loop


def _naive_item(params: list[torch.Tensor]) -> Callable[[], None]:
    def check() -> None:
        for p in params:
            if p.grad is None or not torch.isfinite(p.grad).all().item():
                raise RuntimeError("unhealthy benchmark model")

    return check


@contextlib.contextmanager
def _single_process_group():
    import torch.distributed as dist

    if not dist.is_available():
        yield False
        return
    with tempfile.TemporaryDirectory() as tmp:
        try:
            dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        except Exception as error:  # no gloo on this build
            print(f"  DDP skipped: {error}", file=sys.stderr)
            yield False
            return
        try:
            yield True
        finally:
            dist.destroy_process_group()


HALF_TARGET = "Monitor, half the tensors a BYOL target network (no gradient, EMA after each step)"
HALF_UNUSED = "Monitor, half the tensors never used (500 open missing_grad errors)"


def make_variants(work: Workload, anchors: bool, ddp: bool, tmpdir: str) -> list[Variant]:
    """Every variant of one shape. DDP copies come first: their wrappers register modules, and
    leafwatch Monitors rebuild when that happens."""
    variants: list[Variant] = []
    if anchors and ddp:
        from torch.nn.parallel import DistributedDataParallel

        for unused in (False, True):
            copy_model = copy.deepcopy(work.inner)
            wrapped = DistributedDataParallel(copy_model, find_unused_parameters=unused)
            ddp_work = Workload(work.shape, wrapped)
            name = "DDP, find_unused_parameters=True" if unused else "DDP (1 process, gloo)"
            variants.append(Variant(name, lambda w=ddp_work: w.step(), note="anchor"))
    variants.append(Variant("plain loop", lambda: work.step()))
    variants.append(Variant("plain loop again (A/A: the noise)", lambda: work.step()))
    variants.append(Variant("bare `p.grad` loop (the floor)", lambda f=_grad_loop(work.params): work.step(f)))
    for label, every in (("Monitor, value checks off", 0),
                         (f"Monitor default (value checks every {monitor_module.DEFAULT_VALUE_CHECK_EVERY})", None),
                         ("Monitor, value checks every step", 1)):
        kwargs = {} if every is None else {"check_values_every_n_steps": every}
        monitor = leafwatch.Monitor(work.inner, work.optimizer, **kwargs)
        variants.append(Variant(label, lambda m=monitor: work.step(m.check), close=monitor.close))
    if work.shape.key == "many-small":
        for label, ema in ((HALF_TARGET, True), (HALF_UNUSED, False)):
            half = Workload(work.shape, HalfMissing(ema))
            monitor = leafwatch.Monitor(half.inner, half.optimizer, check_values_every_n_steps=0)
            variants.append(Variant(label, lambda w=half, m=monitor: w.step(m.check), close=monitor.close))
    if anchors:
        variants.append(Variant("naive: one `.item()` per tensor", lambda f=_naive_item(work.params): work.step(f),
                                note="anchor"))

        def anomaly_step() -> float:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.autograd.set_detect_anomaly(True):
                    return work.step()

        variants.append(Variant("anomaly mode (`set_detect_anomaly(True)`)", anomaly_step, 4, note="anchor"))
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(os.path.join(tmpdir, work.shape.key))
        named = [(n, p) for n, p in work.inner.named_parameters() if p.requires_grad]
        counter = [0]

        def histograms() -> None:
            counter[0] += 1
            for n, p in named:
                writer.add_histogram(f"grad/{n}", p.grad, counter[0])

        variants.append(Variant("gradient histograms every step (`add_histogram`)",
                                lambda: work.step(histograms), 8, close=writer.close, note="anchor"))
    return variants


# -- measuring -------------------------------------------------------------------------------
@dataclass
class Samples:
    step_ratio: list[float] = field(default_factory=list)  # per round: mean step / plain mean step
    in_step: list[float] = field(default_factory=list)  # per round: mean check seconds / plain mean step
    check_seconds: list[float] = field(default_factory=list)  # every step's check time


def run_rounds(variants: list[Variant], rounds: int, steps: int, rng: random.Random) -> dict[str, Samples]:
    """Warm up once (two steps each), then ``rounds`` rounds of every variant in a shuffled order."""
    samples = {v.name: Samples() for v in variants}
    plain = next(v for v in variants if v.name == "plain loop")
    for round_index in range(rounds + 1):
        order = list(variants)
        rng.shuffle(order)
        gc.collect()
        means: dict[str, float] = {}
        checks: dict[str, list[float]] = {}
        for v in order:
            n = 2 if round_index == 0 else max(2, steps // v.steps_divisor)
            spent = []
            start = time.perf_counter()
            for _ in range(n):
                spent.append(v.step())
            means[v.name] = (time.perf_counter() - start) / n
            checks[v.name] = spent
        if round_index == 0:
            continue  # warm-up: first checks build the inventory and arm diagnostic hooks
        base = means[plain.name]
        for v in variants:
            s = samples[v.name]
            s.step_ratio.append(means[v.name] / base)
            s.in_step.append(statistics.fmean(checks[v.name]) / base)
            s.check_seconds.extend(checks[v.name])
    return samples


#: Lightning fits per variant (quick, full), one of each per round in a shuffled order, and the steps
#: timed in each. The callback's share of a step is a ratio of two fits run one after the other: on a
#: shared 2-core machine single pairs of 20 steps gave 0.6% to 1.4% for the same code, so the median
#: is over several pairs, each of 40 steps (two value checks of the default cadence in each).
LIGHTNING_ROUNDS = {True: 5, False: 7}
LIGHTNING_STEPS = 40


def lightning_rounds(shape: Shape, rounds: int, steps: int, rng: random.Random) -> dict[str, Samples] | None:
    """A Lightning Trainer with and without LeafWatch, one fit per variant per round."""
    try:
        from leafwatch import LeafWatch
    except Exception:
        return None
    bases = {c.__module__.split(".")[0] for c in LeafWatch.__mro__}
    if "pytorch_lightning" in bases:
        import pytorch_lightning as pl
    else:
        import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = shape.build()
            self.x = shape.batch()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(self.x).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> Any:
            return [0] * (steps + 4)

    class Clock(pl.Callback):
        """Time between consecutive batch starts, and what leafwatch spent in between."""

        def __init__(self, spent: list[float]) -> None:
            self.spent = spent
            self.starts: list[tuple[float, float]] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self.starts.append((time.perf_counter(), self.spent[0]))

    def timed(callback: Any, spent: list[float]) -> Any:
        """Times each per-batch hook that leafwatch defines (the ones inherited from Lightning's
        ``Callback`` do nothing, and the Trainer calls them for any callback)."""
        for name in dir(callback):
            if not (name.startswith("on_") and "batch" in name or name.startswith(("on_before", "on_after"))):
                continue
            owner = next((c for c in type(callback).__mro__ if name in vars(c)), None)
            if owner is None or not owner.__module__.startswith("leafwatch"):
                continue
            method = getattr(callback, name)
            if not callable(method):
                continue

            def wrapper(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _method(*args, **kwargs)
                finally:
                    spent[0] += time.perf_counter() - start

            setattr(callback, name, wrapper)
        return callback

    module = Module()

    def fit(with_callback: bool) -> tuple[float, float]:
        spent = [0.0]
        clock = Clock(spent)
        callbacks: list[Any] = [clock]
        if with_callback:
            callbacks.append(timed(LeafWatch(), spent))
        trainer = pl.Trainer(max_steps=steps + 3, accelerator="cpu", devices=1, logger=False, callbacks=callbacks,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module)
        marks = clock.starts[3:]  # skip the first steps (the first check arms hooks, builds lists)
        times = [b[0] - a[0] for a, b in zip(marks, marks[1:])]
        leaf = [b[1] - a[1] for a, b in zip(marks, marks[1:])]
        return statistics.fmean(times), statistics.fmean(leaf)

    samples = {"Lightning Trainer": Samples(), "Lightning Trainer + LeafWatch": Samples()}
    for round_index in range(rounds + 1):
        order = [False, True]
        rng.shuffle(order)
        result = {flag: fit(flag) for flag in order}
        if round_index == 0:
            continue
        base = result[False][0]
        samples["Lightning Trainer"].step_ratio.append(1.0)
        samples["Lightning Trainer"].in_step.append(0.0)
        samples["Lightning Trainer + LeafWatch"].step_ratio.append(result[True][0] / base)
        samples["Lightning Trainer + LeafWatch"].in_step.append(result[True][1] / base)
    return samples


# -- reporting -------------------------------------------------------------------------------
def _pct(ratio: float) -> str:
    value = (ratio - 1.0) * 100.0
    return f"{value:+.1f}%" if abs(value) < 100 else f"{ratio:.1f}x"


def _ratio_cell(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{_pct(med)} ({_pct(min(values))} … {_pct(max(values))})"


def _share(fraction: float) -> str:
    return f"{fraction * 100:.2f}%" if fraction < 1 else f"{fraction:.1f}x"


@dataclass
class ShapeResult:
    shape: Shape
    tensors: int
    elements: int
    samples: dict[str, Samples]
    notes: dict[str, str]
    lightning: dict[str, Samples] | None = field(default_factory=dict)  # None: callback not available
    rebuild_seconds: float = 0.0
    plain_step_seconds: float = 0.0


def table(results: list[ShapeResult], header: str) -> str:
    lines = [header, "",
             "| workload | variant | step time vs plain loop: median (min … max over rounds) | in the step: the check itself |",
             "|---|---|---|---|"]
    for r in results:
        title = f"{r.shape.title} ({r.tensors:,} tensors, {r.elements / 1e6:.2f}M elements)"
        for name, s in r.samples.items():
            in_step = f"{_share(statistics.median(s.in_step))} of a step" if max(s.check_seconds) > 0 else ""
            if name in ("bare `p.grad` loop (the floor)", "Monitor, value checks off"):
                per = statistics.median(s.check_seconds) / r.tensors * 1e6
                in_step += f"; {per:.2f} µs per tensor"
            label = name + (" *(anchor)*" if r.notes.get(name) == "anchor" else "")
            lines.append(f"| {title} | {label} | {_ratio_cell(s.step_ratio)} | {in_step} |")
            title = ""
        if r.lightning is None:
            lines.append("| | Lightning Trainer + LeafWatch | skipped (callback not available) | |")
        elif r.lightning:
            s = r.lightning["Lightning Trainer + LeafWatch"]
            lines.append(f"| | Lightning Trainer + LeafWatch (vs the same Trainer without it) | "
                         f"{_ratio_cell(s.step_ratio)} | {_share(statistics.median(s.in_step))} of a step |")
        amortized = r.rebuild_seconds / structure_module.REBUILD_EVERY / r.plain_step_seconds
        lines.append(f"| | structure re-read (every {structure_module.REBUILD_EVERY} checks or when the parameter "
                     f"sets change) | | {r.rebuild_seconds * 1e3:.1f} ms once = {_share(amortized)} of a step amortized |")
    return "\n".join(lines)


def budgets(results: list[ShapeResult]) -> list[tuple[str, bool, str]]:
    out = []
    every = monitor_module.DEFAULT_VALUE_CHECK_EVERY
    for r in results:
        s = r.samples
        floor = statistics.median(s["bare `p.grad` loop (the floor)"].check_seconds)
        check = statistics.median(s["Monitor, value checks off"].check_seconds)
        if r.shape.key == "many-small":
            per = check / r.tensors * 1e6
            relative = check / floor
            ok = per <= BUDGETS["check_us_per_tensor"] or relative <= BUDGETS["check_vs_grad_loop"]
            out.append((f"{r.shape.title}: `Monitor.check()` ≤ {BUDGETS['check_us_per_tensor']} µs per tensor "
                        f"or ≤ {BUDGETS['check_vs_grad_loop']:.0f}x the bare `p.grad` loop", ok,
                        f"{per:.2f} µs per tensor, {relative:.2f}x the loop"))
            for label in (HALF_TARGET, HALF_UNUSED):
                if label in s:
                    half = statistics.median(s[label].check_seconds) / check
                    out.append((f"{r.shape.title}: {label.split(', ', 1)[1]}: the check ≤ "
                                f"{BUDGETS['half_missing_vs_healthy']:.0f}x the healthy check",
                                half <= BUDGETS["half_missing_vs_healthy"], f"{half:.2f}x"))
        values = statistics.median(s["Monitor, value checks every step"].in_step)
        no_values = statistics.median(s["Monitor, value checks off"].in_step)
        value_cost = max(0.0, values - no_values)
        amortized = value_cost / every
        needed = max(1, math.ceil(value_cost / BUDGETS["values_amortized_fraction"]))
        out.append((f"{r.shape.title}: value checks every {every} steps < 1% of a step, amortized",
                    amortized < BUDGETS["values_amortized_fraction"],
                    f"{_share(value_cost)} per value check, {_share(amortized)} amortized "
                    f"(every {needed} steps would reach 1%)"))
        if r.lightning:
            frac = statistics.median(r.lightning["Lightning Trainer + LeafWatch"].in_step)
            out.append((f"{r.shape.title}: the LeafWatch callback ≤ 1% of a Lightning step", frac <= BUDGETS["lightning_fraction"],
                        f"{_share(frac)} of a step in its hooks; step time "
                        f"{_pct(statistics.median(r.lightning['Lightning Trainer + LeafWatch'].step_ratio))}"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 10 steps, 5 Lightning rounds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 7, quick 3)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per variant per round (default: a multiple of 10 near 1 s of training, "
                             "0.4 s with --quick, at least 10)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, from {','.join(SHAPES)}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier on a shared machine)")
    parser.add_argument("--no-anchors", action="store_true", help="skip DDP, anomaly mode, histograms, naive .item()")
    parser.add_argument("--no-lightning", action="store_true", help="skip the Lightning Trainer rounds")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for key in shapes:
        if key not in SHAPES:
            parser.error(f"--shapes: unknown shape {key!r}, choose from {', '.join(SHAPES)}")
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    results = []
    anchors = not args.no_anchors
    with tempfile.TemporaryDirectory() as tmpdir, _single_process_group() as ddp:
        for key in shapes:
            shape = SHAPES[key]
            work = Workload(shape)
            steps = args.steps or steps_for(work, 0.4 if args.quick else 1.0)
            variants = make_variants(work, anchors, ddp, tmpdir)
            print(f"[{time.perf_counter() - started:6.1f}s] {shape.title}: {rounds} rounds of {steps} steps",
                  file=sys.stderr)
            samples = run_rounds(variants, rounds, steps, rng)
            for v in variants:
                v.close()
            plain_step = statistics.median([work_time(work) for _ in range(5)])
            monitor = leafwatch.Monitor(work.inner, work.optimizer)
            work.step(monitor.check)
            start = time.perf_counter()
            monitor.structure.rebuild(monitor.step)
            rebuild = time.perf_counter() - start
            monitor.close()
            value_check_timings(work)
            result = ShapeResult(shape, len(work.params), sum(p.numel() for p in work.params), samples,
                                 {v.name: v.note for v in variants}, rebuild_seconds=rebuild,
                                 plain_step_seconds=plain_step)
            results.append(result)
    # Lightning runs after the process group of the DDP anchors is gone (a Trainer would see it).
    for result in results:
        if result.shape.key == "transformer" and not args.no_lightning:
            print(f"[{time.perf_counter() - started:6.1f}s] {result.shape.title}: Lightning", file=sys.stderr)
            result.lightning = lightning_rounds(result.shape, LIGHTNING_ROUNDS[args.quick], LIGHTNING_STEPS, rng)
    elapsed = time.perf_counter() - started
    header = (f"### leafwatch overhead ({datetime.date.today().isoformat()}; {platform.system()} "
              f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
              f"torch {torch.__version__}, {args.threads} torch thread(s); {rounds} rounds"
              f"{', --quick' if args.quick else ''}; {elapsed:.0f} s)")
    text = table(results, header)
    checked = budgets(results)
    text += "\n\n| budget | | measured |\n|---|---|---|\n"
    text += "\n".join(f"| {name} | {'ok' if ok else '**missed**'} | {detail} |" for name, ok, detail in checked)
    if any(r.lightning is None for r in results):
        text += "\n\nLightning Trainer + LeafWatch: skipped (callback not available)"
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    missed = [name for name, ok, _ in checked if not ok]
    if missed:
        print("\nbudget missed: " + "; ".join(missed), file=sys.stderr)
        return 1
    return 0


def value_check_timings(work: Workload, repeats: int = 50) -> None:
    """The batched value check alone on this shape's gradients: NaN/Inf only, and with the
    per-tensor zero test of ``dead_grad`` (one segmented max), printed to stderr."""
    from leafwatch.observe.values import ValueChecker

    grads = [p.grad for p in work.params]
    spent = {}
    for track_zeros in (False, True):
        checker = ValueChecker(track_zeros)
        checker.check(grads, 0)
        start = time.perf_counter()
        for i in range(repeats):
            checker.check(grads, i + 1)
            checker.zeros.clear()
        spent[track_zeros] = (time.perf_counter() - start) / repeats
    print(f"    value check on {len(grads)} tensors: NaN/Inf only {spent[False] * 1e6:,.0f} µs, "
          f"with the dead_grad zero test {spent[True] * 1e6:,.0f} µs "
          f"(every {monitor_module.DEFAULT_VALUE_CHECK_EVERY} checks)", file=sys.stderr)


def steps_for(work: Workload, target_seconds: float) -> int:
    """A multiple of 10 steps (the value-check cadence divides it) taking about ``target_seconds``."""
    work.step()
    start = time.perf_counter()
    for _ in range(3):
        work.step()
    per_step = (time.perf_counter() - start) / 3
    return int(min(40, max(10, round(target_seconds / per_step / 10) * 10)))


def work_time(work: Workload) -> float:
    start = time.perf_counter()
    work.step()
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())

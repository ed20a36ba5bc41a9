"""Helpers for the Leafwatch tab tests: real runs written by Monitor, a real TensorBoard server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import warnings
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

import leafwatch

REPO_ROOT = Path(__file__).resolve().parents[1]


class BuggyModel(nn.Module):
    """An encoder whose output is detached, two experts (the second routed every third step),
    a layer that never runs, and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))
        self.experts = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
        self.unused = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        hidden = self.encoder(x).detach()  # BUGGY_CUT
        hidden = self.experts[0](hidden) + (self.experts[1](hidden) if step % 3 == 0 else 0)
        return self.head(hidden)


class GanModel(nn.Module):
    """A generator and a discriminator with their own optimizers, and a generator layer
    that never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Linear(4, 4)
        self.discriminator = nn.Linear(4, 1)
        self.generator_unused = nn.Linear(4, 4)


#: Where the buggy run's one cut is (the cut recorder's group: a location, said beside the mistake's name).
BUGGY_CUT_AT = "_tensorboard_runs.py:" + str(
    next(i for i, line in enumerate(open(__file__, encoding="utf-8"), 1) if line.rstrip().endswith("# BUGGY_CUT")))
#: The mistake that cut makes: named by the module that holds its tensors, the encoder.
BUGGY_CUT = "encoder"


def write_buggy_run(log_dir: Path, steps: int = 12) -> leafwatch.Report:
    """Trains :class:`BuggyModel` for ``steps`` steps with a Monitor writing to ``log_dir``."""
    model = BuggyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    writer = SummaryWriter(str(log_dir))
    monitor = leafwatch.Monitor(model, optimizer, writer=writer)
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(3, 4), step).sum().backward()
        monitor.check()
        optimizer.step()
    report = monitor.close()
    writer.close()
    return report


def write_gan_run(log_dir: Path, rounds: int = 5) -> leafwatch.Report:
    """Alternates generator (odd checks) and discriminator (even checks) steps, attached."""
    model = GanModel()
    opt_g = torch.optim.SGD([*model.generator.parameters(), *model.generator_unused.parameters()], lr=0.01)
    opt_d = torch.optim.SGD(model.discriminator.parameters(), lr=0.01)
    writer = SummaryWriter(str(log_dir))
    monitor = leafwatch.Monitor(model, [opt_g, opt_d], writer=writer).attach()
    for _ in range(rounds):
        for optimizer in (opt_g, opt_d):
            opt_g.zero_grad(set_to_none=True)
            opt_d.zero_grad(set_to_none=True)
            fake = model.generator(torch.randn(3, 4))
            if optimizer is opt_d:
                fake = fake.detach()
            model.discriminator(fake).sum().backward()
            optimizer.step()
    report = monitor.close()
    writer.close()
    return report


class MixedModel(nn.Module):
    """Findings of several kinds: a layer that never runs, one ignored, a loss weight left out of
    the optimizer, a plain tensor attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)
        self.kept = nn.Linear(4, 4)  # ignored: "kept for later"
        self.loss_weight = nn.Parameter(torch.ones(1))  # left out of the optimizer
        self.scale = torch.ones(1, requires_grad=True)  # not registered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale * self.loss_weight


def write_mixed_run(log_dir: Path, steps: int = 3) -> leafwatch.Report:
    """A Monitor that scans the structure before the first step (findings "at start"), then
    checks :class:`MixedModel` with a watched non-leaf ``temperature`` and ``kept.*`` ignored."""
    model = MixedModel()
    optimizer = torch.optim.SGD([p for n, p in model.named_parameters() if n != "loss_weight"], lr=0.01)
    temperature = torch.ones(1, requires_grad=True).to(torch.float64)  # a non-leaf
    writer = SummaryWriter(str(log_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)
        monitor = leafwatch.Monitor(model, optimizer, tensors={"temperature": temperature}, writer=writer,
                                    ignore={"kept.*": "kept for later"})
    monitor.scan()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        (model(torch.randn(2, 4)).sum() + temperature.sum()).backward()
        monitor.check()
        optimizer.step()
    report = monitor.close()
    writer.close()
    return report


def write_large_run(log_dir: Path, blocks: int = 500, steps: int = 2000) -> tuple[str, ...]:
    """Drives the TensorBoard sink with the checks of a ``4 * blocks``-tensor model: one tensor
    (``blocks.3.norm.bias``) never gets a gradient, one (``blocks.7.weight``) misses every
    other step. Returns the tensor names."""
    from leafwatch.report.events import CheckEvent
    from leafwatch.integrations.tensorboard import TensorBoardSink

    names = tuple(f"blocks.{i}.{part}" for i in range(blocks) for part in ("weight", "bias", "norm.weight", "norm.bias"))
    never, alternate = names.index("blocks.3.norm.bias"), names.index("blocks.7.weight")
    writer = SummaryWriter(str(log_dir))
    sink = TensorBoardSink(writer)
    report = leafwatch.Report(step=0)
    for step in range(1, steps + 1):
        missing = [never, alternate] if step % 2 else [never]
        sink(CheckEvent(step, 0, report, step == 1, names, missing, 1 - len(missing) / len(names)))
    sink.close(report)
    writer.close()
    return names


def write_plain_run(log_dir: Path) -> None:
    """A run with scalars only, no Leafwatch records."""
    writer = SummaryWriter(str(log_dir))
    for step in range(3):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
    writer.close()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read().decode("utf-8"))


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"TensorBoard did not get ready in {timeout}s: {what}")


@contextlib.contextmanager
def tensorboard_server(log_dir: Path, scratch: Path, timeout: float = 120,
                       command: list[str] | None = None) -> Iterator[str]:
    """Starts TensorBoard with the Leafwatch tab on 127.0.0.1 (a free port); yields its URL.

    By default uses ``python -m leafwatch.tensorboard_plugin`` so that it works whether leafwatch
    is installed or only on ``PYTHONPATH``; ``command`` starts another TensorBoard (plain
    ``tensorboard``). The server is always stopped on exit.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    stderr_path = scratch / f"tensorboard-{log_dir.name}.log"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [*(command or [sys.executable, "-m", "leafwatch.tensorboard_plugin"]), "--logdir", str(log_dir),
             "--host", "127.0.0.1", "--port", "0", "--reload_interval", "1"],
            stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        url: list[str] = []

        def started() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"TensorBoard exited with {process.returncode}:\n{stderr_path.read_text()}")
            match = re.search(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+)/", stderr_path.read_text())
            if match:
                url.append(match.group(1))
            return bool(match)

        wait_for(started, timeout, "no serving message")
        yield url[0]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)

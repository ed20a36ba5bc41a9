"""One state, one verdict: ``audit()`` and ``Monitor`` run the same check pipeline.

Each scenario is a small model with one mistake (or none); every front-end must name the same
(kind, name) pairs at its first check. Where a front-end differs on purpose, the difference is a
row of the table in docs/architecture.md and has its own test (it is not one of these scenarios).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

import leafwatch


class _Ema(nn.Module):
    """A network and its EMA copy, run under no_grad each step; the copy is in no optimizer."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.ema = copy.deepcopy(self.net)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.ema(x)
        return self.net(x)

    def after_step(self) -> None:
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), self.net.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)


class _Two(nn.Module):
    """``a`` then ``b``; the output of ``a`` may be detached."""

    def __init__(self, detach: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)
        self.detach = detach

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(h.detach() if self.detach else h)


class _Listed(nn.Module):
    """A layer kept in a Python list instead of ``nn.ModuleList``."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 1)
        self.blocks = [nn.Linear(4, 4)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks[0](x))


class _Scaled(nn.Module):
    """A linear layer applied to a watched tensor given at each call."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def _clean() -> tuple[nn.Module, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    model = _Two()
    return model, torch.optim.SGD(model.parameters(), lr=0.1), {}


def _ema() -> tuple[nn.Module, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    model = _Ema()
    return model, torch.optim.SGD(model.net.parameters(), lr=0.1), {}


def _detached() -> tuple[nn.Module, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    model = _Two(detach=True)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), {}


def _left_out() -> tuple[nn.Module, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    model = _Two()
    return model, torch.optim.SGD(model.a.parameters(), lr=0.1), {}


def _replaced() -> tuple[nn.Module, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    model = _Two()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.a = nn.Linear(4, 4)  # replaced after the optimizer was built
    return model, optimizer, {}


def _listed() -> tuple[nn.Module, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    model = _Listed()
    return model, torch.optim.SGD(model.parameters(), lr=0.1), {}


def _non_leaf() -> tuple[nn.Module, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    model = _Scaled()
    scale = torch.ones(3, requires_grad=True) * 0.01  # a non-leaf: the leaf is the ones()
    return model, torch.optim.SGD([*model.parameters()], lr=0.1), {"scale": scale}


Scenario = Callable[[], tuple[nn.Module, torch.optim.Optimizer, dict[str, torch.Tensor]]]

#: scenario -> the (kind, name) pairs every front-end reports as open at its first check.
SCENARIOS: dict[str, tuple[Scenario, set[tuple[str, str]]]] = {
    "clean": (_clean, set()),
    "ema copy run under no_grad": (_ema, set()),
    "detached output": (_detached, {("missing_grad", "a.weight"), ("missing_grad", "a.bias")}),
    "part left out of the optimizer": (_left_out, {("not_in_optimizer", "b.weight"), ("not_in_optimizer", "b.bias")}),
    "replaced layer": (_replaced, {("stale_param", "a.weight"), ("stale_param", "a.bias")}),
    "plain-list container": (_listed, {("orphan_tensor", "blocks[0].weight"), ("orphan_tensor", "blocks[0].bias")}),
    "non-leaf watched tensor": (_non_leaf, {("non_leaf", "scale")}),
}


def _loss(model: nn.Module, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    x = tensors["scale"] if "scale" in tensors else torch.randn(2, 4)
    return model(x).sum()


def _open(report: leafwatch.Report) -> set[tuple[str, str]]:
    """The verdict per tensor: (kind, name) of every open tensor of every open mistake."""
    return _tensors_of([f.to_dict() for f in report.open])


def _tensors_of(findings: list[dict]) -> set[tuple[str, str]]:
    """(kind, name) of the open tensors of open mistakes given as ``Finding.to_dict()`` data
    (a report read back with ``leafwatch report --json``). Every scenario is one mistake, so
    the open mistakes of one kind are at most one (checked here too)."""
    kinds = [f["kind"] for f in findings if f["status"] == "open" and f["severity"] != "info"]
    assert len(kinds) == len(set(kinds)), f"one scenario, one mistake per kind: {kinds}"
    return {(str(f["kind"]), m["name"]) for f in findings if f["status"] == "open" and f["severity"] != "info"
            for m in (f.get("members") or [f]) if m["status"] == "open"}


@pytest.mark.parametrize(("scenario",), [(name,) for name in SCENARIOS])
@pytest.mark.parametrize(("with_loss",), [(True,), (False,)])
def test_audit_and_monitor_give_one_verdict_for_one_state(scenario: str, with_loss: bool) -> None:
    make, expected = SCENARIOS[scenario]
    model, optimizer, tensors = make()
    monitor = leafwatch.Monitor(model, optimizer, tensors=tensors or None)
    for step in range(1, 4):
        loss = _loss(model, tensors)
        loss.backward(retain_graph="scale" in tensors)
        kwargs = {"loss": loss} if with_loss else {}
        audited = [leafwatch.audit(model, optimizer, tensors=tensors or None, **kwargs) for _ in range(2)]
        checked = monitor.check(**kwargs)
        assert _open(audited[0]) == _open(audited[1]), "audit() is pure: the same state, the same report"
        assert _open(audited[0]) == expected, f"audit() at step {step}"
        # A row of docs/architecture.md's table: the Monitor holds a tensor in no optimizer at the
        # check that first sees its gradient (it may be updated by hand); audit() sees one step.
        held = {key for key in expected if key[0] == "not_in_optimizer"} if step == 1 else set()
        assert _open(checked) == expected - held, f"Monitor at step {step}"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if isinstance(model, _Ema):
            model.after_step()
    assert _open(monitor.close()) == expected


# -- leafwatch run: the same scenarios as a script, judged at the end of the run ----------------
#: Scenarios `leafwatch run` cannot be given as they are: it has no `tensors=` (a watched tensor is
#: flagged with `leafwatch.watch()` in the script instead). A row of docs/architecture.md's table.
NOT_FOR_RUN = {"non-leaf watched tensor"}

_SCRIPT = """
import sys
sys.path.insert(0, {here!r})
from test_front_ends_agree import SCENARIOS, _Ema, _loss

model, optimizer, tensors = SCENARIOS[{scenario!r}][0]()
for step in range(4):
    _loss(model, tensors).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if isinstance(model, _Ema):
        model.after_step()
"""


@pytest.mark.parametrize(("scenario",), [(name,) for name in SCENARIOS if name not in NOT_FOR_RUN])
def test_leafwatch_run_gives_the_same_verdict_at_the_end_of_the_run(scenario: str, tmp_path) -> None:
    import json
    import os
    import sys
    from pathlib import Path

    import _warm  # (here: the scripts below import this module without tests/ on their path)

    here = Path(__file__).resolve().parent
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(here=str(here), scenario=scenario))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(here.parents[1]), os.environ.get("PYTHONPATH", "")) if p)}
    ran = _warm.run([sys.executable, "-m", "leafwatch", "run", "--logdir", str(tmp_path / "runs"), str(script)],
                    capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert ran.returncode == 0, ran.stderr
    read = _warm.run([sys.executable, "-m", "leafwatch", "report", "--json", "--fail-on", "never",
                      str(tmp_path / "runs")], capture_output=True, text=True, env=env, timeout=120)
    assert read.returncode == 0, read.stderr
    (run,) = json.loads(read.stdout)["runs"]
    found = _tensors_of(run["findings"])
    assert found == SCENARIOS[scenario][1], ran.stderr


# -- the Lightning callback: the same scenarios inside a LightningModule ------------------------
#: The callback takes no `tensors=` (a watched tensor is flagged with `leafwatch.watch()`).
NOT_FOR_LIGHTNING = {"non-leaf watched tensor"}


@pytest.mark.parametrize(("scenario",), [(name,) for name in SCENARIOS if name not in NOT_FOR_LIGHTNING])
def test_the_lightning_callback_gives_the_same_verdict(scenario: str, tmp_path) -> None:
    from _requirements import require_lightning_callback, require_module

    pl = require_module("pytorch_lightning")
    leafwatch_callback = require_lightning_callback()
    from torch.utils.data import DataLoader, TensorDataset

    make, expected = SCENARIOS[scenario]
    model, optimizer, tensors = make()

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
            return _loss(self.model, tensors)

        def on_train_batch_end(self, *args: object) -> None:
            if isinstance(self.model, _Ema):
                self.model.after_step()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return optimizer

    callback = leafwatch_callback(verbose=False)
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, callbacks=[callback],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path))
    trainer.fit(Module(), DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=2))
    # The LightningModule holds the model as `self.model`: names are the user's, under that attribute.
    found = {(kind, name.removeprefix("model.")) for kind, name in _open(callback.report)}
    assert found == expected

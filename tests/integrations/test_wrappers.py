"""The wrappers users reach leafwatch through: real accelerate and Lightning Fabric loops on CPU.

The optimizer a framework hands back (accelerate's ``AcceleratedOptimizer``, Fabric's
``_FabricOptimizer``) is unwrapped once, when the Monitor is built: the hooks go on the real
optimizer, and the names are the user's (no ``_forward_module.`` or ``module.`` prefix).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import leafwatch
from _requirements import require_module

STEPS = 4


class Net(nn.Module):
    """A body and a head; ``aux`` runs only when ``use_aux`` is set."""

    def __init__(self, use_aux: bool = True) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.aux = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)
        self.use_aux = use_aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(x))
        if self.use_aux:
            h = h + self.aux(h)
        return self.head(h)


def batches(n: int = 2 * STEPS) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3, 4, generator=g) for _ in range(n)]


# -- accelerate ---------------------------------------------------------------------------------
@pytest.fixture
def accelerate() -> Iterator[Any]:
    """The accelerate package, its process-wide state reset before and after the test."""
    module = require_module("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield module
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _accelerate_loop(accelerate: Any, *, left_out: bool, accumulate: int) -> tuple[leafwatch.Monitor, Any]:
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulate)
    model = Net()
    params = [*model.body.parameters(), *model.head.parameters()]
    if not left_out:
        params += list(model.aux.parameters())
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(params, lr=0.01))
    assert type(optimizer).__name__ == "AcceleratedOptimizer"
    monitor = leafwatch.Monitor(model, optimizer, verbose=False).attach()
    for x in batches(STEPS * accumulate):
        if accumulate > 1:
            with accelerator.accumulate(model):
                accelerator.backward(model(x).pow(2).mean())
                optimizer.step()
                optimizer.zero_grad()
        else:
            accelerator.backward(model(x).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
    monitor.close()
    return monitor, optimizer


@pytest.mark.parametrize("accumulate", [1, 2])
def test_accelerate_loop_names_the_layer_left_out_of_the_optimizer(accelerate: Any, accumulate: int) -> None:
    monitor, optimizer = _accelerate_loop(accelerate, left_out=True, accumulate=accumulate)
    # The hooks went on the real optimizer, which steps once per accumulated batch.
    assert monitor.optimizers == [optimizer.optimizer]
    assert monitor.step == STEPS
    report = monitor.report
    assert {(f.kind, f.name) for f in report.tensors()} == {("not_in_optimizer", "aux.weight"),
                                                 ("not_in_optimizer", "aux.bias")}, str(report)
    finding = report.by_kind("not_in_optimizer")[0]
    assert "is in no optimizer" in finding.message and "gets gradients and never changes" in finding.message


@pytest.mark.parametrize("accumulate", [1, 2])
def test_accelerate_loop_without_a_bug_has_no_findings(accelerate: Any, accumulate: int) -> None:
    monitor, _ = _accelerate_loop(accelerate, left_out=False, accumulate=accumulate)
    assert monitor.step == STEPS
    assert list(monitor.report) == [], str(monitor.report)


def test_audit_and_check_take_the_accelerated_optimizer(accelerate: Any) -> None:
    accelerator = accelerate.Accelerator(cpu=True)
    model = Net()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD([*model.body.parameters(),
                                                                   *model.head.parameters()], lr=0.01))
    accelerator.backward(model(batches(1)[0]).sum())
    report = leafwatch.audit(model, optimizer)
    assert report.names("not_in_optimizer") == {"aux.weight", "aux.bias"}
    monitor = leafwatch.Monitor(model)
    assert monitor.check(optimizer).findings == []  # held: the check that first sees the gradient
    assert monitor.optimizers == [optimizer.optimizer]  # adopted: the real optimizer under the wrapper
    checked = monitor.close()  # no later check: the end of the run decides
    assert checked.names("not_in_optimizer") == {"aux.weight", "aux.bias"}


# -- Lightning Fabric ----------------------------------------------------------------------------
def _fabric_loop(*, bug: bool) -> tuple[leafwatch.Monitor, list[Any], Any]:
    fabric_module = require_module("lightning.fabric")
    fabric = fabric_module.Fabric(accelerator="cpu", devices=1)
    net = Net(use_aux=not bug)
    first = torch.optim.SGD(net.body.parameters(), lr=0.01)
    second = torch.optim.Adam([*net.aux.parameters(), *net.head.parameters()], lr=0.01)
    model, first, second = fabric.setup(net, first, second)
    assert type(model).__name__ == "_FabricModule"
    monitor = leafwatch.Monitor(model, [first, second], verbose=False).attach()
    for x in batches(STEPS):
        fabric.backward(model(x).pow(2).mean())
        for optimizer in (first, second):
            optimizer.step()
            optimizer.zero_grad()
    monitor.close()
    return monitor, [first, second], model


def test_fabric_with_two_optimizers_and_no_bug_has_no_findings() -> None:
    monitor, optimizers, _ = _fabric_loop(bug=False)
    assert monitor.optimizers == [o.optimizer for o in optimizers]
    assert monitor.step == 2 * STEPS  # each optimizer's step is checked
    assert list(monitor.report) == [], str(monitor.report)


def test_fabric_names_a_layer_that_never_runs_with_the_users_names() -> None:
    monitor, _, _ = _fabric_loop(bug=True)
    report = monitor.report
    assert {(f.kind, f.name) for f in report.tensors()} == {("missing_grad", "aux.weight"),
                                                 ("missing_grad", "aux.bias")}, str(report)
    for finding in report:
        assert finding.reason.name == "never_ran"
        assert "module `aux` never ran" in finding.cause
        assert "_forward_module" not in finding.name + finding.message + finding.cause + finding.fix


def test_audit_names_a_fabric_models_tensors_as_the_user_does() -> None:
    fabric_module = require_module("lightning.fabric")
    fabric = fabric_module.Fabric(accelerator="cpu", devices=1)
    net = Net()
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.body.parameters(), lr=0.01))
    fabric.backward(model(batches(1)[0]).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)
        report = leafwatch.audit(model, optimizer)
    assert report.names("not_in_optimizer") == {"aux.weight", "aux.bias", "head.weight", "head.bias"}


# -- any wrapper that exposes the real optimizer ----------------------------------------------
class _Wrapped:
    """A wrapper of the kind many libraries write: ``.optimizer``, ``param_groups``, ``step``."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def step(self) -> None:
        self.optimizer.step()


def test_a_home_made_wrapper_is_unwrapped_and_its_optimizer_hooked() -> None:
    model = Net(use_aux=False)
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = leafwatch.Monitor(model, _Wrapped(inner), verbose=False).attach()
    try:
        assert monitor.optimizers == [inner]
        model(batches(1)[0]).sum().backward()
        _Wrapped(inner).step()  # the pre-hook on the real optimizer checks
        assert monitor.step == 1
        assert monitor.report.names("missing_grad") == {"aux.weight", "aux.bias"}
    finally:
        monitor.close()


def test_a_learning_rate_scheduler_is_no_optimizer_wrapper() -> None:
    model = Net()
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model.parameters(), lr=0.1), step_size=1)
    with pytest.raises(TypeError, match=r"`optimizers` must be a torch\.optim\.Optimizer .*got StepLR"):
        leafwatch.Monitor(model, scheduler)


def test_a_deepspeed_optimizer_is_refused_with_the_reason() -> None:
    inner = torch.optim.SGD(Net().parameters(), lr=0.1)
    deepspeed_like = type("DeepSpeedZeroOptimizer", (_Wrapped,), {})(inner)
    with pytest.raises(ValueError, match=r"`optimizers` is a DeepSpeed optimizer .*flat master copies"):
        leafwatch.Monitor(Net(), deepspeed_like)

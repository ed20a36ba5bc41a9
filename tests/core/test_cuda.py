"""The seed table and device findings with real ``.cuda()`` copies (skipped without CUDA)."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import leafwatch
from leafwatch import LeafwatchInternalWarning, LeafwatchWarning

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA_TABLE: list[tuple[str, bool, Callable[[torch.Tensor], torch.Tensor], bool, bool]] = [
    ("e", False, lambda t: t.cuda(), True, False),
    ("h", True, lambda t: t.cuda(), False, False),
    ("k", True, lambda t: t.cuda().detach(), True, False),
]


def _grad_of(t: torch.Tensor) -> torch.Tensor | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return t.grad


@pytest.mark.parametrize(("name", "requires_grad", "ops", "is_leaf", "gets_grad"), CUDA_TABLE)
def test_cuda_rows_agree_with_torch(name, requires_grad, ops, is_leaf, gets_grad):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeafwatchWarning)
        warnings.simplefilter("error", LeafwatchInternalWarning)  # its own failures still fail
        t = leafwatch.watch(ops(torch.tensor([1.0], requires_grad=requires_grad)), name=name)
    if t.requires_grad:
        (t * 2).sum().backward()
    assert t.is_leaf is is_leaf
    assert (_grad_of(t) is not None) is gets_grad
    for report in (leafwatch.audit(), leafwatch.audit(tensors={name: t})):
        kinds = {f.kind for f in report.findings if f.name == name}
        assert ("non_leaf" in kinds) is (not t.is_leaf)
        assert bool(kinds) is (_grad_of(t) is None)
        assert len(report.findings) == 1


def test_cuda_copy_is_explained_as_a_device_copy_with_the_leaf_on_cpu():
    h = torch.tensor([1.0], requires_grad=True).cuda()
    (finding,) = leafwatch.audit(tensors={"h": h}).findings
    assert (finding.kind, finding.name, finding.severity) == ("non_leaf", "h", "error")
    assert finding.details["op"] == "ToCopyBackward0"
    assert "device copy" in finding.cause
    assert "unnamed temporary leaf" in finding.cause
    assert "shape (1,), float32, cpu" in finding.cause
    assert finding.device.startswith("cuda")
    assert "device=" in finding.fix


def test_watch_warns_about_the_cuda_copy_at_the_callers_line():
    with pytest.warns(LeafwatchWarning, match=r"`h` is not a leaf.*device copy.*ToCopyBackward0") as record:
        line = inspect.currentframe().f_lineno + 1
        leafwatch.watch(torch.tensor([1.0], requires_grad=True).cuda(), name="h")
    assert (record[0].filename, record[0].lineno) == (__file__, line)


class _LeftOnCpu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_parameter_left_on_cpu_is_a_device_mismatch():
    model = _LeftOnCpu().cuda()
    model.scale = nn.Parameter(torch.ones(1))  # registered after .cuda(): stays on the CPU
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    report = leafwatch.audit(model, opt)
    (finding,) = report.by_kind("device_mismatch")
    assert finding.name == "scale"
    assert finding.device == "cpu"
    assert "on cpu while the other trainable parameters are on cuda" in finding.message
    assert "`model.to('cuda:0')`" in finding.fix  # the user's variable for the model, the device it is on


def test_monitor_reports_a_nan_grad_on_cuda_one_check_late_or_at_close():
    model = nn.Linear(3, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt, check_values_every_n_steps=1)
    model(torch.ones(2, 3, device="cuda")).sum().backward()
    model.weight.grad[0, 0] = float("nan")
    monitor.check()
    report = monitor.close()
    assert report.names("nonfinite_grad") == {"weight"}

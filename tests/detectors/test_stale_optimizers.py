"""Stale optimizers: a layer replaced or resized after the optimizer was built is ``stale_param``.

Each old tensor is reported once, under the model's current name (paired by the name leafwatch
saw, else by position in the optimizer, else by shape), whether the Monitor was created before
or after the change; old tensors nothing replaced make one finding per optimizer.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import leafwatch


class Net(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.body(x)))


class TinyGPT(nn.Module):
    """The parts of nanoGPT that ``crop_block_size`` and ``configure_optimizers`` touch."""

    def __init__(self, block_size: int = 64) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(50, 8), wpe=nn.Embedding(block_size, 8),
                                              ln_f=nn.LayerNorm(8)))
        self.lm_head = nn.Linear(8, 50, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in nanoGPT

    def crop_block_size(self, block_size: int) -> None:
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        nodecay = [p for p in params.values() if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                  {"params": nodecay, "weight_decay": 0.0}], lr=1e-3)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        return self.lm_head(self.transformer.ln_f(x))


def _step(model: nn.Module, opt: torch.optim.Optimizer, monitor: leafwatch.Monitor,
          x: torch.Tensor | None = None) -> leafwatch.Report:
    opt.zero_grad()
    model(torch.randn(4, 8) if x is None else x).sum().backward()
    report = monitor.check()
    opt.step()
    return report


def _assert_stale(report: leafwatch.Report, names: set[str]) -> None:
    assert report.names() == names
    assert {f.kind for f in report} == {"stale_param"}, "never missing_grad nor not_in_optimizer"
    for f in report:
        assert f.severity == "error"
        assert "was replaced after the optimizer was built" in f.cause
        assert "rebuild the optimizer after the last change" in f.fix
        assert "add_param_group" in f.fix
        assert "unknown" not in f.cause


@pytest.mark.parametrize("monitor_first", [True, False])
def test_a_new_head_is_stale_param_under_its_current_name(monitor_first: bool) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt) if monitor_first else None
    model.fc = nn.Linear(16, 10)  # a new head for 10 classes, after the optimizer was built
    monitor = monitor or leafwatch.Monitor(model, opt)
    report = _step(model, opt, monitor)
    monitor.close()
    _assert_stale(report, {"fc.weight", "fc.bias"})
    weight = report.by_kind("stale_param")[0] if report.by_kind("stale_param")[0].name == "fc.weight" \
        else report.by_kind("stale_param")[1]
    assert weight.shape == (10, 16)
    assert weight.details["old_shape"] == [1000, 16]
    assert "resized from (1000, 16) to (10, 16)" in weight.cause
    assert weight.details["paired_by"] == ("name" if monitor_first else "position")


@pytest.mark.parametrize("when", ["before", "after", "audit"])
def test_nanogpt_crop_block_size_after_the_optimizer_is_stale_wpe(when: str) -> None:
    model = TinyGPT()
    opt = model.configure_optimizers()
    monitor = leafwatch.Monitor(model, opt) if when == "before" else None
    model.crop_block_size(16)
    if when == "after":
        monitor = leafwatch.Monitor(model, opt)
    idx = torch.randint(0, 50, (2, 16))
    if monitor is None:
        model(idx).sum().backward()
        report = leafwatch.audit(model, opt)
    else:
        report = _step(model, opt, monitor, idx)
        monitor.close()
    _assert_stale(report, {"transformer.wpe.weight"})
    (finding,) = report
    assert finding.details["old_shape"] == [64, 8]
    assert finding.shape == (16, 8)


def test_a_whole_network_swapped_is_paired_by_position() -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model = Net()  # a fresh network, the optimizer kept
    monitor = leafwatch.Monitor(model, opt)
    report = _step(model, opt, monitor)
    monitor.close()
    _assert_stale(report, {"body.weight", "body.bias", "fc.weight", "fc.bias"})
    assert {f.details["paired_by"] for f in report} == {"position"}


def test_model_to_that_overwrites_parameters_is_stale() -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt)
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model.to(torch.float64)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    report = _step(model, opt, monitor, torch.randn(4, 8, dtype=torch.float64))
    monitor.close()
    _assert_stale(report, {"body.weight", "body.bias", "fc.weight", "fc.bias"})


@pytest.mark.parametrize("monitor_first", [True, False])
def test_old_tensors_nothing_replaced_are_one_finding(monitor_first: bool) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt) if monitor_first else None
    del model[2]  # the last layer removed, the optimizer kept
    monitor = monitor or leafwatch.Monitor(model, opt)
    report = _step(model, opt, monitor)
    monitor.close()
    (finding,) = report
    assert (finding.kind, finding.name, finding.severity) == ("stale_param", "optimizers[0]", "error")
    assert "optimizer 0 holds 2 tensors that are no longer parameters of the model and get no gradient" \
        in finding.message
    assert "rebuild the optimizer" in finding.fix
    assert finding.details["count"] == 2
    if monitor_first:
        assert finding.details["old_names"] == ["2.weight", "2.bias"]


def test_parameters_outside_the_model_that_get_gradients_are_no_stale_param() -> None:
    model = Net(classes=4)
    criterion_scale = nn.Parameter(torch.ones(4))  # a learnable loss weight, outside the model
    opt = torch.optim.SGD([*model.parameters(), criterion_scale], lr=0.1)
    monitor = leafwatch.Monitor(model, opt)
    assert monitor.scan().findings == []  # before any backward nothing is judged
    opt.zero_grad()
    (model(torch.randn(4, 8)) * criterion_scale).sum().backward()
    report = monitor.check()
    monitor.close()
    assert report.findings == []


def test_a_plain_unused_tensor_in_the_optimizer_does_not_advise_creating_a_monitor() -> None:
    model = Net(classes=4)
    extra = torch.zeros(3, requires_grad=True)  # never used
    opt = torch.optim.SGD([*model.parameters(), extra], lr=0.1)
    monitor = leafwatch.Monitor(model, opt)
    report = _step(model, opt, monitor)
    monitor.close()
    (finding,) = report
    assert finding.kind == "missing_grad"
    assert "create `leafwatch.Monitor" not in finding.cause
    assert "no parameter of the model" in finding.cause
    # audit() saw only the end state: there the advice is true.
    assert "create `leafwatch.Monitor" in leafwatch.audit(model, opt).by_kind("missing_grad")[0].cause

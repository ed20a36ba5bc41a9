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
        # the user's optimizer, by its variable (the check runs in `_step(model, opt, ...)`)
        assert "rebuild `opt` after the last change" in f.fix
        assert '`opt.add_param_group({"params": [model' in f.fix  # the model's variable too
        assert "AdamW(" not in f.fix
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
    assert "rebuild `opt` (your `SGD`)" in finding.fix
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


# -- lazy modules: parameters that never materialize -------------------------------------------
class LazyNet(nn.Module):
    """A lazy first layer (its shape comes from the first batch) and a plain head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.LazyLinear(4)
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x)))


def _copied_after_the_optimizer(materialize_copy_first: bool) -> tuple[LazyNet, torch.optim.Optimizer]:
    """An optimizer built before the lazy layer ran, then the model copied (a model conversion):
    the optimizer holds the original's parameters, whose lazy ones never materialize."""
    import copy

    original = LazyNet()
    optimizer = torch.optim.SGD(original.parameters(), lr=0.1)
    model = copy.deepcopy(original)
    if materialize_copy_first:
        model(torch.ones(2, 3))  # the copy materializes; the optimizer's tensors stay uninitialized
    return model, optimizer


@pytest.mark.parametrize("materialize_copy_first", [False, True])
def test_uninitialized_leftovers_of_a_copied_lazy_model_are_stale_param(materialize_copy_first: bool,
                                                                       recwarn: pytest.WarningsRecorder) -> None:
    model, optimizer = _copied_after_the_optimizer(materialize_copy_first)
    lazy_left = [p for p in optimizer.param_groups[0]["params"] if nn.parameter.is_lazy(p)]
    assert len(lazy_left) == 2
    with leafwatch.Monitor(model, optimizer) as monitor:
        model(torch.ones(2, 3)).sum().backward()
        reports = [monitor.check(), leafwatch.audit(model, optimizer)]
    assert not [w for w in recwarn if issubclass(w.category, leafwatch.LeafwatchInternalWarning)]
    for report in reports:
        assert {(f.kind, f.name) for f in report} == {
            ("stale_param", n) for n in ("encoder.weight", "encoder.bias", "head.weight", "head.bias")}, str(report)
        for name in ("encoder.weight", "encoder.bias"):
            (finding,) = [f for f in report if f.name == name]
            assert "uninitialized original" in finding.cause and "never materializes" in finding.cause
            assert finding.details["old_shape"] is None
        (head,) = [f for f in report if f.name == "head.weight"]
        assert "was replaced after the optimizer was built" in head.cause


def test_uninitialized_leftovers_nothing_replaced_are_one_finding_that_says_so() -> None:
    model, optimizer = _copied_after_the_optimizer(False)
    model.encoder = nn.Linear(3, 4)  # the copy's lazy layer replaced: nothing sits where the old one did
    other = torch.optim.SGD([*model.encoder.parameters(), *model.head.parameters()], lr=0.1)
    model(torch.ones(2, 3)).sum().backward()
    report = leafwatch.audit(model, [other, optimizer])
    (finding,) = report.by_kind("stale_param")
    assert finding.name == "optimizers[1]"
    assert finding.details["count"] == 4 and finding.details["uninitialized"] == 2
    assert "2 of them are still uninitialized" in finding.cause and "never materialize" in finding.cause
    assert sorted(finding.details["old_shapes"], key=str) == sorted([None, None, [1, 4], [1]], key=str)


def test_a_lazy_layer_that_has_not_run_yet_is_no_finding() -> None:
    model = LazyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, optimizer) as monitor:
        assert list(monitor.scan()) == []  # still uninitialized: pending, nothing to say yet
        model(torch.ones(2, 3)).sum().backward()
        assert list(monitor.check()) == []
    assert list(leafwatch.audit(model, optimizer)) == []

"""Stale optimizers: a layer replaced or resized after the optimizer was built is ``stale_param``.

Each old tensor is reported once, under the model's current name (paired by the name leafwatch
saw, else by position in the optimizer, else by shape), whether the Monitor was created before
or after the change; old tensors nothing replaced make one finding per optimizer.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import leafwatch
from leafwatch.detectors import fixes


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
    assert [f.group for f in report] == ["optimizers[0]"]  # one stale optimizer, one mistake
    for f in report.tensors():
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
    weight = report.tensors("stale_param")[0] if report.tensors("stale_param")[0].name == "fc.weight" \
        else report.tensors("stale_param")[1]
    assert weight.shape == (10, 16)
    assert weight.details["old_shape"] == [1000, 16]
    assert "resized from (1000, 16) to (10, 16)" in weight.cause
    assert weight.details["paired_by"] == ("name" if monitor_first else "position")


def test_a_head_replaced_by_a_bigger_one_is_one_stale_optimizer_whose_fix_gives_it_the_new_head() -> None:
    """`model.fc` becomes two layers: the first pairs with the old head, the second with nothing; both are
    the one replacement (never a `left_out` whose fix would add the first layer a second time)."""
    model = Net(classes=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.fc = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    monitor = leafwatch.Monitor(model, opt, verbose=False)
    (f,) = _step(model, opt, monitor).open
    assert (f.kind, f.name, f.severity) == ("stale_param", "optimizers[0]", "error")
    assert {(m.name, m.reason.name) for m in f.members} == {
        (f"fc.{i}.{w}", "module_replaced") for i in (0, 2) for w in ("weight", "bias")}
    assert f.cause.startswith("`model.fc` was replaced after the optimizer was built by a module with other tensors")
    (code,) = [c for c in fixes.code_spans(f.fix) if "add_param_group" in c]
    assert code == 'opt.add_param_group({"params": model.fc.parameters()})'
    exec(code, {"opt": opt, "model": model})
    report = _step(model, opt, monitor)
    monitor.close()
    assert report.at_least("warning") == [] and report.names("stale_param", status="resolved") == {
        f"fc.{i}.{w}" for i in (0, 2) for w in ("weight", "bias")}


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
    (finding,) = report.tensors()
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
    assert {f.details["paired_by"] for f in report.tensors()} == {"position"}


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
def test_old_tensors_nothing_replaced_are_one_finding_harmless_when_every_live_tensor_is_stepped(
        monitor_first: bool) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt) if monitor_first else None
    del model[2]  # the last layer removed, the optimizer kept
    monitor = monitor or leafwatch.Monitor(model, opt)
    report = _step(model, opt, monitor)
    monitor.close()
    (finding,) = report
    # A layer removed: every parameter the model still uses is stepped, nothing goes untrained.
    assert (finding.kind, finding.name, finding.severity) == ("stale_param", "optimizers[0]", "info")
    assert finding.message.startswith("optimizer 0 still holds 2 old tensors the model no longer uses")
    assert finding.message.endswith(": harmless, costs memory.")
    assert "rebuild `opt` (your `SGD`)" in finding.fix and finding.fix.startswith("nothing needed")
    assert finding.details["count"] == 2 and finding.details["group"] == "optimizers[0]"
    if monitor_first:
        assert finding.details["old_names"] == ["2.weight", "2.bias"]


def test_old_tensors_nothing_replaced_are_an_error_while_a_live_tensor_is_in_no_optimizer() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt)
    model[2] = nn.Linear(8, 8, bias=False)
    model.append(nn.Linear(8, 3))  # nothing pairs the old bias; the new layer is in no optimizer
    for _ in range(2):
        report = _step(model, opt, monitor)
    monitor.close()
    (group,) = [f for f in report.tensors("stale_param") if f.name == "optimizers[0]"]
    assert group.severity == "error"
    assert "optimizer 0 holds 1 tensor that is no longer a parameter of the model and gets no gradient" \
        in group.message
    assert "rebuild `opt` (your `SGD`)" in group.fix
    assert {f.details["group"] for f in report.tensors("stale_param")} == {"optimizers[0]"}


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


# -- a model converted after its optimizer was built: `model = to_hetero(model, metadata)` ----------
EDGE_TYPES = ("paper__cites__paper", "author__writes__paper")


class GNN(nn.Module):
    """A homogeneous GNN as PyG's examples write it (each message-passing layer reduced to a Linear)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x).relu())


class HeteroGNN(nn.Module):
    """What `torch_geometric.nn.to_hetero` returns: a new module holding a deep copy of each layer per
    edge type (new tensors), their outputs summed over the edge types."""

    def __init__(self, module: nn.Module, edge_types: tuple[str, ...]) -> None:
        super().__init__()
        for name, layer in module.named_children():
            setattr(self, name, nn.ModuleDict({t: copy.deepcopy(layer) for t in edge_types}))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = sum(layer(x) for layer in self.conv1.values()).relu()
        return sum(layer(h) for layer in self.conv2.values())


def test_a_model_converted_after_its_optimizer_was_built_is_one_stale_optimizer_every_new_tensor_an_error() -> None:
    """The optimizer holds the old tensors of this very model: every new tensor is an error (never the
    warning of a module no optimizer ever held), one mistake whose fix gives it the new model; a
    perceptual-loss network left requiring grad beside it, which no optimizer ever held, stays that warning."""
    model = GNN()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model = HeteroGNN(model, EDGE_TYPES)  # `model = to_hetero(model, data.metadata())`, after the optimizer
    perceptual = nn.Sequential(nn.Linear(2, 4), nn.Tanh())  # a fixed network still requiring grad
    monitor = leafwatch.Monitor(model, opt, verbose=False).attach()

    def train(steps: int) -> leafwatch.Report:
        for _ in range(steps):
            opt.zero_grad()
            out = model(torch.randn(8, 4))
            (out.pow(2).mean() + perceptual(out).pow(2).mean()).backward()
            opt.step()
        return monitor.report

    stale, fixed = sorted(train(3).open, key=lambda f: f.kind, reverse=True)
    assert (stale.kind, stale.name, stale.severity) == ("stale_param", "optimizers[0]", "error")
    new = {f"conv{i}.{t}.{w}" for i in (1, 2) for t in EDGE_TYPES for w in ("weight", "bias")}
    assert {m.name for m in stale.members} == new
    assert {(m.severity, m.reason.name) for m in stale.members} == {("error", "module_replaced")}
    assert stale.message.endswith(" is in no optimizer and never changes: optimizer 0 still holds the old tensors "
                                  "of `model`.")
    assert stale.cause.startswith("`model` was replaced after the optimizer was built by a module with other tensors "
                                  "(a conversion such as `to_hetero`")
    assert stale.fix.startswith("add the new parameters to `opt` (your `Adam`, its groups as they are): ")
    assert stale.fix.endswith("; or rebuild `opt` after the last change to the model, with the same class and groups")
    assert (fixed.kind, fixed.name, fixed.severity, fixed.reason.name) == (
        "not_in_optimizer", "perceptual", "warning", "root_outside")
    assert "`perceptual.requires_grad_(False)`" in fixed.fix
    (code,) = [c for c in fixes.code_spans(stale.fix) if "add_param_group" in c]
    assert code == 'opt.add_param_group({"params": model.parameters()})'
    exec(code, {"opt": opt, "model": model})  # each mistake's fix, pasted in the training loop's scope
    exec("perceptual.requires_grad_(False)", {"perceptual": perceptual})
    weight = model.conv2[EDGE_TYPES[1]].weight.detach().clone()
    report = train(3)
    monitor.close()
    assert not torch.equal(weight, model.conv2[EDGE_TYPES[1]].weight)  # the converted model trains
    assert {(f.kind, f.name, f.status) for f in report.tensors() if f.name != "optimizers[0]"} == {
        *(("stale_param", name, "resolved") for name in new),
        ("not_in_optimizer", "perceptual.0.weight", "resolved"), ("not_in_optimizer", "perceptual.0.bias", "resolved")}
    assert report.open == []
    (leftovers,) = [f for f in report if f.status == "open"]  # the old tensors, which nothing uses: harmless
    assert (leftovers.kind, leftovers.name, leftovers.severity) == ("stale_param", "optimizers[0]", "info")


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
        assert {(f.kind, f.name) for f in report.tensors()} == {
            ("stale_param", n) for n in ("encoder.weight", "encoder.bias", "head.weight", "head.bias")}, str(report)
        assert [f.group for f in report] == ["optimizers[0]"]  # one stale optimizer, one mistake
        for name in ("encoder.weight", "encoder.bias"):
            (finding,) = [f for f in report.tensors() if f.name == name]
            assert "uninitialized original" in finding.cause and "never materializes" in finding.cause
            assert finding.details["old_shape"] is None
        (head,) = [f for f in report.tensors() if f.name == "head.weight"]
        assert "was replaced after the optimizer was built" in head.cause


def test_uninitialized_leftovers_nothing_replaced_are_one_finding_that_says_so() -> None:
    model, optimizer = _copied_after_the_optimizer(False)
    model.encoder = nn.Linear(3, 4)  # the copy's lazy layer replaced: nothing sits where the old one did
    other = torch.optim.SGD([*model.encoder.parameters(), *model.head.parameters()], lr=0.1)
    model(torch.ones(2, 3)).sum().backward()
    report = leafwatch.audit(model, [other, optimizer])
    (finding,) = report.tensors("stale_param")
    # `other` steps every live parameter: the old ones, lazy or not, are leftovers.
    assert (finding.name, finding.severity) == ("optimizers[1]", "info")
    assert finding.details["count"] == 4 and finding.details["uninitialized"] == 2
    assert "2 of them are uninitialized lazy parameters that can no longer materialize" in finding.cause
    assert "harmless, costs memory" in finding.message
    assert sorted(finding.details["old_shapes"], key=str) == sorted([None, None, [1, 4], [1]], key=str)


def test_a_lazy_layer_that_has_not_run_yet_is_no_finding() -> None:
    model = LazyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, optimizer) as monitor:
        assert list(monitor.scan()) == []  # still uninitialized: pending, nothing to say yet
        model(torch.ones(2, 3)).sum().backward()
        assert list(monitor.check()) == []
    assert list(leafwatch.audit(model, optimizer)) == []


# -- after the fix: the leftovers --------------------------------------------------------------
@pytest.mark.parametrize("monitor_first", [True, False])
def test_after_the_suggested_add_param_group_the_leftovers_are_information(monitor_first: bool) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt, verbose=False) if monitor_first else None
    model.fc = nn.Linear(16, 10)  # a new head, after the optimizer was built
    monitor = monitor or leafwatch.Monitor(model, opt, verbose=False)
    report = _step(model, opt, monitor)
    _assert_stale(report, {"fc.weight", "fc.bias"})
    assert {f.details["group"] for f in report} == {"optimizers[0]"}, "one mistake: the stale optimizer"
    opt.add_param_group({"params": list(model.fc.parameters())})  # the fix the finding gives
    for _ in range(3):
        report = _step(model, opt, monitor)
    monitor.close()
    assert report.at_least("warning") == [], "the fix was applied: no error repeats the same fix"
    (leftovers,) = [f for f in report if f.status == "open"]
    assert (leftovers.kind, leftovers.name, leftovers.severity) == ("stale_param", "optimizers[0]", "info")
    assert leftovers.details["group"] == "optimizers[0]"
    assert "harmless, costs memory" in leftovers.message
    assert "skips them (no gradient)" in leftovers.cause
    assert "add_param_group" not in leftovers.fix and leftovers.fix.startswith("nothing needed")
    assert leftovers.details["count"] == 2
    if monitor_first:
        assert leftovers.details["old_names"] == ["fc.weight", "fc.bias"]
    assert {(f.kind, f.name, f.status) for f in report.tensors() if f.name != "optimizers[0]"} == {
        ("stale_param", "fc.weight", "resolved"), ("stale_param", "fc.bias", "resolved")}


def test_skipped_steps_are_still_counted_once_the_old_tensors_are_leftovers() -> None:
    """The skipped-step watch reads one tensor per optimizer: never a leftover that no backward reaches."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = leafwatch.Monitor(model, opt, verbose=False)
    model.body = nn.Linear(8, 16)
    opt.add_param_group({"params": list(model.body.parameters())})
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for _ in range(5 + leafwatch.detectors.loop.SKIPPED_AFTER + 10):
        opt.zero_grad(set_to_none=True)
        x = torch.randn(4, 8)
        x[0, 0] = float("nan")  # every gradient non-finite: the scaler skips every step
        scaler.scale(model(x).pow(2).mean()).backward()
        monitor.check(opt)
        scaler.step(opt)
        scaler.update()
    report = monitor.close()
    assert report.names("no_update") == {"optimizers[0]"}, str(report)
    assert report.names("stale_param", status=None) == {"optimizers[0]"}

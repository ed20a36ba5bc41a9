"""Every bug class: the kind, the qualified name and the cause leafwatch gives for it.

Each test builds the bug in a tiny model, runs a real forward/backward, and asserts what
``audit()`` and/or a ``Monitor`` (created before the first forward, so causes are complete) say.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

import leafwatch
from leafwatch import LeafwatchWarning
from leafwatch.detectors.constructors import UNKNOWN_CAUSE
from leafwatch.detectors.gradients import STALLED_AFTER
from leafwatch.observe.structure import REQUIRES_GRAD_EVERY


class TwoLayer(nn.Module):
    """``a`` feeds ``b``; subclasses change how ``a``'s output reaches ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 1)

    def middle(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.middle(x))


def _monitor_step(model: nn.Module, opt: torch.optim.Optimizer | None = None, x: torch.Tensor | None = None,
                  **kwargs) -> leafwatch.Report:
    """One training step with a Monitor created before the first forward; the report at its end
    (what waited for a second check, an encoder run under no_grad, is decided by ``close()``)."""
    opt = opt if opt is not None else torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, **kwargs) as monitor:
        model(torch.randn(4, 3) if x is None else x).sum().backward()
        monitor.check()
        return monitor.close()


def _only(report: leafwatch.Report, kind: str) -> list[leafwatch.Finding]:
    """The open tensors of one kind (the per-tensor view of the report's mistakes)."""
    return [f for f in report.tensors(kind) if f.status == "open"]


def _one_mistake(report: leafwatch.Report, kind: str) -> leafwatch.Finding:
    """The one open finding of a kind: a mistake, its tensors listed in ``members``."""
    (mistake,) = [f for f in report if f.kind == kind and f.status == "open"]
    return mistake


# -- non_leaf ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "op", "words"),
    [
        (lambda w: w.to(torch.float64), "ToCopyBackward0", "dtype conversion"),
        (lambda w: w.clone(), "CloneBackward0", "clone"),
        (lambda w: w * 0.01, "MulBackward0", "arithmetic"),
        (lambda w: w[:2], "SliceBackward0", "slice"),
        (lambda w: w[0], "SelectBackward0", "slice"),
        (lambda w: w.view(3, 1), "ViewBackward0", "view"),
    ],
)
def test_non_leaf_tensor_is_named_with_the_op_that_made_it(make, op, words):
    w = make(torch.randn(3, requires_grad=True))
    (w * 2).sum().backward()
    (finding,) = leafwatch.audit(tensors={"w": w}).findings
    assert (finding.kind, finding.name, finding.severity) == ("non_leaf", "w", "error")
    assert finding.details["op"] == op
    assert words in finding.cause
    assert "`w.grad` stays None" in finding.cause
    assert "requires_grad_()" in finding.fix


def test_monitor_reports_a_non_leaf_from_tensors_with_its_cause():
    model = nn.Linear(3, 1)
    scale = (torch.randn(1, requires_grad=True) * 0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(LeafwatchWarning, match="`scale` is not a leaf") as record:
        monitor = leafwatch.Monitor(model, opt, tensors={"scale": scale})
    assert record[0].filename == __file__
    (model(torch.randn(4, 3)) * scale).sum().backward()
    report = monitor.check()
    monitor.close()
    (finding,) = report.findings
    assert (finding.kind, finding.name) == ("non_leaf", "scale")
    assert "arithmetic" in finding.cause and "MulBackward0" in finding.cause
    assert f"(watched at {__file__}:" in finding.message


# -- missing_grad with a Monitor --------------------------------------------------------------------
class NeverRuns(TwoLayer):
    def __init__(self) -> None:
        super().__init__()
        self.extra = nn.Linear(3, 3)


class Detached(TwoLayer):
    def middle(self, x):
        return self.a(x).detach()


class NoGrad(TwoLayer):
    def middle(self, x):
        with torch.no_grad():
            return self.a(x)


class NumpyRoundTrip(TwoLayer):
    def middle(self, x):
        return torch.from_numpy(self.a(x).detach().numpy())


class ListRewrap(TwoLayer):
    def middle(self, x):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
            return torch.tensor(self.a(x).tolist())


class ReentrantCheckpoint(TwoLayer):
    def middle(self, x):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that no input requires grad
            warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
            return torch.utils.checkpoint.checkpoint(self.a, x, use_reentrant=True)


@pytest.mark.parametrize(
    ("model_cls", "names", "reason", "words"),
    [
        (NeverRuns, {"extra.weight", "extra.bias"}, "never_ran", "`extra` never ran"),
        (Detached, {"a.weight", "a.bias"}, "detached", "cut by `.detach()` at test_bug_classes.py:"),
        (NoGrad, {"a.weight", "a.bias"}, "grad_disabled", "torch.no_grad()"),
        (NumpyRoundTrip, {"a.weight", "a.bias"}, "detached", "cut by `.detach()` at test_bug_classes.py:"),
        (ListRewrap, {"a.weight", "a.bias"}, "rewrapped", "cut by `.tolist()` at test_bug_classes.py:"),
        (ReentrantCheckpoint, {"a.weight", "a.bias"}, "checkpoint", "reentrant `torch.utils.checkpoint`"),
    ],
)
def test_monitor_explains_a_missing_gradient(model_cls, names, reason, words):
    report = _monitor_step(model_cls())
    missing = _only(report, "missing_grad")
    assert {f.name for f in missing} == names
    assert set(_one_mistake(report, "missing_grad").names) == names  # one module: one mistake
    for f in missing:
        assert f.severity == "error"
        # what was observed; a no_grad miss that did not change between checks is then confirmed: no target
        assert (f.reason.name, f.reason.observed) == (
            "not_a_target" if reason == "grad_disabled" else reason, reason)
        assert words in f.cause
        assert f.fix


def test_detach_cause_names_where_the_graph_was_cut():
    report = _monitor_step(Detached())
    (finding, _) = sorted(_only(report, "missing_grad"), key=lambda f: f.name)
    at = f"test_bug_classes.py:{Detached.middle.__code__.co_firstlineno + 1}"
    assert f"cut by `.detach()` at {at} (in `Detached.middle`)" in finding.cause
    assert finding.details["group"] == f".detach() at {at}"
    assert f"remove the `.detach()` at {at}" in finding.fix


def test_checkpoint_fix_says_use_reentrant_false():
    report = _monitor_step(ReentrantCheckpoint())
    found = _only(report, "missing_grad")
    assert {f.name for f in found} == {"a.weight", "a.bias"}
    assert all("use_reentrant=False" in f.fix for f in found)


class DataInside(nn.Module):
    """Uses its weight through ``.data`` inside its own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.weight.data


class DataModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = DataInside()
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(self.scale(x))


def test_monitor_explains_a_parameter_used_through_data():
    report = _monitor_step(DataModel())
    (finding,) = _only(report, "missing_grad")
    assert finding.name == "scale.weight"
    assert finding.reason.name == "data_access"
    assert "`.data`" in finding.cause
    assert "not `weight.data`" in finding.fix


# -- missing_grad with audit() ------------------------------------------------------------------------
def test_audit_with_loss_tells_unreachable_parameters():
    model = Detached()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 3)).sum()
    loss.backward()
    report = leafwatch.audit(model, opt, loss=loss)
    assert report.names("missing_grad") == {"a.weight", "a.bias"}
    for f in report.by_kind("missing_grad"):
        assert f.reason.name == "unreachable"
        assert "not reachable from the loss" in f.cause


def test_audit_with_loss_never_advises_deleting_a_tensor_the_forward_may_use():
    """A `.detach()` cut leaves nothing in the loss graph: the fix keeps the output in the graph
    where the forward uses the tensor, and says nothing of deleting it (#46)."""
    model = Detached()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 3)).sum()
    loss.backward()
    (finding,) = leafwatch.audit(model, opt, loss=loss).by_kind("missing_grad")
    assert (finding.name, finding.reason.name) == ("a", "unreachable")
    assert "delete" not in finding.fix
    assert "if the forward uses each of `a.{bias,weight}`, keep its output in the graph: no `.detach()`" in finding.fix


def test_a_stateless_audit_says_no_step():
    model = Detached()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    report = leafwatch.audit(model, opt)
    (finding,) = report.by_kind("missing_grad")
    assert (finding.name, finding.first_step, finding.last_step) == ("a", None, None)
    assert "since" not in str(report) and "at step" not in str(report)
    (stepped,) = leafwatch.audit(model, opt, step=7).by_kind("missing_grad")
    assert stepped.first_step == 7 and "(since step 7)" in str(leafwatch.audit(model, opt, step=7))


def test_audit_with_loss_before_backward_says_not_backpropagated():
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 3)).sum()
    report = leafwatch.audit(model, opt, loss=loss)
    assert report.names("missing_grad") == {"a.weight", "a.bias", "b.weight", "b.bias"}
    assert {f.reason.name for f in report} == {"not_backpropagated"}


def test_audit_without_loss_says_the_cause_is_unknown_and_how_to_learn_it():
    model = NeverRuns()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    report = leafwatch.audit(model, opt)
    assert report.names("missing_grad") == {"extra.weight", "extra.bias"}
    for f in report.by_kind("missing_grad"):
        assert f.reason.name == "unknown"
        assert f.cause == UNKNOWN_CAUSE
        assert "leafwatch.Monitor(model, optimizer)" in f.cause and "loss=" in f.cause


# -- orphan_tensor --------------------------------------------------------------------------------------
class PlainAttribute(TwoLayer):
    def __init__(self) -> None:
        super().__init__()
        self.temperature = torch.ones(1, requires_grad=True)

    def forward(self, x):
        return super().forward(x) * self.temperature


class ParamList(TwoLayer):
    def __init__(self) -> None:
        super().__init__()
        self.gains = [nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))]

    def middle(self, x):
        return self.a(x) * self.gains[0] * self.gains[1]


class ParamTuple(TwoLayer):
    def __init__(self) -> None:
        super().__init__()
        self.gains = (nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3)))

    def middle(self, x):
        return self.a(x) * self.gains[0] * self.gains[1]


class ParamDict(TwoLayer):
    def __init__(self) -> None:
        super().__init__()
        self.gains = {"k": nn.Parameter(torch.ones(3))}

    def middle(self, x):
        return self.a(x) * self.gains["k"]


class BlockList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = [nn.Linear(3, 3), nn.Linear(3, 3)]
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ConvertedParameter(TwoLayer):
    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(3)).to(torch.float64)

    def middle(self, x):
        return self.a(x) * self.gain.float()


@pytest.mark.parametrize(
    ("model_cls", "names", "container", "fix_words"),
    [
        (PlainAttribute, {"temperature"}, "attribute", "`self.temperature = nn.Parameter(torch.ones(1))`"),
        (ParamList, {"gains[0]", "gains[1]"}, "list", "nn.ParameterList"),
        (ParamTuple, {"gains[0]", "gains[1]"}, "list", "nn.ParameterList"),
        (ParamDict, {"gains['k']"}, "dict", "nn.ParameterDict"),
        (BlockList, {"blocks[0].weight", "blocks[0].bias", "blocks[1].weight", "blocks[1].bias"}, "list", "nn.ModuleList"),
        (ConvertedParameter, {"gain"}, "attribute", "`self.gain = nn.Parameter(torch.ones(3).to(torch.float64))`"),
    ],
)
def test_orphans_are_named_by_their_attribute_path(model_cls, names, container, fix_words):
    model = model_cls()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for report in (_monitor_step(model, opt), leafwatch.audit(model, opt)):
        orphans = _only(report, "orphan_tensor")
        assert {f.name for f in orphans} == names
        assert set(_one_mistake(report, "orphan_tensor").names) == names  # one container: one mistake
        for f in orphans:
            assert f.severity == "error"  # model.parameters() does not see it: it never trains
            assert f.details["container"] == container
            assert fix_words in f.fix
            assert "never trains" in f.message
        assert not _only(report, "missing_grad")


def test_orphan_in_the_optimizer_is_a_warning_about_state_dict():
    model = PlainAttribute()
    opt = torch.optim.SGD([*model.parameters(), model.temperature], lr=0.1)
    (finding,) = _only(leafwatch.audit(model, opt), "orphan_tensor")
    assert (finding.name, finding.severity) == ("temperature", "warning")
    assert "state_dict()" in finding.message


def test_converted_parameter_attribute_explains_its_origin():
    model = ConvertedParameter()
    (finding,) = _only(leafwatch.audit(model), "orphan_tensor")
    assert finding.name == "gain"
    assert "non-leaf" in finding.message
    assert finding.details["op"] == "ToCopyBackward0"
    assert "dtype conversion" in finding.cause
    assert "returns a plain non-leaf tensor" in finding.cause


def test_block_list_fix_names_the_attribute():
    (finding, *_) = _only(leafwatch.audit(BlockList()), "orphan_tensor")
    assert "`self.blocks = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])`" in finding.fix


class SharedOrphans(TwoLayer):
    """One orphan tensor and one orphan module, each reachable from three places."""

    def __init__(self) -> None:
        super().__init__()
        self.temperature = torch.ones(1, requires_grad=True)
        self.schedule = [self.temperature, self.temperature]
        self.named = {"t": self.temperature}
        block = nn.Linear(3, 3)
        self.blocks = [block, block]
        self.spares = (block,)

    def middle(self, x):
        return self.blocks[0](self.a(x)) * self.temperature


def test_an_orphan_reachable_twice_is_one_finding_under_its_first_name():
    model = SharedOrphans()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for report in (_monitor_step(model, opt), leafwatch.audit(model, opt)):
        orphans = _only(report, "orphan_tensor")
        assert sorted(f.name for f in orphans) == ["blocks[0].bias", "blocks[0].weight", "temperature"]
        assert len(report.tensors()) == 3
        assert [f.name for f in report] == ["blocks", "temperature"]  # the list, the attribute


# -- ignore patterns ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("ignore", "reasons"), [
    ({"gains*": "a glob, listed first", "gains[0]": "the exact name, listed second"},
     {"gains[0]": "a glob, listed first", "gains[1]": "a glob, listed first"}),
    ({"gains[0]": "the exact name, listed first", "gains*": "a glob, listed second"},
     {"gains[0]": "the exact name, listed first", "gains[1]": "a glob, listed second"}),
])
def test_the_first_matching_ignore_pattern_wins_and_gives_its_reason(ignore, reasons):
    model = ParamList()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for report in (_monitor_step(model, opt, ignore=ignore), leafwatch.audit(model, opt, ignore=ignore)):
        orphans = report.tensors("orphan_tensor")
        assert {f.name: f.status for f in orphans} == dict.fromkeys(reasons, "ignored")
        assert [(f.name, f.status) for f in report.by_kind("orphan_tensor")] == [("gains", "ignored")]
        assert {f.name: f.details["ignored_because"] for f in orphans} == reasons
        assert not report


def test_an_orphan_named_with_brackets_is_ignored_by_its_exact_name():
    model = ParamList()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ignore = {"gains[0]": "scaled by hand", "gains[2]": "a typo: there is no third gain"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reports = [_monitor_step(model, opt, ignore=ignore), leafwatch.audit(model, opt, ignore=ignore)]
    for report in reports:
        statuses = {f.name: f.status for f in report.tensors("orphan_tensor")}
        assert statuses == {"gains[0]": "ignored", "gains[1]": "open"}
        assert [(f.name, f.status) for f in report] == [("gains", "open")]  # the rest stays open
        (ignored,) = [f for f in report.tensors() if f.status == "ignored"]
        assert ignored.details["ignored_because"] == "scaled by hand"
        assert ignored.details["pattern"] == "gains[0]"
    unmatched = [str(w.message) for w in caught if issubclass(w.category, LeafwatchWarning)]
    assert len(unmatched) == 2 and all("pattern 'gains[2]' matches no" in m for m in unmatched), unmatched


# -- optimizer membership ----------------------------------------------------------------------------------
def test_layer_left_out_of_the_optimizer():
    model = TwoLayer()
    opt = torch.optim.SGD(model.a.parameters(), lr=0.1)
    for report in (_monitor_step(model, opt), leafwatch.audit(model, opt)):
        found = _only(report, "not_in_optimizer")
        assert {f.name for f in found} == {"b.weight", "b.bias"}
        assert all("left out" in f.cause and f.severity == "error" for f in found)
        assert not _only(report, "missing_grad")


class WeightedLoss(TwoLayer):
    def __init__(self) -> None:
        super().__init__()
        self.log_var = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return super().forward(x) * torch.exp(-self.log_var) + self.log_var


def test_learnable_loss_weight_left_out_of_the_optimizer():
    model = WeightedLoss()
    opt = torch.optim.Adam([*model.a.parameters(), *model.b.parameters()], lr=0.1)
    for report in (_monitor_step(model, opt), leafwatch.audit(model, opt)):
        (finding,) = report.findings
        assert (finding.kind, finding.name) == ("not_in_optimizer", "log_var")


def test_plain_tensor_without_requires_grad_in_the_optimizer_is_an_error():
    model = TwoLayer()
    bias = torch.zeros(1)
    opt = torch.optim.SGD([*model.parameters(), bias], lr=0.1)
    (model(torch.randn(4, 3)) + bias).sum().backward()
    (finding,) = leafwatch.audit(model, opt).findings
    assert (finding.kind, finding.severity) == ("frozen_in_optimizer", "error")
    assert finding.name == "the tensor of shape (1,) at index 4"  # no variable: described in words, not as code
    assert finding.message.startswith("optimizer 0 holds the tensor of shape (1,) at index 4, which does not require")
    assert "without `requires_grad=True`" in finding.cause


def test_frozen_parameter_in_the_optimizer_is_info():
    model = TwoLayer()
    model.a.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for report in (_monitor_step(model, opt), leafwatch.audit(model, opt)):
        found = report.tensors("frozen_in_optimizer")
        assert {f.name for f in found} == {"a.weight", "a.bias"}
        assert len(report.by_kind("frozen_in_optimizer")) == 1  # one frozen group
        assert {f.severity for f in found} == {"info"}
        assert not report.at_least("warning")


# -- stale_param -----------------------------------------------------------------------------------------
def test_audit_pairs_a_replaced_layer_by_shape():
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.b = nn.Linear(3, 1)
    model(torch.randn(4, 3)).sum().backward()
    report = leafwatch.audit(model, opt)
    found = report.tensors("stale_param")
    assert {f.name for f in found} == {"b.weight", "b.bias"}
    assert [f.group for f in report.by_kind("stale_param")] == ["optimizers[0]"]
    assert all("replaced" in f.cause for f in found)
    assert not report.by_kind("not_in_optimizer")


def test_monitor_pairs_a_resized_layer_by_its_remembered_name():
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt)
    model(torch.randn(4, 3)).sum().backward()
    assert not monitor.check()
    model.a = nn.Linear(3, 5)  # a resize: no shape to pair by
    model.b = nn.Linear(5, 1)
    opt.zero_grad()
    model(torch.randn(4, 3)).sum().backward()
    report = monitor.check()
    monitor.close()
    found = report.tensors("stale_param")
    assert {f.name for f in found} == {"a.weight", "a.bias", "b.weight", "b.bias"}
    weight = next(f for f in found if f.name == "a.weight")
    assert weight.shape == (5, 3)
    assert weight.details["old_shape"] == [3, 3]
    assert not report.by_kind("not_in_optimizer")
    assert not report.by_kind("missing_grad"), "the old tensors are reported once, as stale"


# -- nonfinite_grad ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_grad_is_named(value):
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    model.b.weight.grad[0, 1] = value
    (finding,) = leafwatch.audit(model, opt).findings
    assert (finding.kind, finding.name, finding.severity) == ("nonfinite_grad", "b.weight", "error")
    assert "NaN or Inf" in finding.message
    assert "detect_anomaly" in finding.fix


def test_nonfinite_grads_all_in_one_module_are_one_mistake_named_by_that_module():
    """Every NaN gradient at once is one mistake ("all" of the kind): named by the module that
    holds them all, not by a list of its tensors."""
    model = nn.Sequential()
    model.encoder = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3))
    model.head = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    for p in model.encoder.parameters():
        p.grad[0] = float("nan")
    (finding,) = leafwatch.audit(model, opt).findings
    assert (finding.kind, finding.name, finding.severity) == ("nonfinite_grad", "encoder", "error")
    assert set(finding.names) == {"encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias"}


def test_audit_skips_the_value_check_when_told():
    model = TwoLayer()
    model(torch.randn(4, 3)).sum().backward()
    model.b.weight.grad[0, 1] = float("nan")
    assert not leafwatch.audit(model, check_values=False).findings


def test_monitor_checks_values_at_its_cadence_and_resolves():
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    monitor = leafwatch.Monitor(model, opt, check_values_every_n_steps=3)
    seen = []
    for step in range(1, 7):
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        if step in (2, 3):
            model.a.bias.grad[0] = float("nan")
        seen.append(monitor.check().names("nonfinite_grad"))
    monitor.close()
    # Checked at step 1 and every 3rd step: step 2's NaN is not looked at, step 3's is, step 6 resolves it.
    assert seen == [set(), set(), {"a.bias"}, {"a.bias"}, {"a.bias"}, set()]
    assert monitor.history[("nonfinite_grad", "a.bias")].status == "resolved"


# -- device_mismatch ---------------------------------------------------------------------------------------
def test_float64_parameter_in_a_float32_model_is_a_mismatch():
    model = TwoLayer()
    model.b.bias = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    (finding,) = leafwatch.audit(model, opt, check_values=False).by_kind("device_mismatch")
    assert (finding.name, finding.severity, finding.dtype) == ("b.bias", "warning", "float64")
    assert "float64 while the other trainable parameters are float32" in finding.message


# -- watch() -----------------------------------------------------------------------------------------------
def test_watch_warns_at_once_at_the_callers_line():
    with pytest.warns(LeafwatchWarning, match="`w` is not a leaf") as record:
        line = inspect.currentframe().f_lineno + 1
        leafwatch.watch(torch.randn(3, requires_grad=True) * 0.01, name="w")
    assert (record[0].filename, record[0].lineno) == (__file__, line)


def test_watch_reports_a_leaf_that_got_no_gradient():
    used = leafwatch.watch(torch.randn(3, requires_grad=True), name="used")
    unused = leafwatch.watch(torch.randn(3, requires_grad=True), name="unused")
    (used * 2).sum().backward()
    (finding,) = leafwatch.audit().findings
    assert (finding.kind, finding.name) == ("missing_grad", "unused")
    assert finding.reason.name == "watched_unused"
    assert "not used in the computation of the loss" in finding.cause
    del unused


def test_watch_defaults_the_name_to_the_callers_line():
    line = inspect.currentframe().f_lineno + 1
    t = leafwatch.watch(torch.randn(3, requires_grad=True))
    (finding,) = leafwatch.audit().findings
    assert finding.name == f"tensor@{__file__}:{line}"
    assert list(leafwatch.watched()) == [finding.name]
    del t


# -- Monitor history ---------------------------------------------------------------------------------------
class EveryOther(TwoLayer):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def middle(self, x):
        self.calls += 1
        return self.a(x) if self.calls % 2 else x


def _run_every_other(patience: int, steps: int = 6) -> list[leafwatch.Report]:
    model = EveryOther()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reports = []
    with leafwatch.Monitor(model, opt, patience=patience) as monitor:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            model(torch.randn(4, 3)).sum().backward()
            reports.append(monitor.check())
            opt.step()
    return reports


def test_parameter_used_every_other_step_becomes_intermittent_info():
    reports = _run_every_other(patience=1)
    assert reports[0].findings == []
    # It had a gradient at step 1, so its first miss is already intermittent, never an error.
    assert reports[1].names("missing_grad", status="intermittent") == {"a.weight", "a.bias"}
    assert not any(r.open for r in reports)
    final = reports[-1]
    assert final.names("missing_grad", status="intermittent") == {"a.weight", "a.bias"}
    assert not final.open
    for f in final.by_kind("missing_grad"):
        assert f.severity == "info"
        assert f.details["steps_without_grad"] == 3 and f.details["checks"] == 6


def test_parameter_used_every_other_step_is_never_reported_with_patience():
    assert all(r.findings == [] for r in _run_every_other(patience=3))


def test_patience_reports_a_parameter_that_stops_getting_gradients():
    model = NeverRuns()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    names = []
    with leafwatch.Monitor(model, opt, patience=3) as monitor:
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            model(torch.randn(4, 3)).sum().backward()
            names.append(monitor.check().names("missing_grad"))
    assert names == [set(), set(), {"extra.weight", "extra.bias"}]


# -- Monitor.attach() --------------------------------------------------------------------------------------
def test_attach_checks_before_each_step_only_the_stepping_optimizers_params():
    model = TwoLayer()
    opt_a = torch.optim.SGD(model.a.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(model.b.parameters(), lr=0.1)
    events = []
    monitor = leafwatch.Monitor(model, [opt_a, opt_b], sinks=[events.append]).attach()
    # Only b gets a gradient: stepping opt_b is fine, stepping opt_a finds a's missing gradients.
    model.b(torch.randn(4, 3)).sum().backward()
    opt_b.step()
    assert len(events) == 1 and events[0].optimizer == 1 and not events[0].report
    assert set(events[0].names) == {"b.weight", "b.bias"}
    opt_a.step()
    assert len(events) == 2 and events[1].optimizer == 0
    assert events[1].report.names("missing_grad") == {"a.weight", "a.bias"}
    monitor.close()
    opt_b.step()
    assert len(events) == 2, "close() removes the step hooks"


# -- torch.compile and tied weights ------------------------------------------------------------------------
def test_compiled_model_names_have_no_orig_mod():
    model = TwoLayer()
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.a.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()  # `b` gets gradients that no optimizer applies
    report = leafwatch.audit(compiled, opt)
    assert report.names("not_in_optimizer") == {"b.weight", "b.bias"}
    model.zero_grad(set_to_none=True)
    with leafwatch.Monitor(compiled, opt) as monitor:
        model(torch.randn(4, 3)).sum().backward()  # the eager model: no compile in this test
        assert monitor.check().names("not_in_optimizer") == set()  # held until the value is seen unchanged
        assert monitor.check().names("not_in_optimizer") == {"b.weight", "b.bias"}


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.decoder = nn.Linear(3, 5, bias=False)
        self.decoder.weight = self.embed.weight
        self.head = nn.Linear(5, 1)

    def forward(self, x):
        return self.head(self.decoder(self.embed(x)))


def test_tied_weight_gives_one_finding_listing_every_alias():
    model = Tied()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    model(torch.tensor([0, 1])).sum().backward()
    (finding,) = leafwatch.audit(model, opt).by_kind("not_in_optimizer")
    assert finding.name == "embed.weight"
    assert finding.aliases == ("decoder.weight",)


class TiedDetached(Tied):
    def forward(self, x):
        return self.head(self.decoder(self.embed(x)).detach())


def test_tied_weight_missing_a_gradient_is_one_monitor_finding_with_its_alias():
    model = TiedDetached()
    report = _monitor_step(model, x=torch.tensor([0, 1]))
    (finding,) = _only(report, "missing_grad")
    assert (finding.name, finding.aliases) == ("embed.weight", ("decoder.weight",))
    assert finding.reason.name == "detached"


def test_ignore_matches_a_tied_weight_by_its_alias():
    model = Tied()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    model(torch.tensor([0, 1])).sum().backward()
    report = leafwatch.audit(model, opt, ignore={"decoder.*": "trained elsewhere"})
    (finding,) = report.by_kind("not_in_optimizer")
    assert finding.status == "ignored"
    assert finding.details["ignored_because"] == "trained elsewhere"
    assert not report


# -- Monitor causes after the first step --------------------------------------------------------------------
class CutFromStepThree(TwoLayer):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def middle(self, x):
        self.calls += 1
        out = self.a(x)
        return out.detach() if self.calls >= 3 else out


def test_monitor_explains_a_gradient_lost_after_the_first_step():
    model = CutFromStepThree()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reasons = []
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(4):
            opt.zero_grad(set_to_none=True)
            model(torch.randn(4, 3)).sum().backward()
            reasons.append({(f.reason.name, f.reason.observed) for f in monitor.check().by_kind("missing_grad")})
    # Hooks are armed on `a` when it first misses; the next step says why (it got gradients before: intermittent).
    assert reasons == [set(), set(), {("intermittent", "pending")}, {("intermittent", "detached")}]
    finding = monitor.history[("missing_grad", "a.weight")]
    assert f"cut by `.detach()` at test_bug_classes.py:{CutFromStepThree.middle.__code__.co_firstlineno + 3}" \
        in finding.cause


def test_monitor_created_after_the_forward_does_not_guess_the_cause():
    model = Detached()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    with leafwatch.Monitor(model, opt) as monitor:
        first = monitor.check()
        opt.zero_grad(set_to_none=True)
        model(torch.randn(4, 3)).sum().backward()
        second = monitor.check()
    # The first check saw no forward: the missing gradient is held, not worded, until a traced step says why.
    assert first.by_kind("missing_grad") == [] and first.findings == []
    assert "never ran" not in str(first)
    assert {f.reason.name for f in second.by_kind("missing_grad")} == {"detached"}
    assert second.names("missing_grad") == {"a.weight", "a.bias"}


def test_parameter_on_another_device_is_a_mismatch():
    # The meta device stands in for a second device (tests/core/test_cuda.py uses a real GPU).
    model = TwoLayer()
    model.b.bias = nn.Parameter(torch.zeros(1, device="meta"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    (finding,) = leafwatch.audit(model, opt, check_values=False).by_kind("device_mismatch")
    assert (finding.name, finding.device) == ("b.bias", "meta")
    assert "on meta while the other trainable parameters are on cpu" in finding.message


def test_watched_parameter_is_reported_once_under_its_watch_name():
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    leafwatch.watch(model.a.weight, name="encoder weight")
    with leafwatch.Monitor(model, opt) as monitor:
        model.b(torch.randn(4, 3)).sum().backward()  # `a` is skipped
        reports = [monitor.check(), leafwatch.audit(model, opt)]
    for report in reports:
        assert report.names("missing_grad") == {"encoder weight", "a.bias"}


def test_slice_of_a_named_leaf_names_the_leaf_that_gets_the_gradient():
    model = TwoLayer()
    table = leafwatch.watch(torch.randn(5, requires_grad=True), name="table")
    report = leafwatch.audit(model, tensors={"row": model.a.weight[0], "head": table[:2],
                                             "part": torch.randn(5, requires_grad=True)[1:]})
    causes = {f.name: f.cause for f in report.by_kind("non_leaf")}
    assert "backward() puts the gradient into `a.weight` (shape (3, 3), float32, cpu)" in causes["row"]
    assert "backward() puts the gradient into `table` (shape (5,), float32, cpu)" in causes["head"]
    assert "backward() puts the gradient into the leaf it is a view of (shape (5,), float32, cpu)" in causes["part"]


def test_bfloat16_linear_in_a_float32_model_is_a_mismatch():
    # The less precise island silently loses its small updates; a float32 lm head in a bfloat16
    # model is deliberate (tests/detectors/test_false_alarm_patterns.py).
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 1))
    model[4].to(torch.bfloat16)
    report = leafwatch.audit(model, torch.optim.SGD(model.parameters(), lr=0.1), check_values=False)
    assert report.names("device_mismatch") == {"4.weight", "4.bias"}
    finding = report.by_kind("device_mismatch")[0]
    assert "bfloat16 while the other trainable parameters are float32" in finding.message
    assert "rounded to bfloat16" in finding.cause


def test_intermittent_parameter_that_stops_getting_gradients_is_reported_again():
    model = CutFromStepThree()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    statuses = []
    with leafwatch.Monitor(model, opt, check_values_every_n_steps=0) as monitor:
        for _ in range(2 + STALLED_AFTER):
            model.zero_grad(set_to_none=True)
            model(torch.randn(2, 3)).sum().backward()
            monitor.check()
            finding = monitor.history.get(("missing_grad", "a.weight"))
            statuses.append(None if finding is None else (finding.status, finding.severity))
    assert statuses[:2] == [None, None]
    assert set(statuses[2:-1]) == {("intermittent", "info")}
    assert statuses[-1] == ("open", "warning")
    finding = monitor.report.by_kind("missing_grad")[0]
    assert f"none in {STALLED_AFTER} or more checks in a row: it stopped training" in finding.message
    assert (finding.reason.name, finding.reason.observed) == ("stalled", "detached")
    assert "cut by `.detach()`" in finding.cause


def test_layer_unfrozen_mid_run_but_not_added_to_the_optimizer():
    model = TwoLayer()
    model.a.requires_grad_(False)
    opt = torch.optim.SGD(model.b.parameters(), lr=0.1)
    found_at = None
    with leafwatch.Monitor(model, opt) as monitor:
        for step in range(1, 16):
            if step == 4:
                model.a.requires_grad_(True)  # the classic fine-tuning slip: opt never hears of it
            opt.zero_grad(set_to_none=True)
            model(torch.randn(4, 3)).sum().backward()
            report = monitor.check()
            if found_at is None and report.names("not_in_optimizer"):
                found_at = step
    # Seen at the next look at the requires_grad flags, within REQUIRES_GRAD_EVERY checks, and named
    # one check later, once its value is seen unchanged (the gradient rule).
    assert found_at is not None and 4 < found_at <= 4 + REQUIRES_GRAD_EVERY + 1
    assert report.names("not_in_optimizer") == {"a.weight", "a.bias"}


@dataclasses.dataclass
class EncoderOutput:
    hidden: torch.Tensor


class Opaque:
    def __init__(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden


class ScaleTo(nn.Module):
    """Owns its weight and returns its output wrapped by ``wrap`` (a dataclass or an object)."""

    def __init__(self, wrap) -> None:
        super().__init__()
        self.wrap = wrap
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.wrap(x * self.weight)


class WrappedOutput(nn.Module):
    def __init__(self, wrap) -> None:
        super().__init__()
        self.encoder = ScaleTo(wrap)
        self.b = nn.Linear(3, 1)

    def forward(self, x):
        return self.b(self.encoder(x).hidden.detach())


def test_module_returning_a_dataclass_is_traced_into():
    report = _monitor_step(WrappedOutput(EncoderOutput))
    (finding,) = report.by_kind("missing_grad")
    assert finding.name == "encoder.weight"
    assert finding.reason.name == "detached"
    assert f"cut by `.detach()` at test_bug_classes.py:{WrappedOutput.forward.__code__.co_firstlineno + 1}" \
        in finding.cause


def test_module_returning_an_opaque_object_is_not_blamed_for_data_access():
    report = _monitor_step(WrappedOutput(Opaque))
    (finding,) = report.by_kind("missing_grad")
    assert finding.name == "encoder.weight"
    # The module hooks cannot look into the output, but the recorder saw the `.detach()` after it.
    assert finding.reason.name == "detached"
    assert f"cut by `.detach()` at test_bug_classes.py:{WrappedOutput.forward.__code__.co_firstlineno + 1}" \
        in finding.cause
    assert ".data" not in finding.cause


class ReturnsItsWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(3))

    def forward(self):
        return self.weight


class PositionalModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.positions = ReturnsItsWeight()
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(x + self.positions().detach())


def test_module_returning_its_own_parameter_gets_no_lasting_hook():
    model = PositionalModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            model(torch.randn(4, 3)).sum().backward()
            report = monitor.check()
    (finding,) = report.by_kind("missing_grad")
    assert finding.name == "positions.weight"
    assert finding.reason.name == "detached"
    assert not model.positions.weight._backward_hooks, "no hook left on the parameter"


def test_parameter_passed_in_tensors_is_reported_once_under_that_name():
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.b(torch.randn(4, 3)).sum().backward()  # `a` is skipped
    report = leafwatch.audit(model, opt, tensors={"encoder weight": model.a.weight})
    assert report.names("missing_grad") == {"encoder weight", "a.bias"}

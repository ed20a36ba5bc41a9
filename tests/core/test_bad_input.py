"""Bad input gets a TypeError or ValueError that names the argument and the value received."""

from __future__ import annotations

import re
import sys

import pytest
import torch
from torch import nn

import leafwatch
from leafwatch.integrations.tensorboard import TensorBoardSink


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.head = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x))


def _trained_step() -> tuple[TinyModel, torch.optim.Optimizer]:
    model = TinyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    return model, optimizer


class _Writer:
    """A writer with the SummaryWriter methods the sink needs; it records what it gets."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.calls.append(tag)

    def add_text(self, tag: str, text: str, step: int) -> None:
        self.calls.append(tag)

    def flush(self) -> None:
        pass


# -- watch() ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "shown"), [
    ([1.0, 2.0], "list: [1.0, 2.0]"),
    (3.5, "float: 3.5"),
    (None, "NoneType: None"),
])
def test_watch_rejects_a_non_tensor_naming_the_argument_and_value(value, shown) -> None:
    with pytest.raises(TypeError, match=r"`tensor` must be a torch\.Tensor, got " + re.escape(shown)):
        leafwatch.watch(value, name="w")
    assert leafwatch.watched() == {}


def test_watch_rejects_a_non_string_name() -> None:
    with pytest.raises(TypeError, match=r"`name` must be a str or None, got int: 7"):
        leafwatch.watch(torch.zeros(2, requires_grad=True), name=7)


def test_watch_rejects_an_empty_name() -> None:
    with pytest.raises(ValueError, match=r"`name` must not be empty, got ''"):
        leafwatch.watch(torch.zeros(2, requires_grad=True), name="")


def test_watch_rejects_a_duplicate_name_of_another_live_tensor() -> None:
    first = leafwatch.watch(torch.zeros(2, requires_grad=True), name="encoder_scale")
    second = torch.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match=r"`name` 'encoder_scale' already names another watched tensor"):
        leafwatch.watch(second, name="encoder_scale")
    # The first tensor is still the one watched under that name.
    assert leafwatch.watched()["encoder_scale"] is first


def test_watch_accepts_the_same_tensor_twice_under_one_name() -> None:
    t = torch.zeros(2, requires_grad=True)
    leafwatch.watch(t, name="scale")
    assert leafwatch.watch(t, name="scale") is t
    assert list(leafwatch.watched()) == ["scale"]


@pytest.mark.parametrize("argument", ["expect_leaf", "expect_grad"])
def test_watch_rejects_non_bool_flags(argument: str) -> None:
    with pytest.raises(TypeError, match=rf"`{argument}` must be a bool, got str: 'yes'"):
        leafwatch.watch(torch.zeros(2, requires_grad=True), name="w", **{argument: "yes"})


def test_unwatch_rejects_something_that_is_neither_tensor_nor_name() -> None:
    with pytest.raises(TypeError, match=r"`tensor_or_name` must be a torch\.Tensor or a str, got int: 42"):
        leafwatch.unwatch(42)


# -- audit() ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("model", "shown"), [
    ("resnet50", "str: 'resnet50'"),
    ({"layer": 1}, "dict: {'layer': 1}"),
    (torch.zeros(2), "Tensor: tensor("),
])
def test_audit_rejects_a_model_that_is_not_a_module(model, shown) -> None:
    with pytest.raises(TypeError, match=r"`model` must be a torch\.nn\.Module, got " + re.escape(shown)):
        leafwatch.audit(model=model)


def test_audit_rejects_an_optimizer_of_the_wrong_type() -> None:
    model, optimizer = _trained_step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    with pytest.raises(TypeError, match=r"`optimizers` must be a torch\.optim\.Optimizer .*got StepLR"):
        leafwatch.audit(model, scheduler)
    with pytest.raises(TypeError, match=r"`optimizers` .*got str: 'adam' at index 1"):
        leafwatch.audit(model, [optimizer, "adam"])
    with pytest.raises(TypeError, match=r"`optimizers` .*got str: 'adam'"):
        leafwatch.audit(model, "adam")


def test_audit_rejects_a_bare_tensor_as_tensors() -> None:
    model, optimizer = _trained_step()
    with pytest.raises(TypeError, match=r"`tensors` .*got a single Tensor"):
        leafwatch.audit(model, optimizer, tensors=torch.zeros(2))
    with pytest.raises(TypeError, match=r"`tensors\['scale'\]` must be a torch\.Tensor, got float: 1\.0"):
        leafwatch.audit(model, optimizer, tensors={"scale": 1.0})
    with pytest.raises(TypeError, match=r"`tensors` keys must be str, got int: 3"):
        leafwatch.audit(model, optimizer, tensors={3: torch.zeros(2)})


def test_audit_rejects_a_loss_that_is_not_a_tensor() -> None:
    model, optimizer = _trained_step()
    with pytest.raises(TypeError, match=r"`loss` must be a torch\.Tensor or None, got float: 0\.25"):
        leafwatch.audit(model, optimizer, loss=0.25)


def test_audit_rejects_a_non_bool_check_values() -> None:
    model, optimizer = _trained_step()
    with pytest.raises(TypeError, match=r"`check_values` must be a bool, got int: 1"):
        leafwatch.audit(model, optimizer, check_values=1)


@pytest.mark.parametrize(("ignore", "error", "pattern"), [
    ("head.*", TypeError, r"`ignore` .*got a str: 'head\.\*'; wrap it in a list"),
    (5, TypeError, r"`ignore` .*got int: 5"),
    ([""], ValueError, r"`ignore` patterns must be non-empty str, got ''"),
    ({"head.*": 3}, TypeError, r"`ignore` reasons must be str, got int for pattern 'head\.\*'"),
])
def test_audit_and_monitor_reject_malformed_ignore(ignore, error, pattern) -> None:
    model, optimizer = _trained_step()
    with pytest.raises(error, match=pattern):
        leafwatch.audit(model, optimizer, ignore=ignore)
    with pytest.raises(error, match=pattern):
        leafwatch.Monitor(model, optimizer, ignore=ignore)


def test_audit_warns_about_an_ignore_pattern_that_matches_nothing() -> None:
    model, optimizer = _trained_step()
    with pytest.warns(leafwatch.LeafwatchWarning, match=r"`ignore` pattern 'haed\.\*' matches no parameter"):
        report = leafwatch.audit(model, optimizer, ignore=["haed.*", "head.*"])
    assert len(report) == 0


def test_monitor_warns_about_an_ignore_pattern_that_matches_nothing() -> None:
    model, optimizer = _trained_step()
    monitor = leafwatch.Monitor(model, optimizer, ignore={"layer.wieght": "typo"})
    with pytest.warns(leafwatch.LeafwatchWarning, match=r"`ignore` pattern 'layer\.wieght' matches no parameter"):
        monitor.check()
    monitor.close()


def test_an_attached_monitors_unmatched_ignore_warning_points_at_the_step_call_not_into_torch() -> None:
    model, optimizer = _trained_step()
    monitor = leafwatch.Monitor(model, optimizer, ignore={"layer.wieght": "typo"}).attach()
    with pytest.warns(leafwatch.LeafwatchWarning, match=r"'layer\.wieght' matches no parameter") as caught:
        step_line = sys._getframe().f_lineno + 1
        optimizer.step()  # the check runs in torch's optimizer step pre-hook
    monitor.close()
    (warning,) = [w for w in caught if "matches no parameter" in str(w.message)]
    assert (warning.filename, warning.lineno) == (__file__, step_line)


def test_a_matching_ignore_pattern_does_not_warn(recwarn) -> None:
    model, optimizer = _trained_step()
    leafwatch.audit(model, optimizer, ignore={"head.*": "the head is trained separately"})
    with leafwatch.Monitor(model, optimizer, ignore=["layer.*"]) as monitor:
        monitor.check()
    assert not [w for w in recwarn if issubclass(w.category, leafwatch.LeafwatchWarning)]


NOTHING_TO_CHECK = ("leafwatch: nothing to check: no tensor requires grad and nothing is watched (a model without "
                    "parameters, or every parameter frozen), so no finding can appear.")


def _nothing_to_check_said(caught) -> list[str]:
    return [str(w.message) for w in caught if "nothing to check" in str(w.message)]


@pytest.mark.parametrize("model", [nn.ReLU(), nn.Linear(2, 1).requires_grad_(False)], ids=["no parameters", "all frozen"])
def test_audit_with_nothing_to_check_says_nothing_to_check_not_no_findings(model) -> None:
    with pytest.warns(leafwatch.LeafwatchWarning) as caught:
        line = sys._getframe().f_lineno + 1
        report = leafwatch.audit(model)
    assert _nothing_to_check_said(caught) == [NOTHING_TO_CHECK]
    (warning,) = [w for w in caught if "nothing to check" in str(w.message)]
    assert (warning.filename, warning.lineno) == (__file__, line)
    assert report.nothing_to_check and len(report) == 0
    assert str(report) == "leafwatch: nothing to check: no tensor requires grad and nothing is watched"


def test_a_monitor_with_nothing_to_check_warns_once_and_its_report_says_so() -> None:
    with pytest.warns(leafwatch.LeafwatchWarning) as caught:
        monitor = leafwatch.Monitor(nn.ReLU())
        monitor.check()
        monitor.check()
        report = monitor.close()
    assert _nothing_to_check_said(caught) == [NOTHING_TO_CHECK]
    assert str(report) == "leafwatch: nothing to check at step 2: no tensor requires grad and nothing is watched"


def test_a_watched_tensor_or_a_trainable_parameter_is_something_to_check(recwarn) -> None:
    watched = leafwatch.audit(nn.ReLU(), tensors={"scale": torch.ones(1, requires_grad=True)})
    assert not watched.nothing_to_check and watched.names("missing_grad") == {"scale"}
    model, optimizer = _trained_step()
    clean = leafwatch.audit(model, optimizer)
    assert not clean.nothing_to_check and str(clean) == "leafwatch: no findings"
    assert not _nothing_to_check_said(recwarn)


# -- Monitor ----------------------------------------------------------------------------------
def test_monitor_rejects_a_model_that_is_not_a_module() -> None:
    with pytest.raises(TypeError, match=r"`model` must be a torch\.nn\.Module, got str: 'gpt2'"):
        leafwatch.Monitor("gpt2")


def test_monitor_rejects_an_optimizer_of_the_wrong_type() -> None:
    model = TinyModel()
    with pytest.raises(TypeError, match=r"`optimizers` .*got generator"):
        leafwatch.Monitor(model, model.parameters())


@pytest.mark.parametrize(("argument", "value", "error", "pattern"), [
    ("patience", 0, ValueError, r"`patience` must be >= 1, got 0"),
    ("patience", -3, ValueError, r"`patience` must be >= 1, got -3"),
    ("patience", 2.5, TypeError, r"`patience` must be an int, got float: 2\.5"),
    ("patience", True, TypeError, r"`patience` must be an int, got bool: True"),
    ("check_values_every_n_steps", -1, ValueError, r"`check_values_every_n_steps` must be >= 0, got -1"),
    ("check_values_every_n_steps", "10", TypeError, r"`check_values_every_n_steps` must be an int, got str: '10'"),
    ("strict", "yes", TypeError, r"`strict` must be a bool, got str: 'yes'"),
    ("diagnose", 1, TypeError, r"`diagnose` must be a bool, got int: 1"),
])
def test_monitor_rejects_out_of_range_settings(argument, value, error, pattern) -> None:
    model = TinyModel()
    handles_before = len(model.layer._forward_hooks)
    with pytest.raises(error, match=pattern):
        leafwatch.Monitor(model, **{argument: value})
    # A rejected Monitor leaves no hook behind.
    assert len(model.layer._forward_hooks) == handles_before


@pytest.mark.parametrize(("argument", "value", "pattern"), [
    ("log_every_n_steps", 0, r"`log_every_n_steps` must be an int >= 1, got 0"),
    ("chunk_steps", -5, r"`chunk_steps` must be an int >= 1, got -5"),
    ("log_every_n_steps", 2.0, r"`log_every_n_steps` must be an int >= 1, got 2\.0"),
])
def test_tensorboard_sink_rejects_a_cadence_out_of_range(argument, value, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        TensorBoardSink(_Writer(), **{argument: value})


def test_tensorboard_sink_rejects_something_that_is_not_a_writer() -> None:
    with pytest.raises(TypeError, match=r"`writer` must be a SummaryWriter \(with `add_scalar`\), got str"):
        TensorBoardSink("runs/exp1")
    with pytest.raises(TypeError, match=r"`writer` must be a SummaryWriter .*got str"):
        leafwatch.Monitor(TinyModel(), writer="runs/exp1")


def test_check_rejects_arguments_of_the_wrong_type() -> None:
    model, optimizer = _trained_step()
    monitor = leafwatch.Monitor(model, optimizer)
    with pytest.raises(TypeError, match=r"`optimizer` must be a torch\.optim\.Optimizer or None, got list"):
        monitor.check(optimizer.param_groups)
    with pytest.raises(TypeError, match=r"`optimizer` .*got str: 'sgd'"):
        monitor.check("sgd")
    with pytest.raises(TypeError, match=r"`step` must be an int or None, got str: '3'"):
        monitor.check(step="3")
    with pytest.raises(TypeError, match=r"`loss` must be a torch\.Tensor or None, got float: 0\.5"):
        monitor.check(loss=0.5)
    # None of the rejected calls counted as a check, and a correct one still works.
    assert monitor.step == 0
    assert monitor.check().findings == []
    assert monitor.step == 1
    monitor.close()


def test_attach_without_optimizers_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"`optimizers` must be given to attach\(\): got none"):
        leafwatch.Monitor(TinyModel()).attach()


def test_load_state_dict_rejects_something_that_is_not_a_mapping() -> None:
    monitor = leafwatch.Monitor(TinyModel())
    with pytest.raises(TypeError, match=r"`state` must be a mapping from state_dict\(\), got list"):
        monitor.load_state_dict([("step", 3)])
    monitor.close()


def test_raise_for_findings_rejects_an_unknown_severity() -> None:
    with pytest.raises(ValueError, match=r"`min_severity` can be one of error, warning, info, got 'fatal'"):
        leafwatch.Report().raise_for_findings("fatal")


@pytest.mark.parametrize(("state", "pattern"), [
    ({"step": "12"}, r"`state\['step'\]` must be an int, got str: '12'"),
    ({"step": 3, "records": [{"kind": "missing_grad"}]}, r"`state\['records'\]\[0\]` is not a finding .*'kind': 'missing_grad'"),
    ({"step": 3, "records": ["missing_grad"]}, r"`state\['records'\]\[0\]` is not a finding .*got 'missing_grad'"),
    ({"step": 3, "misses": [1, 2]}, r"`state\['misses'\]` must be a mapping name -> count, got list: \[1, 2\]"),
])
def test_load_state_dict_rejects_a_malformed_state_and_keeps_the_current_one(state, pattern) -> None:
    model = TwoLayerModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    model(torch.ones(1, 2)).sum().backward()
    monitor.check()
    history = dict(monitor.history)
    with pytest.raises(ValueError, match=pattern):
        monitor.load_state_dict(state)
    assert monitor.step == 1
    assert monitor.history == history
    assert set(history) == {("missing_grad", "spare.weight"), ("missing_grad", "spare.bias")}
    monitor.close()


class TwoLayerModel(TinyModel):
    def __init__(self) -> None:
        super().__init__()
        self.spare = nn.Linear(2, 2)


# -- roots --------------------------------------------------------------------------------------
def test_monitor_takes_roots_as_a_sequence_named_as_leafwatch_run_names_them() -> None:
    net, extra = TinyModel(), nn.Linear(2, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with leafwatch.Monitor(roots=[net, extra], optimizers=optimizer) as monitor:
        (net(torch.ones(1, 2)).sum() + extra(torch.ones(1, 2)).sum()).backward()
        monitor.check()  # the check that first sees the gradient holds it (the gradient rule)
        report = monitor.check()
    # Several roots get their class name as a prefix; `extra` gets gradients and is in no optimizer.
    assert report.names("not_in_optimizer") == {"Linear.weight", "Linear.bias"}
    with leafwatch.Monitor(roots=[net], optimizers=optimizer) as monitor:
        assert monitor.check().names("missing_grad") == set()  # one root: no prefix
        assert monitor.structure.inventory.name(net.layer.weight) == "layer.weight"


@pytest.mark.parametrize(("roots", "error", "pattern"), [
    (nn.Linear(1, 1), TypeError, r"`roots` must be a mapping name -> torch\.nn\.Module or a sequence of modules, "
                                 r"got a single module \(Linear: Linear\(in_features=1.*\); pass it as `model`"),
    (nn.Sequential(nn.Linear(1, 1)), TypeError, r"`roots` .*got a single module \(Sequential\)"),  # a multi-line repr: the type
    ("net", TypeError, r"`roots` must be a mapping .*, got str: 'net'"),
    ([nn.Linear(1, 1), "extra"], TypeError, r"`roots` must be .*, got str: 'extra' at index 1"),
    ({"net": 3}, TypeError, r"`roots\['net'\]` must be a torch\.nn\.Module, got int: 3"),
    ({1: nn.Linear(1, 1)}, TypeError, r"`roots` keys must be str, got int: 1"),
])
def test_monitor_rejects_malformed_roots_naming_the_argument(roots, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        leafwatch.Monitor(roots=roots)
    with pytest.raises(error, match=pattern):
        leafwatch.Monitor().set_roots(roots)


def test_monitor_rejects_the_same_root_twice() -> None:
    net = TinyModel()
    with pytest.raises(ValueError, match=r"`roots` holds the same module twice: \['a', 'b'\]"):
        leafwatch.Monitor(roots={"a": net, "b": net})


@pytest.mark.parametrize(("sinks", "shown"), [(print, "builtin_function_or_method"), ([1], "list: \\[1\\]")])
def test_monitor_rejects_sinks_that_are_not_a_sequence_of_callables(sinks, shown) -> None:
    with pytest.raises(TypeError, match=r"`sinks` must be a sequence of callables taking a CheckEvent, got " + shown):
        leafwatch.Monitor(TinyModel(), sinks=sinks)


def test_add_optimizer_rejects_something_that_is_no_optimizer() -> None:
    monitor = leafwatch.Monitor(TinyModel())
    with pytest.raises(TypeError, match=r"`optimizer` must be a torch\.optim\.Optimizer, got str: 'adam' "
                                        r"\(a wrapper is accepted when it exposes the real optimizer"):
        monitor.add_optimizer("adam")
    monitor.close()

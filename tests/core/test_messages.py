"""The words around findings: said at the right time and place, true, and valid code."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn

import leafwatch
from leafwatch.detectors.constructors import ALL_PARAMETERS


def _code_spans(text: str) -> list[str]:
    """The pieces of code in a fix text (between backticks) that are statements or expressions."""
    return [c for c in re.findall(r"`([^`]+)`", text) if ("=" in c or "(" in c) and not c.endswith("=")]


def _assert_valid_code(text: str) -> None:
    spans = _code_spans(text)
    assert spans, text
    for span in spans:
        assert "..." not in span, text  # a placeholder the user does not have
        compile(span, "<fix>", "exec")  # raises SyntaxError on invalid code


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(2, 2)
        self.spare = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


# -- speaking at the right time and place ----------------------------------------------------
def test_attach_warns_each_new_finding_once_at_the_users_line() -> None:
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt).attach()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            model(torch.ones(1, 2)).sum().backward()
            opt.step(); step_line = __import__("inspect").currentframe().f_lineno  # noqa: E702
            opt.zero_grad()
    monitor.close()
    found = [w for w in caught if issubclass(w.category, leafwatch.LeafwatchWarning)]
    # One mistake (the unused module), one warning listing its tensors.
    assert [str(w.message).split("`")[1] for w in found] == ["spare"]
    assert "`spare` (2 tensors: spare.{bias,weight})" in str(found[0].message)
    for w in found:
        assert w.filename == __file__ and w.lineno == step_line
        text = str(w.message)
        assert "\n" not in text and "ERROR missing_grad" in text and "Fix (advice):" in text


def test_explicit_checks_and_verbose_false_print_nothing() -> None:
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    quiet_attached = leafwatch.Monitor(model, opt, verbose=False).attach()
    explicit = leafwatch.Monitor(model, opt)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(torch.ones(1, 2)).sum().backward()
        report = explicit.check(opt)
        opt.step()
    assert report.names("missing_grad") == {"spare.weight", "spare.bias"}
    assert quiet_attached.report.names("missing_grad") == {"spare.weight", "spare.bias"}
    assert [w for w in caught if issubclass(w.category, leafwatch.LeafwatchWarning)] == []
    quiet_attached.close()
    explicit.close()


def test_verbose_must_be_a_bool_or_none() -> None:
    with pytest.raises(TypeError, match=r"`verbose` must be a bool, got str: 'yes'"):
        leafwatch.Monitor(nn.Linear(2, 1), verbose="yes")


# -- texts that are true and valid code ------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "hint"),
    [
        (lambda: torch.ones(3, requires_grad=True).to(torch.float64), "convert first"),
        (lambda: torch.ones(3, requires_grad=True).clone(), "copy a leaf"),
        (lambda: torch.randn(3, requires_grad=True) * 0.01, "arithmetic first"),
    ],
)
def test_the_watch_warning_and_the_report_give_the_same_valid_fix(make, hint) -> None:
    t = make()
    with pytest.warns(leafwatch.LeafwatchWarning) as caught:
        leafwatch.watch(t, name="temperature")
    try:
        warned = str(caught[0].message)
        (finding,) = leafwatch.audit().by_kind("non_leaf")  # the watched tensor is what it checks
    finally:
        leafwatch.unwatch("temperature")
    assert hint in finding.fix
    assert warned.endswith(f"Fix (code): {finding.fix}") and finding.remedy.applicability == "code"
    _assert_valid_code(finding.fix)
    assert "nn.Parameter" not in finding.fix  # the source was a plain tensor: nothing to register


def test_a_dtype_conversion_gets_a_dtype_fix_and_no_parameter_sentence_without_a_parameter() -> None:
    class Converted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.scale = torch.ones(3, requires_grad=True).double()  # a plain tensor, converted

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x) * self.scale.float()

    model = Converted()
    (finding,) = leafwatch.audit(model).by_kind("orphan_tensor")
    assert finding.name == "scale"
    assert "dtype conversion" in finding.cause
    assert "on an `nn.Parameter`" not in finding.cause
    # the right-hand side the user wrote, grad asked for by the Parameter
    assert "`self.scale = nn.Parameter(torch.ones(3).double())`" in finding.fix and "device" not in finding.fix
    _assert_valid_code(finding.fix)


def test_a_converted_parameter_says_why_it_is_no_longer_one() -> None:
    class Converted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = nn.Parameter(torch.ones(3)).to(torch.float64)

    (finding,) = leafwatch.audit(Converted()).by_kind("orphan_tensor")
    assert "on an `nn.Parameter` returns a plain non-leaf tensor" in finding.cause
    assert "`self.gain = nn.Parameter(torch.ones(3).to(torch.float64))`" in finding.fix  # as the user wrote it


def test_unnamed_tensors_get_a_fix_that_names_no_attribute_that_does_not_exist() -> None:
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    t = torch.ones(1, requires_grad=True).to(torch.float64)
    with pytest.warns(leafwatch.LeafwatchWarning):
        monitor = leafwatch.Monitor(model, opt, tensors=[t])
    (model(torch.ones(1, 2)).sum() + t.sum()).backward()
    (finding,) = monitor.check().by_kind("non_leaf")
    monitor.close()
    assert finding.name == "tensors[0]"
    assert "self.tensors" not in finding.fix and "tensors[0] =" not in finding.fix
    assert "`tensors[0]` is a name leafwatch made up" in finding.fix and "`tensors=`" in finding.fix
    _assert_valid_code(finding.fix)


def test_audit_before_backward_says_once_that_nothing_has_a_gradient() -> None:
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    opt.zero_grad()  # gradients cleared: what a check after zero_grad() sees
    report = leafwatch.audit(model, opt)
    (finding,) = report.by_kind("missing_grad")
    assert finding.name == ALL_PARAMETERS and finding.severity == "error"
    assert set(finding.aliases) == {"used.weight", "used.bias", "spare.weight", "spare.bias"}
    assert "before `loss.backward()` or after `optimizer.zero_grad()`" in finding.cause
    assert "unknown" not in finding.cause
    # The aliases make ignore= patterns on parameter names apply.
    assert not leafwatch.audit(model, opt, ignore=["*"])


def test_audit_with_nothing_to_check_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"audit\(\) has nothing to check: pass `model`, `optimizers` or `tensors`"):
        leafwatch.audit()


@pytest.mark.parametrize(("make", "call"), [(leafwatch.Monitor, "Monitor"), (leafwatch.audit, "audit")])
@pytest.mark.parametrize("with_model", [False, True])
def test_an_optimizer_passed_as_the_model_is_a_one_line_type_error_naming_the_function_called(
        make, call: str, with_model: bool) -> None:
    model = nn.Linear(2, 1)
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises(TypeError) as raised:
        make(opt, model) if with_model else make(opt)
    message = str(raised.value)
    assert "\n" not in message
    assert message == ("`model` must be a torch.nn.Module, got Adam "
                       f"(an optimizer goes second: `{call}(model, optimizer)`)")


def test_ignore_applies_to_the_history_with_its_reason() -> None:
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, ignore={"spare.*": "kept for the next experiment"}) as monitor:
        model(torch.ones(1, 2)).sum().backward()
        report = monitor.check()
        history = monitor.history
    assert not report
    ignored = history[("missing_grad", "spare.weight")]
    assert ignored.status == "ignored" and ignored.details["ignored_because"] == "kept for the next experiment"


def test_audit_with_a_loss_that_has_no_graph_says_so() -> None:
    """A `loss=` that does not require grad (a constant, or computed under no_grad) reaches no
    parameter: the cause names that loss, not the diagnostic hooks or `diagnose=`."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    (finding,) = leafwatch.audit(model, opt, loss=torch.tensor(1.0))
    assert (finding.kind, finding.name, finding.reason.name) == ("missing_grad", "{bias,weight}", "loss_without_graph")
    assert finding.details["location"] == "from the loss given"  # one mistake, said where, never as a name
    assert finding.names == ("bias", "weight")
    assert "`loss=` has no autograd graph" in finding.cause
    assert "diagnose" not in finding.cause and "pass `loss=`" not in finding.cause
    assert finding.fix == "pass the loss that `backward()` is called on, computed with gradients on (its `grad_fn` is not None)"

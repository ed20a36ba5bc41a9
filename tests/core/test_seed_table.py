"""The seed table: leafwatch agrees with PyTorch's own ``is_leaf`` and ``.grad`` on eleven tensors.

Each tensor is ``torch.tensor([1.0], requires_grad=R)`` followed by one or two ops. On CPU the
``.cuda()`` column is stood in for by a differentiable dtype copy (``.to(torch.float64)``), which
makes the same ``ToCopyBackward0`` node; ``tests/core/test_cuda.py`` runs the real ``.cuda()``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable

import pytest
import torch

import leafwatch
from leafwatch import LeafwatchInternalWarning, LeafwatchWarning


def _copy(t: torch.Tensor) -> torch.Tensor:
    """The CPU stand-in for ``.cuda()``: a differentiable copy to another dtype."""
    return t.to(torch.float64)


# name, requires_grad, the ops after creation, PyTorch's is_leaf, whether .grad gets filled.
SEED_TABLE: list[tuple[str, bool, Callable[[torch.Tensor], torch.Tensor], bool, bool]] = [
    ("a", False, lambda t: t, True, False),
    ("b", True, lambda t: t, True, True),
    ("c", False, lambda t: t.clone(), True, False),
    ("d", False, lambda t: t.detach(), True, False),
    ("e", False, _copy, True, False),
    ("f", True, lambda t: t.clone(), False, False),
    ("g", True, lambda t: t.detach(), True, False),
    ("h", True, _copy, False, False),
    ("i", True, lambda t: t.clone().detach(), True, False),
    ("j", True, lambda t: t.detach().clone(), True, False),
    ("k", True, lambda t: _copy(t).detach(), True, False),
]


def _make(requires_grad: bool, ops: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    return ops(torch.tensor([1.0], requires_grad=requires_grad))


def _backward(t: torch.Tensor) -> None:
    if t.requires_grad:
        (t * 2).sum().backward()


def _grad_of(t: torch.Tensor) -> torch.Tensor | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch warns when .grad of a non-leaf is read
        return t.grad


@pytest.mark.parametrize(("name", "requires_grad", "ops", "is_leaf", "gets_grad"), SEED_TABLE)
def test_torch_itself_agrees_with_the_table(name, requires_grad, ops, is_leaf, gets_grad):
    t = _make(requires_grad, ops)
    _backward(t)
    assert t.is_leaf is is_leaf
    assert (_grad_of(t) is not None) is gets_grad


@pytest.mark.parametrize(("name", "requires_grad", "ops", "is_leaf", "gets_grad"), SEED_TABLE)
def test_audit_tensors_agrees_with_torch(name, requires_grad, ops, is_leaf, gets_grad):
    t = _make(requires_grad, ops)
    _backward(t)
    report = leafwatch.audit(tensors={name: t})
    kinds = {f.kind for f in report.findings if f.name == name}
    assert ("non_leaf" in kinds) is (not t.is_leaf)
    assert bool(kinds) is (_grad_of(t) is None)
    assert len(report.findings) == len(kinds), "one finding per tensor"
    if t.is_leaf and not gets_grad:
        (finding,) = report.findings
        assert finding.kind == "missing_grad"
        assert finding.reason.name == "requires_grad_false"
        assert "requires_grad" in finding.cause
        # The call is on the variable that holds the tensor (`t`), found by identity, not on its name.
        assert "call `t.requires_grad_()`" in finding.fix and finding.remedy.applicability == "code"


@pytest.mark.parametrize(("name", "requires_grad", "ops", "is_leaf", "gets_grad"), SEED_TABLE)
def test_watch_agrees_with_torch(name, requires_grad, ops, is_leaf, gets_grad):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = leafwatch.watch(_make(requires_grad, ops), name=name)
    assert not [str(w.message) for w in caught if issubclass(w.category, LeafwatchInternalWarning)]
    warned = [w for w in caught if issubclass(w.category, LeafwatchWarning)]
    assert bool(warned) is (not is_leaf)
    _backward(t)
    report = leafwatch.audit()
    kinds = {f.kind for f in report.findings if f.name == name}
    assert ("non_leaf" in kinds) is (not t.is_leaf)
    assert bool(kinds) is (_grad_of(t) is None)
    assert len(report.findings) == len(kinds)


@pytest.mark.parametrize(("name", "requires_grad", "ops", "is_leaf", "gets_grad"), SEED_TABLE)
def test_watch_and_audit_tensors_together_report_each_tensor_once(name, requires_grad, ops, is_leaf, gets_grad):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeafwatchWarning)
        warnings.simplefilter("error", LeafwatchInternalWarning)  # its own failures still fail
        t = leafwatch.watch(_make(requires_grad, ops), name=name)
    _backward(t)
    report = leafwatch.audit(tensors={name: t})
    keys = [f.key for f in report.findings]
    assert len(keys) == len(set(keys))
    assert bool(keys) is (_grad_of(t) is None)


def test_clone_is_explained_as_clone():
    f = torch.tensor([1.0], requires_grad=True).clone()
    (finding,) = leafwatch.audit(tensors={"f": f}).findings
    assert (finding.kind, finding.name, finding.severity) == ("non_leaf", "f", "error")
    assert finding.details["op"] == "CloneBackward0"
    assert "clone" in finding.cause
    assert "detach().clone().requires_grad_()" in finding.fix


def test_copy_is_explained_as_a_dtype_conversion_naming_the_temporary_leaf():
    h = _copy(torch.tensor([1.0], requires_grad=True))
    (finding,) = leafwatch.audit(tensors={"h": h}).findings
    assert (finding.kind, finding.name) == ("non_leaf", "h")
    assert finding.details["op"] == "ToCopyBackward0"
    assert "dtype conversion" in finding.cause
    assert "unnamed temporary leaf" in finding.cause
    assert "shape (1,), float32, cpu" in finding.cause
    assert finding.dtype == "float64"


def test_watch_warning_explains_the_clone_at_the_callers_line():
    with pytest.warns(LeafwatchWarning, match=r"`f` is not a leaf.*clone.*CloneBackward0") as record:
        line = inspect.currentframe().f_lineno + 1
        leafwatch.watch(torch.tensor([1.0], requires_grad=True).clone(), name="f")
    assert (record[0].filename, record[0].lineno) == (__file__, line)


def test_watch_warning_explains_the_copy_and_names_the_temporary_leaf():
    with pytest.warns(LeafwatchWarning, match=r"`h` is not a leaf.*ToCopyBackward0.*unnamed temporary leaf.*\(shape \(1,\), float32, cpu\)") as record:
        line = inspect.currentframe().f_lineno + 1
        leafwatch.watch(_copy(torch.tensor([1.0], requires_grad=True)), name="h")
    assert (record[0].filename, record[0].lineno) == (__file__, line)


@pytest.mark.parametrize(("name", "ops"), [("g", lambda t: t.detach()), ("i", lambda t: t.clone().detach()),
                                           ("k", lambda t: _copy(t).detach())])
def test_detached_leaf_cause_mentions_detach(name, ops):
    t = ops(torch.tensor([1.0], requires_grad=True))
    (finding,) = leafwatch.audit(tensors={name: t}).findings
    assert (finding.kind, finding.name) == ("missing_grad", name)
    assert ".detach()" in finding.cause


def test_device_copy_is_explained_as_a_device_copy():
    # The meta device stands in for CUDA here: the same ToCopyBackward0 across devices.
    h = torch.tensor([1.0], requires_grad=True).to("meta")
    (finding,) = leafwatch.audit(tensors={"h": h}).findings
    assert (finding.kind, finding.name, finding.device) == ("non_leaf", "h", "meta")
    assert "device copy" in finding.cause
    assert "unnamed temporary leaf that nothing in your code holds (shape (1,), float32, cpu)" in finding.cause
    assert "device='meta'" in finding.fix

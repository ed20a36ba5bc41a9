"""``module.requires_grad = True``, the classic wrong unfreeze (#52 item 6): a plain attribute of the module that
PyTorch ignores, so its parameters keep ``requires_grad=False``. The fine-tuning pattern of the PyTorch forums and
of torchvision's transfer-learning tutorial, written the wrong way: every parameter frozen, then the new head
"unfrozen" with the attribute. An error for each parameter of that module, one mistake, named at the assignment's
line, fixed by ``module.requires_grad_(True)``; nothing where the module's parameters require grad already."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import leafwatch


class Classifier(nn.Module):
    """A pretrained backbone and a new head, as a fine-tuning script builds them."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        self.fc = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def _steps(model: nn.Module, opt: torch.optim.Optimizer, monitor: leafwatch.Monitor, steps: int = 3) -> leafwatch.Report:
    x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        report = monitor.check(opt)
        opt.step()
    return report


def _line(marker: str) -> int:
    lines, first = inspect.getsourcelines(inspect.currentframe().f_back.f_code)  # type: ignore[union-attr]
    return first + next(i for i, line in enumerate(lines) if marker in line)


def test_a_module_unfrozen_by_a_plain_attribute_is_one_error_named_at_its_line_with_the_method_as_its_fix() -> None:
    model = Classifier()
    for param in model.features.parameters():  # the pretrained backbone frozen,
        param.requires_grad = False
    model.features[2].requires_grad = True  # its last layer fine-tuned: the wrong unfreeze
    line = _line("# its last layer fine-tuned")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        report = _steps(model, opt, monitor)
    (f,) = report.by_kind("missing_grad")
    assert (f.kind, f.name, f.severity, f.reason.name) == ("missing_grad", "features.2", "error", "plain_requires_grad")
    assert f.names == ("features.2.bias", "features.2.weight") and f.status == "open"  # one mistake, its two tensors
    assert f.message == (
        "each of `features.2.{bias,weight}` does not require grad, so they do not train: `model.features[2]."
        f"requires_grad = True` at test_plain_requires_grad.py:{line} sets a plain attribute of `model.features[2]`, "
        "which PyTorch ignores.")
    assert f.cause == ("`requires_grad` is autograd's flag on each tensor; on an `nn.Module` it is a plain attribute, "
                       "so the parameters of `model.features[2]` keep `requires_grad=False`: no gradient reaches them "
                       "and no optimizer step changes them.")
    assert f.fix == "unfreeze its parameters with the module's method: `model.features[2].requires_grad_(True)`"
    assert f.remedy.applicability == "code" and f.remedy.code == "model.features[2].requires_grad_(True)"
    assert (f.remedy.edit.start, f.remedy.edit.end, f.remedy.edit.action) == (line, line, "replace")
    assert f.remedy.edit.text == "    model.features[2].requires_grad_(True)\n"
    assert all(p.grad is None for p in model.features[2].parameters())  # true: it never trained


def _after_backward(model: nn.Module) -> None:
    nn.functional.cross_entropy(model(torch.randn(8, 8)), torch.randint(0, 3, (8,))).backward()


def test_audit_after_backward_says_it_too() -> None:
    model = Classifier()
    model.features.requires_grad_(False)  # a pretrained backbone, to be fine-tuned too:
    model.features.requires_grad = True  # the wrong unfreeze
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _after_backward(model)
    found = [f for f in leafwatch.audit(model, opt) if f.kind == "missing_grad"]
    assert [(f.name, f.names, f.reason.name, f.severity) for f in found] == [
        ("features", ("features.0.bias", "features.0.weight", "features.2.bias", "features.2.weight"),
         "plain_requires_grad", "error")]
    assert found[0].fix == "unfreeze its parameters with the module's method: `model.features.requires_grad_(True)`"


def test_an_optimizer_built_from_the_trainable_parameters_only_gets_the_method_before_it_is_built() -> None:
    model = Classifier()
    model.features.requires_grad_(False)
    model.features[2].requires_grad = True
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    _after_backward(model)
    (f,) = [f for f in leafwatch.audit(model, opt) if f.kind == "missing_grad"]
    assert (f.name, f.names, f.reason.name) == ("features.2", ("features.2.bias", "features.2.weight"),
                                                 "plain_requires_grad")
    assert f.fix == ("unfreeze its parameters with the module's method, before the optimizer is built: "
                     "`model.features[2].requires_grad_(True)` (or build the optimizer again after it)")
    assert f.remedy.applicability == "words"  # where it goes depends on where the optimizer is built


@pytest.mark.parametrize("how", ["already trainable", "unfrozen by the method too", "the method, as the fix says"])
def test_no_finding_when_the_modules_parameters_require_grad_already(how: str) -> None:
    model = Classifier()
    if how != "already trainable":
        model.features.requires_grad_(False)  # the backbone stays frozen, on purpose
        model.fc.requires_grad_(True)
    if how != "the method, as the fix says":
        model.fc.requires_grad = True  # harmless: its parameters require grad
    if how == "already trainable":
        model.requires_grad = True
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    before = model.fc.weight.detach().clone()
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        report = _steps(model, opt, monitor)
    assert list(report) == []  # no finding at all: nothing is wrong
    assert not torch.equal(before, model.fc.weight)  # the head trains
    _after_backward(model)
    assert list(leafwatch.audit(model, opt)) == []

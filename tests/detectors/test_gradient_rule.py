"""The gradient rule, one for every front-end: a trainable tensor that no optimizer that steps
holds is ``not_in_optimizer`` only when it gets gradients and its value does not change between
checks. No gradient (an EMA copy, a teacher): no finding. A gradient and a value that changes
(manual SGD, an inner loop, a trained perturbation): updated by hand, no finding. The check that
first sees the gradient holds the finding; the next one decides it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import _warm
import pytest
import torch
from torch import nn

import leafwatch

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
STEPS = 5


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))  # in no optimizer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale


def _loop(where: str, by_hand: bool) -> tuple[list[leafwatch.Report], leafwatch.Report, Monitor]:
    """STEPS training steps; the one tensor outside the optimizer is the model's `scale`, a free
    tensor `w` seen as a leaf of the loss, or a free tensor `w` the Monitor watches."""
    torch.manual_seed(0)
    model = Scaled()
    w = torch.randn(4, requires_grad=True)
    # (in a dict, so that the only variable naming `w` is `w`: the finding is named after it)
    outside = {"t": model.scale if where == "module" else w}
    opt = torch.optim.SGD([p for p in model.parameters() if p is not outside["t"]], lr=0.1)
    monitor = leafwatch.Monitor(model, opt, tensors={"w": w} if where == "watched" else None, verbose=False)
    reports = []
    for _ in range(STEPS):
        opt.zero_grad()
        outside["t"].grad = None
        loss = (model(torch.randn(8, 4)) * w).pow(2).mean()
        loss.backward()
        reports.append(monitor.check(loss=loss if where == "loss_leaf" else None))
        opt.step()
        if by_hand:
            with torch.no_grad():
                outside["t"] -= 0.01 * outside["t"].grad
    return reports, monitor.close(), monitor


Monitor = leafwatch.Monitor


@pytest.mark.parametrize("where", ["module", "loss_leaf", "watched"])
def test_manual_sgd_on_a_tensor_outside_the_optimizer_is_no_finding(where: str) -> None:
    reports, final, monitor = _loop(where, by_hand=True)
    assert [r.findings for r in reports] == [[]] * STEPS
    assert final.findings == []
    assert not any(f.kind == "not_in_optimizer" for f in monitor.history.values()), "not even pending"


@pytest.mark.parametrize(("where", "name"), [("module", "scale"), ("loss_leaf", "w"), ("watched", "w")])
def test_a_tensor_outside_the_optimizer_whose_gradient_is_never_applied_is_an_error_once_seen_unchanged(
        where: str, name: str) -> None:
    reports, final, _ = _loop(where, by_hand=False)
    # The first check that sees the gradient holds it: the value evidence comes at the next one. A
    # leaf of the loss is first seen to persist (the same tensor twice), then to keep its value.
    decided = 2 if where == "loss_leaf" else 1
    assert [r.findings for r in reports[:decided]] == [[]] * decided
    for report in (reports[decided], reports[-1], final):
        (finding,) = report.findings
        assert (finding.kind, finding.name, finding.severity, finding.status) == (
            "not_in_optimizer", name, "error", "open")
    assert "never changes" in final.findings[0].message


def test_a_tensor_outside_the_optimizer_that_gets_no_gradient_is_no_finding() -> None:
    """An EMA copy kept as a submodule: trainable, in no optimizer, run under no_grad."""

    class WithEma(Scaled):
        def __init__(self) -> None:
            super().__init__()
            self.ema = nn.Linear(4, 4)

    model = WithEma()
    opt = torch.optim.SGD([*model.body.parameters(), model.scale], lr=0.1)
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            with torch.no_grad():
                model.ema(torch.randn(2, 4))
            assert monitor.check().findings == []
    assert monitor.report.findings == []


def test_audit_sees_one_step_and_decides_at_once() -> None:
    model = Scaled()
    opt = torch.optim.SGD(model.body.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    (finding,) = leafwatch.audit(model, opt).findings
    assert (finding.kind, finding.name, finding.severity) == ("not_in_optimizer", "scale", "error")


def test_run_names_nothing_for_tensors_updated_by_hand() -> None:
    result = _warm.run([sys.executable, "-m", "leafwatch.cli", "run", "--strict",
                             str(SCRIPTS / "updated_by_hand_tensors.py")],
                       capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout
    assert "leafwatch: no findings at step 5" in result.stderr, result.stderr


def test_a_whole_root_module_outside_every_optimizer_is_a_warning_naming_both_fixes() -> None:
    """A separate network that gets gradients and never changes: a forgotten optimizer, or a fixed
    network that should not require grad. A part of a trained root left out is an error."""
    net, critic = nn.Linear(2, 1), nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with leafwatch.Monitor(roots={"net": net, "critic": critic}, optimizers=opt, verbose=False) as monitor:
        for _ in range(2):
            (net(torch.ones(1, 2)).sum() + critic(torch.ones(1, 2)).sum()).backward()
            report = monitor.check()
    assert {(f.kind, f.name, f.severity) for f in report.tensors()} == {
        ("not_in_optimizer", "critic.weight", "warning"), ("not_in_optimizer", "critic.bias", "warning")}
    assert [(f.name, f.severity) for f in report] == [("critic", "warning")]  # one network: one mistake
    finding = report.by_kind("not_in_optimizer")[0]
    assert "nor any tensor of `critic`" in finding.message
    # Both fixes, in the user's names: the optimizer it was forgotten from, or freezing it.
    add = 'opt.add_param_group({"params": critic.parameters()})'
    assert f"`{add}`" in finding.fix and "`critic.requires_grad_(False)`" in finding.fix
    assert finding.remedy.applicability == "code"
    exec(add, {"opt": opt, "critic": critic})  # pasted: the critic trains from the next step on
    with leafwatch.Monitor(roots={"net": net, "critic": critic}, optimizers=opt, verbose=False) as monitor:
        for _ in range(2):
            opt.zero_grad()
            (net(torch.ones(1, 2)).sum() + critic(torch.ones(1, 2)).sum()).backward()
            assert monitor.check().findings == []
            opt.step()

"""A gradient exactly zero because it flows only through ops whose gradient is zero (round, floor,
ceil, trunc, sign): named with the op and the user's line; a straight-through estimator is no finding."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import leafwatch


class Quantized(nn.Module):
    """A layer whose output is rounded to quarters (``ste``: with a straight-through estimator)."""

    def __init__(self, ste: bool = False, op=torch.round) -> None:
        super().__init__()
        self.ste, self.op = ste, op
        self.body = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x) * self.scale
        q = self.op(h * 4) / 4  # the op of zero gradient
        if self.ste:
            q = h + (q - h).detach()
        return q.sum(dim=1)


def _train(model: nn.Module, steps: int = 4) -> leafwatch.Report:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, check_values_every_n_steps=1) as monitor:
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            report = monitor.check(opt)
    return report


def _line_of(text: str) -> int:
    lines, first = inspect.getsourcelines(Quantized.forward)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize(("op", "shown"), [(torch.round, "`torch.round()`"), (torch.floor, "`torch.floor()`"),
                                           (torch.sign, "`torch.sign()`"), (torch.Tensor.ceil, "`.ceil()`")])
def test_a_gradient_that_flows_only_through_an_op_of_zero_gradient_is_named_with_the_op_and_its_line(op, shown) -> None:
    report = _train(Quantized(op=op))
    line = _line_of("the op of zero gradient")
    (f,) = report.findings
    assert (f.kind, f.reason.name, f.severity) == ("dead_grad", "zero_gradient_op", "warning")
    assert f.names == ("body.bias", "body.weight", "scale")  # one mistake: the op
    # Named by its tensors (only the model holds them all), the op said as where it is (#52 item 5).
    assert (f.name, f.details["location"]) == ("body.{bias,weight}, scale", f"through {shown} at test_zero_gradient_ops.py:{line}")
    assert f"passes through {shown} at test_zero_gradient_ops.py:{line} (in `Quantized.forward`)" in f.cause
    assert "`x + (q - x).detach()`" in f.fix and f.remedy.applicability == "words"


def test_a_straight_through_estimator_is_no_finding() -> None:
    assert _train(Quantized(ste=True)).findings == []


def test_a_gradient_zeroed_by_a_gate_keeps_the_generic_cause() -> None:
    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 1)
            self.register_buffer("gate", torch.zeros(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.round(x) + self.body(x) * self.gate)  # a round of the input: no parameter behind it

    (f,) = _train(Gated()).findings
    assert (f.kind, f.name, f.reason.name) == ("dead_grad", "body", "zero_streak")
    assert "multiplied by zero" in f.cause


def test_argmax_and_long_leave_no_graph_and_are_cuts_of_a_missing_gradient_not_zero_gradients() -> None:
    class Indexed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scores, self.table = nn.Linear(4, 3), nn.Parameter(torch.randn(3, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.table[self.scores(x).argmax(dim=1)].sum(dim=1)

    report = _train(Indexed())
    assert report.names("missing_grad") == {"scores.weight", "scores.bias"}
    assert not report.by_kind("dead_grad")

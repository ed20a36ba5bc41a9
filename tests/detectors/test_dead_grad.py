"""dead_grad: a gradient that exists but is exactly zero at several value checks in a row."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import leafwatch
from leafwatch.detectors.dead import DEAD_AFTER


class ZeroGrad(torch.autograd.Function):
    """A custom op whose backward returns zeros."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad)


class Gated(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.body = nn.Linear(4, 4)
        self.side = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side = self.side(x)
        side = side * 0.0 if self.how == "times_zero" else ZeroGrad.apply(side)
        return self.body(x) + side


def _train(model: nn.Module, steps: int, every: int = 1, loss_of=None) -> leafwatch.Report:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with leafwatch.Monitor(model, opt, check_values_every_n_steps=every) as monitor:
        for _ in range(steps):
            opt.zero_grad()
            x = torch.randn(8, 4)
            (loss_of(model, x) if loss_of else model(x).pow(2).mean()).backward()
            monitor.check()
            opt.step()
        return monitor.close()


@pytest.mark.parametrize("how", ["times_zero", "custom_function"])
def test_a_gradient_that_is_always_zero_is_dead_grad(how: str) -> None:
    report = _train(Gated(how), steps=DEAD_AFTER + 1)
    assert report.names() == {"side.weight", "side.bias"}
    for f in report:
        assert (f.kind, f.severity, f.status) == ("dead_grad", "warning", "open")
        assert "exactly zero" in f.message
        assert "multiplied by zero" in f.cause and "autograd.Function" in f.cause
        assert "requires_grad_(False)" in f.fix


def test_a_zero_gradient_at_fewer_checks_than_needed_is_no_finding() -> None:
    assert _train(Gated("times_zero"), steps=DEAD_AFTER - 1).findings == []


def test_dead_grad_with_the_default_cadence_rides_on_the_value_checks() -> None:
    report = _train(Gated("times_zero"), steps=41, every=20)  # value checks at 1, 20, 40
    assert report.names("dead_grad") == {"side.weight", "side.bias"}


class LoRA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(4, 4)
        self.base.requires_grad_(False)
        self.A = nn.Parameter(torch.randn(2, 4) * 0.1)
        self.B = nn.Parameter(torch.zeros(4, 2))  # zero-initialised: A's gradient is zero at step 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.A.t() @ self.B.t()


class ReZero(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(4, 4)
        self.alpha = nn.Parameter(torch.zeros(1))  # the residual gate starts at 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.alpha * self.f(x)


class AdaLNZero(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.modulation = nn.Linear(4, 4)
        nn.init.zeros_(self.modulation.weight)  # adaLN-zero: the gate is zero at the start
        nn.init.zeros_(self.modulation.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.modulation(x) * self.block(x)


class Experts(nn.Module):
    """A dense-gated mixture: each batch routes to a random expert, the others get zeros."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = torch.randint(0, 4, (x.shape[0],))
        gates = nn.functional.one_hot(chosen, 4).float()
        return sum(gates[:, i:i + 1] * e(x) for i, e in enumerate(self.experts))


class PaddedEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4, padding_idx=0)
        self.sparse = nn.Embedding(10, 4, sparse=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = torch.randint(0, 10, (8,))
        return self.emb(ids) + self.sparse(ids) + x


@pytest.mark.parametrize("model_cls", [LoRA, ReZero, AdaLNZero, Experts, PaddedEmbedding])
def test_zero_initialised_gates_routing_and_padding_are_no_dead_grad(model_cls) -> None:
    model = model_cls()
    report = _train(model, steps=3 * DEAD_AFTER)
    assert report.findings == []


def test_dead_grad_resolves_when_the_gradient_comes_back() -> None:
    model = Gated("times_zero")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, check_values_every_n_steps=1) as monitor:
        for step in range(DEAD_AFTER + 2):
            if step == DEAD_AFTER + 1:
                model.forward = lambda x: model.body(x) + model.side(x)
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            report = monitor.check()
            opt.step()
    assert [f for f in report if f.status == "open"] == []
    assert monitor.history[("dead_grad", "side.weight")].status == "resolved"

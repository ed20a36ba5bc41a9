"""Buffers and optimizers: a buffer handed to an optimizer is harmless information named by its
buffer name; a buffer registered with ``requires_grad=True`` (meant as a parameter) that gets
gradients and is in no optimizer is an error whose fix registers it as a parameter."""

from __future__ import annotations

import torch
from torch import nn

import leafwatch


class Actor(nn.Module):
    """As torchrl's TD3 actor: a policy and its action bounds, kept as buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 2)
        self.register_buffer("action_low", -torch.ones(2))
        self.register_buffer("action_high", torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(self.net(x), self.action_high), self.action_low)


class Agent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.actor = Actor()


def _train(model: nn.Module, opt: torch.optim.Optimizer, loss_of, steps: int = 3) -> leafwatch.Report:
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        for _ in range(steps):
            opt.zero_grad()
            loss_of(torch.randn(4, 3)).backward()
            monitor.check()
            opt.step()
        return monitor.close()


def test_buffers_handed_to_the_optimizer_with_the_parameters_are_information_named_by_the_buffer() -> None:
    agent = Agent()
    # torchrl builds Adam from the TensorDict of the actor's weights, buffers included; in plain
    # torch the same list is the values of the state dict.
    opt = torch.optim.Adam(list(agent.state_dict(keep_vars=True).values()), lr=1e-3)
    report = _train(agent, opt, lambda x: agent.actor(x).pow(2).sum())
    assert not report.at_least("warning")
    (f,) = report.findings
    assert (f.kind, f.name, f.severity) == ("frozen_in_optimizer", "opt", "info")  # named by what holds them
    assert report.names("frozen_in_optimizer") == {"actor.action_low", "actor.action_high"}
    for member in f.members:
        assert member.reason.name == "buffer"
        assert "is a registered buffer, handed to the optimizer with the parameters" in member.cause
        assert "requires_grad" not in member.fix  # the bounds must not become trainable


class Alpha(nn.Module):
    """A temperature meant as a parameter, registered as a buffer that requires grad."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)
        self.register_buffer("log_temperature", torch.zeros(1, requires_grad=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.log_temperature.exp()


def test_a_buffer_that_requires_grad_in_no_optimizer_is_an_error_whose_fix_registers_it_as_a_parameter() -> None:
    model = Alpha()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # parameters() lists no buffer
    report = _train(model, opt, lambda x: model(x).sum())
    (f,) = report.open
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "log_temperature", "error")
    assert (f.reason.name, f.remedy.applicability) == ("buffer_requires_grad", "code")
    snippet = 'self.register_parameter("log_temperature", nn.Parameter(torch.zeros(1)))'
    line = Alpha.__init__.__code__.co_firstlineno + 3
    assert f.remedy.code == snippet and f.fix.endswith(f"holds it: `{snippet}`")
    assert (f.remedy.edit.start, f.remedy.edit.end, f.remedy.edit.action) == (line, line, "replace")
    assert f.remedy.edit.text == f"        {snippet}\n"
    assert "is a buffer registered with `requires_grad=True`" in f.cause
    assert f.fix.startswith("make `log_temperature` a parameter where the module registers it: pass the same "
                            "tensor, wrapped in `nn.Parameter`, to `self.register_parameter` in place of "
                            "`self.register_buffer`")
    assert "..." not in f.fix
    assert model.log_temperature.grad is not None  # checked from the tensor: it gets gradients


def test_plain_buffers_outside_the_optimizer_are_no_finding() -> None:
    """Running statistics and masks: buffers that do not require grad are never judged."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert _train(model, opt, lambda x: model(x).sum()).findings == []


class LossStart(nn.Module):
    """vector-quantize-pytorch's loss accumulator written in the user's own file: a registered buffer the
    forward switches on and starts the auxiliary loss from (``loss = self.zero; loss.requires_grad_()``),
    then adds a term to (``as_scale``: multiplies a term by it instead, a scale meant to train)."""

    def __init__(self, as_scale: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.register_buffer("zero", torch.tensor(0.0), persistent=False)
        self.as_scale = as_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        loss = self.zero
        loss.requires_grad_()  # switched on here
        commit = (h - x.detach()).pow(2).mean()
        loss = loss * commit if self.as_scale else loss + commit * 0.25
        return h.sum() + 10 * loss


def test_a_buffer_the_users_forward_switches_on_and_only_adds_to_the_loss_is_no_finding() -> None:
    """Its gradient is the loss's own (here 10, at every step): it has nothing to learn, and no advice to train it."""
    model = LossStart()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    report = _train(model, opt, model, steps=4)
    assert report.findings == []
    assert model.zero.requires_grad and model.zero.grad is not None  # it got the loss's own gradient


def test_a_buffer_the_users_forward_switches_on_and_uses_as_a_scale_stays_an_error() -> None:
    model = LossStart(as_scale=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    (f,) = _train(model, opt, model, steps=4).findings
    assert (f.kind, f.name, f.severity, f.reason.name) == ("not_in_optimizer", "zero", "error", "buffer_switched_on")
    line = LossStart.forward.__code__.co_firstlineno + 3
    assert f.cause.startswith(f"`zero` is a registered buffer that your forward switches to `requires_grad` "
                              f"(`requires_grad_()` at test_buffers.py:{line} (in `LossStart.forward`))")
    assert f.fix.startswith("make `zero` a parameter where the module registers it")

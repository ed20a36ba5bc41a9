"""``leafwatch.assert_trains``: the user's training step, run a few times, judged at the end."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import leafwatch
from leafwatch import LeafwatchAssertionError, LeafwatchError


@pytest.fixture(autouse=True)
def _free_optimizers():
    # A failure kept by pytest.raises holds the test's frame (and its optimizer) in a reference
    # cycle; leafwatch knows every optimizer a Monitor was given while it lives, so free them here.
    yield
    gc.collect()


class Net(nn.Module):
    def __init__(self, use_aux: bool = False) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)
        self.aux_head = nn.Linear(8, 1)
        self.use_aux = use_aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.encoder(x))
        out = self.head(h)
        return out + self.aux_head(h) if self.use_aux else out


def training_step(model: nn.Module, opt: torch.optim.Optimizer):
    x, y = torch.randn(16, 4), torch.randn(16, 1)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    return step


def test_an_unused_layer_fails_naming_it_with_the_cause_and_the_fix():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(LeafwatchAssertionError) as failed:
        leafwatch.assert_trains(model, opt, training_step(model, opt))
    message = str(failed.value)
    assert message.startswith("leafwatch.assert_trains: 1 error finding(s) open after 2 calls of step(): "
                              "missing_grad `aux_head` (2 tensors: aux_head.{bias,weight})")
    assert "cause: module `aux_head` never ran in this step's forward" in message
    assert "fix (advice): call `aux_head` in forward()" in message
    report = failed.value.report
    assert report.names("missing_grad") == {"aux_head.weight", "aux_head.bias"}
    assert len(report.findings) == 1  # one mistake, its two tensors listed


def test_the_failure_is_both_an_assertion_error_and_a_leafwatch_error():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(AssertionError):
        leafwatch.assert_trains(model, opt, training_step(model, opt))
    with pytest.raises(LeafwatchError):
        leafwatch.assert_trains(model, opt, training_step(model, opt))


def test_a_clean_model_passes_and_returns_an_empty_report():
    model = Net(use_aux=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    report = leafwatch.assert_trains(model, opt, training_step(model, opt), steps=3)
    assert report.findings == []
    assert report.step == 3


def test_a_parameter_left_out_of_the_optimizer_fails_at_a_single_step():
    model = Net(use_aux=True)
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if not n.startswith("aux_head")], lr=0.1)
    with pytest.raises(LeafwatchAssertionError, match=r"not_in_optimizer `aux_head` \(2 tensors: aux_head.\{bias,weight\}\)"):
        leafwatch.assert_trains(model, opt, training_step(model, opt), steps=1)


def test_a_layer_skipped_at_one_step_but_trained_at_the_other_is_judged_from_the_whole_run():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []

    def step() -> None:
        model.use_aux = bool(calls)  # the aux head joins at the second step
        calls.append(1)
        training_step(model, opt)()

    report = leafwatch.assert_trains(model, opt, step, steps=2)
    assert {(f.kind, f.name, f.status, f.severity) for f in report.tensors()} == {
        ("missing_grad", "aux_head.weight", "intermittent", "info"),
        ("missing_grad", "aux_head.bias", "intermittent", "info"),
    }
    assert [(f.name, f.status) for f in report] == [("aux_head", "intermittent")]
    assert report.open == []


def test_ignore_lets_a_deliberately_unused_layer_pass():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    report = leafwatch.assert_trains(model, opt, training_step(model, opt), ignore={"aux_head.*": "trained later"})
    assert {(f.name, f.status) for f in report.tensors()} == {("aux_head.weight", "ignored"), ("aux_head.bias", "ignored")}
    assert [(f.name, f.status) for f in report] == [("aux_head", "ignored")]


def test_an_optimizer_that_never_steps_fails_naming_it():
    model = Net(use_aux=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def forgets_the_step() -> None:
        opt.zero_grad()
        model(torch.randn(4, 4)).sum().backward()

    with pytest.raises(LeafwatchAssertionError, match=r"optimizer 0 \(SGD, 6 tensors\) never stepped in 2 calls of step\(\)"):
        leafwatch.assert_trains(model, opt, forgets_the_step)


def test_two_optimizers_of_a_gan_are_both_checked():
    generator, critic = nn.Linear(2, 2), nn.Linear(2, 1)
    model = nn.ModuleDict({"generator": generator, "critic": critic})
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)

    def step() -> None:
        z = torch.randn(8, 2)
        opt_c.zero_grad()
        critic(generator(z).detach()).mean().backward()
        opt_c.step()
        opt_g.zero_grad()
        (-critic(generator(z)).mean()).backward()
        opt_g.step()

    assert leafwatch.assert_trains(model, [opt_g, opt_c], step).findings == []


def test_an_optimizer_stepped_with_a_closure_is_checked_after_the_closure_ran():
    model = Net(use_aux=True)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=2)
    x, y = torch.randn(16, 4), torch.randn(16, 1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    assert leafwatch.assert_trains(model, opt, lambda: opt.step(closure)).findings == []
    model.use_aux = False
    with pytest.raises(LeafwatchAssertionError, match=r"missing_grad `aux_head` \(2 tensors"):
        leafwatch.assert_trains(model, opt, lambda: opt.step(closure))


def test_an_error_raised_by_the_step_propagates_and_the_hooks_are_removed():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def broken() -> None:
        raise RuntimeError("the user's own bug")

    with pytest.raises(RuntimeError, match="the user's own bug"):
        leafwatch.assert_trains(model, opt, broken)
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize(("kwargs", "error", "pattern"), [
    ({"model": "net"}, TypeError, r"`model` must be a torch.nn.Module, got str: 'net'"),
    ({"optimizer": None}, TypeError, r"`optimizer` must be a torch.optim.Optimizer or a sequence of them, got NoneType"),
    ({"optimizer": []}, ValueError, r"`optimizer` must name at least one optimizer, got an empty sequence"),
    ({"optimizer": ["adam"]}, TypeError, r"`optimizer\[0\]` must be a torch.optim.Optimizer, got str: 'adam'"),
    ({"step": 3}, TypeError, r"`step` must be a callable that runs one training step, got int: 3"),
    ({"steps": 0}, ValueError, r"`steps` must be >= 1, got 0"),
    ({"steps": 2.0}, TypeError, r"`steps` must be an int, got float: 2.0"),
    ({"steps": True}, TypeError, r"`steps` must be an int, got bool: True"),
    ({"patience": 0}, ValueError, r"`patience` must be >= 1, got 0"),
    ({"ignore": "aux_head.*"}, TypeError, r"`ignore` must be a mapping pattern -> reason or a sequence of patterns, got a str"),
])
def test_bad_arguments_are_named(kwargs, error, pattern):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    arguments = {"model": model, "optimizer": opt, "step": training_step(model, opt), **kwargs}
    with pytest.raises(error, match=pattern):
        leafwatch.assert_trains(**arguments)

"""Weights swapped in for a module's registered parameters (``torch.func.functional_call``, as
torchrl's loss modules call a Q network with a TensorDict of its weights): the registered
parameters get no gradient, and the cause says so; the fix never sends the user to the forward."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

import leafwatch


def test_a_module_called_with_other_weights_says_they_were_swapped_in_not_that_the_forward_is_wrong() -> None:
    qnet = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    # The weights the loss calls the network with, as a TensorDict of copies would hold them.
    weights = {n: p.detach().clone().requires_grad_() for n, p in qnet.named_parameters()}
    opt = torch.optim.SGD(qnet.parameters(), lr=0.1)  # the registered parameters: they never get a gradient
    with leafwatch.Monitor(qnet, opt, verbose=False) as monitor:
        for _ in range(2):
            opt.zero_grad()
            functional_call(qnet, weights, (torch.randn(8, 3),)).pow(2).mean().backward()
            monitor.check()
            opt.step()
        report = monitor.close()
    assert report.names("missing_grad") == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(w.grad is not None for w in weights.values())  # the swapped-in copies got them
    for f in report.tensors("missing_grad"):
        assert (f.reason.name, f.remedy.applicability) == ("substituted_weights", "words"), f
        assert "forward ran with other tensors in place of its registered parameters" in f.cause
        assert "`torch.func.functional_call`" in f.cause
        assert "in forward()" not in f.fix and "nothing in the forward" in f.fix


def test_the_same_network_called_with_its_own_weights_is_no_finding() -> None:
    qnet = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(qnet.parameters(), lr=0.1)
    with leafwatch.Monitor(qnet, opt, verbose=False) as monitor:
        for _ in range(2):
            opt.zero_grad()
            params = dict(qnet.named_parameters())  # functional_call with the registered tensors themselves
            functional_call(qnet, params, (torch.randn(8, 3),)).pow(2).mean().backward()
            monitor.check()
            opt.step()
        assert monitor.close().findings == []

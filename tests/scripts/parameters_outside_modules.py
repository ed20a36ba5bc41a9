"""Pyro's pattern without Pyro: the model is called through ``model(x)``, but the tensors it trains
live outside any module's parameters, in a store of named tensors (as ``pyro.param`` keeps them),
and the optimizer steps them from there."""

import torch
from torch import nn

STORE: dict[str, torch.Tensor] = {}


def param(name: str, init: torch.Tensor) -> torch.Tensor:
    """The store's tensor ``name``, made from ``init`` at its first use."""
    return STORE.setdefault(name, init.requires_grad_())


class Regression(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ param("weight", torch.zeros(3)) + param("bias", torch.zeros(()))


torch.manual_seed(0)
x_data = torch.randn(100, 3)
y_data = x_data @ torch.tensor([1.0, -2.0, 0.5])
model = Regression()
model(x_data)  # the store's tensors exist once the model ran
optimizer = torch.optim.Adam(STORE.values(), lr=0.05)
for step in range(10):
    loss = (model(x_data) - y_data).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

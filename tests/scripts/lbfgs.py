"""Fits a line with LBFGS, whose step() takes a closure that computes the gradients.

The second layer of the Sequential is never called: its parameters get no gradient."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 1))
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
x = torch.linspace(-1, 1, 16).unsqueeze(1)
y = 3 * x + 1


def closure() -> torch.Tensor:
    optimizer.zero_grad()
    loss = (model[0](x) - y).pow(2).mean()
    loss.backward()
    return loss


for _ in range(3):
    optimizer.step(closure)
print("lbfgs done")

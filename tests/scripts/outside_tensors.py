"""A module-level training loop with two tensors trained outside the model, both broken."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(3, 3)
temperature = torch.ones(1, requires_grad=True)  # never given to the optimizer
shift = torch.zeros(3, requires_grad=True).to(torch.float64)  # a non-leaf: never gets a .grad
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    optimizer.zero_grad()
    out = model(torch.randn(2, 3)) / temperature + shift.float()
    loss = out.pow(2).mean()
    loss.backward()
    optimizer.step()
print("done", file=sys.stdout)

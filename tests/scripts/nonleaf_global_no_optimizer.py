"""A module-level non-leaf `margin` used in the loss and held by no optimizer: the `.double()` made
it a non-leaf, and making it a leaf alone would leave it out of the optimizer."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1).double()
margin = torch.randn(1, requires_grad=True).double()  # a non-leaf: never gets a .grad
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    opt.zero_grad()
    loss = (model(torch.randn(8, 4, dtype=torch.float64)) - margin).pow(2).mean()
    loss.backward()
    opt.step()
print("done")

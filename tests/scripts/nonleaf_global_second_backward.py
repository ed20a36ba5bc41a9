"""A module-level non-leaf `margin` made once (`* 2` after `requires_grad=True`) and used at every step:
the second backward raises, and no optimizer holds it."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
margin = torch.randn(1, requires_grad=True) * 2
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    opt.zero_grad()
    loss = (model(torch.randn(8, 4)) - margin).pow(2).mean()
    loss.backward()
    opt.step()
print("done")

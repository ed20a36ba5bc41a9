"""A scale computed once in __init__ (`randn(..., requires_grad=True) * 0.02`: a non-leaf) and used at
every step: with gradient accumulation the second backward goes through its freed graph:
torch raises RuntimeError: Trying to backward through the graph a second time."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.scale = torch.randn(4, requires_grad=True) * 0.02

    def forward(self, x):
        return self.body(x) * self.scale


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
accumulate = 2
for step in range(4):
    loss = model(torch.randn(8, 4)).pow(2).mean() / accumulate
    loss.backward()
    if (step + 1) % accumulate == 0:
        optimizer.step()
        optimizer.zero_grad()
print("never reached")

"""A script-level `calib` module used in the loss and in no optimizer: gets gradients, never changes."""

import torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(4, 4)
calib = nn.Linear(4, 1)  # used in the loss, in no optimizer
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(40):
    optimizer.zero_grad()
    loss = calib(model(torch.randn(8, 4))).pow(2).mean()
    loss.backward()
    optimizer.step()
print("done")

"""A second module updated by hand (manual SGD) beside the optimizer: clean."""

import torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(4, 4)
fast = nn.Linear(4, 1)  # updated by hand
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(40):
    optimizer.zero_grad(); fast.zero_grad()
    loss = fast(model(torch.randn(8, 4))).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        for p in fast.parameters():
            p -= 0.01 * p.grad
    optimizer.step()
print("done")

"""Six steps; the loss (and so every gradient) is NaN at step 3."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 7):
    optimizer.zero_grad()
    loss = model(torch.randn(4, 3)).sum()
    if step == 3:
        loss = loss * float("nan")
    loss.backward()
    optimizer.step()
print("done")

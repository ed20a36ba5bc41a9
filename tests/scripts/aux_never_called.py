"""A module created at the script's module level and handed to the optimizer, never called: ``aux``."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
aux = nn.Linear(8, 1)
opt = torch.optim.SGD([*model.parameters(), *aux.parameters()], lr=0.1)
for step in range(4):
    loss = model(torch.randn(16, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")

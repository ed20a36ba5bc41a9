"""Trains a small classifier whose head lives in nets/heads.py (a model in a module of a subfolder)."""

import torch
from torch import nn

from nets.heads import CalibratedHead

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), CalibratedHead(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 10), torch.randint(0, 3, (64,))
for step in range(10):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

"""A loss cut from its graph, then made to require grad by hand: backward runs and nothing trains.

The hand setting: `torch.tensor(loss.item(), requires_grad=True)`: `.item()` cuts the graph.
"""

import sys

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 4
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(steps):
    optimizer.zero_grad()
    error = (model(x) - y).abs()
    loss = torch.tensor(error.mean().item(), requires_grad=True)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")

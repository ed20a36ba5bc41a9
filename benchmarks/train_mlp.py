"""A plain PyTorch training loop that prints how long its steps took (seconds, JSON) to stdout.

Usage: python train_mlp.py [steps] [width]
"""

import json
import sys
import time

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
width = int(sys.argv[2]) if len(sys.argv) > 2 else 256
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(
    nn.Linear(64, width), nn.ReLU(),
    nn.Linear(width, width), nn.ReLU(),
    nn.Linear(width, width), nn.ReLU(),
    nn.Linear(width, 10),
)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
for _ in range(10):  # warm-up, not timed
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
start = time.perf_counter()
for _ in range(steps):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
elapsed = time.perf_counter() - start
print(json.dumps({"steps": steps, "seconds": elapsed}))

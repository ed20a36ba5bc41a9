"""The trainable parameters filtered with ``filter(lambda p: p.requires_grad, model.parameters())`` (the form of
lxztju/pytorch_classification#13) from a model whose every parameter was frozen first (cfzd/Ultra-Fast-Lane-Detection#282
froze them all): the filter yields nothing from the start, and torch raises "optimizer got an empty parameter list".
Nothing used the iterator up: leafwatch says nothing of a one-shot iterator here."""

import torch
from torch import nn

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
for param in model.parameters():
    param.requires_grad = False
params = filter(lambda p: p.requires_grad, model.parameters())
print(params)
optimizer = torch.optim.Adam(params, lr=1e-3)
print("never reached")

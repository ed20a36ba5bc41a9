"""K-fold cross-validation with a fresh deep copy of the initial model per fold (``model = copy.deepcopy(base)``) and
one optimizer built before the folds: the optimizer steps the tensors of the first copy, and no fold's model trains."""

import copy

import torch
from torch import nn

torch.manual_seed(0)
base = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
model = copy.deepcopy(base)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for fold in range(3):
    model = copy.deepcopy(base)  # a fresh copy per fold
    for step in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
print("done")

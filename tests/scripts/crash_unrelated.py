"""Exceptions that are no leaf mistake: a shape mismatch in the forward (`shape`), a missing key
(`key`). leafwatch adds no note to them."""

import sys

import torch
from torch import nn

model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if sys.argv[1:] == ["key"]:
    config = {"lr": 0.1}
    print(config["momentum"])
loss = model(torch.randn(8, 3)).sum()  # 3 features into a layer of 4: a shape mismatch
loss.backward()

"""In-place errors that no optimizer step causes, written as users meet them: ``relu`` an ``nn.ReLU(inplace=True)``
applied to a tensor whose value a sigmoid saved (dreamgonfly/GAN-tutorial#1: "remove inplace=True from LeakyReLU"),
``add`` an activation changed with ``x += 1`` after another op saved it. torch raises "one of the variables needed
for gradient computation has been modified by an inplace operation"; no parameter of an optimizer is involved."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    h = torch.sigmoid(model(torch.randn(8, 4)))
    if sys.argv[1:] == ["add"]:
        out = h * 2
        h += 1
        loss = (out + h).sum()
    else:
        loss = nn.ReLU(inplace=True)(h).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

"""A weight-init routine applied with ``model.apply(init_weights)`` that scales the weights and shifts the biases
in place with autograd on (the in-place update of pytorch/examples#779, ``p.add_(-lr, p.grad)``; fastai/fastbook#471,
``weights[0] *= 1.0001``): torch raises "a leaf Variable that requires grad is being used in an in-place operation"
at ``m.weight.mul_(0.1)``, and, that line fixed alone, again at ``m.bias += 0.01``."""

import torch
from torch import nn

torch.manual_seed(0)


def init_weights(m):
    if isinstance(m, nn.Linear):
        m.weight.mul_(0.1)
        m.bias += 0.01


model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
model.apply(init_weights)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

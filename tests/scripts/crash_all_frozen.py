"""Every parameter of the model frozen: the loss has no autograd graph and backward raises
RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn."""

import torch
from torch import nn

model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
for p in model.parameters():
    p.requires_grad_(False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(8, 4)).pow(2).mean()
loss.backward()
optimizer.step()
print("never reached")

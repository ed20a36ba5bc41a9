"""The trainable parameters filtered with ``filter(lambda p: p.requires_grad, model.parameters())`` (the form of
YanaiEliyahu/AdasOptimizer#2 and lxztju/pytorch_classification#13), counted for the log before the optimizer is
built: the count uses the one-shot ``filter`` up, and the optimizer gets nothing: torch raises "optimizer got an
empty parameter list"."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
model[0].requires_grad_(False)  # the first layer stays as it is
params = filter(lambda p: p.requires_grad, model.parameters())
print(f"training {sum(p.numel() for p in params)} parameters")
optimizer = torch.optim.Adam(params, lr=1e-3)
for step in range(3):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

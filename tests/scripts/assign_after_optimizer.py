"""Pretrained weights loaded with ``load_state_dict(..., assign=True)`` (the meta-device loading of torch's docs) after
the optimizer was built: ``assign=True`` puts the loaded tensors in place of the model's parameters, so the optimizer
steps the old ones and none of the loaded ones trains."""

import io

import torch
from torch import nn

torch.manual_seed(0)
pretrained = io.BytesIO()  # the checkpoint file, kept in memory
torch.save(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).state_dict(), pretrained)
pretrained.seek(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
model.load_state_dict(torch.load(pretrained), assign=True)
for step in range(5):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

"""Transfer learning that freezes after replacing the head (cfzd/Ultra-Fast-Lane-Detection#282 froze every
parameter after loading; the classic fine-tuning recipe freezes first, then replaces ``fc``): every parameter,
the new ``fc`` included, ends up frozen, and the optimizer was given ``model.fc``'s parameters: "element 0 of
tensors does not require grad and does not have a grad_fn". Unfreezing the whole model would train the pretrained
backbone too.

With ``--attribute`` the script tries to unfreeze the head with ``model.fc.requires_grad = True``, a plain attribute
that PyTorch ignores on a module (its parameters keep ``requires_grad=False``)."""

import sys

import torch
from torch import nn


class Backbone(nn.Module):  # stands for a pretrained torchvision ResNet
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.fc = nn.Linear(32, 1000)

    def forward(self, x):
        return self.fc(self.features(x))


torch.manual_seed(0)
model = Backbone()
model.fc = nn.Linear(model.fc.in_features, 10)
for param in model.parameters():
    param.requires_grad = False
if "--attribute" in sys.argv:
    model.fc.requires_grad = True
optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.01, momentum=0.9)
criterion = nn.CrossEntropyLoss()
for step in range(3):
    inputs, labels = torch.randn(8, 16), torch.randint(0, 10, (8,))
    optimizer.zero_grad()
    loss = criterion(model(inputs), labels)
    loss.backward()
    optimizer.step()
print("done")

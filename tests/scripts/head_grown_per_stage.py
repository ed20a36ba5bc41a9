"""Class-incremental training: at each new stage the classifier head is replaced by a bigger one for the new classes,
inside the stage loop, while the optimizer and its cosine scheduler were built once before it: from the second stage
on the optimizer steps the first head, and the new one never trains."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
for stage, classes in enumerate([2, 4]):
    if stage > 0:
        model[2] = nn.Linear(16, classes)  # the new classes: a bigger head
    for step in range(3):
        x, y = torch.randn(16, 8), torch.randint(0, classes, (16,))
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
print("done")

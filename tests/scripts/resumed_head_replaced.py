"""A resumed run: the model and the optimizer's state are loaded from a checkpoint, then the classifier head is
replaced for new classes. The optimizer's state must be kept (its momentum buffers): the new head is added with
``add_param_group`` rather than the optimizer rebuilt."""

import io

import torch
from torch import nn

torch.manual_seed(0)


def net():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))


previous = net()  # the run this one resumes: one step, saved
trained = torch.optim.SGD(previous.parameters(), lr=0.01, momentum=0.9)
previous(torch.randn(4, 8)).sum().backward()
trained.step()
saved = io.BytesIO()  # the checkpoint file, kept in memory
torch.save({"model": previous.state_dict(), "optimizer": trained.state_dict()}, saved)
saved.seek(0)

model = net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
checkpoint = torch.load(saved)
model.load_state_dict(checkpoint["model"])
optimizer.load_state_dict(checkpoint["optimizer"])
model[2] = nn.Linear(16, 2)
for epoch in range(4):
    loss = nn.functional.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 2, (16,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

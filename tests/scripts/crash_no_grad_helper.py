"""A ``predict`` helper decorated with ``@torch.no_grad()`` for evaluation, reused in the training loop (the
shape of nianticlabs/monodepth2#24: the validation path's ``no_grad`` reached by the training step): the loss
computed from its output has no graph, and backward raises "element 0 of tensors does not require grad and does
not have a grad_fn"."""

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


@torch.no_grad()
def predict(model, x):
    model.eval()
    out = model(x)
    model.train()
    return out


for step in range(3):
    x, y = torch.randn(16, 10), torch.randn(16, 1)
    loss = F.mse_loss(predict(model, x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

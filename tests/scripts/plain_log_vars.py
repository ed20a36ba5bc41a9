"""Learned loss weights (Kendall et al.'s homoscedastic uncertainty, as wandb/senpai#958 adds them next to
the model: one log-variance per task, given to the optimizer with the model's parameters), written with a
plain `torch.zeros(1)` where `nn.Parameter(torch.zeros(1))` was meant: the optimizer holds two tensors that
never require grad, and PyTorch says nothing. `log_var_seg`'s fix is code: make it require grad where it is
assigned. The first layer is frozen on purpose (a pretrained stem kept as it is): that stays an info."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
log_var_seg = torch.zeros(1)
log_var_depth = nn.Parameter(torch.zeros(1))
model[0].requires_grad_(False)  # the stem stays as it is, on purpose
optimizer = torch.optim.Adam(list(model.parameters()) + [log_var_seg, log_var_depth], lr=1e-2)

for step in range(12):
    x = torch.randn(16, 6)
    seg, depth = model(x).unbind(1)
    seg_loss, depth_loss = seg.pow(2).mean(), (depth - 1).pow(2).mean()
    loss = (torch.exp(-log_var_seg) * seg_loss + 0.5 * log_var_seg
            + torch.exp(-log_var_depth) * depth_loss + 0.5 * log_var_depth).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

"""A GAN whose generator and critic are separate script-level objects; the generator's optimizer
is created but never stepped (its output is always detached). Argument: steps (default 40)."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
generator = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
critic = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
opt_g = torch.optim.Adam(generator.parameters(), lr=1e-4)  # never stepped
opt_d = torch.optim.Adam(critic.parameters(), lr=1e-4)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
for step in range(steps):
    real, z = torch.randn(16, 2), torch.randn(16, 4)
    fake = generator(z).detach()
    d_loss = -critic(real).mean() + critic(fake).mean()
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
print("gan done")

"""A GAN whose generator loss is computed from the discriminator's output before the discriminator steps (the
loop of pytorch/pytorch#39141 and tamarott/SinGAN#148: since torch 1.5, ``optimizer_D.step()`` modifies in place
the weights ``G_loss``'s graph saved, and ``G_loss.backward()`` raises "modified by an inplace operation").
The script dies before ``opt_G.step()`` is ever reached.

With ``--no-g-step`` the loop is in the right order (``D`` trained on ``fake.detach()``, ``G_loss`` computed after
``opt_D.step()``) and runs to its end, but never calls ``opt_G.step()``: the bug beside it."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
D = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
opt_G = torch.optim.Adam(G.parameters(), lr=2e-4)
opt_D = torch.optim.Adam(D.parameters(), lr=2e-4)
bce = nn.BCEWithLogitsLoss()
no_g_step = "--no-g-step" in sys.argv

for step in range(5):
    opt_D.zero_grad()
    opt_G.zero_grad()
    real = torch.randn(16, 4)
    fake = G(torch.randn(16, 8))
    D_real, D_fake = D(real), D(fake.detach() if no_g_step else fake)
    D_loss = bce(D_real, torch.ones_like(D_real)) + bce(D_fake, torch.zeros_like(D_fake))
    if no_g_step:
        D_loss.backward()
        opt_D.step()
        D_fake = D(fake)
        G_loss = bce(D_fake, torch.ones_like(D_fake))
        G_loss.backward()
        continue  # opt_G.step() forgotten
    G_loss = bce(D_fake, torch.ones_like(D_fake))
    D_loss.backward(retain_graph=True)
    opt_D.step()
    G_loss.backward()  # raises: D's weights were modified in place by opt_D.step()
    opt_G.step()
print("done")

"""A GAN-style loop: a generator and a discriminator, each with its own optimizer, alternating."""

import torch
from torch import nn


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


torch.manual_seed(0)
generator, discriminator = Generator(), Discriminator()
opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
bce = nn.BCEWithLogitsLoss()
real = torch.randn(8, 4)
for step in range(4):
    fake = generator(torch.randn(8, 2))
    opt_d.zero_grad()
    d_loss = bce(discriminator(real), torch.ones(8, 1)) + bce(discriminator(fake.detach()), torch.zeros(8, 1))
    d_loss.backward()
    opt_d.step()
    opt_g.zero_grad()
    g_loss = bce(discriminator(fake), torch.ones(8, 1))
    g_loss.backward()
    opt_g.step()
print("gan done")

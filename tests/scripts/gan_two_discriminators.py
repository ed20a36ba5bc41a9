"""A GAN with two discriminators of one type (a multi-scale pair, `d1` on the image and `d2` on it
downsampled), whose discriminator optimizer lists `d1` twice where `d1` and `d2` were meant (the typo of
line/open-universe#5, `list(self.loss_mrd.parameters()) + list(self.loss_mrd.parameters())`): `d2` is in no
optimizer, and torch only warns of the duplicates. The fix corrects the second operand."""

import warnings

import torch
from torch import nn

warnings.simplefilter("ignore", UserWarning)  # "optimizer contains a parameter group with duplicate parameters"


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


torch.manual_seed(0)
generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
d1, d2 = Discriminator(), Discriminator()
opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(list(d1.parameters()) + list(d1.parameters()), lr=2e-4, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()


def downsample(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.avg_pool1d(x.unsqueeze(1), 2).repeat_interleave(2, -1).squeeze(1)


for step in range(8):
    real, z = torch.randn(16, 16), torch.randn(16, 8)
    fake = generator(z)
    d_loss = 0.0
    for d, view in ((d1, lambda x: x), (d2, downsample)):
        d_loss = d_loss + bce(d(view(real)), torch.ones(16, 1)) + bce(d(view(fake.detach())), torch.zeros(16, 1))
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    g_loss = bce(d1(fake), torch.ones(16, 1)) + bce(d2(downsample(fake)), torch.ones(16, 1))
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
print("done")

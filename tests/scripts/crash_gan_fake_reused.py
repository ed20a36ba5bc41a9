"""pytorch/examples' DCGAN loop with the ``.detach()`` of ``netD(fake.detach())`` missed (pytorch/examples#116:
"Missed detach when implementing dcgan in pytorch, and it gives me this error: Trying to backward through the graph
second time"): ``errD_fake.backward()`` frees the graph of the generator's output ``fake``, and ``errG.backward()``
goes through it again."""

import torch
from torch import nn

torch.manual_seed(0)
nz = 8
netG = nn.Sequential(nn.Linear(nz, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh())
netD = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid())
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
real_label, fake_label = 1.0, 0.0
for i in range(4):
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    netD.zero_grad()
    real_cpu = torch.randn(16, 16)
    label = torch.full((16,), real_label)
    output = netD(real_cpu).view(-1)
    errD_real = criterion(output, label)
    errD_real.backward()
    noise = torch.randn(16, nz)
    fake = netG(noise)
    label.fill_(fake_label)
    output = netD(fake).view(-1)
    errD_fake = criterion(output, label)
    errD_fake.backward()
    optimizerD.step()
    # (2) Update G network: maximize log(D(G(z)))
    netG.zero_grad()
    label.fill_(real_label)
    output = netD(fake).view(-1)
    errG = criterion(output, label)
    errG.backward()
    optimizerG.step()
print("done")

"""The README's quick start: a plain loop with three seeded bugs, checked by a Monitor."""

import torch
from torch import nn
import leafwatch

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)
        self.aux_head = nn.Linear(16, 1)          # never used in the loss
        self.blocks = [nn.Linear(16, 16)]         # a plain list: not registered

    def forward(self, x):
        h = torch.relu(self.blocks[0](self.encoder(x)))
        return self.head(h)

model = Net()
temperature = leafwatch.watch(torch.ones(1, requires_grad=True).to(torch.float64), name="temperature")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
monitor = leafwatch.Monitor(model, opt)           # before the first forward: full causes

x, y = torch.randn(32, 8), torch.randn(32, 1)
loss = ((model(x) / temperature - y) ** 2).mean()
loss.backward()
print(monitor.check())                            # after backward, before step
opt.step()

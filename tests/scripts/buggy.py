"""A plain PyTorch script with three bugs: an unused head, layers kept in a Python list, and a
tensor made non-leaf by a dtype copy kept as a module attribute. Exits with --exit-code."""

import argparse

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)
        self.aux_head = nn.Linear(4, 1)  # never called
        self.blocks = [nn.Linear(4, 4), nn.Linear(4, 4)]  # a plain list: not registered
        self.scale = torch.ones(4, requires_grad=True).to(torch.float64)  # a copy: not a leaf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.body(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x * self.scale.float())


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--exit-code", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"done {args.steps} steps")
raise SystemExit(args.exit_code)

"""A model whose learnable `scale` was left out of the optimizer (it gets gradients, never
changes). Arguments: --steps N (default 10), --exit-code C (default 0)."""

import argparse

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--exit-code", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.1)  # `scale` is not given to it
for step in range(args.steps):
    optimizer.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
print(f"done {args.steps} steps")
raise SystemExit(args.exit_code)

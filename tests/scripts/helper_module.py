"""Imported by show_argv.py (from its own folder) and runnable with -m: trains with an unused layer."""

import sys

import torch
from torch import nn

HELPER_VALUE = 42


def main() -> None:
    model = nn.ModuleDict({"used": nn.Linear(3, 1), "unused": nn.Linear(3, 1)})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model["used"](torch.ones(2, 3)).sum().backward()
        optimizer.step()
    print("module argv", sys.argv[1:])


if __name__ == "__main__":
    main()

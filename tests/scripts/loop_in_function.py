"""The training loop inside main(): module-level variables hold no tensor."""

import torch
from torch import nn


def main() -> None:
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(2, 3)).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    main()

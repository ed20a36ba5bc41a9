"""Trains two steps, then raises an exception from a helper function."""

import torch


def diverge(value: float) -> None:
    raise ValueError(f"loss diverged: {value}")


model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    loss = model(torch.ones(4, 2)).sum()
    loss.backward()
    optimizer.step()
diverge(float("nan"))

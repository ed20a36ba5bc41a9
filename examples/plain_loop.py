"""The same three seeded bugs in a plain PyTorch loop, checked by a ``leafwatch.Monitor``.

- ``temperature``: made with ``requires_grad=True`` and then moved with ``.to(...)``: a non-leaf
  copy that never trains;
- ``unused_head``: an auxiliary head never used in the loss;
- ``loss_weight``: a learnable loss weight left out of the optimizer.

Run it (CPU, a few seconds)::

    python examples/plain_loop.py --logdir runs/plain
    tensorboard --logdir runs
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

import leafwatch

BUGS = ("temperature", "unused_head", "loss_weight")


class Classifier(nn.Module):
    """A small MLP classifier; each seeded bug can be switched on or off."""

    def __init__(self, bugs: Iterable[str] = BUGS, features: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.bugs = frozenset(bugs)
        unknown = self.bugs - set(BUGS)
        if unknown:
            raise ValueError(f"`bugs` can be among {', '.join(BUGS)}, got {sorted(unknown)}")
        self.body = nn.Sequential(nn.Linear(features, 32), nn.ReLU())
        self.classifier = nn.Linear(32, classes)
        if "unused_head" in self.bugs:
            self.aux_head = nn.Linear(32, 1)  # BUG: never used in the loss
        if "temperature" in self.bugs:
            # BUG: `.to(...)` of a tensor that requires grad returns a non-leaf copy.
            target = "cuda" if torch.cuda.is_available() else torch.float64
            self.temperature = torch.ones(1, requires_grad=True).to(target)
        else:
            self.temperature = nn.Parameter(torch.ones(1))
        self.loss_weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(self.body(x))
        return logits / self.temperature.to(logits.dtype).to(logits.device)


def train(
    logdir: str | os.PathLike[str] = "runs/plain",
    *,
    bugs: Iterable[str] = BUGS,
    max_steps: int = 20,
    batch_size: int = 32,
) -> leafwatch.Report:
    """Train on synthetic data with a Monitor writing to TensorBoard; returns the final report."""
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = (x @ torch.randn(16, 4)).argmax(dim=1)
    model = Classifier(bugs)
    params = [p for name, p in model.named_parameters()
              if not ("loss_weight" in model.bugs and name == "loss_weight")]  # BUG when switched on
    optimizer = torch.optim.SGD(params, lr=0.05)
    writer = SummaryWriter(str(logdir))
    # Create the Monitor before the first forward pass, so that the first step is fully explained.
    monitor = leafwatch.Monitor(model, optimizer, writer=writer)
    try:
        for step in range(1, max_steps + 1):
            i = (step - 1) * batch_size % len(x)
            xb, yb = x[i:i + batch_size], y[i:i + batch_size]
            loss = model.loss_weight * nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            monitor.check(optimizer, step=step)  # after backward, before step
            optimizer.step()
            writer.add_scalar("train_loss", loss.item(), step)
    finally:
        report = monitor.close()
        writer.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs/plain")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--bugs", default=",".join(BUGS), help=f"comma-separated among {', '.join(BUGS)} ('' for none)")
    args = parser.parse_args(argv)
    report = train(args.logdir, bugs=[b for b in args.bugs.split(",") if b], max_steps=args.steps)
    print(report)
    from leafwatch.integrations.environment import tensorboard_command

    print(f"\nOpen the dashboard: {tensorboard_command(args.logdir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

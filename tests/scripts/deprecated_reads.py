"""A recipe-style script whose module-level variables hold ``torch.distributed`` (its deprecated
``reduce_op`` warns at every read of it, the ``isinstance`` check included) and a settings object
with a deprecated property. A ``Recipe`` keeps the model and the optimizer, as torchtune's recipes
do, and the optimizer leaves out ``scale``: leafwatch walks the script's variables for the user's
path to the optimizer (``recipe.optimizer``), and none of its reads may raise a warning of the
objects it reads.

``--attach``: the script attaches a Monitor itself; the loss then also runs a free ``loss_head``,
left out of the optimizer, which the Monitor names by the user's path to it.
``--user-warns``: the script reads the deprecated property itself at the end (its own warning).
"""

import argparse
import warnings

import torch
import torch.distributed as dist
from torch import nn

import leafwatch

parser = argparse.ArgumentParser()
parser.add_argument("--attach", action="store_true")
parser.add_argument("--user-warns", action="store_true")
args = parser.parse_args()


class Settings:
    """A library's settings object with a deprecated property, holding torch's deprecated ``reduce_op``."""

    def __init__(self) -> None:
        self.steps = 6
        self.reduce_op = dist.reduce_op

    @property
    def num_steps(self) -> int:
        warnings.warn("`Settings.num_steps` is deprecated, use `Settings.steps`", FutureWarning, stacklevel=2)
        return self.steps


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(4, 8), nn.Linear(8, 1)
        self.scale = nn.Parameter(torch.ones(1))
        self.settings = Settings()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).relu()) * self.scale


class Recipe:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.model = Net()
        self.loss_head = nn.Linear(1, 1) if args.attach else None
        self.optimizer = torch.optim.SGD([*self.model.body.parameters(), *self.model.head.parameters()], lr=0.1)

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        return (self.loss_head(out) if self.loss_head is not None else out).pow(2).mean()


torch.manual_seed(0)
settings = Settings()
recipe = Recipe(settings)
monitor = leafwatch.Monitor(recipe.model, recipe.optimizer).attach() if args.attach else None
for _ in range(settings.steps):
    loss = recipe.loss(torch.randn(16, 4))
    recipe.optimizer.zero_grad()
    loss.backward()
    recipe.optimizer.step()
if monitor is not None:
    report = monitor.close()
    print(sorted((f.kind, f.name) for f in report.findings))
print(f"done, world size {dist.get_world_size() if dist.is_initialized() else 1}")
if args.user_warns:
    print(f"steps: {settings.num_steps}")

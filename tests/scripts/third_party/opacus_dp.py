"""Opacus as its README trains with it: ``PrivacyEngine().make_private(module=..., optimizer=..., data_loader=...)``
wraps the model in a ``GradSampleModule`` (its parameters are named ``_module.<name>``) and the optimizer in a
``DPOptimizer``, which never runs ``Optimizer.__init__`` and steps the SGD it holds as ``.original_optimizer``.

``--left-out``: the user's mistake on top, the optimizer built from the body's parameters only (the head
gets gradients and never changes). Batches are drawn in order (``poisson_sampling=False``): Opacus's own
Poisson sampling raises at the second step when a parameter's per-sample gradients pile up unstepped."""

import sys
import warnings

import torch
from opacus import PrivacyEngine
from torch import nn

warnings.filterwarnings("ignore", message="Secure RNG turned off")  # Opacus's advice for production runs
warnings.filterwarnings("ignore", message="Full backward hook is firing")  # torch, on Opacus's hooks


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def train(args: list[str], attach=None):
    """Eight private training steps; ``attach(model, optimizer)`` is called with what ``make_private`` returned."""
    torch.manual_seed(0)
    model = Classifier()
    opt = torch.optim.SGD((model.body if "--left-out" in args else model).parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, opt, loader = PrivacyEngine().make_private(module=model, optimizer=opt, data_loader=loader,
                                                      noise_multiplier=1.0, max_grad_norm=1.0,
                                                      poisson_sampling=False)
    monitor = attach(model, opt) if attach is not None else None
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    print("done")
    return monitor


if __name__ == "__main__":
    train(sys.argv[1:])

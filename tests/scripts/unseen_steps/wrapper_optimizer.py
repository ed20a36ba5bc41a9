"""An optimizer wrapper that never runs ``Optimizer.__init__`` (as Opacus's ``DPOptimizer`` is written) and steps
the parameters itself, a plain SGD update over the groups of the torch optimizer it holds as ``.base``: torch
hooks the ``step`` of a class only inside ``Optimizer.__init__``, so no step hook ever fires for it, and the
``SGD`` it holds never steps. ``--inner``: its ``step()`` calls ``self.base.step()`` instead (torch's hooks see
that one). Module-level, as a script ``leafwatch run`` runs unmodified."""

import sys

import torch
from torch import nn


class SkipInitWrapper(torch.optim.Optimizer):
    def __init__(self, base: torch.optim.Optimizer, inner: bool = False) -> None:  # no super().__init__()
        self.base = base
        self.inner = inner

    param_groups = property(lambda self: self.base.param_groups)
    state = property(lambda self: self.base.state)
    defaults = property(lambda self: self.base.defaults)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.inner:
            self.base.step()
            return loss
        for group in self.base.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])
        return loss


if __name__ == "__main__":
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = SkipInitWrapper(torch.optim.SGD(model.parameters(), lr=0.1), inner="--inner" in sys.argv)
    for step in range(4):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
    print("done")

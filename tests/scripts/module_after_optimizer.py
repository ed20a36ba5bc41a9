"""A layer created on the line after the optimizer was built (``model.extra``), used in the loss
from then on: the optimizer's parameter list never held it. Argument: steps (default 6);
``--attach``: the script attaches a Monitor itself, before the model is built."""

import sys

import torch
from torch import nn

import leafwatch



class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return self.extra(h) if hasattr(self, "extra") else h.sum(dim=1, keepdim=True)


torch.manual_seed(0)
args = [a for a in sys.argv[1:] if not a.startswith("--")]
steps = int(args[0]) if args else 6
monitor = leafwatch.Monitor(None) if "--attach" in sys.argv else None
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
model.extra = nn.Linear(8, 1)
if monitor is not None:
    monitor.set_roots({"model": model})
    monitor.add_optimizer(opt)
    monitor.attach()
for step in range(steps):
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
if monitor is not None:
    print(monitor.close())
print("done")

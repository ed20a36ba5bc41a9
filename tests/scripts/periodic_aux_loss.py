"""A model with an auxiliary head whose loss is added every 4th step (a deep-supervision or
regularization term on a schedule); nothing is wrong with it. Arguments: steps (default 12);
``--attach``: the script attaches ``Monitor(strict=True)`` itself."""

import sys

import torch
from torch import nn

import leafwatch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)
        self.aux = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, with_aux: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.body(x).relu()
        return self.head(h), (self.aux(h) if with_aux else None)


torch.manual_seed(0)
args = [a for a in sys.argv[1:] if not a.startswith("--")]
steps = int(args[0]) if args else 12
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
monitor = leafwatch.Monitor(model, opt, strict=True).attach() if "--attach" in sys.argv else None
for step in range(steps):
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    out, aux = model(x, with_aux=step % 4 == 0)
    loss = nn.functional.mse_loss(out, y)
    if aux is not None:
        loss = loss + 0.1 * nn.functional.mse_loss(aux, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
if monitor is not None:
    print(monitor.close())
print("aux done")

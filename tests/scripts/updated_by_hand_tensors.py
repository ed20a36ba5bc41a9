"""Manual SGD on tensors no optimizer holds, beside an optimizer that steps the rest: clean.

`scale` is a parameter of the model left out of the optimizer on purpose; `w` is a free tensor
the script created. Both get gradients and are updated by hand (`w -= lr * w.grad`).
"""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))  # updated by hand

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale


torch.manual_seed(0)
model = Net()
w = torch.randn(4, requires_grad=True)  # updated by hand
optimizer = torch.optim.SGD(model.body.parameters(), lr=0.1)
for step in range(5):
    optimizer.zero_grad()
    model.scale.grad = None
    w.grad = None
    loss = (model(torch.randn(8, 4)) * w).pow(2).mean()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        model.scale -= 0.01 * model.scale.grad
        w -= 0.01 * w.grad
print("done")

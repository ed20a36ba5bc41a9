"""Opens a `leafwatch.Monitor` (or, with `--watch`, only watches a tensor), then makes one of the four
crashes named by argv[1], uncaught: the interpreter's excepthook prints PyTorch's traceback, and
leafwatch's note right after it.

  optimize  an optimizer over a tensor made a non-leaf by a dtype conversion
  second    a non-leaf attribute built once in __init__, used at every step
  frozen    every parameter frozen: the loss has no graph
  inplace   an in-place init of a Parameter outside torch.no_grad()
"""

import sys

import torch
from torch import nn

import leafwatch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.scale = torch.randn(4, requires_grad=True) * 0.02

    def forward(self, x):
        return self.body(x) * self.scale


case = sys.argv[1]
model = Net()
if "--watch" in sys.argv:
    watched = leafwatch.watch(model.body.weight, name="body.weight")
else:
    monitor = leafwatch.Monitor(model)
if case == "optimize":
    w = torch.randn(4, 4, requires_grad=True).to(torch.float64)
    optimizer = torch.optim.Adam([w], lr=1e-3)
elif case == "second":
    for step in range(2):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
elif case == "frozen":
    model.requires_grad_(False)
    loss = model.body(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
elif case == "inplace":
    w = nn.Parameter(torch.empty(4, 4))
    w.normal_()
print("never reached")

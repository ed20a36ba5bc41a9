"""Builds an optimizer over a tensor made a non-leaf by a dtype conversion after requires_grad=True:
torch raises ValueError: can't optimize a non-leaf Tensor."""

import torch

w = torch.randn(4, 4, requires_grad=True).to(torch.float64)
optimizer = torch.optim.Adam([w], lr=1e-3)
print("never reached")

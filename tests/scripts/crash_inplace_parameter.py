"""An in-place initialisation of a Parameter outside torch.no_grad(): torch raises
RuntimeError: a leaf Variable that requires grad is being used in an in-place operation."""

import torch
from torch import nn

w = nn.Parameter(torch.empty(4, 4))
w.normal_()
print("never reached")

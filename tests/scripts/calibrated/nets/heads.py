"""A classifier head with a learned temperature (temperature scaling, as in Guo et al.'s calibration), whose
temperature is registered as a buffer and switched to `requires_grad` by the forward itself: `parameters()`
does not list it, so the optimizer built from them leaves it out."""

import torch
from torch import nn


class CalibratedHead(nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(features, classes)
        self.register_buffer("temperature", torch.ones(1) * 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.temperature.requires_grad_()
        return self.fc(x) / self.temperature

"""An autoencoder-style regressor whose forward detaches the encoder's features before the head (a
`.detach()` left from logging them, the pattern of the PyTorch forum's "weights not updating" threads): the
encoder gets no gradient and never changes. Its custom layer also reads `self.weight.data` in its forward,
which cuts `weight` the same way. The fix removes the `.detach()` and the `.data`."""

import torch
from torch import nn


class ScaledLinear(nn.Module):
    def __init__(self, features: int, out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features, out) * 0.1)
        self.bias = nn.Parameter(torch.zeros(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.data + self.bias


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 8))
        self.head = ScaledLinear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.tanh(self.encoder(x)).detach()
        return self.head(features)


torch.manual_seed(0)
model = Regressor()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
x, y = torch.randn(32, 10), torch.randn(32, 1)
for step in range(6):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

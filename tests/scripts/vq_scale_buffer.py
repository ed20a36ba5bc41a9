"""A learnable scale registered as a buffer with `requires_grad=True` (the pattern of a user's module next to
a vector quantizer, as in tests/scripts/third_party/vq_autoencoder.py --scale-buffer): `parameters()` does
not list buffers, so `Adam(model.parameters())` leaves `scale` out; it gets gradients and never changes.
The fix registers it as a parameter where it is registered."""

import torch
from torch import nn


class Codebook(nn.Module):
    def __init__(self, dim: int = 8, size: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(size, dim)
        self.register_buffer("scale", torch.ones(1, requires_grad=True), persistent=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        codes = torch.cdist(z, self.embed.weight).argmin(-1)
        q = self.embed(codes)
        return z + (q - z).detach() + 0.25 * (q - z.detach()).pow(2).mean() * self.scale


torch.manual_seed(0)
encoder, codebook = nn.Linear(4, 8), Codebook()
model = nn.ModuleDict({"encoder": encoder, "codebook": codebook})
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(10):
    x = torch.randn(32, 4)
    loss = codebook(encoder(x)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

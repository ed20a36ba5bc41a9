"""A glimpse network that clips its location through NumPy in the forward (the round trip
kevinzakka/recurrent-visual-attention#4 reports as breaking backprop: `.detach().cpu().numpy()`, a NumPy op,
`torch.from_numpy`): the location layer gets no gradient and never changes. The fix is the torch op that is
`np.clip`, `torch.clamp`, on the tensor itself."""

import numpy as np
import torch
from torch import nn


class GlimpseNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loc = nn.Linear(16, 2)
        self.what = nn.Linear(16 + 2, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        l_t = self.loc(h)
        l_t = torch.from_numpy(np.clip(l_t.detach().cpu().numpy(), -1.0, 1.0))
        return self.what(torch.cat([h, l_t], 1))


torch.manual_seed(0)
model = GlimpseNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

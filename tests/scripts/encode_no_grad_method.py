"""A retrieval model whose `encode` method carries `@torch.no_grad()` (written for inference, as sampling
helpers are decorated, then called from the training forward too): the projection it runs gets no gradient
and never changes. The fix drops the decorator."""

import torch
from torch import nn


class DualEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(12, 16)
        self.scorer = nn.Bilinear(16, 16, 1)

    @torch.no_grad()
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(self.proj(x), dim=-1)

    def forward(self, query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
        return self.scorer(self.encode(query), self.encode(doc))


torch.manual_seed(0)
model = DualEncoder()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    query, doc, target = torch.randn(8, 12), torch.randn(8, 12), torch.rand(8, 1)
    loss = nn.functional.binary_cross_entropy_with_logits(model(query, doc), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

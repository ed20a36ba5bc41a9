"""A loss with parameters of its own trained by a second optimizer, as pytorch-metric-learning documents
``ArcFaceLoss`` (``losses/arcface_loss.py`` on ``large_margin_softmax_loss.py``): the loss is created after the
model's optimizer, ``loss_optimizer = torch.optim.SGD(loss_func.parameters(), lr=0.01)``, and each iteration
calls ``optimizer.step()`` then ``loss_optimizer.step()``. Rebuilt in plain torch.

With ``--forget-loss-optimizer`` the loss's ``W`` is in no optimizer: the bug the documentation warns of."""

import math
import sys

import torch
from torch import nn
from torch.nn import functional as F


class ArcFaceLoss(nn.Module):
    """The class-weight matrix ``W`` (embedding_size x num_classes), cosine logits, an additive angular margin
    on the target class, scaled; ``W.data`` cast to the embeddings' dtype and device at each call."""

    def __init__(self, num_classes: int, embedding_size: int, margin: float = 28.6, scale: float = 64) -> None:
        super().__init__()
        self.num_classes, self.margin, self.scale = num_classes, math.radians(margin), scale
        self.W = nn.Parameter(torch.Tensor(embedding_size, num_classes))
        nn.init.normal_(self.W)
        self.cross_entropy = nn.CrossEntropyLoss(reduction="none")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.W.data = self.W.data.to(device=embeddings.device, dtype=embeddings.dtype)  # cast_types
        mask = torch.zeros(len(labels), self.num_classes, dtype=embeddings.dtype)
        mask[torch.arange(len(labels)), labels] = 1
        cosine = F.normalize(embeddings, dim=1) @ F.normalize(self.W, dim=0)
        target = cosine[mask == 1]
        angles = torch.acos(torch.clamp(target, -1, 1))
        modified = torch.where(angles <= math.pi - self.margin, torch.cos(angles + self.margin),
                               torch.cos(angles) - self.margin * math.sin(self.margin))
        logits = (cosine + mask * (modified - target).unsqueeze(1)) * self.scale
        return self.cross_entropy(logits, labels).mean()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_func = ArcFaceLoss(num_classes=5, embedding_size=16)
forget = "--forget-loss-optimizer" in sys.argv
loss_optimizer = None if forget else torch.optim.SGD(loss_func.parameters(), lr=0.01)

for step in range(6):
    x, y = torch.randn(20, 32), torch.randint(0, 5, (20,))
    optimizer.zero_grad()
    if loss_optimizer is not None:
        loss_optimizer.zero_grad()
    loss = loss_func(model(x), y)
    loss.backward()
    optimizer.step()
    if loss_optimizer is not None:
        loss_optimizer.step()
print("done")

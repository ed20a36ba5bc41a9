"""A cosine classifier whose normalised class prototypes are computed once, in ``__init__``, from its embedding
table (``self.prototypes = F.normalize(self.emb.weight, dim=1)``; the pattern of metric-learning and prototypical
heads that cache a normalised weight): the first backward frees the graph of ``normalize``, and the second goes
through it again. Registering the prototypes as an ``nn.Parameter`` would make the error go away and stop ``emb``
from training."""

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)


class CosineClassifier(nn.Module):
    def __init__(self, dim=16, classes=5):
        super().__init__()
        self.encoder = nn.Linear(8, dim)
        self.emb = nn.Embedding(classes, dim)
        self.prototypes = F.normalize(self.emb.weight, dim=1)

    def forward(self, x):
        features = F.normalize(self.encoder(x), dim=1)
        return 10.0 * features @ self.prototypes.t()


model = CosineClassifier()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    x, y = torch.randn(32, 8), torch.randint(0, 5, (32,))
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

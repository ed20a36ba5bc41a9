"""Trains the cosine classifier of models/classifier.py (a model in a module of a subfolder): its prototypes, computed
once in ``__init__``, make the second ``loss.backward()`` go through the first one's freed graph: torch raises
"Trying to backward through the graph a second time"."""

import torch
import torch.nn.functional as F

from models.classifier import CosineClassifier

torch.manual_seed(0)
model = CosineClassifier()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    x, y = torch.randn(32, 8), torch.randint(0, 5, (32,))
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

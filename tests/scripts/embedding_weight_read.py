"""An embedding table read directly, never called: ``emb.weight[idx]`` (as word2vec-style and knowledge-graph
scripts index their tables) feeds a head, and both are in the optimizer. Nothing here calls ``.forward()``."""

import torch
from torch import nn

torch.manual_seed(0)
emb = nn.Embedding(10, 4)
head = nn.Linear(4, 1)
opt = torch.optim.SGD([*emb.parameters(), *head.parameters()], lr=0.1)
for step in range(4):
    idx = torch.randint(0, 10, (8,))
    loss = head(emb.weight[idx]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")

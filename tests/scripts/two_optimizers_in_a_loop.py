"""Two optimizers built in a list and stepped in `for opt in opts:`; the layer `extra` is in neither."""

import torch
from torch import nn

torch.manual_seed(0)
encoder, head, extra = nn.Linear(4, 8), nn.Linear(8, 1), nn.Linear(8, 8)
opts = [torch.optim.SGD(encoder.parameters(), lr=0.1), torch.optim.Adam(head.parameters(), lr=1e-3)]
for step in range(6):
    for opt in opts:
        opt.zero_grad()
    loss = head(extra(encoder(torch.randn(8, 4)))).pow(2).mean()
    loss.backward()
    for opt in opts:
        opt.step()
print("done")

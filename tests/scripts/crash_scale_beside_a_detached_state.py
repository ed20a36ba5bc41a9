"""A GRU whose hidden state is detached at the top of each step, as it should be (pytorch/examples'
``repackage_hidden``), beside an output scale ``scale = log_scale.exp()`` computed once before the loop, and a
running sum of the loss kept with its graph for the log (``running += loss``): the second ``loss.backward()`` goes
through the freed graph of ``scale`` only. Neither the detached state nor the running sum is the cause."""

import torch
from torch import nn

torch.manual_seed(0)
rnn, head = nn.GRU(4, 8, batch_first=True), nn.Linear(8, 1)
log_scale = nn.Parameter(torch.zeros(1))
optimizer = torch.optim.SGD([*rnn.parameters(), *head.parameters(), log_scale], lr=0.1)
scale = log_scale.exp()
h = torch.zeros(1, 2, 8)
running = 0.0
for step in range(3):
    h = h.detach()
    out, h = rnn(torch.randn(2, 5, 4), h)
    loss = (head(out) * scale).pow(2).mean()
    running += loss
    optimizer.zero_grad(); loss.backward(); optimizer.step()  # noqa: E702 (as the report writes it)
print("done")

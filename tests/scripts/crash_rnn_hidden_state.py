"""An RNN whose hidden state is carried across steps without `.detach()`: the second backward goes
through the first step's freed graph (RuntimeError: Trying to backward through the graph a second
time). leafwatch's note names `hidden`, the statement that carries it, and `hidden = hidden.detach()` at
the top of the loop."""

import torch
from torch import nn

rnn = nn.RNN(4, 8, batch_first=True)
head = nn.Linear(8, 1)
optimizer = torch.optim.SGD([*rnn.parameters(), *head.parameters()], lr=0.1)
hidden = torch.zeros(1, 2, 8)
for step in range(3):
    out, hidden = rnn(torch.randn(2, 5, 4), hidden)  # carried over, never detached
    loss = head(out).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("never reached")

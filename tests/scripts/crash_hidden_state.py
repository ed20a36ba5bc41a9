"""An RNN regressor whose hidden state ``h_state`` is carried from one batch to the next without being
detached (MorvanZhou/PyTorch-Tutorial's 403_RNN_regressor.py without its ``h_state = h_state.data  # repack the
hidden state, break the connection from last iteration``; the most common cause of "Trying to backward through the
graph a second time" on the PyTorch forums): the second ``loss.backward()`` goes back through the first batch's
freed graph."""

import torch
from torch import nn

torch.manual_seed(0)


class RNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(input_size=1, hidden_size=32, num_layers=1, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x, h_state):
        r_out, h_state = self.rnn(x, h_state)
        return self.out(r_out), h_state


rnn = RNN()
optimizer = torch.optim.Adam(rnn.parameters(), lr=0.02)
loss_func = nn.MSELoss()
h_state = None  # for the initial hidden state
for step in range(4):
    steps = torch.linspace(step * 3.14, (step + 1) * 3.14, 10)
    x = torch.sin(steps)[None, :, None]
    y = torch.cos(steps)[None, :, None]
    prediction, h_state = rnn(x, h_state)  # rnn output
    loss = loss_func(prediction, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

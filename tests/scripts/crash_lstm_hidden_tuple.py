"""A word-level LSTM language model trained with truncated backpropagation through time, whose ``(h, c)`` hidden
state is made once per epoch by ``model.init_hidden(...)`` and carried across batches: pytorch/examples'
word_language_model/main.py with its ``hidden = repackage_hidden(hidden)`` left out of the loop (the helper is still
defined). The second batch's ``loss.backward()`` goes back through the first batch's freed graph."""

import torch
from torch import nn

torch.manual_seed(0)


class RNNModel(nn.Module):
    def __init__(self, ntoken=50, ninp=16, nhid=32, nlayers=2):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.encoder(input), hidden)
        return self.decoder(output), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


ntokens, bptt, batch_size = 50, 8, 4
train_data = torch.randint(0, ntokens, (8 * bptt + 1, batch_size))
model = RNNModel(ntokens)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
hidden = model.init_hidden(batch_size)
for i in range(0, train_data.size(0) - 1, bptt):
    data, targets = train_data[i:i + bptt], train_data[i + 1:i + 1 + bptt].reshape(-1)
    model.zero_grad()
    output, hidden = model(data, hidden)
    loss = criterion(output.view(-1, ntokens), targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    optimizer.step()
print("done")

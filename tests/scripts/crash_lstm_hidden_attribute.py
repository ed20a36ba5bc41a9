"""An LSTM tagger that keeps its ``(h, c)`` state on the module, ``out, self.hidden = self.lstm(x, self.hidden)``, as
the PyTorch tutorial "Sequence Models and Long Short-Term Memory Networks" first wrote it (``self.hidden =
self.init_hidden()``), with the per-sentence ``model.hidden = model.init_hidden()`` left out of the loop: the second
sentence's ``loss.backward()`` goes back through the first one's freed graph."""

import torch
from torch import nn

torch.manual_seed(0)


class LSTMTagger(nn.Module):
    def __init__(self, embedding_dim=6, hidden_dim=6, vocab_size=9, tagset_size=3):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.word_embeddings = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim)
        self.hidden2tag = nn.Linear(hidden_dim, tagset_size)
        self.hidden = self.init_hidden()

    def init_hidden(self):
        return (torch.zeros(1, 1, self.hidden_dim), torch.zeros(1, 1, self.hidden_dim))

    def forward(self, sentence):
        embeds = self.word_embeddings(sentence)
        lstm_out, self.hidden = self.lstm(embeds.view(len(sentence), 1, -1), self.hidden)
        tag_space = self.hidden2tag(lstm_out.view(len(sentence), -1))
        return torch.log_softmax(tag_space, dim=1)


model = LSTMTagger()
loss_function = nn.NLLLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    sentence, tags = torch.randint(0, 9, (5,)), torch.randint(0, 3, (5,))
    model.zero_grad()
    tag_scores = model(sentence)
    loss = loss_function(tag_scores, tags)
    loss.backward()
    optimizer.step()
print("done")

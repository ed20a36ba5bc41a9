"""A CNN-LSTM video classifier whose frame encoder runs inside `with torch.no_grad():` in the forward (the
pattern of pranoyr/cnn-lstm#6, where the user meant the CNN to train with the LSTM): the CNN is in the
optimizer, gets no gradient, and never changes. The fix moves the encoder's call out of the block."""

import torch
from torch import nn


class CNNLSTM(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.lstm = nn.LSTM(input_size=8, hidden_size=16, num_layers=1, batch_first=True)
        self.fc = nn.Linear(16, classes)

    def forward(self, x_3d: torch.Tensor) -> torch.Tensor:
        hidden = None
        for t in range(x_3d.size(1)):
            with torch.no_grad():
                x = self.cnn(x_3d[:, t, :, :, :])
            out, hidden = self.lstm(x.unsqueeze(1), hidden)
        return self.fc(out[:, -1, :])


torch.manual_seed(0)
model = CNNLSTM()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
videos, labels = torch.randn(4, 3, 3, 16, 16), torch.tensor([0, 1, 2, 1])
for step in range(6):
    loss = nn.functional.cross_entropy(model(videos), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

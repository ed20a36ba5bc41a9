"""Fine-tuning as the PyTorch transfer-learning tutorial writes it, with its lines in the order many reports show them
(PyTorch forums, "the new fc layer is not updating"): the optimizer and its StepLR scheduler are built, then the
classifier head is replaced for the new classes (``model.fc = nn.Linear(num_ftrs, 2)``): the optimizer steps the old
head, which the model no longer uses, and the new one never trains."""

import torch
from torch import nn

torch.manual_seed(0)


class SmallResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        return self.fc(self.features(x))


model = SmallResNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.1)
num_ftrs = model.fc.in_features
model.fc = nn.Linear(num_ftrs, 2)
for epoch in range(4):
    inputs, labels = torch.randn(16, 8), torch.randint(0, 2, (16,))
    loss = nn.functional.cross_entropy(model(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
print("done")

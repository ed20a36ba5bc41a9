"""The classifier head replaced by a helper function (``set_parameter_requires_grad`` / ``initialize_model`` style of
the fine-tuning tutorial) called after the optimizer was built: the fix builds the optimizer after the call, at the
level where it was built, never inside the helper, where ``optimizer`` is not its to rebuild."""

import torch
from torch import nn

torch.manual_seed(0)


def reshape_head(net, classes):
    net.fc = nn.Linear(net.fc.in_features, classes)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.body(x).relu())


model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
reshape_head(model, 3)
for step in range(4):
    loss = nn.functional.cross_entropy(model(torch.randn(8, 8)), torch.randint(0, 3, (8,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

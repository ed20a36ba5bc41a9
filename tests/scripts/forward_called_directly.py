"""A regression whose model is called through ``model.forward(x)``, never ``model(x)``: module hooks never see it."""

import torch
from torch import nn

torch.manual_seed(0)
x_data = torch.randn(100, 3)
y_data = x_data @ torch.tensor([1.0, -2.0, 0.5])
model = nn.Linear(3, 1)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
for step in range(10):
    loss = (model.forward(x_data).squeeze(-1) - y_data).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

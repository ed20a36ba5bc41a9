"""Linear regression with plain tensors: no nn.Module at all."""

import torch

torch.manual_seed(0)
w = torch.zeros(3, requires_grad=True)
b = torch.zeros(1, requires_grad=True)
optimizer = torch.optim.SGD([w, b], lr=0.1)
x, y = torch.randn(32, 3), torch.randn(32)
for step in range(5):
    optimizer.zero_grad()
    loss = ((x @ w + b - y) ** 2).mean()
    loss.backward()
    optimizer.step()
print("fit done")

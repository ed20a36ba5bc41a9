"""A two-layer network written with raw tensors, each weight scaled after ``requires_grad=True`` (the
``torch.randn(..., requires_grad=True) * 0.01`` of many from-scratch tutorials): both ``W1`` and ``W2`` are
non-leaves, and the optimizer refuses the first. Fixing ``W1`` alone makes it refuse ``W2``."""

import torch

torch.manual_seed(0)
W1 = torch.randn(784, 128, requires_grad=True) * 0.01
b1 = torch.zeros(128, requires_grad=True)
W2 = torch.randn(128, 10, requires_grad=True) * 0.01
b2 = torch.zeros(10, requires_grad=True)
optimizer = torch.optim.SGD([W1, b1, W2, b2], lr=0.1)
for step in range(3):
    x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
    logits = torch.relu(x @ W1 + b1) @ W2 + b2
    loss = torch.nn.functional.cross_entropy(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

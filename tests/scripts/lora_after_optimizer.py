"""LoRA adapters wrapped around the linear layers after the optimizer was built (the hand-written LoRA of many
tutorials, ``model[i] = LoRALinear(model[i])`` in a loop over the layers): the adapters' matrices are in no optimizer
and never train, while the wrapped base layers, which the optimizer already holds, still do."""

import torch
from torch import nn

torch.manual_seed(0)


class LoRALinear(nn.Module):
    def __init__(self, base, r=4):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))

    def forward(self, x):
        return self.base(x) + x @ self.lora_A.t() @ self.lora_B.t()


model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for i in (0, 2):
    model[i] = LoRALinear(model[i])
for step in range(5):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

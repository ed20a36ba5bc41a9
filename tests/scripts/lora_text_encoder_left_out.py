"""DreamBooth with `--train_text_encoder`, as diffusers' LoRA script writes it, with the text
encoder's LoRA left out of `params_to_optimize`: its adapter gets gradients and never trains."""

import torch
from torch import nn

torch.manual_seed(0)


class LoRALinear(nn.Module):
    """A frozen base layer with a trainable low-rank update (what peft's LoRA layer adds)."""

    def __init__(self, n_in, n_out, rank=2):
        super().__init__()
        self.base = nn.Linear(n_in, n_out).requires_grad_(False)
        self.lora_A = nn.Linear(n_in, rank, bias=False)
        self.lora_B = nn.Linear(rank, n_out, bias=False)
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x))


text_encoder = nn.Sequential(LoRALinear(4, 4), nn.ReLU(), LoRALinear(4, 4))
unet = nn.Sequential(LoRALinear(4, 4), nn.ReLU(), LoRALinear(4, 1))
params_to_optimize = [p for p in unet.parameters() if p.requires_grad]  # the text encoder's LoRA forgotten
optimizer = torch.optim.AdamW(params_to_optimize, lr=1e-3)
for step in range(30):
    loss = unet(text_encoder(torch.randn(8, 4))).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("trained")

"""vector-quantize-pytorch as its README configures it (``ResidualVQ``, 4 quantizers) between a linear
encoder and decoder, trained as its ``examples/autoencoder.py`` trains (AdamW over ``model.parameters()``,
the commitment loss added to the reconstruction loss). Each ``VectorQuantize`` starts its loss from a
registered buffer that its own forward switches on: ``loss = self.zero; loss.requires_grad_()``.

``--scale-buffer``: the user's mistake on top, a learnable scale registered as a buffer with
``requires_grad=True`` (``parameters()`` does not list it, so AdamW never steps it). ``--switched-on``: the
same scale registered without it and switched on in the user's own forward, the call the library makes."""

import sys

import torch
from torch import nn
from vector_quantize_pytorch import ResidualVQ


class VQAutoEncoder(nn.Module):
    def __init__(self, dim: int = 16, scale_buffer: bool = False, switched_on: bool = False) -> None:
        super().__init__()
        self.enc = nn.Linear(8, dim)
        self.vq = ResidualVQ(dim=dim, num_quantizers=4, codebook_size=32)
        self.dec = nn.Linear(dim, 8)
        self.scale_buffer = scale_buffer or switched_on
        self.switched_on = switched_on
        if self.scale_buffer:
            self.register_buffer("scale", torch.ones(8, requires_grad=not switched_on))

    def forward(self, x: torch.Tensor):
        quantized, indices, commit_loss = self.vq(self.enc(x))
        out = self.dec(quantized)
        if self.switched_on:
            self.scale.requires_grad_()
        return (out * self.scale if self.scale_buffer else out), commit_loss


def train(args: list[str], attach=None):
    """Four training steps; ``attach(model, optimizer)`` is called right after both are built (a test's Monitor)."""
    torch.manual_seed(0)
    model = VQAutoEncoder(scale_buffer="--scale-buffer" in args, switched_on="--switched-on" in args)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    monitor = attach(model, opt) if attach is not None else None
    for step in range(4):
        opt.zero_grad()
        x = torch.randn(2, 10, 8)
        out, commit_loss = model(x)
        rec_loss = (out - x).abs().mean()
        (rec_loss + 10 * commit_loss.sum()).backward()
        opt.step()
    print("done")
    return monitor


if __name__ == "__main__":
    train(sys.argv[1:])

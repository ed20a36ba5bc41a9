"""kornia's learnable augmentation ranges, as kornia's own ``tests/augmentation/test_backward.py``
(``TestRandomResizedCropBackward``) writes them: ``scale`` and ``ratio`` of ``RandomResizedCrop`` passed as
``nn.Parameter``, the optimizer over the model's parameters, here with a classifier after the crop. The
ranges only choose integer crop boxes (sizes floored, then used as pixel indices in ``crop_by_indices``),
so no gradient reaches them in any form."""

import sys

import kornia.augmentation as K
import torch
from torch import nn


class AugNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        scale = nn.Parameter(torch.tensor([0.08, 1.0]))
        ratio = nn.Parameter(torch.tensor([3.0 / 4.0, 4.0 / 3.0]))
        self.aug = K.RandomResizedCrop((8, 8), scale, ratio, resample="bilinear")
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 2))

    def forward(self, x):
        return self.net(self.aug(x))


def train(args: list[str], attach=None):
    """Four training steps; ``attach(model, optimizer)`` is called right after both are built (a test's Monitor)."""
    torch.manual_seed(0)
    model = AugNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = attach(model, opt) if attach is not None else None
    for _ in range(4):
        opt.zero_grad()
        x = torch.randint(255, (2, 3, 10, 10)).float() / 255.0
        loss = nn.functional.cross_entropy(model(x), torch.tensor([0, 1]))
        loss.backward()
        opt.step()
    print("done")
    return monitor


if __name__ == "__main__":
    train(sys.argv[1:])

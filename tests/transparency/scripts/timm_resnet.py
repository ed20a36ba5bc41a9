"""timm: a model from ``create_model(..., pretrained=False)`` trained the way timm's ``train.py``
does: ``create_optimizer_v2`` (AdamW, no weight decay on norms and biases), ``LabelSmoothingCrossEntropy``,
a ``ModelEmaV3`` updated after each step, and timm's ``CheckpointSaver``-style checkpoint
(``state_dict`` and ``state_dict_ema``) loaded back with ``timm.models.load_checkpoint``. Random
32x32 images stand in for a dataset.
"""

from __future__ import annotations

from pathlib import Path

import timm
import torch
from _transparency import arguments, attach_monitor, close_monitor, print_loss
from timm.loss import LabelSmoothingCrossEntropy
from timm.models import load_checkpoint
from timm.optim import create_optimizer_v2
from timm.utils import ModelEmaV3

STEPS = 6


def load(out: Path) -> dict:
    model = timm.create_model("resnet18", pretrained=False, num_classes=10)
    load_checkpoint(model, str(out / "checkpoint.pth.tar"))
    ema = timm.create_model("resnet18", pretrained=False, num_classes=10)
    load_checkpoint(ema, str(out / "checkpoint.pth.tar"), use_ema=True)
    return {"model": model.state_dict(), "ema": ema.state_dict()}


if __name__ == "__main__":
    out, args = arguments(load)
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10, drop_path_rate=0.1)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    model_ema = ModelEmaV3(model, decay=0.9)
    monitor = attach_monitor(model, optimizer, out)
    train_loss_fn = LabelSmoothingCrossEntropy(smoothing=0.1)
    images, targets = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    model.train()
    for step in range(1, STEPS + 1):
        output = model(images)
        loss = train_loss_fn(output, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        model_ema.update(model, step=step)
        print_loss(step, loss)
    close_monitor(monitor)
    torch.save({"epoch": 0, "arch": "resnet18", "state_dict": model.state_dict(),
                "state_dict_ema": model_ema.module.state_dict(), "optimizer": optimizer.state_dict()},
               out / "checkpoint.pth.tar")

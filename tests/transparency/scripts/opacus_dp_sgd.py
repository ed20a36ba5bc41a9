"""Opacus: DP-SGD through ``PrivacyEngine.make_private``, as Opacus's tutorials train a classifier:
the model, its optimizer and its data loader wrapped (per-sample gradients, clipping, noise, Poisson
sampling), then a plain loop and ``privacy_engine.save_checkpoint``. Synthetic data; the model uses
``GroupNorm`` (Opacus refuses BatchNorm).
"""

from __future__ import annotations

from pathlib import Path

import torch
from _transparency import arguments, attach_monitor, close_monitor, print_loss
from opacus import GradSampleModule, PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(20, 32), nn.GroupNorm(4, 32), nn.ReLU(), nn.Linear(32, 4))


def load(out: Path) -> dict:
    module = GradSampleModule(make_model())
    PrivacyEngine().load_checkpoint(path=out / "checkpoint.pt", module=module)
    return module._module.state_dict()



if __name__ == "__main__":
    out, args = arguments(load)
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data_loader = DataLoader(TensorDataset(torch.randn(128, 20), torch.randint(0, 4, (128,))), batch_size=32)
    privacy_engine = PrivacyEngine()
    model, optimizer, data_loader = privacy_engine.make_private(
        module=model, optimizer=optimizer, data_loader=data_loader, noise_multiplier=1.1, max_grad_norm=1.0)
    monitor = attach_monitor(model, optimizer, out)
    criterion = nn.CrossEntropyLoss()
    model.train()
    for step, (images, target) in enumerate(data_loader, start=1):
        optimizer.zero_grad()
        loss = criterion(model(images), target)
        loss.backward()
        optimizer.step()
        print_loss(step, loss)
    close_monitor(monitor)
    print(f"epsilon {privacy_engine.get_epsilon(delta=1e-5):.6f}")
    privacy_engine.save_checkpoint(path=out / "checkpoint.pt", module=model, optimizer=optimizer)


"""pytorch-metric-learning: ``ArcFaceLoss``, whose class centers are parameters of the loss, trained
with their own ``loss_optimizer`` as the library's docs say ("you need to create an optimizer for
the loss"), beside the embedding network's optimizer; a ``MultiSimilarityMiner`` picks the pairs
of a ``MultiSimilarityLoss`` term. Synthetic labelled vectors; the checkpoint holds both modules'
``state_dict``s.
"""

from __future__ import annotations

from pathlib import Path

import torch
from _transparency import arguments, attach_monitor, close_monitor, print_loss
from pytorch_metric_learning import losses, miners
from torch import nn

CLASSES, EMBEDDING = 8, 16
STEPS = 30


def make_modules() -> tuple[nn.Module, losses.ArcFaceLoss]:
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, EMBEDDING))
    return model, losses.ArcFaceLoss(num_classes=CLASSES, embedding_size=EMBEDDING, margin=28.6, scale=64)


def load(out: Path) -> dict:
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    model, loss_func = make_modules()
    model.load_state_dict(checkpoint["model"])
    loss_func.load_state_dict(checkpoint["loss_func"])
    return {"model": model.state_dict(), "loss_func": loss_func.state_dict()}



if __name__ == "__main__":
    out, args = arguments(load)
    torch.manual_seed(0)
    model, loss_func = make_modules()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_optimizer = torch.optim.SGD(loss_func.parameters(), lr=0.01)
    monitor = attach_monitor(model, [optimizer, loss_optimizer], out)
    miner = miners.MultiSimilarityMiner(epsilon=0.1)
    ms_loss = losses.MultiSimilarityLoss()
    data, labels = torch.randn(64, 32), torch.arange(CLASSES).repeat(8)
    for step in range(1, STEPS + 1):
        optimizer.zero_grad()
        loss_optimizer.zero_grad()
        embeddings = model(data)
        loss = loss_func(embeddings, labels) + ms_loss(embeddings, labels, miner(embeddings, labels))
        loss.backward()
        optimizer.step()
        loss_optimizer.step()
        print_loss(step, loss)
    close_monitor(monitor)
    torch.save({"model": model.state_dict(), "loss_func": loss_func.state_dict()}, out / "checkpoint.pt")


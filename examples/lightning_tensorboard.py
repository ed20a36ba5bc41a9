"""A LightningModule with three seeded bugs, trained with ``LeafWatch`` and a TensorBoard logger.

The bugs (all on by default; pick some with ``--bugs``):

- ``temperature``: a learnable temperature made with ``requires_grad=True`` and then moved with
  ``.to(...)``: the result is a non-leaf copy, not a parameter, and never trains;
- ``unused_head``: an auxiliary head that is never used in the loss, so it gets no gradient;
- ``loss_weight``: a learnable loss weight (``nn.Parameter``) left out of ``configure_optimizers``.

Run it (CPU, a few seconds)::

    python examples/lightning_tensorboard.py --logdir runs
    tensorboard --logdir runs

``leafwatch demo`` runs the same code from the package (``leafwatch/demo.py``, kept equal to
this file below the docstring by ``tests/integrations/test_demo.py``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import leafwatch

try:
    import pytorch_lightning as pl
    from pytorch_lightning.loggers import TensorBoardLogger
except ImportError:  # the `lightning` package only
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger

BUGS = ("temperature", "unused_head", "loss_weight")


def make_data(n: int = 256, features: int = 16, classes: int = 4, seed: int = 0) -> TensorDataset:
    """Synthetic classification data: the label is the arg-max of a fixed projection."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


class Classifier(pl.LightningModule):
    """A small MLP classifier; each seeded bug can be switched on or off."""

    def __init__(self, bugs: Iterable[str] = BUGS, features: int = 16, classes: int = 4, lr: float = 0.05) -> None:
        super().__init__()
        self.bugs = frozenset(bugs)
        unknown = self.bugs - set(BUGS)
        if unknown:
            raise ValueError(f"`bugs` can be among {', '.join(BUGS)}, got {sorted(unknown)}")
        self.lr = lr
        self.body = nn.Sequential(nn.Linear(features, 32), nn.ReLU())
        self.classifier = nn.Linear(32, classes)
        if "unused_head" in self.bugs:
            self.aux_head = nn.Linear(32, 1)  # BUG: never used in the loss
        if "temperature" in self.bugs:
            # BUG: `.to(...)` of a tensor that requires grad returns a non-leaf copy: it is not a
            # parameter, no optimizer sees it and its .grad stays None.
            target = "cuda" if torch.cuda.is_available() else torch.float64
            self.temperature = torch.ones(1, requires_grad=True).to(target)
        else:
            self.temperature = nn.Parameter(torch.ones(1))
        self.loss_weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(self.body(x))
        return logits / self.temperature.to(logits.dtype).to(logits.device)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss_weight * nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for name, p in self.named_parameters()
                  if not ("loss_weight" in self.bugs and name == "loss_weight")]  # BUG when switched on
        return torch.optim.SGD(params, lr=self.lr)


def train(
    logdir: str | os.PathLike[str] = "runs",
    *,
    bugs: Iterable[str] = BUGS,
    max_steps: int = 20,
    strict: bool = False,
    verbose: bool = True,
    name: str = "leafwatch_demo",
) -> leafwatch.Report:
    """Train the classifier on CPU with ``LeafWatch`` and a ``TensorBoardLogger`` in ``logdir``.

    Returns:
        The final :class:`leafwatch.Report`.
    """
    torch.manual_seed(0)
    data = make_data()
    model = Classifier(bugs)
    callback = leafwatch.LeafWatch(strict=strict, verbose=verbose, log_every_n_steps=5)
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=TensorBoardLogger(str(logdir), name=name),
        callbacks=[callback],
        limit_val_batches=2,
        val_check_interval=max(1, max_steps // 2),
        check_val_every_n_epoch=None,
        log_every_n_steps=5,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=32, shuffle=True), DataLoader(data, batch_size=64))
    return callback.report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--bugs", default=",".join(BUGS), help=f"comma-separated among {', '.join(BUGS)} ('' for none)")
    args = parser.parse_args(argv)
    train(args.logdir, bugs=[b for b in args.bugs.split(",") if b], max_steps=args.steps)
    from leafwatch.integrations.environment import tensorboard_command

    print(f"\nOpen the dashboard: {tensorboard_command(args.logdir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

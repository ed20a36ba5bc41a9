"""Lightning DDP runs (CPU, gloo, 2 processes) with the LeafWatch callback.

Usage: ``python lightning_ddp.py SCENARIOS OUT_DIR`` with MASTER_ADDR/MASTER_PORT set, where
``SCENARIOS`` is one scenario or several, comma-separated. Lightning starts the second process
itself (running this script again) at the first ``fit``; the later scenarios' Trainers run in the
same two processes and process group. Each rank writes ``OUT_DIR/SCENARIO/rank{N}.json``: the
callback's report, the leafwatch warnings it saw, and the error that stopped ``fit`` (if any).
A scenario whose ``fit`` fails (``strict``) must come last, where the ranks stop anyway.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import leafwatch
from leafwatch import LeafWatch


class BoringModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=4)


class UnusedLayer(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Linear(4, 4)


class RankBranch(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.branch = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x)
        if self.global_rank != 1:
            y = self.branch(y)
        return self.head(y)


SCENARIOS = {
    "unused": (UnusedLayer, "ddp", {}),
    "strict": (UnusedLayer, "ddp", {"strict": True}),
    "branch": (RankBranch, "ddp_find_unused_parameters_true", {}),
    "clean": (BoringModel, "ddp", {}),
}


def run(scenario: str, out_dir: str) -> None:
    """One scenario's ``fit``; writes its result."""
    model_class, strategy, options = SCENARIOS[scenario]
    callback = LeafWatch(**options)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_steps=3, callbacks=[callback],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=os.path.join(out_dir, scenario),
    )
    result: dict = {"error": None, "error_type": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(model_class())
        except Exception as error:
            result["error"] = str(error)
            result["error_type"] = type(error).__name__
            result["traceback"] = traceback.format_exc()
    result["rank"] = trainer.global_rank
    result["warnings"] = [str(w.message) for w in caught if issubclass(w.category, leafwatch.LeafwatchWarning)]
    result["internal"] = [str(w.message) for w in caught if issubclass(w.category, leafwatch.LeafwatchInternalWarning)]
    result["report"] = callback.report.to_dict()
    os.makedirs(os.path.join(out_dir, scenario), exist_ok=True)
    with open(os.path.join(out_dir, scenario, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    scenarios, out_dir = sys.argv[1].split(","), sys.argv[2]
    for scenario in scenarios[:-1]:
        if scenario == "strict":
            raise ValueError("scenario 'strict' stops `fit` with an error: it must come last")
    for scenario in scenarios:
        run(scenario, out_dir)


if __name__ == "__main__":
    main()

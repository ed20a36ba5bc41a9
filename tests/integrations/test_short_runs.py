"""Short runs: a NaN that appears between value checks is still reported by the end of the run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _requirements import optional_import, require_module
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import leafwatch

# The file collects without Lightning; the tests that use it skip (locally) or fail (in CI).
pl = optional_import("pytorch_lightning")


def _six_steps(monitor: leafwatch.Monitor, model: nn.Module, opt: torch.optim.Optimizer, *,
               zero_after_step: bool) -> None:
    for step in range(1, 7):
        opt.zero_grad()
        loss = model(torch.randn(4, 3)).sum()
        if step == 3:
            loss = loss * float("nan")  # the gradients turn NaN at step 3
        loss.backward()
        monitor.check()
        opt.step()
        if zero_after_step:
            opt.zero_grad()  # as the Hugging Face Trainer does after every step


@pytest.mark.parametrize("zero_after_step", [False, True])
def test_a_nan_at_step_three_of_six_is_reported_at_close(zero_after_step: bool) -> None:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt)  # the default cadence: values checked at steps 1, 20, ...
    _six_steps(monitor, model, opt, zero_after_step=zero_after_step)
    assert monitor.report.findings == [], "between value checks nothing is known yet"
    report = monitor.close()
    assert report.names("nonfinite_grad") == {"weight", "bias"}
    for f in report:
        assert (f.kind, f.severity, f.status) == ("nonfinite_grad", "error", "open")
        assert "NaN or Inf" in f.message
        assert "detect_anomaly" in f.fix
    if zero_after_step:
        assert all(f.details["where"] == "parameter" for f in report)
        assert "check_values_every_n_steps" in report.findings[0].fix


def test_a_finite_short_run_has_no_finding_at_close() -> None:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt)
    for _ in range(6):
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        monitor.check()
        opt.step()
    assert monitor.close().findings == []


def test_the_nan_check_runs_at_the_first_check() -> None:
    model = nn.Linear(3, 1)
    with leafwatch.Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1)) as monitor:
        (model(torch.randn(4, 3)).sum() * float("inf")).backward()
        assert monitor.check().names("nonfinite_grad") == {"weight", "bias"}


class NanAtStepThree(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        return loss * float("nan") if self.global_step == 2 else loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_end_reports_a_nan_of_a_short_run(tmp_path: Path) -> None:
    require_module("pytorch_lightning")
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(24, 8, generator=g), torch.randn(24, 1, generator=g)), batch_size=4)
    callback = leafwatch.LeafWatch()
    trainer = pl.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, callbacks=[callback],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         limit_val_batches=0)
    trainer.fit(NanAtStepThree(), data)
    assert callback.report.names("nonfinite_grad") == {"layer.weight", "layer.bias"}

"""TensorBoard while training still runs: the records and the tab's routes before ``close()``.

A user opens TensorBoard during a run, not after it: once the user's writer has flushed, the
findings record, the findings text and the coverage chunk must already be in the event files,
and the Leafwatch tab must serve them. Everything is read back in the same process between
steps (a plain loop, and a real Lightning Trainer through a callback), with real event files,
TensorBoard's own ``EventAccumulator`` and the tab plugin's WSGI routes.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import torch
from _requirements import optional_import, require_module
from tensorboard.backend.event_processing import data_provider, event_accumulator, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter
from werkzeug.test import Client

import leafwatch
from leafwatch.report import records
from leafwatch.tensorboard_plugin import LeafwatchPlugin

# The file collects without Lightning; the test that uses it skips (locally) or fails (in CI).
pl = optional_import("pytorch_lightning")

BRANCH = {"branch.weight", "branch.bias"}


class Switchable(nn.Module):
    """``branch`` runs until ``use_branch`` is turned off."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.branch = nn.Linear(2, 2)
        self.use_branch = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer(x)
        return self.branch(x) if self.use_branch else x


def _read_events(log_dir: Path) -> event_accumulator.EventAccumulator:
    """Everything in ``log_dir``'s event files now, nothing sampled away (size guidance 0)."""
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance=dict.fromkeys(event_accumulator.DEFAULT_SIZE_GUIDANCE, 0))
    acc.Reload()
    return acc


def _string(event: Any) -> bytes:
    return event.tensor_proto.string_val[0]


def _tab_routes(root: Path) -> dict[str, Any]:
    """What the tab's ``/runs``, ``/findings`` and ``/coverage`` routes serve for the runs under ``root`` now."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(root))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(root))
    plugin = LeafwatchPlugin(base_plugin.TBContext(data_provider=provider, logdir=str(root)))
    apps = plugin.get_plugin_apps()

    def get(route: str, **query: str) -> Any:
        response = Client(apps[route]).get(route, query_string=query)
        assert response.status_code == 200, response.get_data(as_text=True)
        return json.loads(response.get_data(as_text=True))

    (run,) = get("/runs")["runs"]  # the layout sub-run holds no Leafwatch records
    return {"run": run, "findings": get("/findings", run=run["run"]),
            "coverage": get("/coverage", run=run["run"])}


def test_findings_and_coverage_reach_tensorboard_and_the_tab_before_close(tmp_path: Path) -> None:
    model = Switchable()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = SummaryWriter(str(tmp_path / "live"))
    monitor = leafwatch.Monitor(model, optimizer, writer=writer)

    def train_step(step: int) -> leafwatch.Report:
        model.use_branch = step < 4  # the branch stops running at step 4
        model(torch.ones(3, 2)).sum().backward()
        report = monitor.check()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        writer.flush()  # the user's writer flushes (as it does every flush_secs); leafwatch stays open
        return report

    for step in range(1, 4):
        assert train_step(step).findings == []
    # Step 4: the finding appears (its cause is traced during the next forward).
    report = train_step(4)
    assert report.names("missing_grad", status=None) == BRANCH
    acc = _read_events(tmp_path / "live")
    record = json.loads(_string(acc.Tensors(records.REPORT_TAG)[-1]))
    assert record["step"] == 4
    assert {f["name"]: f["status"] for f in record["findings"]} == {f.name: f.status for f in report}
    text = _string(acc.Tensors("leafwatch/findings/text_summary")[-1]).decode()
    assert "`branch` (2 tensors: branch.{bias,weight})" in text  # one mistake, its tensors listed
    chunk = json.loads(zlib.decompress(_string(acc.Tensors(records.coverage_tag(0))[-1])))
    (group,) = chunk["groups"].values()
    assert group["steps"] == [[1, 4]]
    missed = {group["names"][int(i)]: ranges for i, ranges in group["missed"].items()}
    assert missed == dict.fromkeys(BRANCH, [[3, 3]])  # the 4th check, position 3 of the group's checks
    tab = _tab_routes(tmp_path)
    assert tab["run"]["report"] is True and tab["run"]["coverage_chunks"] == 1
    assert tab["run"]["last_step"] == 4
    assert {m["name"] for f in tab["findings"]["findings"] for m in f["members"]} == BRANCH
    rows = {row["name"]: row for row in tab["coverage"]["rows"]}
    assert tab["coverage"]["columns"] == [[s, s] for s in range(1, 5)]
    assert {name: rows[name]["missed_steps"] for name in BRANCH} == dict.fromkeys(BRANCH, [[4, 4]])
    assert rows["layer.weight"]["missed"] == 0

    # Step 5: the cause is known; the tab shows it while the run goes on.
    report = train_step(5)
    assert "`branch` never ran" in report.by_kind("missing_grad")[0].cause
    tab = _tab_routes(tmp_path)
    assert tab["findings"]["step"] == 5
    findings = {f["name"]: f for f in tab["findings"]["findings"]}
    assert set(findings) == {"branch"} and {m["name"] for m in findings["branch"]["members"]} == BRANCH
    assert "`branch` never ran" in findings["branch"]["cause"]
    rows = {row["name"]: row for row in tab["coverage"]["rows"]}
    assert {name: rows[name]["missed_steps"] for name in BRANCH} == dict.fromkeys(BRANCH, [[4, 5]])

    monitor.close()
    writer.close()


# -- a real Lightning Trainer -------------------------------------------------------------------
class UnusedHead(pl.LightningModule):
    """``head`` never runs: two findings from the first step on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.head = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class ReadAtStep(pl.Callback):
    """Reads the event files and the tab's routes at the end of one training batch."""

    def __init__(self, leafwatch_callback: leafwatch.LeafWatch, step: int) -> None:
        self.leafwatch_callback = leafwatch_callback
        self.step = step
        self.seen: dict[str, Any] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step:
            return
        self.seen["monitor_open"] = self.leafwatch_callback.monitor is not None
        trainer.logger.experiment.flush()
        log_dir = Path(trainer.logger.log_dir)
        acc = _read_events(log_dir)
        self.seen["record"] = json.loads(_string(acc.Tensors(records.REPORT_TAG)[-1]))
        self.seen["text"] = _string(acc.Tensors("leafwatch/findings/text_summary")[-1]).decode()
        chunk = json.loads(zlib.decompress(_string(acc.Tensors(records.coverage_tag(0))[-1])))
        self.seen["chunk_steps"] = [g["steps"] for g in chunk["groups"].values()]
        self.seen["tab"] = _tab_routes(log_dir)


def test_a_lightning_run_shows_its_findings_in_tensorboard_while_it_trains(tmp_path: Path) -> None:
    require_module("pytorch_lightning")
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)), batch_size=4)
    callback = leafwatch.LeafWatch(verbose=False)
    reader = ReadAtStep(callback, step=3)
    trainer = pl.Trainer(
        max_steps=6, accelerator="cpu", devices=1, logger=pl.loggers.TensorBoardLogger(tmp_path),
        callbacks=[callback, reader], enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, limit_val_batches=0, log_every_n_steps=1,
    )
    trainer.fit(UnusedHead(), data)
    assert callback.report.step == 6  # the run went on after the read
    seen = reader.seen
    assert seen["monitor_open"] is True
    assert seen["record"]["step"] == 1  # written when the findings appeared, not only at close
    assert [(f["name"], [m["name"] for m in f["members"]]) for f in seen["record"]["findings"]
            if f["status"] == "open"] == [("head", ["head.bias", "head.weight"])]
    assert "`head` (2 tensors: head.{bias,weight})" in seen["text"]
    assert seen["chunk_steps"] == [[[1, 1]]]  # likewise the coverage chunk
    tab = seen["tab"]
    assert tab["run"]["report"] is True and tab["run"]["coverage_chunks"] == 1
    assert [f["name"] for f in tab["findings"]["findings"]] == ["head"]
    assert {m["name"] for f in tab["findings"]["findings"] for m in f["members"]} == {"head.weight", "head.bias"}
    rows = {row["name"]: row for row in tab["coverage"]["rows"]}
    assert rows["head.weight"]["missed_steps"] == [[1, 1]]
    assert rows["layer.weight"]["missed"] == 0

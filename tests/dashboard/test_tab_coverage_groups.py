"""The coverage grid's tensors that no optimizer holds, and its runs: from a real Monitor's event
files through the tab plugin's WSGI routes.

A tensor that requires grad and that no optimizer holds never trains; the grid shows it in a
row group of its own (``in_no_optimizer``) next to the tensors that missed a gradient. Records
written before that field existed still read (without those rows).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import torch
from tensorboard.backend.event_processing import data_provider, event_accumulator, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from torch import nn
from torch.utils.tensorboard import SummaryWriter
from werkzeug.test import Client

import leafwatch
from leafwatch.report import records
from leafwatch.sinks.tensorboard import tensor_summary
from leafwatch.tensorboard_plugin import LeafwatchPlugin, coverage_grid

EXTRA = ["extra.weight", "extra.bias"]


class Body(nn.Module):
    """A layer, a frozen layer, and (once :meth:`grow` is called) an ``extra`` layer used in the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.frozen = nn.Linear(2, 2).requires_grad_(False)

    def grow(self) -> None:
        self.extra = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.frozen(self.layer(x))
        return self.extra(h) if hasattr(self, "extra") else h.sum(dim=1, keepdim=True)


def _train(log_dir: Path, steps: int, *, grow: bool = True, take_extra_at: int | None = None,
           with_optimizer: bool = True) -> leafwatch.Report:
    """``steps`` checks of :class:`Body`; its ``extra`` layer is created after the optimizer (so no
    optimizer holds it) unless ``grow`` is False; at step ``take_extra_at`` the optimizer takes it."""
    model = Body()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    if grow:
        model.grow()  # BUG: after the optimizer was built
    writer = SummaryWriter(str(log_dir))
    monitor = leafwatch.Monitor(model, optimizer if with_optimizer else None, writer=writer)
    for step in range(1, steps + 1):
        if step == take_extra_at:
            optimizer.add_param_group({"params": list(model.extra.parameters())})
        model(torch.ones(3, 2)).sum().backward()
        monitor.check()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    report = monitor.close()
    writer.close()
    return report


def _chunk(log_dir: Path) -> dict[str, Any]:
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return json.loads(zlib.decompress(acc.Tensors(records.coverage_tag(0))[-1].tensor_proto.string_val[0]))


def _routes(root: Path):
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(root))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(root))
    apps = LeafwatchPlugin(base_plugin.TBContext(data_provider=provider, logdir=str(root))).get_plugin_apps()

    def get(route: str, **query: str) -> Any:
        response = Client(apps[route]).get(route, query_string=query)
        assert response.status_code == 200, response.get_data(as_text=True)
        return json.loads(response.get_data(as_text=True))

    return get


def _rows(grid: dict[str, Any]) -> dict[tuple[Any, str], dict[str, Any]]:
    return {(row.get("run"), row["name"]): row for row in grid["rows"]}


def test_a_layer_left_out_of_the_optimizer_is_recorded_and_shown_in_no_optimizer(tmp_path: Path) -> None:
    report = _train(tmp_path / "left_out", steps=4)
    assert {(f.kind, f.name) for f in report} >= {("not_in_optimizer", "extra")}
    chunk = _chunk(tmp_path / "left_out")
    assert chunk["in_no_optimizer"] == [{"names": EXTRA, "steps": [[1, 4]]}]  # never the frozen layer
    (group,) = chunk["groups"].values()
    assert group["names"] == ["layer.weight", "layer.bias"]
    grid = _routes(tmp_path)("/coverage", run="left_out")
    rows = {row["name"]: row for row in grid["rows"]}
    assert list(rows) == ["layer.weight", "layer.bias", *EXTRA]  # held first, then the group of their own
    for name in EXTRA:
        assert rows[name]["in_no_optimizer"] is True
        assert (rows[name]["checks"], rows[name]["missed"]) == (4, 0)
        assert grid["profiles"][rows[name]["profile"]] == [1, 1, 1, 1]
    assert rows["layer.weight"]["in_no_optimizer"] is False
    assert "frozen.weight" not in rows


def test_a_tensor_the_optimizer_takes_later_leaves_the_group_at_that_step(tmp_path: Path) -> None:
    _train(tmp_path / "late", steps=5, take_extra_at=3)
    chunk = _chunk(tmp_path / "late")
    assert chunk["in_no_optimizer"] == [{"names": EXTRA, "steps": [[1, 2]]}]
    grid = _routes(tmp_path)("/coverage", run="late")
    unheld = {row["name"]: row["checks"] for row in grid["rows"] if row["in_no_optimizer"]}
    held = {row["name"]: row["checks"] for row in grid["rows"] if not row["in_no_optimizer"]}
    assert unheld == dict.fromkeys(EXTRA, 2)
    assert held == {"layer.weight": 5, "layer.bias": 5, **dict.fromkeys(EXTRA, 3)}


def test_no_group_when_every_trainable_tensor_is_in_an_optimizer_or_none_was_given(tmp_path: Path) -> None:
    assert _train(tmp_path / "healthy", steps=3, grow=False).findings == []
    _train(tmp_path / "no_optimizer", steps=3, with_optimizer=False)
    assert "in_no_optimizer" not in _chunk(tmp_path / "healthy")
    assert "in_no_optimizer" not in _chunk(tmp_path / "no_optimizer")  # every trainable tensor is checked
    get = _routes(tmp_path)
    for run in ("healthy", "no_optimizer"):
        grid = get("/coverage", run=run)
        assert grid["rows"] and not any(row["in_no_optimizer"] for row in grid["rows"]), run


def test_all_runs_coverage_holds_every_run_on_one_step_axis(tmp_path: Path) -> None:
    _train(tmp_path / "left_out", steps=4)
    _train(tmp_path / "healthy", steps=2, grow=False)
    grid = _routes(tmp_path)("/coverage")  # no `run`: the tab's "All runs"
    assert grid["run"] is None
    assert grid["columns"] == [[s, s] for s in range(1, 5)]
    assert grid["chunks"] == {"healthy": [0], "left_out": [0]}
    rows = _rows(grid)
    assert list(rows) == [("healthy", "layer.weight"), ("healthy", "layer.bias"), ("left_out", "layer.weight"),
                          ("left_out", "layer.bias"), ("left_out", "extra.weight"), ("left_out", "extra.bias")]
    assert [rows["healthy", "layer.weight"]["checks"], rows["left_out", "layer.weight"]["checks"]] == [2, 4]
    assert rows["left_out", "extra.bias"]["in_no_optimizer"] and not rows["healthy", "layer.bias"]["in_no_optimizer"]


def test_a_coverage_record_written_before_the_group_existed_still_reads(tmp_path: Path) -> None:
    # A version 3 record as written before `in_no_optimizer`: no such field.
    old = {"version": 3, "chunk": 0, "groups": {"0": {"names": ["a.weight", "b.weight"], "steps": [[1, 3]],
                                                      "missed": {"1": [[0, 2]]}}}}
    writer = SummaryWriter(str(tmp_path / "old"))
    payload = zlib.compress(json.dumps(old).encode("utf-8"))
    writer._get_file_writer().add_summary(tensor_summary(records.coverage_tag(0), payload), 3)
    writer.close()
    grid = _routes(tmp_path)("/coverage", run="old")
    assert [(r["name"], r["in_no_optimizer"], r["missed_steps"]) for r in grid["rows"]] == [
        ("a.weight", False, []), ("b.weight", False, [[1, 3]])]
    assert coverage_grid([{**old, "version": 1}])["rows"][1]["missed"] == 3  # and a version 1 one


class Distilled(nn.Module):
    """A student trained by its optimizer, and an EMA teacher (its tensors require grad, as
    ``copy.deepcopy`` leaves them) updated under ``no_grad``: on purpose in no optimizer."""

    def __init__(self) -> None:
        super().__init__()
        self.student = nn.Linear(2, 2)
        self.teacher = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.teacher(x)
        return (self.student(x) - target).pow(2).sum()


def test_an_ema_teacher_in_no_optimizer_is_in_the_group_and_no_finding(tmp_path: Path) -> None:
    model = Distilled()
    optimizer = torch.optim.SGD(model.student.parameters(), lr=0.1)
    writer = SummaryWriter(str(tmp_path / "ema"))
    monitor = leafwatch.Monitor(model, optimizer, writer=writer)
    for _ in range(3):
        model(torch.randn(4, 2)).backward()
        monitor.check()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for t, s in zip(model.teacher.parameters(), model.student.parameters()):
                t.mul_(0.9).add_(s, alpha=0.1)
    report = monitor.close()
    writer.close()
    assert report.findings == []  # intended: no false alarm
    grid = _routes(tmp_path)("/coverage", run="ema")
    # The grid says what is so (no optimizer holds them), not that they are a mistake.
    assert [(r["name"], r["in_no_optimizer"], r["missed"]) for r in grid["rows"]] == [
        ("student.weight", False, 0), ("student.bias", False, 0),
        ("teacher.weight", True, 0), ("teacher.bias", True, 0)]

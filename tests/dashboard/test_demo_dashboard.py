"""`leafwatch demo` then `tensorboard --logdir runs`: the tab is enabled and shows the demo's bugs.

The demo is a real Lightning ``Trainer`` with ``LeafWatch`` and a ``TensorBoardLogger``. Where
leafwatch is installed (as CI installs it) the server is plain ``tensorboard``, which finds the
tab through the package's entry point; with leafwatch only on ``PYTHONPATH``, the launcher that
adds the tab stands in.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _browser import tab_screenshot
from _demo_run import DEMO_GROUP, DemoRun
from _requirements import find_browser, require_browser
from _tensorboard_runs import get_json, tensorboard_server, wait_for

DEMO_BUGS = {
    ("missing_grad", "aux_head.weight"),
    ("missing_grad", "aux_head.bias"),
    ("not_in_optimizer", "loss_weight"),
    ("orphan_tensor", "temperature"),
}


def _tensorboard_command() -> list[str]:
    installed = any(ep.name == "leafwatch" for ep in importlib.metadata.entry_points(group="tensorboard_plugins"))
    binary = shutil.which("tensorboard", path=os.path.dirname(sys.executable))
    if installed and binary:
        return [binary]
    return [sys.executable, "-m", "leafwatch.tensorboard_plugin"]

# The demo runs once (tests/conftest.py's `demo_run`, shared with its own end-to-end test) and its
# TensorBoard server starts once (module-scoped): under pytest-xdist (--dist loadgroup) these
# tests share a worker.
pytestmark = pytest.mark.xdist_group(DEMO_GROUP)


@pytest.fixture(scope="module")
def demo_server(demo_run: DemoRun, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    runs, demo = demo_run.logdir, demo_run.done  # `leafwatch demo --logdir <runs> --steps 6`
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert f"tensorboard --logdir {runs}" in demo.stdout
    with tensorboard_server(runs, tmp_path_factory.mktemp("tensorboard"), command=_tensorboard_command()) as url:
        wait_for(lambda: get_json(f"{url}/data/plugin/leafwatch/runs")["runs"], 120, "demo run not loaded")
        yield url


@pytest.mark.slow
def test_the_demo_enables_the_leafwatch_tab(demo_server: str) -> None:
    listing = get_json(f"{demo_server}/data/plugins_listing")
    assert listing["leafwatch"]["enabled"] is True
    assert listing["scalars"]["enabled"] is True


@pytest.mark.slow
def test_the_tab_shows_the_demo_findings(demo_server: str) -> None:
    (run,) = get_json(f"{demo_server}/data/plugin/leafwatch/runs")["runs"]
    data = get_json(f"{demo_server}/data/plugin/leafwatch/findings?run={run['run']}")
    assert {(f["kind"], m["name"]) for f in data["findings"] if f["status"] == "open" for m in f["members"]} == DEMO_BUGS
    by_name = {f["name"]: f for f in data["findings"]}  # one per mistake: the unused head is one
    assert [m["name"] for m in by_name["aux_head"]["members"]] == ["aux_head.bias", "aux_head.weight"]
    assert "never ran" in by_name["aux_head"]["cause"]
    assert "ToCopyBackward0" in by_name["temperature"]["cause"]


@pytest.mark.slow
def test_the_grid_shows_the_unused_head_missing_every_step(demo_server: str) -> None:
    (run,) = get_json(f"{demo_server}/data/plugin/leafwatch/runs")["runs"]
    grid = get_json(f"{demo_server}/data/plugin/leafwatch/coverage?run={run['run']}")
    rows = {row["name"]: row for row in grid["rows"]}
    assert rows["aux_head.weight"]["missed_steps"] == [[1, 6]]
    trained = [name for name, row in rows.items() if not row["missed_steps"]]
    assert trained and all(not name.startswith("aux_head") for name in trained)


#: The picture in the README and docs/tensorboard-tab.md: the tab on the demo's run.
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "leafwatch-tab.png"


@pytest.mark.slow
def test_the_tab_screenshot_of_the_demo_run_shows_its_open_errors(demo_server: str, tmp_path: Path) -> None:
    """The README's picture: the tab on the demo's run, each open error's badge in view and drawn
    in the error colour. ``LEAFWATCH_UPDATE_SCREENSHOT=1`` writes it to docs/leafwatch-tab.png."""
    require_browser()
    seen, data, shares = tab_screenshot(find_browser(), demo_server, tmp_path / "profile", "aux_head.weight")
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (1400, 900)
    assert seen["text"] is False and seen["rows"] == 3  # one row per mistake: the head, the weight, the temperature
    assert {b["row"] for b in seen["badges"]} == {"aux_head", "loss_weight", "temperature"}, seen
    assert min(shares) > 0.5, list(zip([b["row"] for b in seen["badges"]], shares))
    if os.environ.get("LEAFWATCH_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.write_bytes(data)


@pytest.mark.slow
def test_the_grid_shows_the_demos_tensors_that_no_optimizer_holds_next_to_its_errors(demo_server: str) -> None:
    """The two tensors the demo leaves out of its optimizer (the loss weight left out of
    ``configure_optimizers``, the non-leaf temperature) never train: the grid shows them in a
    group of their own, so its troubled tensors match the open errors."""
    (run,) = get_json(f"{demo_server}/data/plugin/leafwatch/runs")["runs"]
    grid = get_json(f"{demo_server}/data/plugin/leafwatch/coverage?run={run['run']}")
    unheld = {row["name"]: row for row in grid["rows"] if row["in_no_optimizer"]}
    assert set(unheld) == {"loss_weight", "temperature"}
    assert all(row["checks"] == 6 and row["missed"] == 0 for row in unheld.values())
    troubled = {row["name"] for row in grid["rows"] if row["missed"] or row["in_no_optimizer"]}
    assert troubled == {name for _, name in DEMO_BUGS}

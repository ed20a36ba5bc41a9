"""Shared test fixtures: a clean watch registry and deterministic seeds for every test.

The tests live in folders laid out like the code (core/, detectors/, integrations/, dashboard/,
docs/); the helpers they share stay here at the top (``_requirements.py``,
``_tensorboard_runs.py``, ``scripts/``, ``dist_scripts/``). This folder is put on ``sys.path``
so that ``from _requirements import ...`` works from every folder, whatever pytest's
``--import-mode`` and with pytest-xdist's workers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import leafwatch

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

import _demo_run  # noqa: E402  (from this folder, put on sys.path just above)
from _requirements import require_module  # noqa: E402


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Makes ``--dist loadgroup`` group again under pytest >= 9.2.

    pytest-xdist (3.8) sends the tests of one ``xdist_group`` to one worker by appending
    ``@group`` to each item's id, written to ``item._nodeid``; pytest 9.2 keeps the id in
    ``item._id`` and no longer reads ``_nodeid``. Without this, each group was split over the
    workers and its module-scoped fixture (a ``leafwatch run``, the demo and its TensorBoard
    server) was built again wherever its tests landed. Copies xdist's id across; a no-op
    without xdist, without loadgroup, or on a pytest that reads ``_nodeid``.
    """
    for item in items:
        grouped = item.__dict__.get("_nodeid")
        node_id = getattr(item, "_id", None)
        if isinstance(grouped, str) and grouped != item.nodeid and node_id is not None and hasattr(node_id, "parse"):
            item._id = type(node_id).parse(grouped)
    if hasattr(config, "workerinput"):
        _slow_first(items)


def _slow_first(items: list[pytest.Item]) -> None:
    """Under pytest-xdist, hands the ``slow`` tests out first (the order is kept otherwise).

    xdist's scheduler gives each worker the next test (or ``xdist_group``, the larger groups
    first) in collection order as it finishes the last one, so a long test collected late (the
    wheel build, at the end of the alphabet) ran while the other worker had nothing left. The
    workers all collect the same order, so they agree; without xdist nothing moves.
    """
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _clean_state():
    torch.manual_seed(0)
    leafwatch.unwatch_all()
    yield
    leafwatch.unwatch_all()


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> _demo_run.DemoRun:
    """``leafwatch demo`` run once for the tests that read it (``_demo_run.py``). Without PyTorch
    Lightning (the demo trains with it) they skip locally and fail in CI."""
    require_module("pytorch_lightning")
    return _demo_run.run_demo(tmp_path_factory.mktemp("demo"))

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


@pytest.fixture(autouse=True)
def _clean_state():
    torch.manual_seed(0)
    leafwatch.unwatch_all()
    yield
    leafwatch.unwatch_all()

"""Shared test fixtures: a clean watch registry and deterministic seeds for every test."""

from __future__ import annotations

import pytest
import torch

import leafwatch


@pytest.fixture(autouse=True)
def _clean_state():
    torch.manual_seed(0)
    leafwatch.unwatch_all()
    yield
    leafwatch.unwatch_all()

"""leafwatch: name every tensor that will not train, say why, and give the one-line fix.

The core (``audit``, ``watch``, ``Monitor``) needs only torch; the Lightning callback and the
TensorBoard parts are imported lazily, so ``import leafwatch`` stays cheap.
"""

from __future__ import annotations

from typing import Any

from .audit import audit
from .findings import KINDS, SEVERITIES, Finding, LeafwatchError, LeafwatchWarning, Report
from .monitor import CheckEvent, Monitor
from .watch import unwatch, unwatch_all, watch, watched

__version__ = "0.1.0"

__all__ = [
    "KINDS",
    "SEVERITIES",
    "CheckEvent",
    "Finding",
    "LeafWatch",
    "LeafwatchError",
    "LeafwatchWarning",
    "Monitor",
    "Report",
    "TensorBoardSink",
    "__version__",
    "audit",
    "unwatch",
    "unwatch_all",
    "watch",
    "watched",
]


def __getattr__(name: str) -> Any:
    if name == "LeafWatch":
        from .lightning import LeafWatch

        return LeafWatch
    if name == "TensorBoardSink":
        from .tensorboard import TensorBoardSink

        return TensorBoardSink
    raise AttributeError(f"module 'leafwatch' has no attribute {name!r}")

"""leafwatch: name every tensor that will not train, say why, and give the one-line fix.

The public names are imported on first use, so ``import leafwatch`` is cheap and does not import
torch: TensorBoard imports the Leafwatch tab (``leafwatch.tensorboard_plugin``) through this
package at start-up, and ``leafwatch report`` reads logs without torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from .report.events import CheckEvent
from .options import LeafwatchAssertionError, LeafwatchError, LeafwatchInternalWarning, LeafwatchWarning
from .report.findings import KINDS, SEVERITIES, Finding, Kind, Report, Severity, Status

__version__ = "0.1.0"

#: Public name -> the module that defines it (imported on first use).
_LAZY = {
    "audit": "auditing",
    "assert_trains": "testing",
    "watch": "watching",
    "unwatch": "watching",
    "unwatch_all": "watching",
    "watched": "watching",
    "Monitor": "monitor",
    "LeafWatch": "integrations.lightning",
    "TensorBoardSink": "sinks.tensorboard",
}

__all__ = ["KINDS", "SEVERITIES", "CheckEvent", "Finding", "Kind", "LeafWatch", "LeafwatchAssertionError",
           "LeafwatchError", "LeafwatchInternalWarning", "LeafwatchWarning", "Monitor", "Report", "Severity", "Status",
           "TensorBoardSink", "__version__", "assert_trains", "audit", "unwatch", "unwatch_all", "watch", "watched"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        # A submodule (``leafwatch.monitor``) reached as an attribute, as with an eager package.
        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module 'leafwatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""What a training-framework callback keeps of its Monitor's history, shared by the callbacks.

The live :class:`~leafwatch.Monitor` while training runs; a saved state waiting for the next
start (a resumed run keeps its history); the final report and state once training ended. The
Lightning and Hugging Face callbacks both inherit it, so ``report``, ``state_dict()`` and
``load_state_dict()`` mean the same in both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Report
from ..monitor import Monitor


class MonitorState:
    """The report and the plain-data history of a callback's Monitor, before, during and after training."""

    monitor: Monitor | None = None
    _pending_state: dict[str, Any] | None = None
    _last_report: Report | None = None
    _final_state: dict[str, Any] | None = None

    @property
    def report(self) -> Report:
        """The latest report: the live one during training, the final one after it, the saved one
        before a resumed run starts."""
        if self.monitor is not None:
            return self.monitor.report
        if self._last_report is not None:
            return self._last_report
        if self._pending_state is not None:
            saved = self._pending_state.get("monitor", {})
            return Report.from_dict({"findings": saved.get("records", []), "step": saved.get("step")})
        return Report()

    def state_dict(self) -> dict[str, Any]:
        """Plain data (the Monitor's history), JSON-ready; saved in checkpoints."""
        if self.monitor is not None:
            return {"monitor": self.monitor.state_dict()}
        if self._pending_state is not None:
            return dict(self._pending_state)
        return dict(self._final_state or {})

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take up a history from :meth:`state_dict` (at the next start if not training).

        Raises:
            TypeError: ``state_dict`` is not a mapping.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"`state_dict` must be a mapping from state_dict(), got {type(state_dict).__name__}")
        if not state_dict:
            return
        self._pending_state = dict(state_dict)
        if self.monitor is not None:
            self.monitor.load_state_dict(self._pending_state.get("monitor", {}))
            self._pending_state = None

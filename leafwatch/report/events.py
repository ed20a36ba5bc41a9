"""What a sink receives after each check: :class:`CheckEvent` (torch-free plain data)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from .findings import Report


@dataclasses.dataclass
class CheckEvent:
    """What a sink gets after each check. ``names`` keeps its identity until the lists change.

    Attributes:
        step: The step of the check.
        optimizer: The index of the optimizer checked (None: all of them, or none given).
        report: The report after the check.
        changed: Whether the report changed since the last event.
        names: The names of the tensors checked, in order.
        missing: Indices into ``names`` of the tensors without a gradient at this check.
        coverage: The fraction of ``names`` that had a gradient (None when nothing was checked).
        in_no_optimizer: The names of the tensors that require grad and that no optimizer holds
            (nothing updates them: they are never in ``names``); empty when no optimizer was given.
    """

    step: int
    optimizer: int | None
    report: Report
    changed: bool
    names: tuple[str, ...]
    missing: list[int]
    coverage: float | None
    in_no_optimizer: tuple[str, ...] = ()


class Sinks:
    """The sinks a Monitor writes to, in order; a sink that raises is warned once and skipped.

    Args:
        sinks: Callables taking a :class:`CheckEvent` (optionally with ``close(report)``).
        warn: Warns once per failing place (``warn(where, error)``).
    """

    def __init__(self, sinks: Iterable[Callable[[CheckEvent], Any]], warn: Callable[[str, BaseException], None]) -> None:
        #: The sinks, in order (a Monitor with none builds no event: the report is all it needs).
        self.sinks = list(sinks)
        self._warn = warn
        #: Whether every sink is changes-only (its ``changes_only`` attribute: it does nothing with
        #: a report it already read), so that no event is built while the history stays the same.
        self.changes_only = self._all_changes_only()

    def __len__(self) -> int:
        return len(self.sinks)

    def add(self, sink: Callable[[CheckEvent], Any], *, first: bool = False) -> None:
        """Add ``sink`` last (``first``: before the others, as the console's short lines are)."""
        self.sinks.insert(0 if first else len(self.sinks), sink)
        self.changes_only = self._all_changes_only()

    def _all_changes_only(self) -> bool:
        return all(getattr(sink, "changes_only", False) is True for sink in self.sinks)

    def emit(self, event: CheckEvent) -> None:
        for sink in self.sinks:
            try:
                sink(event)
            except Exception as error:
                self._warn(f"the {type(sink).__name__} sink", error)

    def flush(self) -> None:
        """Each sink's ``flush()``, where it has one (what it wrote reaches its files: the run may end now)."""
        self._each("flush", "flushing")

    def close(self, report: Report) -> None:
        """The end of the run: each sink's ``close(report)``, where it has one."""
        self._each("close", "closing", report)

    def _each(self, method: str, doing: str, *args: Any) -> None:
        """Call each sink's ``method`` with ``args`` where it has one; one that raises is warned (``doing`` it)."""
        for sink in self.sinks:
            call = getattr(sink, method, None)
            if call is not None:
                try:
                    call(*args)
                except Exception as error:
                    self._warn(f"{doing} {type(sink).__name__}", error)

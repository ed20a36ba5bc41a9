"""The console sink: one short warning per new open finding, at the user's line.

Used by ``Monitor(verbose=True)`` / ``attach()`` and the Lightning callback. The line is
:func:`leafwatch.report.format.finding_line` (severity, kind, name, when, the one-line fix); the full
table, causes included, is for summaries (``print(report)``). The warning points at the first
frame outside leafwatch, torch and the training frameworks: the ``optimizer.step()`` or
``trainer.fit(...)`` line.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from ..report.events import CheckEvent
from ..report.findings import Report
from ..options import LeafwatchWarning
from ..report.format import finding_line
from ..observe.frames import stacklevel_outside


class NewFindingWarnings:
    """A sink that warns once per new open finding (a :class:`~leafwatch.LeafwatchWarning`).

    Args:
        warn: Emits the text (default: ``warnings.warn`` at the first frame outside leafwatch).
        every_status: Also say info and intermittent findings (``leafwatch run``'s console), not
            only open ones.
    """

    #: A report it already read says nothing new: the Monitor builds no event for it while the
    #: history stays the same (see :class:`~leafwatch.report.events.Sinks`).
    changes_only = True

    def __init__(self, warn: Callable[[str], None] | None = None, *, every_status: bool = False) -> None:
        self.warned: set[tuple[str, str]] = set()
        self._warn = warn
        self._every_status = every_status
        self._read: Report | None = None  # the last report read at a check

    def __call__(self, event: CheckEvent) -> None:
        # A Monitor hands the same report object again until its history changes: nothing new in it.
        if event.report is not self._read:
            self._read = event.report
            self.report(event.report)

    def close(self, report: Report) -> None:
        """The end of the run: what it decided (a suspicion that waited for evidence) is warned too."""
        self.report(report)

    def report(self, report: Report) -> None:
        shown = [f for f in report if f.status not in ("resolved", "ignored")] if self._every_status else report.open
        for f in shown:
            if f.key in self.warned or f.reason.observed == "pending" or f.details.get("crash"):
                continue  # a finding whose cause is being traced is warned once it is known; a crash's note says it
            self.warned.add(f.key)
            if self._warn is not None:
                self._warn(finding_line(f))
            else:
                warnings.warn(finding_line(f), LeafwatchWarning, stacklevel=stacklevel_outside())

"""The console sink: one short warning per new open finding, at the user's line.

The full table (causes included) is for summaries (``print(report)``); a finding's warning is
short: severity, kind, name and the one-line fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from .events import CheckEvent
from .findings import Finding, LeafwatchWarning, Report
from .options import stacklevel_outside


def short_line(f: Finding) -> str:
    """``leafwatch: ERROR missing_grad `head.weight` (step 3): <fix>`` — one line."""
    step = f" (step {f.first_step})" if f.first_step is not None else ""
    text = f"leafwatch: {f.severity.upper()} {f.kind} `{f.name}`{step}: {f.message}"
    return text + (f" Fix: {f.fix}" if f.fix else "")


class NewFindingWarnings:
    """A sink that warns once per new open finding (a :class:`~leafwatch.LeafwatchWarning`).

    Args:
        warn: Emits the text (default: ``warnings.warn`` at the first frame outside leafwatch).
    """

    def __init__(self, warn: Callable[[str], None] | None = None) -> None:
        self.warned: set[tuple[str, str]] = set()
        self._warn = warn

    def __call__(self, event: CheckEvent) -> None:
        self.report(event.report)

    def report(self, report: Report) -> None:
        for f in report.open:
            if f.key in self.warned or f.details.get("reason") == "pending":
                continue  # a finding whose cause is being traced is warned once it is known
            self.warned.add(f.key)
            if self._warn is not None:
                self._warn(short_line(f))
            else:
                warnings.warn(short_line(f), LeafwatchWarning, stacklevel=stacklevel_outside())

"""What a sink receives after each check: :class:`CheckEvent` (torch-free plain data)."""

from __future__ import annotations

import dataclasses

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
    """

    step: int
    optimizer: int | None
    report: Report
    changed: bool
    names: tuple[str, ...]
    missing: list[int]
    coverage: float | None

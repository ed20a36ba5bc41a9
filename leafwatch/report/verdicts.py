"""Verdicts: what a detector decides, as values; the history applies them, and only it writes.

A detector (:mod:`leafwatch.detectors`) reads the evidence of a check and the findings so far
through a read-only :class:`~leafwatch.report.history.FindingsView`, and returns a list of verdicts.
The check hands them to :meth:`leafwatch.report.history.FindingHistory.apply`, in order, once the
detector has returned: a detector that raises returns nothing, so none of its half-made
decisions reaches the history (the report says ``incomplete`` instead).

The verbs:

=========  ==========================================================================
``open``   a finding seen at this check: added, or merged into the one of its key
           (its first step kept, its count of steps seen bumped)
``hold``   a suspicion waiting for named evidence (``details["pending"]``, a
           :class:`~leafwatch.report.findings.Waiting`): kept out of reports; never takes back a
           finding already shown
``confirm`` a held suspicion the evidence confirmed: shown, as the finding its decision made
``drop``   a held suspicion the evidence dropped: forgotten, never shown
``merge``  findings of one check that one finding speaks for: forgotten (audit()'s "no gradient at all")
``resolve`` an open finding that no longer holds: shown as resolved at ``step``
``set``    a finding replaced as it is (a status or text decided outside the usual merge)
``count``  a finding's step and counts brought up to date: no change a user would see
=========  ==========================================================================

Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .findings import Finding, _WordEnum


class Action(_WordEnum):
    """What a verdict does to the history."""

    OPEN = "open"
    HOLD = "hold"
    CONFIRM = "confirm"
    DROP = "drop"
    MERGE = "merge"
    RESOLVE = "resolve"
    SET = "set"
    COUNT = "count"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One decision of a detector about one finding key.

    Build one with the class methods (``Verdict.open(f)``, ``Verdict.resolve(key, step)``, ...).
    """

    action: Action
    key: tuple[str, str]
    finding: Finding | None = None
    step: int | None = None
    changes: Mapping[str, Any] | None = None

    @classmethod
    def open(cls, f: Finding) -> Verdict:
        return cls(Action.OPEN, f.key, f)

    @classmethod
    def hold(cls, f: Finding) -> Verdict:
        return cls(Action.HOLD, f.key, f)

    @classmethod
    def confirm(cls, key: tuple[str, str], finding: Finding | None = None, **changes: Any) -> Verdict:
        """A held suspicion shown: as ``finding`` when given (the words its decision renders; the held
        one's first step and count kept), else as it was with ``changes`` (data only)."""
        return cls(Action.CONFIRM, key, finding, changes=changes)

    @classmethod
    def drop(cls, key: tuple[str, str]) -> Verdict:
        return cls(Action.DROP, key)

    @classmethod
    def merge(cls, key: tuple[str, str]) -> Verdict:
        return cls(Action.MERGE, key)

    @classmethod
    def resolve(cls, key: tuple[str, str], step: int | None) -> Verdict:
        return cls(Action.RESOLVE, key, step=step)

    @classmethod
    def set(cls, f: Finding) -> Verdict:
        return cls(Action.SET, f.key, f)

    @classmethod
    def count(cls, f: Finding) -> Verdict:
        return cls(Action.COUNT, f.key, f)

    def __repr__(self) -> str:
        return f"Verdict.{self.action.value}({self.key[0]} {self.key[1]!r})"


#: What a detector returns.
Verdicts = list[Verdict]


def open_after(verdicts: Verdicts, kind: str) -> dict[str, bool]:
    """For each name of ``kind`` that ``verdicts`` touch, whether its finding is open once they are
    applied in order (a detector that reads its own decisions before the history applies them).

    ``hold`` and ``drop`` leave a finding's openness as it was: a hold never takes back a shown
    finding and a drop forgets only a held one.
    """
    after: dict[str, bool] = {}
    for v in verdicts:
        if v.key[0] != kind or v.action in (Action.HOLD, Action.DROP):
            continue
        if v.action == Action.CONFIRM:
            after[v.key[1]] = True
        elif v.action == Action.RESOLVE:
            after[v.key[1]] = False
        else:  # open, set, count: the finding as it will stand
            after[v.key[1]] = v.finding is not None and v.finding.status == "open"
    return after

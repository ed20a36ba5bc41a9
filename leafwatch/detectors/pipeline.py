"""The check as one ordered list of parts, each run guarded: a failing part never reads as "no findings".

A check is a sequence of parts (read the structure, read the gradients, judge the watched
tensors, ...). :class:`Pipeline` runs them in their one order; each part returns its detectors'
verdicts and the pipeline hands them to the history, the only writer. A part that raises costs
only its own verdicts (none of them is applied): the failure is warned once (:class:`~leafwatch.LeafwatchInternalWarning`),
training goes on, and the report carries an ``incomplete`` finding that names the part and the
exception in one line, so the console, TensorBoard, the tab and ``leafwatch report`` all say
that part of the check did not run. The finding is resolved at the next check where the part
runs through again.

Torch-free: a part is a detector's ``judge(evidence, state, view, *needed)`` (or any callable of
that form) returning verdicts (or None), with the state it keeps and the states it reads of the
detectors before it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..report.findings import Finding, Kind, Severity
from ..report.history import FindingHistory
from ..options import WarnOnce
from ..report.verdicts import Verdict, Verdicts
from ..report.reasons import Reason
from ..report.words import Members, Words

State = TypeVar("State")  #: what the parts judge (a check's evidence)


@dataclasses.dataclass(frozen=True)
class Part(Generic[State]):
    """One part of the check: what it is called in the user's words, and what it does.

    ``judge(evidence, state, view, *needs)``: the evidence of the check, the part's own ``state``,
    the findings so far (read-only), and the states of the detectors before it that it reads.
    ``when`` names what the part waits on, as ``(owner, attribute)`` pairs (owner None: the field
    of that index in the check's evidence): the part runs only at a check where one is truthy, or
    while it is failing (so that its ``incomplete`` finding can clear); empty: at every check. It
    only saves the call (cold right after backward): the part still checks for itself.
    """

    name: str
    judge: Callable[..., Verdicts | None]
    state: Any = None
    needs: tuple[Any, ...] = ()
    when: tuple[tuple[object, str | int], ...] = ()


def one_line(error: BaseException, limit: int = 200) -> str:
    """``Type: message`` on one line, at most ``limit`` characters."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def incomplete(part: str, error: BaseException, step: int | None) -> Finding:
    """The finding that says ``part`` of the check did not run at ``step``."""
    return Finding(Kind.INCOMPLETE, part, Severity.WARNING, PartFailed(error=one_line(error)), step=step,
                   first_step=step, last_step=step, details={"part": part, "error": one_line(error)})


class PartFailed(Reason, kind=Kind.INCOMPLETE, name="part_failed", fixes="never"):
    """A part of the check raised (``error``: the exception on one line); the others ran."""

    error: str

    def words(self, m: Members) -> Words:
        return Words(f"Part of leafwatch's check did not run: {m.name} failed, so its findings may be missing.",
                     f"an internal failure of leafwatch ({self.error}); every other part of the check ran.",
                     "nothing to change in your code: please report it with the LeafwatchInternalWarning's text; "
                     "the finding clears at the next check where this part runs through")


class Pipeline(Generic[State]):
    """Runs the parts of a check in order; a failing part leaves an ``incomplete`` finding.

    Args:
        parts: The parts, in the order they run.
        history: Where the parts' verdicts and the ``incomplete`` findings are applied.
        warn: Warns once per failing part.
    """

    def __init__(self, parts: Sequence[Part[State]], history: FindingHistory, warn: WarnOnce) -> None:
        #: The parts, in the order they run (fixed at construction).
        self.parts = tuple(parts)
        names = [part.name for part in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"`parts` must have unique names (a failing part is known by its name), got {names}")
        # What run() reads of each part, as plain tuples (a part is a dataclass: each field read
        # is a dict lookup, and right after backward each one runs cold).
        self._plan = self._planned(self.parts)
        self.history = history
        self._view = history.view
        self.warn = warn
        #: The parts that failed at their last run.
        self.failing: set[str] = set()

    @staticmethod
    def _planned(parts: Sequence[Part[State]]) -> tuple[tuple[Any, ...], ...]:
        return tuple((part.name, part.judge, part.state, part.needs, part.when) for part in parts)

    def run(self, evidence: State, step: int | None, parts: Sequence[Part[State]] | None = None) -> None:
        """Run every part (``parts``, default: the pipeline's) on ``evidence``; never raises for a part's failure."""
        failing = self.failing  # (the same set while the parts run: read once)
        plan = self._plan if parts is None else self._planned(parts)
        view = self._view
        for name, judge, state, needs, when in plan:
            if when and not (failing and name in failing):
                for owner, attribute in when:
                    if evidence[attribute] if owner is None else getattr(owner, attribute):  # type: ignore[index]
                        break
                else:
                    continue  # nothing it waits on is there: the part has nothing to do
            try:
                verdicts = judge(evidence, state, view, *needs) if needs else judge(evidence, state, view)
            except Exception as error:  # noqa: BLE001 - a part's failure must not stop training
                self.failed(name, error, step)
            else:
                if verdicts:
                    self.history.apply(verdicts)
                if failing and name in failing:
                    self.ran(name, step)

    def ran(self, part: str, step: int | None) -> None:
        """``part`` ran through at ``step``: its ``incomplete`` finding, if any, is resolved (also for the
        evidence read, run outside :meth:`run`)."""
        if part in self.failing:
            self.failing.discard(part)
            self.history.apply([Verdict.resolve((Kind.INCOMPLETE, part), step)])

    def failed(self, part: str, error: BaseException, step: int | None) -> None:
        """Record that ``part`` failed at ``step`` (also for parts run outside :meth:`run`)."""
        self.warn(part, error, stacklevel=4)
        self.failing.add(part)
        self.history.apply([Verdict.open(incomplete(part, error, step))])

"""The finding history: every finding seen so far by ``(kind, name)``, with a version counter.

The only writer of findings. Detectors return :class:`~leafwatch.report.verdicts.Verdict` values and
read the findings so far through a read-only :class:`FindingsView`; the check applies their
verdicts with :meth:`FindingHistory.apply`, which bumps :attr:`~FindingHistory.version` when
what a user would see changes. "Changed since the last event" is ``version != emitted``, and the
report is built once per version: there are no hand-kept dirty flags.

A finding in the ``pending`` status is a suspicion waiting for evidence (an EMA target that may
still move, a layer that may be dropped on purpose): it stays in the history, out of reports,
until a verdict confirms it or drops it, or the run ends and the detector that held it decides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .findings import KIND_SPECS, Finding, MistakeMemo, Report, Status, apply_ignore
from ..observe.names import ancestors
from .verdicts import Action, Verdict


class FindingsView:
    """The findings so far, read-only: what a detector may know of the history.

    Args:
        records: The history's records by key (read, never written, through this view).
    """

    __slots__ = ("_records",)

    def __init__(self, records: Mapping[tuple[str, str], Finding]) -> None:
        self._records = records

    def get(self, key: tuple[str, str]) -> Finding | None:
        return self._records.get(key)

    def is_open(self, key: tuple[str, str]) -> bool:
        found = self._records.get(key)
        return found is not None and found.status == Status.OPEN

    def __iter__(self) -> Iterator[Finding]:
        return iter(list(self._records.values()))

    def __len__(self) -> int:
        return len(self._records)

    def pending(self) -> list[Finding]:
        pending = Status.PENDING  # (an enum member's lookup costs 0.2 µs on Python 3.11: once per pass)
        return [f for f in self._records.values() if f.status == pending]

    def open_names(self, kind: str) -> set[str]:
        """The names with an open finding of ``kind``."""
        open_ = Status.OPEN
        return {f.name for key, f in self._records.items() if key[0] == kind and f.status == open_}


class FindingHistory(FindingsView):
    """Findings over time; the report of the current version, with ``ignore`` applied.

    Reads as a :class:`FindingsView`; only :meth:`apply` (and :meth:`load`) write.

    Args:
        ignore: Pattern -> reason (validated, see :mod:`leafwatch.options`).
    """

    __slots__ = ("ignore", "tensor_names", "nothing_to_check", "version", "revision", "_report", "_report_revision",
                 "view", "_lifted", "_mistakes", "_module_counts")

    def __init__(self, ignore: Mapping[str, str] | None = None) -> None:
        super().__init__({})
        self.ignore = dict(ignore or {})
        #: The qualified names of the model's trainable tensors (set by the Checker from the
        #: structure): a mistake grouped by module is named by the largest module whose
        #: tensors all share it (`aux_head`, not `aux_head.0` and `aux_head.2`).
        self.tensor_names: Callable[[], Iterable[str]] | None = None
        #: Set by the Checker from the structure: no tensor requires grad and nothing is watched
        #: (the report says "nothing to check").
        self.nothing_to_check = False
        #: Bumped by every change a user would see (a sink logs the report again).
        self.version = 0
        #: Bumped by every write (the report is rebuilt: step counts and last steps too); the
        #: same report object is handed out while it stays the same.
        self.revision = 0
        self._report: Report = Report(step=0)
        self._report_revision = 0
        # What the last report was built from: a rebuild reworks only the mistakes that changed.
        self._lifted: dict[int, tuple[Finding, str, Finding]] = {}
        self._mistakes = MistakeMemo()
        self._module_counts = ModuleCounts()
        #: What detectors read: the same records, no way to write them.
        self.view = FindingsView(self._records)

    # -- reading -----------------------------------------------------------------------------
    def as_dict(self) -> dict[tuple[str, str], Finding]:
        """Every finding by key, the ``ignore`` patterns applied (a new dict)."""
        return {f.key: f for f in apply_ignore(self._records.values(), self.ignore)}

    def report(self, step: int) -> Report:
        """The current report (built once per change; pending findings left out)."""
        if self._report_revision != self.revision:
            pending = Status.PENDING
            shown = [f for f in self._records.values() if f.status != pending]
            names = self.tensor_names() if self.tensor_names is not None and shown else ()
            lifted = lift_to_modules(shown, names, self._lifted, self._module_counts)
            self._report = Report(apply_ignore(lifted, self.ignore), step=step, memo=self._mistakes)
            self._report_revision = self.revision
        else:
            self._report.step = step
        self._report.nothing_to_check = self.nothing_to_check
        return self._report

    # -- writing -----------------------------------------------------------------------------
    def apply(self, verdicts: Iterable[Verdict]) -> None:
        """Apply detectors' verdicts in order (see :mod:`leafwatch.report.verdicts`)."""
        for v in verdicts:
            action = v.action
            if action is Action.OPEN:
                self._upsert(v.finding)  # type: ignore[arg-type]
            elif action is Action.RESOLVE:
                self._resolve(v.key, v.step)
            elif action is Action.HOLD:
                self._hold(v.finding)  # type: ignore[arg-type]
            elif action is Action.CONFIRM:
                self._confirm(v.key, v.finding, **(v.changes or {}))
            elif action is Action.DROP:
                self._drop(v.key)
            elif action is Action.MERGE:
                self._drop(v.key, Status.OPEN)
            elif action is Action.SET:
                self._put(v.finding)  # type: ignore[arg-type]
            elif action is Action.COUNT:  # new steps and counts only: no version change
                self._records[v.key] = v.finding  # type: ignore[assignment]
                self.revision += 1
            else:  # pragma: no cover - a new Action without its branch here
                raise ValueError(f"`verdicts` holds an unknown action {action!r}")

    def _changed(self) -> None:
        self.version += 1
        self.revision += 1

    def _upsert(self, f: Finding) -> None:
        """Add a finding, or update the one of the same key (keeping its first step and count)."""
        old = self._records.get(f.key)
        if old is None:
            self._put(f)
            return
        updated = f.replace(first_step=old.first_step if old.first_step is not None else f.first_step,
                            steps_seen=old.steps_seen + 1)
        self._records[f.key] = updated
        self.revision += 1
        # Compared as data: a count alone (the steps an intermittent tensor missed) is no change worth
        # logging again (it would rewrite the whole report every other step of a routed model).
        if not old.same(updated):
            self.version += 1

    def _put(self, f: Finding) -> None:
        """Replace the record of ``f.key`` as it is (no merge with the old one) and bump the version."""
        self._records[f.key] = f
        self._changed()

    def _resolve(self, key: tuple[str, str], step: int | None) -> None:
        """Mark an open (or pending) finding resolved."""
        old = self._records.get(key)
        if old is None or old.status not in (Status.OPEN, Status.PENDING):
            return
        if old.status == Status.PENDING:
            del self._records[key]  # a suspicion that the evidence dropped was never shown
        else:
            self._records[key] = old.replace(status=Status.RESOLVED, last_step=step)
        self._changed()

    def _hold(self, f: Finding) -> None:
        """Keep ``f`` as a suspicion (``pending``) until :meth:`confirm` or :meth:`drop`."""
        old = self._records.get(f.key)
        if old is not None and old.status != Status.PENDING:
            return  # already decided: a hold never takes back a shown finding
        self._upsert(f.replace(status=Status.PENDING))

    def _confirm(self, key: tuple[str, str], finding: Finding | None = None, **changes: Any) -> None:
        """Turn a pending finding into an open one: ``finding`` (its first step and count those of the
        pending one), or the pending one with ``changes``."""
        old = self._records.get(key)
        if old is not None and old.status == Status.PENDING:
            self._put(old.replace(status=Status.OPEN, **changes) if finding is None else finding.replace(
                status=Status.OPEN, first_step=old.first_step, steps_seen=old.steps_seen, **changes))

    def _drop(self, key: tuple[str, str], status: Status = Status.PENDING) -> None:
        """Forget a pending finding (the evidence says it was intended), or an open one another
        finding speaks for (``status``)."""
        old = self._records.get(key)
        if old is not None and old.status == status:
            del self._records[key]
            self._changed()

    # -- state -------------------------------------------------------------------------------
    def to_list(self) -> list[dict[str, Any]]:
        return [f.to_dict() for f in self._records.values()]

    def load(self, records: Iterable[Finding]) -> None:
        self._records.clear()  # the view reads this same dict
        self._records.update((f.key, f) for f in records)
        self._changed()


def lift_to_modules(findings: list[Finding], tensor_names: Iterable[str],
                    memo: dict[int, tuple[Finding, str, Finding]] | None = None,
                    counts: ModuleCounts | None = None) -> list[Finding]:
    """Name the mistakes grouped by module (:attr:`KindSpec.grouped_by`) by the largest module
    whose trainable tensors all have a finding of that kind, status and group: one module left
    out of the optimizer is one finding however deep its layers go. That module is each
    finding's ``details["cover"]``: its group (:func:`~leafwatch.report.findings.group_of`) unless its
    detector named one (a cut point), and what one ``ignore`` pattern of the mistake names. A top-level module
    is the largest (never the whole model).

    ``memo`` (a dict kept by the caller) holds the findings lifted by the last call: a finding
    given again with the same cover comes back as the same object (so the mistakes made of
    unchanged findings are not regrouped, see :data:`~leafwatch.report.findings.MistakeMemo`);
    ``counts`` (kept by the caller too) the modules' tensor counts of the last names given.

    Example::

        >>> found = [Finding("missing_grad", n, "error", "m") for n in ("aux.0.weight", "aux.2.weight")]
        >>> [f.details["cover"] for f in lift_to_modules(found, ["aux.0.weight", "aux.2.weight", "body.weight"])]
        ['aux', 'aux']
    """
    names = tensor_names if isinstance(tensor_names, tuple) else tuple(tensor_names)
    under = (counts if counts is not None else ModuleCounts()).of(names)
    if not under:
        return findings
    # Findings of the same kind, status and detector-named group count together, per module.
    having: Counter[tuple[tuple[str, str, str], str]] = Counter()
    lifted: list[tuple[Finding, tuple[str, str, str], tuple[str, ...]]] = []
    for f in findings:
        spec = KIND_SPECS.get(f.kind)  # type: ignore[call-overload]
        if spec is None or spec.grouped_by != "module":
            continue
        alike = (f.kind, f.status, str(f.details.get("group") or ""))
        modules = ancestors(f.name)
        lifted.append((f, alike, modules))
        having.update((alike, module) for module in modules)
    kept: dict[int, tuple[Finding, str, Finding]] = {}
    for f, alike, modules in lifted:
        cover = None
        for module in modules:
            if having.get((alike, module)) != under.get(module):
                break
            cover = module
        if cover is not None:
            last = (memo or {}).get(id(f))
            if last is None or last[0] is not f or last[1] != cover:
                last = (f, cover, f.replace(details={**f.details, "cover": cover}))
            kept[id(f)] = last
    if memo is not None:
        memo.clear()
        memo.update(kept)  # the last call's only (each entry holds its finding: no id is reused)
    return [kept[id(f)][2] if id(f) in kept else f for f in findings]


class ModuleCounts:
    """How many of the model's trainable tensors each module path holds, for the last names
    given (the Checker gives the same tuple at every check: worked out again only for new names)."""

    __slots__ = ("_names", "_under")

    def __init__(self) -> None:
        self._names: tuple[str, ...] | None = None
        self._under: dict[str, int] = {}

    def of(self, names: tuple[str, ...]) -> dict[str, int]:
        if self._names is not names and self._names != names:
            self._names, self._under = names, Counter(module for name in names for module in ancestors(name))
        return self._under


def parse_state(state: Any) -> tuple[int, list[Finding], dict[str, int], dict[int | None, int]]:
    """Read a ``Monitor.state_dict()``: the step, the findings, miss counts by name, check counts.

    Raises:
        TypeError: ``state`` is not a mapping.
        ValueError: a part of it is not what ``state_dict()`` writes.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"`state` must be a mapping from state_dict(), got {type(state).__name__}")
    step = state.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"`state['step']` must be an int, got {type(step).__name__}: {step!r:.80}")
    records = []
    for i, data in enumerate(state.get("records", ())):
        try:
            records.append(Finding.from_dict(data))
        except (TypeError, AttributeError) as error:
            raise ValueError(f"`state['records'][{i}]` is not a finding from state_dict(), got {data!r:.80}") from error
    misses = state.get("misses", {})
    if not isinstance(misses, Mapping):
        raise ValueError(f"`state['misses']` must be a mapping name -> count, got {type(misses).__name__}: {misses!r:.80}")
    checks_done = state.get("checks", {})
    if not isinstance(checks_done, Mapping):
        raise ValueError(f"`state['checks']` must be a mapping optimizer -> count, got {type(checks_done).__name__}: {checks_done!r:.80}")
    counts = {int(k) if k != "None" else None: int(v) for k, v in checks_done.items()}
    return step, records, dict(misses), counts

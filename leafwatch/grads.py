"""The gradient tracker: per-tensor streaks of missing gradients, and the findings they make.

Fed the indices of the tensors whose ``.grad`` was None at a check (the Monitor's one read of
each ``p.grad``), it keeps for each tensor the current streak, the total misses and the longest
streak before, and writes ``missing_grad`` findings into the history: open after ``patience``
checks in a row, ``intermittent`` (info) once the tensor got gradients at other checks, open
again as ``stalled`` when an intermittent tensor goes far longer than before without one.
Only the few tensors that miss are touched: a healthy step does no work here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

from . import checks, inventory, outside, tracing
from .findings import Finding, Severity, Status
from .history import FindingHistory
from .structure import CheckList
from .watching import WatchEntry

#: An intermittent tensor is reported again (a warning) once it goes this many checks in a row
#: without a gradient, and at least twice its longest gap before: it stopped training.
STALLED_AFTER = 100

_TRACED_NOTHING = ("unknown: the forward hooks on {shown} saw the whole step and found no module-level "
                   "cause: `{name}` is probably used outside any module's forward (in a function or the "
                   "training loop), where a `.detach()`, `torch.no_grad()` or a `torch.tensor(...)` rewrap "
                   "cut it. Pass `loss=` to check() to walk the loss's graph.")
_GOT_IT_LATER = ("`{name}` got no gradient at first and got one again at step {step}: it is used at some "
                 "steps only (routing, branches, alternating optimizers).")
_PENDING_CAUSE = ("being traced: leafwatch armed forward hooks on `{module}` and will say why at "
                  "the next check.")


class GradientTracker:
    """Streaks and counts of missing gradients by tensor id, turned into findings.

    Args:
        history: Where the findings go.
        patience: Checks in a row without a gradient before ``missing_grad`` is reported.
        diagnose: Whether forward hooks explain the misses (else the cause is never "pending").
    """

    def __init__(self, history: FindingHistory, patience: int, diagnose: bool) -> None:
        self.history = history
        self.patience = patience
        self.diagnose = diagnose
        #: Whether the Monitor was created before any gradient existed (it saw the run from its start).
        self.from_start = True
        self.streak: dict[int, int] = {}
        self.misses: dict[int, int] = {}
        self.longest: dict[int, int] = {}
        self._restored: dict[str, int] = {}

    def __bool__(self) -> bool:
        """Whether some tensor is in a streak of missing gradients now."""
        return bool(self.streak)

    def update(self, clist: CheckList, missing: list[int], step: int, *, tracer: tracing.Tracer,
               reachable: set[int] | None, skip: set[int]) -> None:
        """Record one check of ``clist``: ``missing`` are the indices without a gradient.

        ``skip`` holds ids reported elsewhere (watched tensors, replaced ones).
        """
        now: set[int] = set()
        for i in missing:
            p = clist.params[i]
            pid = id(p)
            if not p.requires_grad or pid in skip:
                continue
            now.add(pid)
            streak = self.streak[pid] = self.streak.get(pid, 0) + 1
            misses = self.misses[pid] = self.misses.get(pid, 0) + 1
            if streak < self.patience:
                continue
            name, info = clist.names[i], clist.infos[i]
            if info is None and self.history.is_open(("stale_param", name)):
                continue  # the replaced tensor: its stale_param finding already says it will not train
            self._report_miss(clist, p, name, info, clist.checks_of(pid), streak, misses, step, tracer, reachable)
        for pid in [k for k in self.streak if k in clist.ids and k not in now]:
            self._recovered(clist, pid, step)

    @staticmethod
    def _siblings_got_grads(clist: CheckList, info: inventory.ParamInfo) -> bool:
        return any(other is not None and other is not info and other.module == info.module and q.grad is not None
                   for q, other in zip(clist.params, clist.infos))

    def _report_miss(self, clist: CheckList, p: torch.Tensor, name: str, info: inventory.ParamInfo | None, checks_of_p: int,
                     streak: int, misses: int, step: int, tracer: tracing.Tracer,
                     reachable: set[int] | None) -> None:
        pid = id(p)
        old = self.history.get(("missing_grad", name))
        explanation = None
        if info is not None and info.module not in tracer.records and self._siblings_got_grads(clist, info):
            # The module never ran through its hooks, yet its other parameters got gradients.
            explanation = tracing.called_directly(name, info.module)
        elif info is not None:
            explanation = tracing.explain_missing(name, info.module, info.attribute, tracer.records,
                                                  tracer.armed_since_reset)
        if old is not None and explanation is None and old.details.get("reason") not in (None, "unknown", "pending"):
            # Explained before and nothing new: keep the cause, update the counts.
            self.history.upsert(self._stalled(
                old.replace(step=step, last_step=step,
                            status=Status.OPEN if old.status != Status.INTERMITTENT else Status.INTERMITTENT,
                            details={**old.details, "checks": checks_of_p, "steps_without_grad": misses}),
                pid, streak, checks_of_p, misses))
            return
        f = checks.missing_grad(name, p, step=step, explanation=explanation, info=info,
                                reachable=None if reachable is None else pid in reachable,
                                checks=checks_of_p, misses=misses, watched_from_start=self.from_start)
        traced_before = old is not None and old.details.get("reason") in ("pending", "unknown")
        if explanation is None and reachable is None and self.diagnose and info is not None and not traced_before:
            f = f.replace(cause=_PENDING_CAUSE.format(module=info.module or "the model"),
                          details={**f.details, "reason": "pending"})
        elif explanation is None and reachable is None and traced_before:
            # Traced for a whole step and still nothing to say: the placeholder goes, the truth stays.
            f = f.replace(cause=_TRACED_NOTHING.format(name=name, module=info.module if info else "",
                                                       shown=f"`{info.module}`" if info and info.module else "the model"),
                          details={**f.details, "reason": "unknown"})
        if misses < checks_of_p:
            f = checks.intermittent(f, checks_of_p, misses, step)
        elif old is not None and old.status == Status.INTERMITTENT:
            f = f.replace(status=Status.INTERMITTENT, severity=Severity.INFO)
        self.history.upsert(self._stalled(f, pid, streak, checks_of_p, misses))

    def _recovered(self, clist: CheckList, pid: int, step: int) -> None:
        """A tensor in a streak got a gradient: an open finding becomes intermittent."""
        self.longest[pid] = max(self.longest.get(pid, 0), self.streak.pop(pid))
        key = ("missing_grad", clist.name_of(pid))
        old = self.history.get(key)
        if old is not None and old.details.get("reason") == "pending":
            # The placeholder promised a cause at the next check: the gradient came instead.
            old = old.replace(cause=_GOT_IT_LATER.format(name=old.name, step=step),
                              details={**old.details, "reason": "came_back"})
            if old.status != Status.OPEN:
                self.history.put(old)
        if old is not None and old.status == Status.OPEN:
            self.history.put(checks.intermittent(old, clist.checks_of(pid), self.misses.get(pid, 0), step))

    def _stalled(self, f: Finding, pid: int, streak: int, checks_of_p: int, misses: int) -> Finding:
        """An intermittent tensor without a gradient for long: open again, as a warning."""
        limit = max(self.patience, STALLED_AFTER, 2 * self.longest.get(pid, 0))
        if misses >= checks_of_p or streak < limit:
            return f
        return f.replace(
            status=Status.OPEN, severity=Severity.WARNING,
            message=f"`{f.name}` got gradients before, but none in {limit} or more checks in a row: "
            "it stopped training.",
            details={**f.details, "stalled_for": streak})

    def missing_ids(self, lists: Iterable[CheckList]) -> list[int]:
        """The ids in a streak now that belong to one of ``lists``."""
        lists = list(lists)
        return [pid for pid in self.streak if any(pid in clist.ids for clist in lists)]

    # -- state -------------------------------------------------------------------------------
    def misses_by_name(self, names: Mapping[int, str]) -> dict[str, int]:
        return {names[k]: v for k, v in self.misses.items() if k in names}

    def restore(self, misses: Mapping[str, int]) -> None:
        """Miss counts by name from a saved state, applied by :meth:`apply_restored`."""
        self._restored = dict(misses)

    def apply_restored(self, names: Mapping[int, str]) -> None:
        """Map restored counts onto the tensors that carry those names now."""
        if not self._restored:
            return
        for pid, name in names.items():
            if name in self._restored:
                self.misses[pid] = self._restored[name]
                record = self.history.get(("missing_grad", name))
                if record is not None and record.status == Status.OPEN:
                    # Still missing when saved: a gradient after the resume ends it as usual.
                    self.streak[pid] = self.patience
        self._restored = {}


class WatchedTracker:
    """Whether each watched tensor got a gradient since the last check, turned into findings.

    A watched finding that does not recur (a gradient arrived, or the tensor is gone) is
    resolved; that scan runs only while such a finding can be open, not every step.
    """

    def __init__(self, history: FindingHistory) -> None:
        self.history = history
        self._counts: dict[str, tuple[WatchEntry, int]] = {}
        self._verdicts: dict[str, tuple[WatchEntry, bool, object]] = {}
        #: Set by the owner to anything that changes when the optimizers or their groups change.
        self.optimizers_version: object = None
        self._may_be_open = True

    def update(self, entries: list[WatchEntry], step: int, inv: inventory.Inventory | None,
               in_optimizer: Callable[[WatchEntry], bool] | None = None) -> None:
        """Record one check of the watched tensors.

        ``in_optimizer`` says whether an entry's tensor is in an optimizer that judges it; with
        it, a watched leaf that got a gradient and is in none is ``not_in_optimizer``.
        """
        if not (entries or self._may_be_open):
            return  # nothing watched and no watched finding open: nothing to do at all
        current: set[tuple[str, str]] = set()
        counts: dict[str, tuple[WatchEntry, int]] = {}
        if entries:
            got = {}
            for e in entries:
                seen = self._counts.get(e.name)
                # A name watched again (the next step's activation) is a new entry that counts from 0.
                last = seen[1] if seen is not None and seen[0] is e else 0
                t = e.tensor()
                got[e.name] = e.grads_seen > last or (
                    e.is_leaf and e.grads_seen == 0 and t is not None and t.grad is not None)
                counts[e.name] = (e, e.grads_seen)
            found = checks.watched_findings(entries, step, got, inv)
            if in_optimizer is not None:
                found += outside.watched_in_no_optimizer(
                    entries, step, model_ids=set(inv.tensors) if inv is not None else set(),
                    in_optimizer=self._cached(in_optimizer))
            for f in found:
                current.add(f.key)
                self.history.upsert(f)
        self._counts = counts  # only the live entries: bounded by what is watched now
        self._verdicts = {k: v for k, v in self._verdicts.items() if k in counts}
        self._may_be_open = bool(current)
        self.history.resolve_where(lambda f: f.details.get("source") == "watch" and f.key not in current, step)

    def _cached(self, in_optimizer: Callable[[WatchEntry], bool]) -> Callable[[WatchEntry], bool]:
        """``in_optimizer`` asked once per entry (and again when the optimizers change)."""
        def cached(entry: WatchEntry) -> bool:
            verdict = self._verdicts.get(entry.name)
            if verdict is None or verdict[0] is not entry or verdict[2] != self.optimizers_version:
                verdict = self._verdicts[entry.name] = (entry, in_optimizer(entry), self.optimizers_version)
            return verdict[1]
        return cached

    def sizes(self) -> int:
        return len(self._counts)

"""Watched tensors (``watch()``, ``Monitor(tensors=...)``): did each get a gradient since the last check?

A watched non-leaf or a watched tensor without a gradient is a finding of its own (under the
name it was watched by); a watched leaf that gets gradients while no optimizer holds it is
judged by the gradient rule (:class:`~leafwatch.observe.changes.HandUpdates`): held one check, then
nothing when its value changed (updated by hand) and ``not_in_optimizer`` when it did not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from .. import watching
from ..observe import changes
from ..observe.inventory import Inventory
from ..report.findings import Finding, Status, Waiting
from ..report.history import FindingsView
from ..report.verdicts import Verdict, Verdicts
from ..watching import WatchEntry
from . import fixes, leaves, outside
from .constructors import make
from ..report.reasons import Reason
from ..report.words import ADVICE, Members, Words, code
from ..observe.evidence import INVENTORY, SEEN, STEP, Evidence


def waits_on(state: WatchedState, seen: Any, *needed: Any) -> tuple[tuple[object, str], ...]:
    """What the check of watched tensors waits on: a tensor watched (with ``watch()`` or the Monitor's
    own), or a watched finding open."""
    return (watching.DEFAULT, "by_name"), (seen.watches, "by_name"), (state, "may_be_open")


def judge(evidence: Evidence, state: WatchedState, view: FindingsView) -> Verdicts | None:
    """At a check: each watched tensor (nothing to do with nothing watched and no watched finding open)."""
    seen = evidence[SEEN]
    if not (watching.DEFAULT.by_name or seen.watches.by_name or state.may_be_open):
        return None
    entries = seen.watch_entries()
    if entries:
        state.optimizers_version = (seen.cache.rebuilds, seen.observer.generation)
    return update(state, seen.hands["watched"], view, entries, evidence[STEP], evidence[INVENTORY],
                  lambda entry: in_judging_optimizer(seen, entry))


def in_judging_optimizer(seen: Any, entry: WatchEntry) -> bool:
    """A Monitor's own ``tensors=`` are judged by its optimizers; ``watch()``-ed tensors by its
    optimizers and every optimizer its observer saw stepping (never by one that only an ``audit()``
    call was given). A Monitor without optimizers judges nothing."""
    own = any(e is entry for e in seen.watches.entries())
    mine = seen.cache.optimizers
    optimizers = mine if own or not mine else [*mine, *seen.observer.stepping_optimizers()]
    return not optimizers or id(entry.tensor()) in outside.optimizer_ids(optimizers)


def decide_pending(evidence: Evidence, state: None, view: FindingsView, judged: WatchedState) -> Verdicts:
    """At the end of the run: each watched finding still held is decided (updated by hand, or not); after an
    exception it stays undecided (the check that would show its value change never came)."""
    if evidence[SEEN].interrupted:
        return []
    out: Verdicts = []
    for f in view.pending():
        if f.details.get("source") == "watch":
            decided = decide(judged, evidence[SEEN].hands["watched"], f)
            out.append(Verdict.drop(f.key) if decided is None else Verdict.set(decided))
    return out


@dataclasses.dataclass(eq=False, slots=True)
class WatchedState:
    """Whether each watched tensor got a gradient since the last check, turned into findings.

    A watched finding that does not recur (a gradient arrived, or the tensor is gone) is
    resolved; that scan runs only while such a finding can be open, not every step.
    """

    counts: dict[str, tuple[WatchEntry, int]] = dataclasses.field(default_factory=dict)
    _verdicts: dict[str, tuple[WatchEntry, bool, object]] = dataclasses.field(default_factory=dict)
    #: Set by the owner to anything that changes when the optimizers or their groups change.
    optimizers_version: object = None
    #: Whether a watched finding may be open (else a check with nothing watched skips this detector).
    may_be_open: bool = True


def update(state: WatchedState, hand: changes.HandUpdates, view: FindingsView, entries: list[WatchEntry], step: int,
           inv: Inventory | None, in_optimizer: Callable[[WatchEntry], bool] | None = None) -> Verdicts:
    """Record one check of the watched tensors; returns the verdicts.

    ``in_optimizer`` says whether an entry's tensor is in an optimizer that judges it; with
    it, a watched leaf that got a gradient and is in none is ``not_in_optimizer``.
    """
    if not (entries or state.may_be_open):
        return []  # nothing watched and no watched finding open: nothing to do at all
    out: Verdicts = []
    current: set[tuple[str, str]] = set()
    counts: dict[str, tuple[WatchEntry, int]] = {}
    if entries:
        got = {}
        for e in entries:
            seen = state.counts.get(e.name)
            # A name watched again (the next step's activation) is a new entry that counts from 0.
            t = e.tensor()
            if e.is_leaf and (seen is None or seen[0] is not e):
                # First sight of a leaf: its end state is its .grad (the watch hook may have
                # counted gradients from before this check's owner existed).
                got[e.name] = t is not None and t.grad is not None
            else:
                last = seen[1] if seen is not None and seen[0] is e else 0
                got[e.name] = e.grads_seen > last or (
                    e.is_leaf and e.grads_seen == 0 and t is not None and t.grad is not None)
            counts[e.name] = (e, e.grads_seen)
        for f in watched_findings(entries, step, got, inv):
            current.add(f.key)
            out.append(Verdict.open(f))
        if in_optimizer is not None:
            current |= _outside_optimizers(state, hand, entries, step, inv, in_optimizer, out)
    state.counts = counts  # only the live entries: bounded by what is watched now
    state._verdicts = {k: v for k, v in state._verdicts.items() if k in counts}
    state.may_be_open = bool(current)
    for f in view:
        if f.details.get("source") == "watch" and f.key not in current:
            if f.status == Status.OPEN:
                out.append(Verdict.resolve(f.key, step))
            elif f.status == Status.PENDING:
                out.append(Verdict.drop(f.key))
    return out


def _outside_optimizers(state: WatchedState, hand: changes.HandUpdates, entries: list[WatchEntry], step: int,
                        inv: Inventory | None, in_optimizer: Callable[[WatchEntry], bool], out: Verdicts) -> set[tuple[str, str]]:
    """The gradient rule for watched leaves in no optimizer (as the module docstring says); the keys written."""
    keys = set()
    found = outside.watched_in_no_optimizer(entries, step, model_ids=set(inv.tensors) if inv is not None else set(),
                                            in_optimizer=_cached(state, in_optimizer), inventory=inv)
    tensors = {e.name: e.tensor() for e in entries}
    for f in found:
        t = tensors.get(f.name)
        verdict = hand.verdict(t) if t is not None else "unchanged"
        if verdict == "by_hand":
            continue
        keys.add(f.key)
        out.append(Verdict.hold(f.replace(details={**f.details, "pending": Waiting.MEMBERSHIP}))
                   if verdict == "wait" else Verdict.open(f))
    return keys


def decide(state: WatchedState, hand: changes.HandUpdates, f: Finding) -> Finding | None:
    """At the end of the run: a held watched finding is open unless the tensor changed since
    the check that held it (updated by hand)."""
    entry = state.counts.get(f.name)
    t = entry[0].tensor() if entry is not None else None
    if t is None or hand.verdict(t, final=True) == "by_hand":
        return None
    return f.replace(status=Status.OPEN, details={k: v for k, v in f.details.items() if k != "pending"})


def _cached(state: WatchedState, in_optimizer: Callable[[WatchEntry], bool]) -> Callable[[WatchEntry], bool]:
    """``in_optimizer`` asked once per entry (and again when the optimizers change)."""
    def cached(entry: WatchEntry) -> bool:
        verdict = state._verdicts.get(entry.name)
        if verdict is None or verdict[0] is not entry or verdict[2] != state.optimizers_version:
            verdict = state._verdicts[entry.name] = (entry, in_optimizer(entry), state.optimizers_version)
        return verdict[1]
    return cached


# -- its words ---------------------------------------------------------------------------------
def not_requiring_grad(name: str, t: torch.Tensor, step: int | None, **details: Any) -> Finding:
    """``missing_grad``/``requires_grad_false``: a tensor handed or watched to train that does not
    require grad."""
    return make(RequiresGradFalse(variable=fixes.variable_for(t)), name, "error", tensor=t, step=step, **details)


class RequiresGradFalse(Reason, kind="missing_grad", name="requires_grad_false"):
    """A tensor handed or watched to train that does not require grad (``variable``: the user's name for it)."""

    variable: str | None = None

    def words(self, m: Members) -> Words:
        variable = self.variable if m.single else None
        call = f"call `{variable}.requires_grad_()`" if variable else "call `requires_grad_()` on your tensor"
        return Words(
            f"{m.who} does not require grad: it will never get a gradient.",
            f"{m.who} does not require grad: it was created without `requires_grad=True`, frozen with "
            "`requires_grad_(False)`, or it is the result of `.detach()` (or of an op under `torch.no_grad()`), "
            "which returns a new leaf that does not require grad.",
            f"create it with `requires_grad=True`, or {call} "
            "(drop the `.detach()` if it is meant to share the original's gradient)",
            code(f"{variable}.requires_grad_()") if variable else ADVICE)


def watched_findings(entries: Iterable[WatchEntry], step: int | None,
                     got_grad: Mapping[str, bool], inventory: Inventory | None = None) -> list[Finding]:
    """Findings for tensors flagged with ``watch()``; ``got_grad`` says which saw a gradient."""
    out = []
    entries = list(entries)
    for entry in entries:
        t = entry.tensor()
        if t is None:
            continue
        if entry.expect_leaf and not entry.is_leaf:
            out.append(leaves.non_leaf(entry.name, t, step=step, inventory=inventory, found=entry.origin,
                                where=f" (watched at {entry.location})", watched=entries, location=entry.location,
                                hand_over=True).with_details(source="watch"))
            continue
        if not entry.expect_grad:
            continue
        if not t.requires_grad:
            out.append(not_requiring_grad(entry.name, t, step, source="watch"))
        elif not got_grad.get(entry.name, False):
            out.append(make(WatchedUnused(leaf=entry.is_leaf), entry.name, "error", tensor=t, step=step, source="watch"))
    return out


class WatchedUnused(Reason, kind="missing_grad", name="watched_unused", fixes="never"):
    """A watched tensor that got no gradient (``leaf``), or none flowed through it, in this step."""

    leaf: bool

    def words(self, m: Members) -> Words:
        what = "no gradient reached it" if self.leaf else "no gradient flowed through it"
        return Words(
            f"watched tensor{'' if m.single else 's'} `{m.name}`: {what} in this step.",
            "it is not used in the computation of the loss, or it is cut off from it "
            "(`.detach()`, `torch.no_grad()`, a NumPy round trip or a `torch.tensor(...)` rewrap).",
            f"use {m.who} in the loss through torch ops only")

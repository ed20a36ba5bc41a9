"""Missing gradients held as suspicions until the evidence decides: intent or accident?

Two kinds of miss are not reported when first seen:

- a tensor whose module ran only under ``no_grad``: an EMA / target network updated by other
  means, or an encoder run under ``no_grad`` by mistake. Held (``Waiting.TARGET``) until its
  value is seen to change between checks (a target: no finding, never followed again) or not
  (``missing_grad``, saying it did not change either);
- a layer of a ``ModuleList`` that never ran while its siblings did: a layer dropped at random
  (LayerDrop), unless the chance that random drops skip it at every check is negligible
  (``Waiting.LAYERDROP`` until then).

What a run ends with still held is decided by :func:`decide`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ..observe import changes, follow
from . import causes
from .constructors import transition
from ..report.reasons import Transition
from ..report.words import Members, Words
from ..report.findings import Finding, Severity, Status, Waiting
from ..report.verdicts import Verdict, Verdicts


@dataclasses.dataclass(eq=False, slots=True)
class HeldState:
    """The suspicions of the gradient detector, and the evidence that decides them."""

    #: Tensors no gradient reaches that change by other means (EMA / target networks).
    targets: set[int] = dataclasses.field(default_factory=set)
    _new_targets: set[int] = dataclasses.field(default_factory=set)
    evidence: changes.ChangeEvidence = dataclasses.field(default_factory=changes.ChangeEvidence)
    #: Tensors held as possible targets: id -> (the tensor, followed through its module, the name).
    suspects: dict[int, tuple[follow.Ref, str]] = dataclasses.field(default_factory=dict)
    #: Tensors whose suspicion the evidence settled: reported as plain misses from now on.
    decided: set[int] = dataclasses.field(default_factory=set)
    #: How often each layer's siblings were skipped (LayerDrop).
    skips: changes.SiblingSkips = dataclasses.field(default_factory=changes.SiblingSkips)


def forget(state: HeldState, alive: set[int]) -> None:
    """A new reading of the structure: forget the tensors that are gone."""
    state.targets &= alive
    state.decided &= alive
    gone = [pid for pid in state.suspects if pid not in alive]
    for pid in gone:
        del state.suspects[pid]
    state.evidence.forget(gone)


def take_new_targets(state: HeldState) -> set[int]:
    """Targets found since the last call (the structure cache leaves them out of the checks)."""
    found, state._new_targets = state._new_targets, set()
    return found


def judges(state: HeldState, pid: int, reason: str | None) -> bool:
    """Whether a miss is a target suspicion: held before, or its module ran under ``no_grad``."""
    return pid not in state.decided and (pid in state.suspects or reason == "grad_disabled")


def target(state: HeldState, p: torch.Tensor, name: str, old: Finding | None, explanation: causes.Explanation | None,
           step: int, made: Callable[[], Finding]) -> Verdicts | None:
    """Hold a ``no_grad`` miss until the tensor is seen to change (a target) or not (an error); ``made``
    makes the ``missing_grad`` finding. None: the tensor changed, it is a target."""
    pid = id(p)
    verdict = state.evidence.verdict(p)
    if verdict == "changed":
        _settled(state, pid)
        state.targets.add(pid)
        state._new_targets.add(pid)
        return None
    f = old.replace(step=step, last_step=step) if explanation is None and old is not None else made()
    if verdict == "unknown":
        state.suspects[pid] = (state.evidence.follow(p), name)
        return [Verdict.hold(f.replace(details={**f.details, "pending": Waiting.TARGET}))]
    _settled(state, pid)
    state.decided.add(pid)
    return [Verdict.hold(f), Verdict.confirm(f.key, _not_a_target(f))]


def layerdrop(state: HeldState, pid: int, f: Finding, layer: tuple[str, int], misses: int, list_checks: int, step: int,
              sibling_open: Callable[[], bool]) -> Verdicts | None:
    """A layer of ``layer[0]`` that never ran while its siblings did: held while random drops
    explain it, confirmed once they cannot. None: every sibling was skipped too (no LayerDrop)."""
    container, index = layer
    if state.skips.all_skipped(container, list_checks):
        return None
    chance = state.skips.chance(container, index, misses, list_checks)
    f = f.replace(details={**f.details, "container": container, "chance": chance,
                           "declared_drop_rate": state.skips.declared(container)})
    # A parameter of a module already known not to run is no new LayerDrop suspicion.
    if chance >= changes.LAYERDROP_FALSE_ALARM and not sibling_open():
        return [Verdict.hold(f.replace(details={**f.details, "pending": Waiting.LAYERDROP}))]
    state.decided.add(pid)
    decided = transition(f, NotLayerdrop, container=container, misses=misses, chance=chance)
    return [Verdict.hold(f), Verdict.confirm(f.key, decided, step=step, last_step=step)]


def _settled(state: HeldState, pid: int) -> None:
    state.suspects.pop(pid, None)
    state.evidence.forget([pid])


def decide(state: HeldState, f: Finding) -> Finding | None:
    """What a finding still held at the end of the run becomes (None: dropped as intended)."""
    waiting = f.details.get("pending")
    if waiting == Waiting.TARGET:
        t = next((ref() for ref, n in state.suspects.values() if n == f.name), None)
        verdict = state.evidence.verdict(t, final=True) if t is not None else "unknown"
        if verdict == "changed":
            return None
        if verdict == "unchanged":
            return _not_a_target(f)
        # the run ended first
        return transition(f, TargetUndecided).replace(status=Status.OPEN, severity=Severity.WARNING)
    chance = float(f.details.get("chance", 1.0))
    if waiting == Waiting.LAYERDROP and chance >= changes.LAYERDROP_END_OF_RUN:  # too short a run to tell
        return transition(f, LayerdropUndecided, steps=f.details.get("steps_without_grad"), chance=chance).replace(
            status=Status.INTERMITTENT, severity=Severity.INFO)
    if waiting == Waiting.TRACE:  # the run ended before its module's hooks saw a whole step
        return transition(f, Untraced).replace(status=Status.OPEN)
    return f.replace(status=Status.OPEN, details={k: v for k, v in f.details.items() if k != "pending"})


def _not_a_target(f: Finding) -> Finding:
    """A held ``no_grad`` miss whose value did not change by other means either."""
    return transition(f, NotATarget, {"changed": False}).replace(status=Status.OPEN)


class NotATarget(Transition, kind="missing_grad", name="not_a_target", fixes="never"):
    """A miss of a module run under ``no_grad`` whose value did not change between checks either."""

    def words(self, m: Members) -> Words:
        before = self.before(m)
        return Words(before.message, f"{before.cause} It did not change between checks either (no EMA or target "
                     "update): nothing trains it.", before.fix, before.remedy)


class TargetUndecided(Transition, kind="missing_grad", name="target_undecided", fixes="never"):
    """A miss of a module run under ``no_grad``: the run ended before its value could be seen to change."""

    def words(self, m: Members) -> Words:
        before = self.before(m)
        return Words(f"{m.who} got no gradient, and the run ended before leafwatch could tell whether "
                     "something else updates it (an EMA target).", before.cause, before.fix, before.remedy)


class NotLayerdrop(Transition, kind="missing_grad", name="not_layerdrop", fixes="never"):
    """A layer of ``container`` skipped at every one of ``misses`` checks while its siblings ran: no random drop
    (``chance``: of that under random drops)."""

    container: str
    misses: int
    chance: float

    def words(self, m: Members) -> Words:
        before = self.before(m)
        return Words(before.message, f"{before.cause} Its siblings in `{self.container}` ran: skipped at all "
                     f"{self.misses} checks, it is no layer dropped at random (chance {self.chance:.1e}).",
                     before.fix, before.remedy)


class Untraced(Transition, kind="missing_grad", name="untraced", fixes="never"):
    """A miss whose module's hooks had not seen a whole step when the run ended."""

    def words(self, m: Members) -> Words:
        before, traced = self.before(m), getattr(self.earlier, "traced", None) or "its module"
        return Words(before.message, f"unknown: the run ended before leafwatch's forward hooks saw a whole step of "
                     f"`{traced}`, so it cannot say where the gradient was lost.", before.fix, before.remedy)


class LayerdropUndecided(Transition, kind="missing_grad", name="layerdrop_undecided", fixes="never"):
    """A layer never run in ``steps`` checked steps, which random drops explain with ``chance``: too short a run."""

    steps: int | None
    chance: float

    def words(self, m: Members) -> Words:
        before = self.before(m)
        return Words(f"{m.who} never ran in the {self.steps} checked steps, which a random layer drop explains with "
                     f"chance {self.chance:.1e}: too short a run to tell LayerDrop from a layer that is never called.",
                     before.cause, before.fix, before.remedy)

"""Whether the optimizer step applies the gradients that backward produced, judged from what the
loop hooks (``observe/loop.py``) recorded, at a cost paid only when something is already off.

A tensor can be a healthy leaf, held by an optimizer and reached by backward, and still never
train because the training loop throws its gradient away:

- **cleared between** ``backward()`` **and** ``step()`` (:func:`judge_cleared`, per optimizer
  about to step): all of its gradients cleared is one error (``zero_grad()`` in the wrong place);
  some of them is information (a schedule that withholds them on purpose);
- **a learning rate stuck at 0**: :func:`read_lrs` reads each param group's ``lr`` every
  :data:`LR_READ_EVERY` checks of its optimizer (never a pass over the parameters);
- **steps that are always skipped** (an AMP ``GradScaler`` while the gradients are non-finite):
  :func:`note_check`.

Each judge's state is a plain dataclass; :class:`LoopState` holds the three for a
:class:`~leafwatch.Monitor`, :func:`judge` and :func:`about_to_step` are the calls its check makes.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..observe import frames
from ..report.findings import Finding, Status
from ..report.history import FindingsView
from ..observe.inventory import shape_text
from ..observe.loop import SKIPPED_AFTER, ArrivalHooks, Skipping, StepSentinels
from ..observe.structure import CheckList
from ..report.verdicts import Verdict, Verdicts
from . import fixes
from .constructors import make, transition
from ..report.reasons import Reason, Transition
from ..report.words import ADVICE, Members, Remedy, Words, code

#: A param group's ``lr`` is read every this many checks of its optimizer (and at its first).
LR_READ_EVERY = 10
#: A learning rate at 0 for this many checks in a row (configured non-zero) is reported.
LR_ZERO_AFTER = 100
#: Forced NaN/Inf checks (the result comes one check later on CUDA) before skipped steps with
#: finite gradients are let be.
_EVIDENCE_CHECKS = 3
_MAX_FRAMES = 40
_MAX_LOCALS = 500


def optimizer_name(index: int | None) -> str:
    """How findings name an optimizer: ``optimizers[0]``."""
    return f"optimizers[{index}]" if index is not None else "the checked parameters"


# -- gradients cleared between backward and step ----------------------------------------------
@dataclasses.dataclass(eq=False, slots=True)
class ClearedGradients:
    """Per optimizer about to step, the tensors whose gradient arrived and was cleared."""

    #: Tensors reported as cleared on purpose (information), by id -> name, while it lasts.
    ongoing: dict[int, str] = dataclasses.field(default_factory=dict)
    #: Optimizers with the error open, by name.
    all_cleared: set[str] = dataclasses.field(default_factory=set)


def judge_cleared(state: ClearedGradients, view: FindingsView, clist: CheckList, missing: list[int], arrived: set[int],
                  where: str, step: int, optimizer: Any = None,
                  unknown: set[int] = frozenset()) -> tuple[list[int], list[int], Verdicts]:  # type: ignore[assignment]
    """One check of ``clist``: (the indices still missing, the cleared ids, the verdicts).

    ``missing`` are the indices whose ``.grad`` is None at the check, ``arrived`` the ids
    whose gradient arrived in backward since the last check of this list, ``unknown`` the ids whose
    arrival could not be seen (swapped since their hook was put on: it fired for the old contents):
    one found cleared before is taken as cleared still, any other as missing, as before the swap.
    """
    out: Verdicts = []
    if unknown:
        assumed = {pid for pid in unknown if pid in state.ongoing or where in state.all_cleared}
        arrived = arrived | assumed
    cleared = [i for i in missing if id(clist.params[i]) in arrived]
    cleared_ids = {id(clist.params[i]) for i in cleared}
    if state.ongoing:
        missing_ids = {id(clist.params[i]) for i in missing}
        for pid in [k for k in state.ongoing if k in clist.ids and k not in cleared_ids]:
            # Cleared before, not now: it kept its gradient (the schedule ended), or backward no longer
            # reached it (``missing_grad`` says so).
            old = view.get(("grad_cleared", state.ongoing.pop(pid)))
            if old is not None and old.status == Status.OPEN:
                out.append(Verdict.set(clearing_ended(old, step, trained=pid not in missing_ids)))
    everything = bool(cleared) and len(missing) == len(clist.params)
    if where in state.all_cleared and not everything:
        state.all_cleared.discard(where)
        out.append(Verdict.resolve(("grad_cleared", where), step))
    if not cleared:
        return missing, [], out
    for i in cleared:  # a suspicion or an earlier cause of these misses was wrong
        key = ("missing_grad", clist.names[i])
        if view.get(key) is not None:
            out.append(Verdict.resolve(key, step))
    if everything:
        state.all_cleared.add(where)
        out.append(Verdict.open(grad_cleared_all(where, [clist.names[i] for i in cleared], step=step,
                                                 optimizer=optimizer)))
    else:
        for i in cleared:
            p, name, info = clist.params[i], clist.names[i], clist.infos[i]
            state.ongoing[id(p)] = name
            out.append(Verdict.open(grad_cleared(name, p, where=where, step=step,
                                                 aliases=info.aliases if info else ())))
    keep = set(cleared)
    return [i for i in missing if i not in keep], sorted(cleared_ids), out


# -- a learning rate stuck at 0 ----------------------------------------------------------------
def _number(value: Any) -> float | None:
    """``value`` as a float when reading it costs nothing: a Python number or a CPU tensor."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.numel() == 1:
        return float(value)
    return None  # a CUDA tensor lr: reading it would wait for the device


@dataclasses.dataclass(eq=False, slots=True)
class _GroupLR:
    built: float | None  # the lr when the Monitor first saw the group
    zero_since_check: int | None = None
    zero_since_step: int | None = None
    reported: str | None = None  # the finding's name while it is open


@dataclasses.dataclass(eq=False, slots=True)
class LearningRates:
    """Each param group's learning rate, read every :data:`LR_READ_EVERY` checks of its optimizer.

    A group whose configured learning rate (``initial_lr`` when a scheduler manages it, else the
    value the Monitor first saw) is not 0 but whose ``lr`` has been 0 for :data:`LR_ZERO_AFTER`
    checks while its tensors get gradients is a ``no_update`` warning. Groups built with lr 0 (a
    deliberate freeze), warm-ups from 0 and decays that reach 0 at the last steps are not.
    """

    groups: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[_GroupLR]] = dataclasses.field(
        default_factory=weakref.WeakKeyDictionary)


def read_lrs(state: LearningRates, optimizer: torch.optim.Optimizer, where: str, checks_done: int, step: int,
             names: Callable[[torch.Tensor], str | None]) -> Verdicts:
    """Read the lrs of ``optimizer`` (its ``checks_done``-th check): the verdicts on its groups."""
    out: Verdicts = []
    states = state.groups.setdefault(optimizer, [])
    for j, group in enumerate(optimizer.param_groups):
        lr = _number(group.get("lr"))
        if j == len(states):
            states.append(_GroupLR(lr))
        kept = states[j]
        configured = _number(group.get("initial_lr", kept.built))
        if lr is None or configured is None or configured == 0 or lr != 0 \
                or not any(p.requires_grad and p.grad is not None for p in group["params"]):
            kept.zero_since_check = kept.zero_since_step = None
            if kept.reported is not None:
                out.append(Verdict.resolve(("no_update", kept.reported), step))
                kept.reported = None
            continue
        if kept.zero_since_check is None:
            kept.zero_since_check, kept.zero_since_step = checks_done, step
        if checks_done - kept.zero_since_check >= LR_ZERO_AFTER and kept.reported is None:
            tensor_names = [names(p) or shape_text(p) for p in group["params"] if p.requires_grad]
            kept.reported = f"{where}.param_groups[{j}]"
            out.append(Verdict.open(zero_lr(
                kept.reported, tensor_names, configured=configured, since=kept.zero_since_step,
                steps=checks_done - kept.zero_since_check, step=step,
                scheduler=find_scheduler(optimizer), managed="initial_lr" in group)))
    return out


def find_scheduler(optimizer: torch.optim.Optimizer) -> str | None:
    """The class name of a learning-rate scheduler of ``optimizer`` that the calling code holds.

    torch keeps no reference from an optimizer to its schedulers: look in the calling frames'
    locals (and their ``self``'s attributes; a Lightning Trainer's ``lr_scheduler_configs``).
    Runs once, when a finding is made.
    """
    base = torch.optim.lr_scheduler.LRScheduler
    frame: Any = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        values = list(frame.f_locals.values())[:_MAX_LOCALS]
        owner = frame.f_locals.get("self")
        if frames.readable(owner):  # (not an object whose reads run code of its own: a warning)
            try:  # the attributes of the frame's `self` (vars(None) raises too)
                values.extend(list(vars(owner).values())[:_MAX_LOCALS])
            except TypeError:
                pass
        for value in filter(frames.readable, values):
            configs = getattr(value, "lr_scheduler_configs", None) if type(value).__name__ == "Trainer" else None
            candidates = [getattr(c, "scheduler", None) for c in configs or ()] or [value]
            for candidate in candidates:
                if isinstance(candidate, base) and getattr(candidate, "optimizer", None) is optimizer:
                    return type(candidate).__name__
        frame = frame.f_back
    return None


# -- steps that are always skipped -------------------------------------------------------------
@dataclasses.dataclass(eq=False, slots=True)
class _Judged:
    reported: bool = False
    forced: int = 0  # NaN/Inf checks asked for while skipping; past _EVIDENCE_CHECKS, let be (finite gradients)


@dataclasses.dataclass(eq=False, slots=True)
class SkippedSteps:
    """Per optimizer, the steps skipped in a row that its sentinel counted, as judged."""

    #: Optimizers (by id) looked at since they began to skip many steps in a row.
    judged: dict[int, _Judged] = dataclasses.field(default_factory=dict)


def wants_check(state: SkippedSteps, optimizer: torch.optim.Optimizer) -> bool:
    """Whether a check asked for by the skipped-step hook has anything left to decide."""
    judged = state.judged.get(id(optimizer))
    return judged is None or not (judged.reported or judged.forced > _EVIDENCE_CHECKS)


def note_check(state: SkippedSteps, view: FindingsView, seen: Skipping | None, optimizer: torch.optim.Optimizer,
               clist: CheckList, index: int, step: int) -> tuple[bool, Verdicts]:
    """A check of ``optimizer`` before its step: (whether the NaN/Inf check should run now, the verdicts).

    Skipped steps are reported once the NaN/Inf check finds a non-finite gradient among the
    optimizer's tensors (the GradScaler's reason to skip); after :data:`_EVIDENCE_CHECKS`
    forced checks without one, the run of skipped steps is let be (a loop that computes
    gradients without stepping, on purpose).
    """
    if seen is None or seen.skipped < SKIPPED_AFTER:
        judged = state.judged.pop(id(optimizer), None)
        if judged is not None and judged.reported:
            return False, [Verdict.resolve(("no_update", optimizer_name(index)), step)]
        return False, []
    judged = state.judged.setdefault(id(optimizer), _Judged())
    if judged.reported or judged.forced > _EVIDENCE_CHECKS:
        return False, []
    if not view.open_names("nonfinite_grad").isdisjoint(clist.names):
        judged.reported = True
        return False, [Verdict.open(steps_skipped(optimizer_name(index), clist.names, skipped=seen.skipped,
                                                  since=seen.skipping_since, step=step))]
    judged.forced += 1
    return judged.forced <= _EVIDENCE_CHECKS, []


@dataclasses.dataclass(eq=False, slots=True)
class LoopState:
    """What the three judges of one Monitor remember (the loop hooks that they read, ``ArrivalHooks``
    and ``StepSentinels``, are the Checker's)."""

    cleared: ClearedGradients = dataclasses.field(default_factory=ClearedGradients)
    lrs: LearningRates = dataclasses.field(default_factory=LearningRates)
    skips: SkippedSteps = dataclasses.field(default_factory=SkippedSteps)
    #: The gradients found cleared since the diagnostic hooks last took them (the arrival hooks follow them too).
    cleared_now: list[int] = dataclasses.field(default_factory=list)
    #: A step about to be skipped asked for the value check at the last check.
    force_values: bool = False


def judge(state: LoopState, arrivals: ArrivalHooks, view: FindingsView, clist: CheckList, missing: list[int],
          index: int | None, step: int, optimizers: list[torch.optim.Optimizer]) -> tuple[list[int], Verdicts]:
    """The missing indices left once the cleared gradients are told apart, and the verdicts
    (the hot path: a healthy step, with no hook armed and nothing cleared, returns at the
    first test, which the check also reads in place to skip the call)."""
    cleared = state.cleared
    if not (arrivals.arrived or cleared.ongoing or cleared.all_cleared):
        return missing, []
    arrived = arrivals.take(clist.ids)
    if not (missing or cleared.ongoing or cleared.all_cleared):
        return missing, []
    unknown = arrivals.rearm_swapped() if arrivals.handles else set()  # (their hook sat on what a swap took out)
    missing, cleared_ids, out = judge_cleared(cleared, view, clist, missing, arrived, optimizer_name(index), step,
                                              optimizers[index] if index is not None else None, unknown)
    state.cleared_now += cleared_ids
    return missing, out


def about_to_step(state: LoopState, sentinels: StepSentinels, view: FindingsView, optimizer: torch.optim.Optimizer,
                  index: int, clist: CheckList, step: int, inv: Any) -> tuple[bool, Verdicts]:
    """A check of ``optimizer`` before its step, called only when there is loop work to do (its
    ``clist.checks`` is 1 or a multiple of :data:`LR_READ_EVERY`, or ``sentinels.alert`` or
    ``skips.judged`` names an optimizer; the check reads those in place): the lrs (every few
    checks) and the skipped steps: (whether the NaN/Inf check should run now, the verdicts)."""
    checks_done, key = clist.checks, id(optimizer)
    out: Verdicts = []
    if checks_done == 1 or checks_done % LR_READ_EVERY == 0:
        out = read_lrs(state.lrs, optimizer, optimizer_name(index), checks_done, step,
                       inv.name if inv is not None else (lambda t: None))
    if key not in sentinels.alert and key not in state.skips.judged:
        return False, out
    force, skipped = note_check(state.skips, view, sentinels.seen.get(key), optimizer, clist, index, step)
    return force, out + skipped


# -- its words ---------------------------------------------------------------------------------
_CLEARED_CAUSE = ("gradients arrived in backward and were cleared before the optimizer step: "
                  "`zero_grad()` is called between `backward()` and `step()`")


def cleared_fix(variable: str | None) -> tuple[str, Remedy]:
    """Where ``zero_grad()`` belongs, on the user's optimizer ``variable`` when known (words without it)."""
    if variable is not None:
        return (f"call `{variable}.zero_grad()` before the forward pass (or right after `{variable}.step()`)",
                code(f"{variable}.zero_grad()"))
    return "call your optimizer's `zero_grad()` before the forward pass (or right after its `step()`)", ADVICE


def _listed(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def grad_cleared_all(where: str, names: list[str], *, step: int | None, optimizer: Any = None) -> Finding:
    """Every gradient of the optimizer about to step arrived in backward and was cleared."""
    variable = fixes.variable_for(optimizer) if optimizer is not None else None
    return make(Cleared(tensors=tuple(names), optimizer_variable=variable), where, "error", step=step, aliases=names,
                tensors=len(names))


class Cleared(Reason, kind="grad_cleared", name="cleared"):
    """Every gradient of the optimizer about to step arrived in backward and was gone at the step."""

    tensors: tuple[str, ...]
    optimizer_variable: str | None = None

    def words(self, m: Members) -> Words:
        names = self.tensors
        n = len(names)
        fix, remedy = cleared_fix(self.optimizer_variable)
        return Words(
            f"`{m.name}` steps with no gradient: the gradients of its {n} tensor{'s' if n != 1 else ''} "
            f"({_listed(list(names))}) arrived in backward() and were gone at the step, so nothing trains.",
            _CLEARED_CAUSE + ".", fix, remedy)


def grad_cleared(name: str, t: torch.Tensor, *, where: str, step: int | None,
                 aliases: Iterable[str] = ()) -> Finding:
    """Some gradients of the optimizer about to step were cleared after backward (a schedule)."""
    return make(ClearedOnPurpose(optimizer=where), name, "info", tensor=t, step=step, aliases=aliases, optimizer=where)


class ClearedOnPurpose(Reason, kind="grad_cleared", name="cleared_on_purpose", fixes="never"):
    """Some gradients of the optimizer ``optimizer`` were cleared before its step while the others were kept."""

    optimizer: str

    def words(self, m: Members) -> Words:
        where = m.shared("optimizer") or "its optimizer"
        return Words(
            f"{m.who} got its gradient in backward(), but it was cleared before `{where}` stepped: "
            "it does not train at this step.",
            f"backward reached {m.who}; the training loop cleared its gradient (`.grad = None` or "
            f"`zero_()`) before the step while the other tensors of `{where}` kept theirs: a schedule "
            "that withholds gradients on purpose (a layer frozen for the first epoch, a head held back "
            "during warm-up), which resumes later.",
            "nothing if it is a schedule: it trains once the loop stops clearing it; otherwise stop clearing "
            + (f"`{m.name}.grad`" if m.single else f"the `.grad` of {m.who}") + " between backward() and step()")


def clearing_ended(old: Finding, step: int, trained: bool) -> Finding:
    """``grad_cleared``/``clearing_ended``: a tensor cleared before is not now (``trained``: it kept its gradient)."""
    ended = transition(old, ClearingEnded, from_step=old.first_step, to_step=old.last_step, trained=trained)
    return ended.replace(status=Status.RESOLVED, last_step=step)


class ClearingEnded(Transition, kind="grad_cleared", name="clearing_ended"):
    """A tensor whose gradient was cleared before the step from ``from_step`` to ``to_step`` is not any more."""

    from_step: int | None
    to_step: int | None
    trained: bool

    def words(self, m: Members) -> Words:
        before = self.before(m)
        since = "it has trained since" if self.trained else "backward has not reached it since"
        return Words(
            f"{m.who}'s gradient was cleared before the optimizer step from step {self.from_step} to step "
            f"{self.to_step}; {since}.", before.cause, before.fix, before.remedy)


def zero_lr(where: str, names: list[str], *, configured: float, since: int | None, steps: int,
            step: int | None, scheduler: str | None, managed: bool) -> Finding:
    """A param group stepped with a learning rate of 0 for many checks while it gets gradients."""
    return make(ZeroLr(tensors=tuple(names), configured=configured, since=since, steps=steps, scheduler=scheduler,
                       managed=managed), where, "warning", step=step, aliases=names, configured_lr=configured,
                zero_since_step=since, scheduler=scheduler)


class ZeroLr(Reason, kind="no_update", name="zero_lr", fixes="never"):
    """A param group that stepped with lr 0 for ``steps`` steps (0 at every reading since ``since``)."""

    tensors: tuple[str, ...]
    configured: float
    since: int | None
    steps: int
    scheduler: str | None = None
    managed: bool = False

    def words(self, m: Members) -> Words:
        scheduler, configured = self.scheduler, self.configured
        if scheduler is not None:
            cause = (f"its learning rate scheduler `{scheduler}` sets lr to 0 (its `initial_lr` is "
                     f"{configured:g}): the schedule returns 0 at every step.")
            fix = (f"check `{scheduler}`'s schedule: it should give a non-zero factor after warm-up "
                   "(e.g. `LambdaLR` multiplies `initial_lr` by what its function returns)")
        elif self.managed:
            cause = (f"a learning rate scheduler sets lr to 0 (the group's `initial_lr` is {configured:g}): "
                     "the schedule returns 0 at every step.")
            fix = "check the scheduler's schedule: it should give a non-zero learning rate after warm-up"
        else:
            cause = f"the group's lr was {configured:g} when leafwatch first saw it and was set to 0 since."
            fix = ("find what sets the group's `\"lr\"` to 0, or freeze these tensors with `requires_grad_(False)` if "
                   "that is intended")
        return Words(
            f"`{m.name}` ({_listed(list(self.tensors))}) has stepped with lr 0 for {self.steps} steps or more (0 at "
            f"every reading since step {self.since}): its tensors get gradients and never change.", cause, fix)


def steps_skipped(where: str, names: Iterable[str], *, skipped: int, since: int, step: int | None) -> Finding:
    """An optimizer whose step was skipped many times in a row (a GradScaler and NaN/Inf)."""
    return make(SkippedSteps(skipped=skipped, since=since), where, "warning", step=step, aliases=tuple(names),
                skipped=skipped, since_step=since)


class SkippedSteps(Reason, kind="no_update", name="skipped_steps", fixes="never"):
    """An optimizer whose step a GradScaler skipped ``skipped`` times in a row since ``since``."""

    skipped: int
    since: int

    def words(self, m: Members) -> Words:
        seen = " (see the `nonfinite_grad` findings)"
        return Words(
            f"`{m.name}` has not stepped for {self.skipped} steps: backward ran, but `optimizer.step()` "
            "was not called, so its tensors do not change.",
            "an AMP `GradScaler` skips `optimizer.step()` whenever the gradients hold NaN or Inf and "
            f"halves its scale: the gradients have been non-finite at every step since step {self.since}{seen}, "
            "so the scale collapses and nothing trains.",
            "find the first op that gives NaN/Inf (`torch.autograd.detect_anomaly()` for one step): "
            "a too-high learning rate, a `log`/division of 0, an fp16 overflow (use bf16, or clip gradients after "
            "`scaler.unscale_()`)")

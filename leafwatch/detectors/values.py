"""The values of the gradients: NaN/Inf (``nonfinite_grad``) and exactly-zero streaks (``dead_grad``).

One batched check per value check, never one host read per tensor (:mod:`leafwatch.observe.values`), at
a cadence: every ``check_values_every_n_steps`` checks, the first check, a check a loop watch
asks for (a step about to be skipped), and every check up to ``every_check_values_until`` (so
``leafwatch run`` names a NaN at the step it appears). The exactly-zero streaks count only the
checks of the cadence, so their timing does not depend on the extra checks.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from ..observe import inventory, sharding as distributed, structure
from ..observe.evidence import LISTS, SEEN, STEP, Evidence
from ..report.findings import Finding, Kind, Status
from ..report.history import FindingsView
from ..observe.values import NamedValueCheck, nonfinite
from ..report.verdicts import Verdict, Verdicts, open_after
from .constructors import make
from ..report.reasons import Reason
from ..report.words import Members, Words
from . import dead

if TYPE_CHECKING:
    from .gradients import GradientState


def judge(evidence: Evidence, state: ValuesState, view: FindingsView, grads: GradientState) -> Verdicts:
    """At a check: the value check when it is due (or a step about to be skipped asked for it)."""
    step, every = evidence[STEP], state.every
    on_cadence = bool(every) and (step == 1 or step % every == 0 or grads.loop.force_values)
    if on_cadence or (every and step <= state.every_check_values_until):
        if not on_cadence:
            state.off_cadence_steps.add(step)
        return check(state, evidence[SEEN].values, evidence[SEEN].cache, view, step,
                     [clist for _, clist, _ in evidence[LISTS]])
    return []


@dataclasses.dataclass(eq=False, slots=True)
class ValuesState:
    """What the value checks keep: their cadence (every ``every`` checks, 0: off) and the zero streaks."""

    every: int
    #: Check at every check up to this step too, besides the cadence.
    every_check_values_until: int = 0
    dead: dead.DeadGradState = dataclasses.field(default_factory=dead.DeadGradState)
    _last_step: int = -1
    off_cadence_steps: set[int] = dataclasses.field(default_factory=set)


def judge_last(evidence: Evidence, _: None, view: FindingsView, state: ValuesState) -> Verdicts:
    """At the end of a run: the checks still in flight, the gradients not checked since the last
    value check, and the parameters themselves (a short run may end between value checks, and
    gradients are often cleared by then: a NaN gradient that was applied left NaN in the parameter)."""
    reads, cache, step = evidence[SEEN].values, evidence[SEEN].cache, evidence[STEP]
    out = _record(state, reads, view, step, *reads.flush())
    if not state.every or step <= 0:
        return out
    lists = list(cache.lists.values())
    if state._last_step != step:
        out += check(state, reads, cache, view, step, lists)
        out += _record(state, reads, view, step, *reads.flush())
    named = [(p, n) for c in lists for p, n in zip(c.params, c.names) if inventory.has_values(p)]
    params, names = [p for p, _ in named], [n for _, n in named]
    after = open_after(out, Kind.NONFINITE_GRAD)
    flagged = {n for n in view.open_names(Kind.NONFINITE_GRAD) if after.get(n, True)}
    flagged |= {n for n, is_open in after.items() if is_open}
    for _, i in nonfinite(params, step):
        if names[i] not in flagged:
            out.append(Verdict.open(nonfinite_param(names[i], params[i], step)))
    return out


def check(state: ValuesState, reads: NamedValueCheck, cache: structure.StructureCache, view: FindingsView,
          step: int, lists: list[structure.CheckList]) -> Verdicts:
    state._last_step = step
    if len(lists) == 1:  # one optimizer: its list as it is (a new list at each structure reading)
        params, names = lists[0].params, lists[0].names
    else:
        params = [p for c in lists for p in c.params]
        names = tuple(n for c in lists for n in c.names)
    grads = [p.grad for p in params]
    if cache.grad_view.local_grads:
        grads = [distributed.local_tensor(g) for g in grads]
    return _record(state, reads, view, step, *reads.check(names, params, grads, step))


def _record(state: ValuesState, reads: NamedValueCheck, view: FindingsView, step: int, completed: list[int],
            bad: list[tuple[int, str, torch.Tensor]]) -> Verdicts:
    out: Verdicts = []
    flagged = set()
    for bad_step, name, param in bad:
        flagged.add(name)
        out.append(Verdict.open(nonfinite_grad(name, param, bad_step)))
    if completed:
        latest = max(completed)
        kind, open_ = Kind.NONFINITE_GRAD, Status.OPEN
        out += [Verdict.resolve(f.key, latest) for f in view
                if f.kind == kind and f.status == open_ and f.name not in flagged and (f.last_step or 0) < latest]
    zeros = reads.take_zeros()
    if state.off_cadence_steps:
        zeros = [z for z in zeros if z[0] not in state.off_cadence_steps]
        state.off_cadence_steps = {s for s in state.off_cadence_steps if s >= step - 2}  # (CUDA: a step late)
    out += dead.record(state.dead, view, zeros)
    return out


# -- its words ---------------------------------------------------------------------------------
_FIND_THE_OP = ("find the first op producing NaN/Inf (`torch.autograd.detect_anomaly()` for one step), "
                "lower the learning rate, clip gradients, or use a GradScaler with fp16")


def nonfinite_grad(name: str, t: torch.Tensor, step: int) -> Finding:
    return make(NanOrInf(step=step), name, "error", tensor=t, step=step)


def nonfinite_param(name: str, t: torch.Tensor, step: int) -> Finding:
    """A parameter holding NaN/Inf at the end of a run (its gradient was not at hand to check)."""
    return make(NanOrInfValue(step=step), name, "error", tensor=t, step=step, where="parameter")


def _at(m: Members) -> str:
    """The step the values were read at, or the steps of each tensor."""
    step = m.shared("step")
    return f"step {step}" if step is not None else "steps " + ", ".join(map(str, sorted(set(m.each("step")))))


class NanOrInf(Reason, kind="nonfinite_grad", name="nan_or_inf", fixes="never"):
    """A gradient holding NaN or Inf at the value check of ``step``."""

    step: int

    def words(self, m: Members) -> Words:
        return Words(
            f"{m.who}.grad holds NaN or Inf at {_at(m)}." if m.single else f"{m.who} has NaN or Inf in its .grad at {_at(m)}.",
            "the loss or an op in the forward pass overflowed or divided by zero (or the learning rate is too high).",
            _FIND_THE_OP)


class NanOrInfValue(Reason, kind="nonfinite_grad", name="nan_or_inf_value", fixes="never"):
    """A parameter holding NaN or Inf at the end of the run, read at ``step``."""

    step: int

    def words(self, m: Members) -> Words:
        return Words(
            f"{m.who} holds NaN or Inf at the end of the run ({_at(m)}): a non-finite gradient was applied to it.",
            "a gradient turned NaN or Inf between two value checks (the loss or an op in the forward pass "
            "overflowed or divided by zero, or the learning rate is too high) and the optimizer applied it.",
            f"{_FIND_THE_OP}; to catch it at the step it happens, lower `check_values_every_n_steps`")

"""A run that trained where leafwatch could not see it: the model's forward and backward ran, no check did.

``Monitor.attach()`` checks before each step of the optimizers it was given, through torch's
optimizer step hooks; ``leafwatch run`` checks at every torch optimizer's step. An optimizer that
never ran ``Optimizer.__init__`` (Opacus's ``DPOptimizer`` does not: leafwatch unwraps it, but any
other wrapper like it) never has its ``step`` hooked by torch, and a wrapper that updates the
parameters itself, or through an optimizer it holds by a name leafwatch does not follow, steps
where no hook sees. Such a run would end with "no findings" after no check at all: at the end of
the run this detector says so instead, as an ``incomplete`` finding that names the optimizer and
how to give leafwatch its steps. It runs once, at the end (stage ``CLOSE``): nothing per step.

The evidence is the run's own: no check ran; gradients reached the model's tensors (the arrival
hooks armed from the Monitor's creation saw one, or one is there now), so a backward ran; their values
changed in place since the Monitor was created (their ``_version``, noted then: something stepped them;
a script that raised before its first step changed none); and an optimizer the Monitor was given (or the
script holds, under ``leafwatch run``) holds them and was never seen stepping by torch's global step hook
(one that stepped and whose check failed is the ``incomplete`` finding of that failure, not this one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..observe.evidence import INVENTORY, SEEN, STEP, Evidence
from ..report.findings import Kind, Severity
from ..report.history import FindingsView
from ..report.verdicts import Verdict, Verdicts
from ..report.reasons import Reason
from ..report.words import ADVICE, Members, Words, code
from . import fixes
from .constructors import make

#: The attributes of a wrapper looked into for the torch optimizer it steps (one level).
_MAX_ATTRIBUTES = 64


@dataclasses.dataclass
class UncheckedState:
    """What a front-end tells this detector: the optimizers the script holds that never stepped
    (``leafwatch run``: met in the script's frames, none handed to a Monitor); and the ``_version`` of each
    of the model's tensors when the Monitor was created (by id; :func:`note`)."""

    waiting: Callable[[], list[torch.optim.Optimizer]] | None = None
    versions: dict[int, int] = dataclasses.field(default_factory=dict)


def note(state: UncheckedState, tensors: Mapping[int, torch.Tensor]) -> None:
    """The tensors' ``_version`` now (once, at the Monitor's creation: no value is copied)."""
    state.versions = {pid: getattr(t, "_version", -1) for pid, t in tensors.items()}


def judge(evidence: Evidence, state: UncheckedState, view: FindingsView) -> Verdicts | None:
    """At the end of the run: the ``incomplete``/``unchecked_optimizer`` finding when no check ran although
    the model trained with an optimizer leafwatch knows of; None otherwise."""
    seen, inv = evidence[SEEN], evidence[INVENTORY]
    if seen.checks or not seen.cache.has_model():
        return None
    if inv is None:  # no check read the structure: read once now, at the end
        inv = seen.cache.rebuild(evidence[STEP])
    optimizers = [*seen.cache.optimizers, *(state.waiting() if state.waiting is not None else [])]
    tensors, versions = set(inv.tensors), state.versions
    trained = (seen.arrivals.arrived & tensors) or {pid for pid, t in inv.tensors.items() if t.grad is not None}
    # ...and updated since the Monitor was created (their version moved: something stepped them)
    trained = {pid for pid in trained if versions.get(pid, -1) not in (-1, getattr(inv.tensors[pid], "_version", -1))}
    stepping = seen.observer.stepping_optimizers()
    # (one seen stepping was checked, or its check failed: that failure is an `incomplete` finding of its own)
    holders = [o for i, o in enumerate(optimizers) if all(o is not q for q in optimizers[:i])  # (each once)
               and _holds(o, trained) and all(o is not s for s in stepping)]
    if not holders:
        return None
    return [Verdict.open(unchecked(holders[0], evidence[STEP], stepping, inv))]


def _holds(optimizer: Any, ids: set[int]) -> bool:
    try:
        return any(id(p) in ids for group in optimizer.param_groups for p in group["params"])
    except Exception:  # an optimizer whose groups cannot be read: it is no evidence
        return False


def _inner_stepping(optimizer: Any, stepping: list[torch.optim.Optimizer]) -> str | None:
    """The attribute of ``optimizer`` that holds a torch optimizer seen stepping with its parameters (the
    one its ``step()`` calls), or None."""
    try:
        attributes = list(vars(optimizer).items())[:_MAX_ATTRIBUTES]
    except TypeError:
        return None
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for attribute, value in attributes:
        if isinstance(attribute, str) and attribute.isidentifier() and value is not optimizer \
                and any(value is s for s in stepping) and _holds(value, ids):
            return attribute
    return None


def unchecked(optimizer: Any, step: int, stepping: list[torch.optim.Optimizer], inv: Any) -> Any:
    """The finding that says no check ran while ``optimizer``'s tensors trained."""
    variable = fixes.variable_for(optimizer, inv.variables, inv.fix_names)
    model = fixes.variable_for(inv.model, inv.variables, inv.fix_names) if inv.model is not None else None
    cls = type(optimizer).__name__
    hooked = bool(getattr(getattr(type(optimizer), "step", None), "hooked", False))  # (Optimizer.__init__ ran for one)
    return make(UncheckedOptimizer(variable=variable, cls=cls, hooked=hooked, model=model,
                                   inner=_inner_stepping(optimizer, stepping) if variable else None),
                variable or cls, Severity.WARNING, step=step)


class UncheckedOptimizer(Reason, kind=Kind.INCOMPLETE, name="unchecked_optimizer"):
    """The model trained with an optimizer whose steps torch's hooks never saw: no check ran."""

    cls: str
    hooked: bool
    variable: str | None = None
    model: str | None = None
    inner: str | None = None

    def words(self, m: Members) -> Words:
        shown = f"`{self.variable}` (a `{self.cls}`)" if self.variable else f"the `{self.cls}` optimizer"
        if not self.hooked:
            why = (f"torch's optimizer step hooks, where leafwatch checks before each step, never fire for {shown}: "
                   "its class never ran `Optimizer.__init__`, which hooks `step`")
        else:
            why = f"{shown} never stepped through a `step()` that torch's optimizer step hooks see, where leafwatch checks"
        cause = (f"the model's forward and backward ran, its tensors got gradients and were updated, but no check ran: "
                 f"{why}. Nothing was judged, so no other finding here means nothing was looked at, not that nothing "
                 "is wrong.")
        message = f"No check ran: {shown} trained the model where leafwatch could not see its steps."
        inner, model = self.inner, self.model or "model"
        if inner:
            target = f"{self.variable}.{inner}"
            snippet = f"leafwatch.Monitor({model}, {target}).attach()"
            fix = (f"attach the Monitor to `{target}`, the torch optimizer that `{self.variable}.step()` steps, which "
                   f"torch's hooks see: `{snippet}`")
            return Words(message, cause, fix, code(snippet) if self.model else ADVICE)
        holder = self.variable or "optimizer"
        fix = (f"call `monitor.check()` yourself after `loss.backward()` and before `{holder}.step()`, with "
               f"`monitor = leafwatch.Monitor({model}, {holder})`; or attach the Monitor to the torch optimizer that "
               f"`{holder}` steps (leafwatch unwraps a wrapper that holds it as `.optimizer` or `.original_optimizer`)")
        return Words(message, cause, fix)

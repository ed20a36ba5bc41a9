"""Optimizer membership judged by what a check sees, not by the structure alone.

A trainable tensor that no optimizer holds is read off the structure, but whether that is a bug
depends on what happens at a step: a learnable weight left out of ``configure_optimizers``
gets gradients and never changes (an error); a teacher or an EMA target kept as a submodule
runs only under ``no_grad`` and is updated by other means (no finding); an optimizer created
or stepped late (WGAN-GP's generator, TD3's actor, a second optimizer after warm-up) holds its
tensors only from its first step on. So ``not_in_optimizer`` findings are *held* (pending in
the history) when the structure is read, and decided here at
the next check, or after ``grace`` checks for front-ends that meet optimizers only when they
step, or at the end of the run.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch

from . import fixes, rebuild
from ..observe.evidence import INVENTORY, SEEN, STEP, Evidence
from ..observe.changes import HandUpdates
from ..report.findings import Finding, Severity, Status, Waiting
from ..report.history import FindingsView
from ..observe.inventory import Inventory, ParamInfo
from ..observe.tracing import Tracer
from .constructors import make, silence
from ..report.reasons import Reason, Span, Transition
from ..report.words import ADVICE, Edit, Members, Remedy, Words, code
from ..report.verdicts import Verdict, Verdicts


def decide_pending(evidence: Evidence, state: None, view: FindingsView, judged: MembershipState) -> Verdicts:
    """At the end of the run: a late-optimizer warning still open becomes an error, and whatever this
    check still holds is decided (a held missing gradient or watched tensor is decided by its own detector)."""
    inv, step, checks, hand = evidence[INVENTORY], evidence[STEP], evidence[SEEN].checks, evidence[SEEN].hands["membership"]
    _read(judged, hand, inv)
    if evidence[SEEN].interrupted:
        return _interrupted(judged, hand, view, inv, step, checks, evidence[SEEN])
    out = escalate_late(view, step, checks)
    for f in view.pending():  # (a structural finding held before any gradient too)
        if f.kind != "missing_grad" and f.details.get("source") != "watch":
            decided = decide(judged, hand, f, inv, step, checks, evidence[SEEN].tracer)
            out.append(Verdict.drop(f.key) if decided is None else Verdict.set(decided))
    return out + _held_by_unstepped(inv, evidence[SEEN], view, step, checks)


def _interrupted(state: MembershipState, hand: HandUpdates, view: FindingsView, inv: Inventory | None, step: int,
                 checks: int, seen: Any) -> Verdicts:
    """The run ended by an exception: what waits for a later step (an optimizer built and not stepped yet, the
    value evidence of the next check) is left undecided, an info finding that says so; a late optimizer's
    warning stays one; a tensor seen without a gradient is still no finding."""
    out: Verdicts = []
    for f in view.pending():
        if f.kind != "not_in_optimizer":
            continue
        if f.details.get("pending") == Waiting.STRUCTURE:
            decided = decide(state, hand, f, inv, step, checks)
            out.append(Verdict.drop(f.key) if decided is None else Verdict.set(decided))
            continue
        if f.details.get("source") != "watch":  # (a watched tensor's gradient rule is its detector's)
            found = _reported_at_end(state, hand, inv, f.name, seen.tracer)
            if found is None:
                out.append(Verdict.drop(f.key))
                continue
            waiting = _waiting_holder(state, found[0])
            holder = _holder_of(waiting, inv) if waiting is not None else state.holders.get(f.name)
        else:
            holder = None
        out.append(Verdict.set(_undecided(f, holder, step, checks)))
    return out + _held_by_unstepped(inv, seen, view, step, checks, interrupted=True)


def _undecided(f: Finding, holder: tuple[str, str] | None, step: int, checks: int) -> Finding:
    """``not_in_optimizer``/``undecided`` (info): the run raised before the checks that decide ``f``."""
    return f.replace(reason=Undecided(holder=tuple(holder) if holder else None, step=step, checks=checks),  # type: ignore[arg-type]
                     severity=Severity.INFO,
                     status=Status.OPEN, first_step=f.first_step or step, last_step=step,
                     details=_bookkeeping(f))


class Undecided(Reason, kind="not_in_optimizer", name="undecided", fixes="never"):
    """The run raised at ``step`` before the checks that decide whether a tensor in no optimizer that stepped
    trains (``holder``: the variable and class of an optimizer that holds it and had not stepped)."""

    step: int
    checks: int
    holder: tuple[str, str] | None = None

    def words(self, m: Members) -> Words:
        if self.holder:
            held = _holder_words(*self.holder) + " holds it and had not stepped yet: it may step later in the iteration"
        else:
            held = "an optimizer that steps later in the iteration may hold it"
        return Words(
            f"{m.who} requires grad and no optimizer that stepped holds it, but the run raised an exception at step "
            f"{self.step}, before the checks that decide whether it trains: left undecided.",
            f"leafwatch decides a tensor in no optimizer that steps at the checks after the one that first sees it: "
            f"{held}, or its value may change by hand; those checks never came.",
            "nothing to change for it yet: fix the exception; a run that goes on decides it")


def _held_by_unstepped(inv: Inventory | None, seen: Any, view: FindingsView, step: int, checks: int, *,
                       interrupted: bool = False) -> Verdicts:
    """At the end of a run: the trainable tensors that only optimizers the Monitor was given hold, and
    that never stepped while it watched (another one did: steps were seen) -- they never changed; after an
    exception (``interrupted``), their optimizer may have been about to step: left undecided.
    (``leafwatch run`` hands its Monitor only the optimizers that stepped: its waiting ones are
    decided by :func:`_late`.)"""
    if inv is None or not checks or len(inv.optimizers) < 2:
        return []
    stepped = set(map(id, seen.observer.stepping_optimizers()))
    if not stepped.intersection(map(id, inv.optimizers)):
        return []  # no step seen: whether these stepped is unknown
    trained = {id(p) for o, ps in zip(inv.optimizers, inv.optimizer_params) if id(o) in stepped for p in ps}
    named = {f.name for f in view if f.kind == "not_in_optimizer"}
    out: Verdicts = []
    for opt, params in zip(inv.optimizers, inv.optimizer_params):
        if id(opt) in stepped:
            continue
        variable = fixes.variable_for(opt, inv.variables, inv.fix_names) or ""
        for p in params:
            info = inv.params.get(id(p))
            if info is None or not p.requires_grad or id(p) in trained or info.name in named:
                continue
            named.add(info.name)
            base = not_in_optimizer(info, p, step=step, inventory=inv)
            holder = (variable, type(opt).__name__)
            decided = _undecided(base, holder, step, checks) if interrupted else _never_stepped(
                holder, checks, base, Severity.ERROR)
            out.append(Verdict.set(decided.replace(first_step=step, last_step=step)))
    return out


@dataclasses.dataclass(eq=False, slots=True)
class MembershipState:
    """What the membership judge keeps: which tensors it judged intended, and whether a finding waits."""

    #: Checks during which membership stays pending (optimizers may still appear).
    grace: int = 0
    #: Optimizers that exist but have not stepped yet (their tensors are named as such).
    waiting_optimizers: Callable[[], list[torch.optim.Optimizer]] | None = None
    #: ``leafwatch run``'s tensor id -> (root name, optimizer variable) of the root modules no
    #: optimizer holds a tensor of; None: read off the inventory (:func:`_outside_root`).
    outside_roots: Callable[[], dict[int, tuple[str, str]]] | None = None
    #: Tensors judged intended (a teacher, a target network): a new reading holds them no more.
    quiet: set[int] = dataclasses.field(default_factory=set)
    roots_read: tuple[Inventory | None, dict[int, tuple[str, str]]] = (None, {})
    #: The reading whose tensors :attr:`by_name` names (weakly: never an old reading kept alive).
    read: weakref.ReferenceType | None = None
    #: Each name's tensor id in that reading (never a weak reference to a tensor: ``torch.utils.swap_tensors``
    #: refuses one; the reading holds the tensor, and a check reads it from there).
    by_name: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Whether a finding is held for this judge: a check has work for it only then (and at first).
    waiting: bool = True
    #: Held tensor's name -> (the variable, the class) of the optimizer not stepped yet seen holding it while it
    #: waited: the end of the run names it even when it is gone with the script.
    holders: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


def _read(state: MembershipState, hand: HandUpdates, inv: Inventory | None) -> None:
    """A new reading of the structure (none when ``inv`` is the one read last): its tensors by name;
    forget what is gone."""
    if inv is None or (state.read is not None and state.read() is inv):
        return
    state.roots_read = (None, {})  # never keep an old reading (and its modules) alive
    alive = set(inv.tensors)
    state.quiet &= alive
    hand.keep(alive)
    hand.follow_through(inv)
    state.by_name = {info.name: k for k, info in inv.params.items()}
    state.holders = {name: holder for name, holder in state.holders.items() if name in state.by_name}
    state.read = weakref.ref(inv)


def _tensor(state: MembershipState, inv: Inventory | None, name: str) -> tuple[torch.Tensor, ParamInfo] | None:
    """The tensor named ``name`` in ``inv``, the reading :func:`_read` read last, and its info (None: gone)."""
    t = inv.tensors.get(state.by_name.get(name, -1)) if inv is not None else None
    info = inv.params.get(id(t)) if inv is not None and t is not None else None
    return None if info is None else (t, info)  # type: ignore[return-value]


def _reported_at_end(state: MembershipState, hand: HandUpdates, inv: Inventory | None, name: str,
                     tracer: Tracer | None) -> tuple[torch.Tensor, ParamInfo] | None:
    """The tensor named ``name`` and its info when the gradient rule reports it at the end of the run (None: gone,
    a library's constant, or quiet)."""
    found = _tensor(state, inv, name)
    if found is None or _library_constant(found[1], found[0], tracer) \
            or _gradient_rule(state, hand, found[0], final=True) == "quiet":
        return None
    return found


def judge(evidence: Evidence, state: MembershipState, view: FindingsView) -> Verdicts:
    """At a check: the held findings decided, ``not_in_optimizer`` by the gradient rule (none held: nothing)."""
    inv, step, seen = evidence[INVENTORY], evidence[STEP], evidence[SEEN]
    hand = seen.hands["membership"]
    _read(state, hand, inv)
    out: Verdicts = []
    still = False
    for f in view.pending():
        waiting = f.details.get("pending")
        if waiting == Waiting.STRUCTURE:
            out.append(Verdict.confirm(f.key, details=_without_pending(f)))
        elif waiting == Waiting.MEMBERSHIP and not f.details.get("outside"):
            # (a tensor outside the model is held and decided by its own owner)
            verdict = _judge_one(state, hand, f, inv, step, seen.checks, seen.tracer)
            if verdict is None:
                still = True
            else:
                out.append(verdict)
    state.waiting = still
    return out


def _judge_one(state: MembershipState, hand: HandUpdates, f: Finding, inv: Inventory | None, step: int,
               checks: int, tracer: Tracer | None) -> Verdict | None:
    """Decide one held ``not_in_optimizer`` (None: it stays held); ``checks``: how many ran (the grace counts in it)."""
    found = _tensor(state, inv, f.name)
    if found is None or id(found[0]) in state.quiet:
        return Verdict.drop(f.key)
    t, info = found
    rule = "quiet" if _library_constant(info, t, tracer) else _gradient_rule(state, hand, t)
    if rule == "quiet":
        state.quiet.add(id(t))
        return Verdict.drop(f.key)
    if rule == "wait" or checks <= state.grace and f.reason.name != "created_after_optimizer":
        if f.name not in state.holders and (holder := _waiting_holder(state, t)) is not None:
            state.holders[f.name] = _holder_of(holder, inv)
        return None  # the value evidence, or an optimizer that steps late, may still come (not for a
        # tensor created after every optimizer was built: none could hold it)
    return Verdict.confirm(f.key, _decide(state, f, info, t, step, checks, inv, switched=_switched_at(info, t, tracer)),
                           step=step, last_step=step)


def _library_constant(info: ParamInfo, t: torch.Tensor, tracer: Tracer | None) -> bool:
    """A registered buffer that a library's own forward switched to ``requires_grad`` (the loss
    accumulator of vector-quantize-pytorch: ``loss = self.zero; loss.requires_grad_()``), or that a forward
    switched on and then only added to other tensors (the same code in the user's own file): the gradient
    it collects is the loss's constant derivative, and nothing means it to train. A buffer registered
    with ``requires_grad=True``, or switched on by the user's own line and used any other way (a scale), is
    no such constant."""
    return info.buffer and tracer is not None and (tracer.switched_on_by_library(t) is not None
                                                   or tracer.added_to_a_loss(t))


def _gradient_rule(state: MembershipState, hand: HandUpdates, t: torch.Tensor, *, final: bool = False) -> str:
    """The gradient rule for a tensor in no optimizer that steps: ``quiet`` (no gradient: an EMA
    copy, a teacher, a target network, a part neither trained nor used; or a gradient and a
    value that changes between checks: updated by hand), ``wait`` (a gradient, first seen at
    this check: the value evidence comes at the next one) or ``report`` (a gradient that is
    computed and never applied). A tensor that an optimizer holds and never steps: ``report``."""
    if _waiting_holder(state, t) is not None:
        return "report"
    if t.grad is None and not (final and hand.saw(t)):
        # No gradient: quiet. At the end of a run the loop may have cleared the gradient a
        # check saw (a Trainer's zero_grad after each step): that check's evidence decides.
        return "quiet"
    return {"by_hand": "quiet", "wait": "wait"}.get(hand.verdict(t, final=final), "report")


def _switched_at(info: ParamInfo, t: torch.Tensor, tracer: Tracer | None) -> str | None:
    """``model.py:12 (in `Net.forward`)`` where the user's forward switched the buffer ``t`` to requires_grad."""
    place = tracer.switched_on_by_user(t) if info.buffer and tracer is not None else None
    return place.described() if place is not None else None


def _decide(state: MembershipState, f: Finding, info: ParamInfo, t: torch.Tensor, step: int, checks: int,
            inv: Inventory | None, *, final: bool = False, switched: str | None) -> Finding:
    """What a held finding becomes once the gradient rule reports it (``final``: at the end of the run, where
    the optimizer seen holding it while it waited may be gone with the script)."""
    waiting = _waiting_holder(state, t)
    holder = _holder_of(waiting, inv) if waiting is not None else state.holders.get(f.name) if final else None
    outside = _outside_root(state, t, inv) if holder is None else None
    if outside is not None:
        decided = _outside_root_finding(info, t, step, outside, inv)
        return decided.replace(details={**_without_pending(decided), "decided_step": step})
    if state.grace and checks and f.reason.name != "created_after_optimizer":  # late (no check ran: the structure's words)
        decided = _late(holder, not_in_optimizer(info, t, step=step, got_grad=t.grad is not None,
                                                          inventory=inv, switched=switched), final, checks)
    elif f.reason.name == "unfrozen_after":  # the structure's words for it, kept whole
        decided = f
    else:
        decided = not_in_optimizer(info, t, step=step, got_grad=t.grad is not None, inventory=inv, switched=switched)
    details = _without_pending(decided)
    if f.first_step is not None and step > f.first_step:
        details["decided_step"] = step
    return decided.replace(details=details)


def _outside_root(state: MembershipState, t: torch.Tensor, inv: Inventory | None) -> tuple[str, str] | None:
    """When no optimizer holds any tensor of ``t``'s root module: the root's name in the
    script and the variable of the optimizer to add it to ("" when unknown); else None.
    Without ``outside_roots`` (a Monitor's own roots), read off the inventory."""
    if state.outside_roots is not None:
        return state.outside_roots().get(id(t))
    if inv is None or not inv.optimizers:
        return None
    if state.roots_read[0] is not inv:  # once per reading of the structure
        outside: dict[int, tuple[str, str]] = {}
        for prefix, root in inv.roots.items():
            ids = [id(p) for p in root.parameters()]
            if not inv.in_optimizer.intersection(ids):
                outside.update(dict.fromkeys(ids, (prefix, "")))
        state.roots_read = (inv, outside)
    return state.roots_read[1].get(id(t))


def _waiting_holder(state: MembershipState, t: torch.Tensor) -> torch.optim.Optimizer | None:
    """The optimizer that exists but has not stepped and holds ``t``; None when none does."""
    waiting = state.waiting_optimizers() if state.waiting_optimizers is not None else []
    return next((opt for opt in waiting for g in opt.param_groups for p in g["params"] if p is t), None)


def _holder_of(optimizer: torch.optim.Optimizer, inv: Inventory | None) -> tuple[str, str]:
    """``(the user's variable for it or "", its class)`` of an optimizer that holds a tensor and has not stepped."""
    variable = fixes.variable_for(optimizer, inv.variables if inv is not None else None,
                                  inv.fix_names if inv is not None else None)
    return variable or "", type(optimizer).__name__


def _late(holder: tuple[str, str] | None, base: Finding, final: bool, checks: int) -> Finding:
    # An optimizer that has not stepped yet may still step: a warning until the end of the run.
    severity = Severity.WARNING if holder is not None and not final else Severity.ERROR
    if holder is not None:
        return _never_stepped(holder, checks, base, severity)
    return base.replace(reason=NoOptimizerStepped(earlier=base.reason, checks=checks), severity=severity,
                        details={**_bookkeeping(base), "late_optimizer": True})


class NoOptimizerStepped(Transition, kind="not_in_optimizer", name="no_optimizer_stepped"):
    """No optimizer that stepped in ``checks`` checks holds the tensor; why it is out: the earlier reason."""

    checks: int

    def words(self, m: Members) -> Words:
        why = self.before(m)  # why it is out
        return Words(f"{m.who} requires grad but no optimizer that stepped in {self.checks} checks holds it: "
                     "it never changes.", why.cause, why.fix, why.remedy)


def _bookkeeping(f: Finding) -> dict[str, Any]:
    """A finding's details that a decision made of it keeps (not what it waited for, nor the late optimizer's)."""
    return {k: v for k, v in f.details.items() if k not in ("pending", "late_optimizer", "holder")}


def decide(state: MembershipState, hand: HandUpdates, f: Finding, inv: Inventory | None, step: int,
           checks: int, tracer: Tracer | None = None) -> Finding | None:
    """At the end of the run: what a held (or late-optimizer) finding becomes."""
    if f.details.get("pending") == Waiting.STRUCTURE:
        return f.replace(status=Status.OPEN, details=_without_pending(f))
    found = _reported_at_end(state, hand, inv, f.name, tracer)
    if found is None:
        return None
    t, info = found
    decided = _decide(state, f, info, t, step, checks, inv, final=True, switched=_switched_at(info, t, tracer))
    return decided.replace(status=Status.OPEN, first_step=f.first_step, steps_seen=f.steps_seen)


def escalate_late(view: FindingsView, step: int, checks: int) -> Verdicts:
    """At the end of the run: a late-optimizer warning still open becomes an error, a
    never-stepped one in its builder's words (from the details: the optimizer may be gone with
    the script); any other keeps its words."""
    out: Verdicts = []
    for f in view:
        if f.status == Status.OPEN and f.details.get("late_optimizer") and f.severity != Severity.ERROR:
            decided = f.replace(severity=Severity.ERROR, last_step=step)
            if isinstance(f.reason, NeverStepped):
                decided = _never_stepped(f.reason.holder, checks, decided, Severity.ERROR).replace(
                    first_step=f.first_step, last_step=step, steps_seen=f.steps_seen)
            out.append(Verdict.set(decided.replace(details={**decided.details, "decided_step": step})))
    return out


def not_in_optimizer(info: ParamInfo, p: torch.Tensor, *, step: int | None, got_grad: bool | None = None,
                     inventory: Inventory | None = None, switched: str | None = None) -> Finding:
    """A trainable tensor no optimizer holds; ``got_grad``: what the check saw (None: no check yet);
    ``switched``: the user's line whose ``requires_grad_()`` made the buffer ``p`` require grad, when seen."""
    name = info.name
    seen = inventory.appeared(p, inventory.optimizers_mark) if inventory is not None else None
    saw = {} if got_grad is None else {"got_grad": got_grad}
    args: dict[str, Any] = {"got_grad": got_grad, **_add_args(name, inventory), "module": info.module}
    if seen is not None and inventory is not None and inventory.optimizers and not _held_by_existing(p, inventory):
        where, function = seen[:2]
        built = max((b for b in map(inventory.built, inventory.optimizers) if b is not None), default=None)
        at = args["target"].at
        span = rebuild.after_change(at, seen[2])  # in the optimizer's scope, never inside a function it calls
        reason: InNoOptimizer = CreatedAfterOptimizer(
            **args, created_at=fixes.short_place(where), function=function, created_span=span,
            rebuilt=rebuild.rebuilt(at, span, args["target"].variable),
            created=fixes.outside_module(info.name, inventory) or name,
            lightning=fixes.framework(inventory.model, inventory.fix_names) == "lightning",
            built_at=None if built is None else fixes.short_place(built[1]), built_variable=None if built is None else built[2])
    elif (library := _built_by_library(info, p, args["target"], inventory)) is not None:
        reason = LibraryOptimizers(**args, **library)
    elif inventory is not None and (twice := _listed_twice(fixes.outside_module(name, inventory), inventory)):
        reason = twice
    elif info.buffer:
        registered = fixes.registration_args(inventory.modules.get(info.module) if inventory is not None else None,
                                             info.attribute)
        reason = (BufferRequiresGrad(**args, attribute=info.attribute, registered=registered) if switched is None
                  else BufferSwitchedOn(**args, attribute=info.attribute, switched_at=switched, registered=registered))
    else:
        reason = LeftOut(**args)
    return make(reason, name, "error", tensor=p, step=step, aliases=info.aliases, **saw)


def _held_by_existing(p: torch.Tensor, inv: Inventory) -> bool:
    """Whether an optimizer that exists holds ``p``, stepped or not yet (a ``loss_optimizer`` built after
    the tensor and stepped after the model's optimizer): then ``p`` was not created after every optimizer."""
    return any(q is p for opt in inv.existing() for g in opt.param_groups for q in g["params"])


def _built_by_library(info: ParamInfo, p: torch.Tensor, target: fixes.Target,
                      inv: Inventory | None) -> dict[str, Any] | None:
    """When a library's code built every optimizer (none by the user's, none held by a user variable):
    which library, where, and from which of the user's lines; Pyro's name for the tensor when Pyro's
    param store holds it. None otherwise: the user holds an optimizer, and the fix names it."""
    if inv is None or not inv.optimizers or target.variable is not None or target.framework:
        return None
    builders = [inv.built_by(o) for o in inv.optimizers]
    if any(b is None for b in builders) or len({b[0] for b in builders}) != 1:  # type: ignore[index]
        return None
    built = inv.built(inv.optimizers[0])
    module = fixes.outside_module(info.name, inv)
    return {"library": builders[0][0], "built_at": builders[0][1],  # type: ignore[index]
            "called_at": fixes.short_place(built[1]) if built is not None else None,
            "module_code": fixes.model_tensor_code(module, inv) if module else None,
            "pyro_name": _pyro_name(p) if builders[0][0] == "pyro" else None}  # type: ignore[index]


def _pyro_name(p: torch.Tensor) -> str | None:
    """The name ``pyro.module``/``pyro.param`` gave ``p`` in Pyro's param store (``decoder``), or None."""
    store = getattr(sys.modules.get("pyro"), "get_param_store", None)
    try:
        return store().param_name(p).split("$$$")[0] if store is not None else None
    except Exception:  # not in the store
        return None


class InNoOptimizer(Reason, kind="not_in_optimizer"):
    """A trainable tensor of the model no optimizer holds: what the check saw of its gradient (``got_grad``;
    None: no check yet), the module it sits in, and what the fix that gives it to an optimizer needs (the
    optimizer, ``target``; the module's tensors, ``module_params``, when all of the module is left out; else
    the tensor's code, ``param_code``)."""

    got_grad: bool | None = None
    target: fixes.Target = fixes.Target()
    module_params: str | None = None
    param_code: str | None = None
    module: str | None = None

    def message(self, m: Members) -> str:
        """The message of a tensor in no optimizer, by what the check saw of its gradient."""
        got_grad = m.shared("got_grad", self.got_grad)
        if got_grad is None:
            return f"{m.who} requires grad but is in no optimizer: nothing steps it."
        if got_grad:
            return f"{m.who} requires grad but is in no optimizer: it gets gradients and never changes."
        return (f"{m.who} requires grad but is in no optimizer, and no gradient reached it at this "
                "step either: it never trains.")

    def add(self, m: Members, target: fixes.Target | None = None) -> tuple[str, Remedy]:
        """:func:`~leafwatch.detectors.fixes.add_words` for the tensors of ``m``, to ``target`` (default: its own)."""
        params = m.shared("module_params") or fixes.params_of(m.each("param_code"))
        return fixes.add_words(params, target or self.target, "it")


class LibraryOptimizers(InNoOptimizer, name="library_optimizers", fixes="never"):
    """Every optimizer that steps was built inside a library (Pyro's ``PyroOptim``: one torch optimizer per
    parameter, inside ``svi.step``): the user holds none, so the fix names none; it says how the library
    collects what it trains."""

    library: str = ""
    built_at: str = ""
    called_at: str | None = None
    module_code: str | None = None
    pyro_name: str | None = None

    def words(self, m: Members) -> Words:
        what = f"`{self.module_code}`" if self.module_code else m.who
        inside = f", inside your call at {self.called_at}" if self.called_at else ""
        built = (f"the optimizers that step are built by `{self.library}` at {self.built_at}{inside}, and none of them "
                 "is yours")
        if self.library == "pyro":
            name = m.shared("pyro_name")
            registered = (f"{what} is in Pyro's param store (`pyro.module(\"{name}\", ...)`), but registered outside "
                          "the model and the guide" if name else
                          f"{what} is not registered with Pyro inside the model or the guide")
            call = f'pyro.module("{name or "<name>"}", ...)'
            return Words(self.message(m), f"{registered}: SVI steps only the parameters whose `pyro.param` sites run "
                         f"inside the model or the guide during `svi.step`, one torch optimizer each ({built}).",
                         f"call `{call}` on {what} inside the model (the function passed to SVI) or the guide that "
                         "uses it, at each call, as Pyro's examples do")
        return Words(self.message(m), f"{m.who} is in no optimizer: {built}; it gives them only the tensors it "
                     f"collects itself.", f"hand {what} to `{self.library}` the way it collects the tensors it trains, "
                     "or freeze it with `requires_grad_(False)`")


def _add_args(name: str, inv: Inventory | None) -> dict[str, Any]:
    """What the fix that gives the model's tensor ``name`` to the user's optimizer needs: the
    optimizer (``target``), the module the user assigned when all of it is left out
    (``module_params``: ``model.aux_head.parameters()``), else the tensor's code (``param_code``)."""
    if inv is None:
        return {}
    module = fixes.outside_module(name, inv)
    code_ = fixes.model_tensor_code(module, inv) if module else None
    return {"target": fixes.inventory_target(inv),
            "module_params": fixes.trainable_params_code(code_, inv.modules[module]) if code_ is not None else None,
            "param_code": fixes.model_tensor_code(name, inv)}


class LeftOut(InNoOptimizer, name="left_out"):
    """Left out when the optimizer's parameter list was built."""

    def words(self, m: Members) -> Words:
        add, remedy = self.add(m)
        hint = silence(m)
        return Words(self.message(m), f"{m.who} was left out when the optimizer's parameter list was built.",
                     f"{add}; or freeze it with `requires_grad_(False)`" + (f"; {hint}" if hint else ""), remedy)


class CreatedAfterOptimizer(InNoOptimizer, name="created_after_optimizer"):
    """The registration hooks saw the user's code create it (``created``: the module) at ``created_at`` in
    ``function``, after its optimizer was built (at ``built_at``, as ``built_variable``)."""

    created_at: str = ""
    function: str = ""
    created: str = ""
    created_span: Span | None = None
    lightning: bool = False
    built_at: str | None = None
    built_variable: str | None = None
    rebuilt: rebuild.Rebuilt | None = None

    def words(self, m: Members) -> Words:
        module, function = self.created, self.function
        optimizer = "the optimizer" if not self.built_at else f"`{self.built_variable or 'the optimizer'}`"
        after = f"after {optimizer} was built" + (f" at {self.built_at}" if self.built_at else "")
        where = self.created_at + ("" if function.startswith("<") else f" in `{function}`")
        cause = f"`{module}` was created at {where}, {after}: the optimizer's parameter list was made before it existed."
        if self.lightning:
            return Words(self.message(m), cause,
                         f"create `{module}` in `__init__` (or `setup`), before Lightning calls `configure_optimizers`: "
                         f"`{function}` runs after the optimizers are built")
        built = rebuild.after_last(m.each("created_span"), m.each("rebuilt"))
        if built is not None:
            return Words(self.message(m), cause, rebuild.words(built, self.target.variable),
                         code(built.code, built.edit))
        # (the tensors exist only from their creation on: the call goes right after it, not after the optimizer's)
        add, remedy = self.add(m, dataclasses.replace(self.target, at=self.created_span))
        return Words(self.message(m), cause, f"create `{module}` before the optimizer is built; or {add}", remedy)


#: The fix of a buffer meant as a parameter.
_AS_PARAMETER = ("make `{}` a parameter where the module registers it: pass the same tensor, wrapped in `nn.Parameter`, "
                 "to `self.register_parameter` in place of `self.register_buffer`, before the optimizer is built")


def _registered(registered: fixes.Assigned | None, words: str, tail: str = "") -> tuple[str, Remedy]:
    """``words`` then ``tail``, with the registration of the buffer as a parameter in place of the user's
    between them (code, where the registration was read from the class's source)."""
    snippet = registered.parameter_code if registered is not None else None
    if snippet is None:
        return words + tail, ADVICE
    at = registered.at  # type: ignore[union-attr]
    return f"{words}: `{snippet}`{tail}", code(snippet, None if at is None else at.put(snippet, "replace"))


class BufferRequiresGrad(InNoOptimizer, name="buffer_requires_grad"):
    """A buffer meant as a parameter: register it as one where it is registered now (``registered``: that
    registration rewritten, read from the class's source when the finding is decided)."""

    attribute: str = ""
    registered: fixes.Assigned | None = None

    def words(self, m: Members) -> Words:
        fix, remedy = _registered(self.registered, _AS_PARAMETER.format(self.attribute)
                                  + ", so that `parameters()` (and the optimizer) holds it")
        return Words(
            self.message(m),
            f"{m.who} is a buffer registered with `requires_grad=True`: `parameters()` does not list buffers, "
            "so the optimizer was built without it.", fix, remedy)


class BufferSwitchedOn(InNoOptimizer, name="buffer_switched_on"):
    """A buffer the user's own forward switches to requires grad (at ``switched_at``), meant as a parameter
    (``registered``: as for :class:`BufferRequiresGrad`; the ``requires_grad_()`` left is harmless then)."""

    attribute: str = ""
    switched_at: str = ""
    registered: fixes.Assigned | None = None

    def words(self, m: Members) -> Words:
        at = self.switched_at
        fix, remedy = _registered(self.registered, _AS_PARAMETER.format(self.attribute),
                                  f", and remove the `requires_grad_()` at {at.split(' ')[0]}")
        return Words(
            self.message(m),
            f"{m.who} is a registered buffer that your forward switches to `requires_grad` (`requires_grad_()` at "
            f"{at}): `parameters()` does not list buffers, so the optimizer was built without it.", fix, remedy)


def _never_stepped(holder: tuple[str, str], checks: int, base: Finding, severity: str) -> Finding:
    """``not_in_optimizer``/``never_stepped``: the tensor's optimizer exists and holds it, but its
    ``step()`` is never called; the fix is that call, on the user's variable for the optimizer.
    ``holder``: that variable ("" when none) and the optimizer's class, kept for the end of the run
    (the optimizer may be gone with the script)."""
    return base.replace(reason=NeverStepped(holder=tuple(holder), checks=checks, final=severity == Severity.ERROR),  # type: ignore[arg-type]
                        severity=severity, details={**_bookkeeping(base), "late_optimizer": True})


class NeverStepped(Reason, kind="not_in_optimizer", name="never_stepped"):
    """The only optimizer that holds the tensor (``holder``: the user's variable for it, or "", and its
    class) has not stepped in ``checks`` checks (``final``: at the end of the run)."""

    holder: tuple[str, str]
    checks: int
    final: bool

    def words(self, m: Members) -> Words:
        variable, cls = self.holder
        if variable:
            fix = (f"call `{variable}.step()` after the backward pass that computes its gradients, as for the "
                   "optimizers that step")
            remedy = code(f"{variable}.step()")
        else:
            fix = f"call `step()` on the `{cls}` that holds it after the backward pass that computes its gradients"
            remedy = ADVICE
        return Words(
            f"{m.who} is held only by an optimizer that {'never stepped' if self.final else 'has not stepped'} in "
            f"{self.checks} checks: it never changes.", f"{_holder_words(variable, cls)} was created with it, but its "
            "`step()` is never called, so its gradients are never applied.", fix, remedy)


def _holder_words(variable: str, cls: str) -> str:
    """An optimizer that holds a tensor, in words: `` `opt` (an `Adam`) ``, or "the `Adam` that holds it"."""
    return f"`{variable}` ({'an' if cls[:1] in 'AEIOU' else 'a'} `{cls}`)" if variable else f"the `{cls}` that holds it"


def _outside_root_finding(info: ParamInfo, t: torch.Tensor, step: int, names: tuple[str, str],
                          inv: Inventory | None) -> Finding:
    """A tensor of a module no optimizer holds any tensor of, that gets gradients and never
    changes. Intent sets the severity: when only some of the module's tensors require grad
    (adapters on a frozen base: someone chose what trains) its optimizer was forgotten, an
    error; when all of it requires grad it may be a fixed network left requiring grad, a
    warning naming both fixes. ``names``: the module's name in the script and the optimizer's
    variable ("" when unknown). The module is code in the fix only when the user's code for it
    is known (its variable, or its path from the Trainer); a root named by its class is words."""
    root, optimizer = names
    module = inv.roots.get(root) if inv is not None else None
    code_ = fixes.variable_for(module, inv.variables, inv.fix_names) if inv is not None and module is not None else None
    chosen = module is not None and any(not p.requires_grad for p in module.parameters())
    reason: Reason | None = _listed_twice(root, inv) if inv is not None and module is not None else None
    if reason is None:
        target = fixes.inventory_target(inv, variable=optimizer or None) if inv is not None else fixes.Target()
        reason = (ChosenOutside if chosen else RootOutside)(
            root=root, code=code_, module_params=fixes.trainable_params_code(code_, module) if code_ else None,
            target=target)
    return make(reason, info.name, "error" if chosen else "warning", tensor=t, step=step, aliases=info.aliases,
                got_grad=True, root=root, optimizer=optimizer)


def _module_code(name: str, inv: Inventory) -> str | None:
    """The user's code for the module ``name``: a root's variable, else its path under the model's."""
    root = inv.roots.get(name)
    if root is not None and name:
        return fixes.variable_for(root, inv.variables, inv.fix_names)
    return fixes.model_tensor_code(name, inv)


def _listed_twice(left_out: str | None, inv: Inventory) -> ListedTwice | None:
    """The module ``left_out`` (no optimizer holds any of its tensors) where an optimizer holds every tensor of
    a sibling of it twice, listed side by side in the user's statement (``list(d1.parameters()) +
    list(d1.parameters())``, ``d2`` left out): that typo, corrected. A sibling of another type counts only when
    ``left_out`` is the one module of that parent left out. None otherwise."""
    module = inv.modules.get(left_out) if left_out is not None else None
    if module is None or not left_out:
        return None
    parent = left_out.rpartition(".")[0]
    for optimizer, twice_held in zip(inv.optimizers, _held_twice(inv)):
        if not twice_held:
            continue
        for name, sibling in inv.modules.items():
            own = list(sibling.parameters())
            if (name == left_out or name.rpartition(".")[0] != parent or not own
                    or any(id(p) not in twice_held for p in own) or not _meant(sibling, module, name, inv)):
                continue
            twice, meant, built = _module_code(name, inv), _module_code(left_out, inv), inv.built(optimizer)
            corrected = fixes.corrected_operand(built[1], twice, meant) if twice and meant and built else None
            if corrected is not None:
                return ListedTwice(module=left_out, twice=twice, meant=meant, corrected=corrected[0],  # type: ignore[arg-type]
                                   edit=corrected[1], listed_at=corrected[2])
    return None


def _held_twice(inv: Inventory) -> list[set[int]]:
    """For each optimizer, the ids of the tensors it holds more than once (worked out once per inventory)."""
    cache = inv.fix_names
    if "held twice" not in cache:
        out = []
        for params in inv.optimizer_params:
            seen: set[int] = set()
            out.append({id(p) for p in params if id(p) in seen or seen.add(id(p))})  # type: ignore[func-returns-value]
        cache["held twice"] = out
    return cache["held twice"]


def _meant(sibling: Any, module: Any, name: str, inv: Inventory) -> bool:
    """Whether ``module`` (left out) is the one the duplicate of ``sibling`` was meant to be: of its type, or
    the only module beside it that no optimizer holds any tensor of."""
    if type(sibling) is type(module):
        return True
    parent = name.rpartition(".")[0]
    left = [m for n, m in inv.modules.items() if n.rpartition(".")[0] == parent and list(m.parameters())
            and all(id(p) not in inv.in_optimizer for p in m.parameters())]
    return len(left) == 1 and left[0] is module


class ListedTwice(Reason, kind="not_in_optimizer", name="listed_twice"):
    """A module (``module``, the user's code ``meant``) no optimizer holds any tensor of, while an optimizer holds
    a sibling's tensors twice: its statement lists ``twice`` twice side by side (at ``listed_at``), the second
    meant to be ``meant``; ``corrected``: that statement corrected, placed by ``edit``."""

    module: str
    twice: str
    meant: str
    corrected: str
    listed_at: str
    edit: Edit | None = None

    def words(self, m: Members) -> Words:
        twice, meant = self.twice, self.meant
        return Words(f"{m.who} requires grad but is in no optimizer: it gets gradients and never changes.",
                     f"`{twice}` is listed twice in an optimizer's parameters at {self.listed_at}, and `{meant}` in none: "
                     f"the second `{twice}` was meant to be `{meant}` (torch keeps the duplicate tensors, and only warns "
                     "of them).", f"list `{meant}` in place of the second `{twice}`: `{self.corrected}`",
                     code(self.corrected, self.edit))


class OutsideRoot(Reason, kind="not_in_optimizer"):
    """A tensor of a root module (``root``: its name in the script; ``code``: the user's code for it) no
    optimizer holds any tensor of, that gets gradients and never changes."""

    root: str
    code: str | None = None
    module_params: str | None = None
    target: fixes.Target = fixes.Target()

    def parts(self, m: Members) -> tuple[str, str, tuple[str, Remedy]]:
        owner = f"`{self.root}`" if self.root else "its module"
        if self.code:
            add = fixes.add_words(self.module_params, self.target, "it")
        else:
            add = "add its parameters to an optimizer (a new one, or yours with `add_param_group`)", ADVICE
        message = f"{m.who} gets gradients but no optimizer holds it, nor any tensor of {owner}: it never changes."
        return owner, message, add


class ChosenOutside(OutsideRoot, name="chosen_outside"):
    """Only some of the root's tensors require grad: the ones chosen to train were left out."""

    def words(self, m: Members) -> Words:
        owner, message, (add, remedy) = self.parts(m)
        return Words(message, f"no optimizer holds {owner} (none of its tensors), and only some of its tensors "
                     "require grad: the ones chosen to train (adapters on a frozen base) were left out of the "
                     "optimizer.", add, remedy)


class RootOutside(OutsideRoot, name="root_outside"):
    """All of the root requires grad: its optimizer was forgotten, or it is a fixed network that still requires grad."""

    def words(self, m: Members) -> Words:
        owner, message, (add, remedy) = self.parts(m)
        frozen = f"`{self.code}.requires_grad_(False)`" if self.code else "`requires_grad_(False)` on it"
        return Words(message, f"no optimizer holds {owner} (none of its tensors): its optimizer was forgotten, or it "
                     "is a fixed network that still requires grad.", f"{add}; or, if it should stay fixed, {frozen}",
                     remedy)


def _without_pending(f: Finding) -> dict[str, Any]:
    return {k: v for k, v in f.details.items() if k != "pending"}

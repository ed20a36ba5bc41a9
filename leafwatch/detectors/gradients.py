"""The gradient detector: per-tensor streaks of missing gradients, and the findings they make.

Fed the indices of the tensors whose ``.grad`` was None at a check (the Monitor's one read of
each ``p.grad``), it keeps for each tensor the current streak, the total misses and the longest
streak before, and returns its verdicts on ``missing_grad`` findings: open after ``patience``
checks in a row, ``intermittent`` (info) once the tensor got gradients at other checks, open
again as ``stalled`` when an intermittent tensor goes far longer than before without one.
Only the few tensors that miss are touched: a healthy step does no work here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from ..observe import changes as evidence, copies, cuts, graph, inventory, tracing
from ..report.findings import Finding, Kind, Severity, Status, Waiting
from ..report.history import FindingsView
from ..observe.structure import CheckList
from ..report.verdicts import Verdict, Verdicts, open_after
from . import causes, fixes, held, loop as stepping, silenced
from .causes import Explanation
from .constructors import ALL_PARAMETERS, UNKNOWN_CAUSE, make, missing_words, transition
from ..report.reasons import Reason, Transition, counter
from ..report.words import Members, Words
from .held import HeldState
from .loop import LR_READ_EVERY, cleared_fix
from ..observe.evidence import INVENTORY, LISTS, LOSS, SEEN, STEP, Evidence

#: A finding that stays the same at every check (an open error whose tensor misses at every
#: check) is not worked out again: its step and counts are brought up to date at each check
#: while there are at most STEADY_EXACT of them, else every STEADY_REFRESH checks (and at
#: ``state_dict()`` / ``close()``), so that a model with hundreds of dead tensors is not checked
#: at hundreds of times the cost of a healthy one.
STEADY_EXACT = 64
STEADY_REFRESH = 50

#: An intermittent tensor is reported again (a warning) once it goes this many checks in a row
#: without a gradient, and at least twice its longest gap before: it stopped training.
STALLED_AFTER = 100



#: The reasons of a missing gradient whose cause is not known (yet): the hooks may still tell.
_NO_CAUSE_YET = (None, "pending", "unknown", "unknown_hooks_off", "unknown_not_a_parameter", "traced_nothing")


@dataclasses.dataclass(eq=False, slots=True)
class GradientState:
    """Streaks and counts of missing gradients by tensor id, turned into findings by :func:`update`:
    ``missing_grad`` after ``patience`` checks in a row, explained by forward hooks if ``diagnose``."""

    patience: int
    diagnose: bool
    #: Whether the Monitor was created before any gradient existed (it saw the run from its start).
    from_start: bool = True
    streak: dict[int, int] = dataclasses.field(default_factory=dict)
    misses: dict[int, int] = dataclasses.field(default_factory=dict)
    longest: dict[int, int] = dataclasses.field(default_factory=dict)
    _restored: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The misses held until the evidence decides (EMA / target networks, LayerDrop).
    held: HeldState = dataclasses.field(default_factory=HeldState)
    _modules: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict)
    #: Module name -> each ``nn.ModuleList`` item it is in, innermost first; check list id -> how many of its
    #: tensors each such item holds (which layer was skipped is read from them at each check with a new miss).
    _layers: dict[str, tuple[tuple[str, int], ...]] = dataclasses.field(default_factory=dict)
    _layer_sizes: dict[int, dict[tuple[str, int], int]] = dataclasses.field(default_factory=dict)
    #: Module name -> the layer it was last skipped in (a check where every layer of its stack was skipped
    #: shows no sibling running: the stack seen before stands).
    _stacks: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    _steady: dict[int, tuple[str, CheckList, int]] = dataclasses.field(default_factory=dict)
    #: Bumped when a tensor enters or leaves ``_steady``; ``_repeat`` holds (the list, that
    #: count, the missing indices, their ids) of a check where every miss was a steady one.
    _steady_changes: int = 0
    _repeat: tuple[CheckList, int, list[int], list[int]] | None = None
    #: The cut last seen upstream of each tensor in a streak (forwards after the first are not
    #: instrumented while nothing changes: the cut stays known).
    _cuts: dict[int, cuts.Cut] = dataclasses.field(default_factory=dict)
    #: Bumped whenever a tensor enters or leaves a streak (the diagnostic hooks follow it).
    changes: int = 0
    #: At the last check: the indices (into its joined names) of the tensors without a gradient,
    #: how many tensors it checked, and whether a streak began.
    missing_now: list[int] = dataclasses.field(default_factory=list)
    checked_now: int = 0
    new_miss: bool = False
    #: The loop watch: gradients cleared before the step, learning rates, skipped steps.
    loop: stepping.LoopState = dataclasses.field(default_factory=stepping.LoopState)
    #: The count of structure readings last seen; what was learnt of tensors gone is forgotten at a new one.
    readings: int = -1
    #: At a check with misses: the ids of the modules a global forward hook watched over the step and never saw
    #: run (the observer's ``not_run``).
    not_run: frozenset[int] = frozenset()


def counted_only(state: GradientState) -> tuple[int, Collection[int]]:
    """The misses whose finding is counted at each check without being worked out again (the same open
    finding twice in a row: the forward hooks need not follow them), and a count of that set's changes."""
    return state._steady_changes, state._steady.keys()


def rebuilt(state: GradientState, inv: inventory.Inventory) -> None:
    """A new reading of the structure: forget what was learnt about tensors that are gone."""
    alive = set(inv.tensors) | set(inv.in_optimizer)
    held.forget(state.held, alive)
    state.held.evidence.follow_through(inv)  # (never a weak reference to a tensor a module or optimizer holds)
    state._cuts = {pid: c for pid, c in state._cuts.items() if pid in alive}
    state._modules = inv.modules
    state._layers, state._layer_sizes, state._stacks, state._steady, state._repeat = {}, {}, {}, {}, None
    state._steady_changes += 1


def _layers(state: GradientState, info: inventory.ParamInfo | None) -> tuple[tuple[str, int], ...]:
    if info is None:
        return ()
    if info.module not in state._layers:
        state._layers[info.module] = evidence.layers_of(info.module, state._modules)
    return state._layers[info.module]


def _skipped_layers(state: GradientState, clist: CheckList, missing: list[int]) -> dict[int, tuple[str, int]]:
    """Index of each missing tensor of ``clist`` in an ``nn.ModuleList`` -> the layer it was skipped in (the
    innermost item whose siblings ran), counted in the skip statistics (LayerDrop)."""
    fresh = [i for i in missing if id(clist.params[i]) not in state._steady]
    candidates = [_layers(state, clist.infos[i]) for i in fresh]
    if not any(candidates):
        return {}
    sizes = state._layer_sizes.get(id(clist))
    if sizes is None:  # once per reading of the structure: how many of the list's tensors each item holds
        sizes = state._layer_sizes[id(clist)] = {}
        for info in clist.infos:
            for layer in _layers(state, info):
                sizes[layer] = sizes.get(layer, 0) + 1
    out = {}
    for i, layer in zip(fresh, evidence.skipped_layers(candidates, sizes)):
        module = clist.infos[i].module  # (a tensor with candidates has its info)
        if layer is None:
            layer = state._stacks.get(module)
        else:
            state._stacks[module] = layer
        if layer is not None:
            out[i] = layer
            state.held.skips.skipped(layer[0], layer[1], clist.checks, state._modules)
    return out


def update(state: GradientState, view: FindingsView, clist: CheckList, missing: list[int], step: int, *,
           tracer: tracing.Tracer, reachable: set[int] | None, skip: set[int], hand_set: Callable[[], Any] = lambda: None,
           copied: Callable[[torch.Tensor], copies.Copy | None] = lambda p: None) -> Verdicts:
    """Record one check of ``clist``: ``missing`` are the indices without a gradient, ``skip`` the ids reported
    elsewhere (watched tensors, replaced ones), ``hand_set`` the look for a loss whose ``requires_grad`` was set by
    hand, ``copied`` for a library's copy run in place of a module (each asked only for a miss to explain)."""
    out: Verdicts = []
    repeat = state._repeat
    if repeat is not None and repeat[0] is clist and repeat[1] == state._steady_changes and repeat[2] == missing:
        # The same steady misses as at the last check (500 dead tensors): counted in one pass.
        streaks, counts = state.streak, state.misses
        for pid in repeat[3]:
            streaks[pid] += 1
            counts[pid] += 1
        _after_update(state, view, clist, set(repeat[3]) if len(repeat[3]) != len(streaks) else None, step, out)
        return out
    now: set[int] = set()
    # Count the skipped layers of each ModuleList first: a layer is judged with all its siblings of this check known.
    layers = _skipped_layers(state, clist, missing) if state._modules and missing else {}
    steady, streaks, counts = state._steady, state.streak, state.misses
    steady_hits: list[int] = []
    for i in missing:
        p = clist.params[i]
        pid = id(p)
        if pid in steady:
            # The same open error as at the last check: counted, refreshed in bulk.
            now.add(pid)
            steady_hits.append(pid)
            streaks[pid] += 1
            counts[pid] += 1
            continue
        if not p.requires_grad or pid in skip or pid in state.held.targets:
            continue
        now.add(pid)
        streak = streaks[pid] = streaks.get(pid, 0) + 1
        misses = counts[pid] = counts.get(pid, 0) + 1
        if streak == 1:
            state.changes += 1
        name, info = clist.names[i], clist.infos[i]
        layer = layers.get(i)
        if streak < state.patience:
            continue
        if info is None and view.is_open(("stale_param", name)):
            continue  # the replaced tensor: its stale_param finding already says it will not train
        _report_miss(state, view, clist, i, streak, misses, step, tracer, reachable, layer, out, hand_set, copied)
    steady_now = state._steady_changes
    _after_update(state, view, clist, now if len(now) != len(streaks) else None, step, out)
    # Every miss a steady one, and none left or entered the steady set since: the next check
    # with the same misses takes the one-pass count above.
    state._repeat = (clist, steady_now, list(missing), steady_hits) \
        if len(steady_hits) == len(missing) and steady_now == state._steady_changes else None
    return out


def _after_update(state: GradientState, view: FindingsView, clist: CheckList, now: set[int] | None, step: int,
                  out: Verdicts) -> None:
    """The tensors of ``clist`` in a streak but not in ``now`` recovered (None: every tensor in a
    streak missed again); the steady findings brought up to date when due."""
    if now is not None:
        for pid in [k for k in state.streak if k in clist.ids and k not in now]:
            out += _recovered(state, view, clist, pid, step)
    if state._steady and (len(state._steady) <= STEADY_EXACT or step % STEADY_REFRESH == 0):
        out += refresh(state, view, step)


def refresh(state: GradientState, view: FindingsView, step: int) -> Verdicts:
    """Bring the steps and counts of the steady findings up to date (they are not rebuilt per check)."""
    out: Verdicts = []
    for pid, (name, clist, written) in list(state._steady.items()):
        old = view.get(("missing_grad", name))
        if old is None or old.status != Status.OPEN:
            del state._steady[pid]
            state._steady_changes += 1
            continue
        checks_of_p, misses = clist.checks_of(pid), state.misses.get(pid, 0)
        if misses == written:
            continue
        state._steady[pid] = (name, clist, misses)
        out.append(Verdict.count(old.replace(step=step, last_step=step, steps_seen=old.steps_seen + misses - written,
                                             details={**old.details, "checks": checks_of_p, "steps_without_grad": misses})))
    return out


def _explain(state: GradientState, clist: CheckList, pid: int, info: inventory.ParamInfo | None,
             tracer: tracing.Tracer, old: Finding | None) -> causes.Explanation | None:
    """Why the tensor ``pid`` got no gradient, as the diagnostic hooks and the cut recorder observed it
    (``old``: its finding of an earlier check)."""
    explanation = None
    if info is not None and state.not_run and id(state._modules.get(info.module)) in state.not_run:
        explanation = causes.never_called(info.module)  # a global hook watched the step: it never ran
    elif info is not None and info.module in tracer.armed_since_reset and info.module not in tracer.records \
            and _siblings_got_grads(clist, info):
        # The module never ran through its hooks, yet its other parameters got gradients.
        explanation = causes.called_directly(state._modules.get(info.module))
    elif info is not None:
        explanation = causes.explain_missing(info.module, info.attribute, tracer.records, tracer.armed_since_reset,
                                             state._modules, ops_traced=tracer.ops_traced)
        explanation = causes.call_kept(explanation, old.reason if old is not None else None)
    cut = _observed_cut(state, pid, tracer)
    if cut is not None and (explanation is None or explanation.reason.name not in ("grad_disabled", "checkpoint", "inside_function")):
        # Seen, not guessed: the op that cut it and its line (a module run under no_grad as a
        # whole stays a module-level cause: an EMA target is told from a mistake by it).
        explanation = causes.explain_cut(cut, pid, info.attribute if info is not None else "")
    return explanation


def _report_miss(state: GradientState, view: FindingsView, clist: CheckList, i: int, streak: int, misses: int,
                 step: int, tracer: tracing.Tracer, reachable: set[int] | None, layer: tuple[str, int] | None,
                 out: Verdicts, hand_set: Callable[[], Any], copied: Callable[[torch.Tensor], copies.Copy | None]) -> None:
    p, name, info = clist.params[i], clist.names[i], clist.infos[i]
    pid, checks_of_p = id(p), clist.checks_of(id(p))
    old = view.get(("missing_grad", name))
    explanation = _explain(state, clist, pid, info, tracer, old)
    if (explanation is None or explanation.reason.name == "never_ran") and info is not None and not tracer.records \
            and info.module in tracer.armed_since_reset and (copy := copied(p)) is not None:
        explanation = causes.copied_weights(copy)  # none of the model ran: a library's copy ran in its place
    if (explanation.reason.name if explanation is not None else None) in silenced.EXPLAINS and (found := hand_set()):
        explanation = silenced.explain(found, explanation)  # backward stopped at a loss made to require grad by hand
    reason = explanation.reason.name if explanation is not None else None
    if held.judges(state.held, pid, reason):
        # Ran only under no_grad: an EMA / target network, or an encoder run under no_grad by
        # mistake. Whether it changes between checks tells them apart.
        found = held.target(state.held, p, name, old, explanation, step, lambda: missing_grad(
            name, p, step=step, explanation=explanation, info=info, checks=checks_of_p, misses=misses))  # type: ignore[arg-type]
        if found is None:  # it changes by other means: a target, no longer followed
            state.changes += 1
            state.streak.pop(pid, None)
            state.misses.pop(pid, None)
            found = [Verdict.drop(("missing_grad", name))]
        out += found
        return
    if pid not in state.held.decided and layer is not None and reason == "never_ran" and misses >= checks_of_p \
            and (old is None or old.status != Status.OPEN):  # (a shown error is no suspect: its hold would not count it)
        found = held.layerdrop(state.held, pid, missing_grad(name, p, step=step, explanation=explanation, info=info,
                                                             checks=checks_of_p, misses=misses),
                               layer, misses, clist.checks, step, lambda: _module_already_open(view, clist, info, out))
        if found is not None:
            out += found
            return
    before = old  # (a miss held while its module was being traced: traced now)
    if old is not None and old.status == Status.PENDING:
        old = None  # a suspicion the evidence settled: reported afresh below
    if old is not None and explanation is None and old.reason.observed not in _NO_CAUSE_YET:
        # Explained before and nothing new: keep the cause, update the counts.
        kept = old.replace(step=step, last_step=step, status=old.status if old.status == Status.INTERMITTENT
                           else Status.OPEN, details={**old.details, "checks": checks_of_p, "steps_without_grad": misses})
        out.append(Verdict.open(_stalled(kept, streak, _stall_limit(state, pid), checks_of_p, misses)))
        return
    if explanation is None:
        explanation = _without_hooks(state, info, None if reachable is None else "no_graph" if reachable is graph.NO_GRAPH
                                     else pid in reachable, before)
    f = missing_grad(name, p, step=step, explanation=explanation, info=info, checks=checks_of_p, misses=misses)
    if f.reason.name == "pending" and misses >= checks_of_p:
        # Its module's hooks had not seen a whole step: no cause to give yet, so no error to show
        # yet either (the next check, traced, decides).
        out.append(Verdict.hold(f.with_details(pending=Waiting.TRACE)))
        return
    if misses < checks_of_p or old is not None and old.status == Status.INTERMITTENT:
        f = intermittent(f, checks_of_p, misses, step)
    f = _stalled(f, streak, _stall_limit(state, pid), checks_of_p, misses)
    out.append(Verdict.open(f))
    if f.status == Status.OPEN and misses >= checks_of_p and f.reason.name not in _NO_CAUSE_YET \
            and old is not None and old.status == f.status and old.reason.compared() == f.reason.compared():
        # The same finding twice in a row: from now on it is counted, not worked out again.
        state._steady[pid] = (name, clist, misses)
        state._steady_changes += 1


def _observed_cut(state: GradientState, pid: int, tracer: tracing.Tracer) -> cuts.Cut | None:
    """The cut the recorder saw upstream of ``pid``: this round's when a forward was
    instrumented (and remembered), else the one remembered from the last instrumented forward."""
    if not tracer.ops_traced:
        return state._cuts.get(pid)
    cut = tracer.cut_of(pid)
    if cut is None:
        state._cuts.pop(pid, None)
    else:
        state._cuts[pid] = cut
    return cut


def _recovered(state: GradientState, view: FindingsView, clist: CheckList, pid: int, step: int) -> Verdicts:
    """A tensor in a streak got a gradient: an open (or held) finding becomes intermittent."""
    state.longest[pid] = max(state.longest.get(pid, 0), state.streak.pop(pid))
    if state._steady.pop(pid, None) is not None:
        state._steady_changes += 1
    state._cuts.pop(pid, None)
    state.changes += 1
    old = view.get(("missing_grad", clist.name_of(pid)))
    if old is None:
        return []
    came = old.status != Status.PENDING and old.reason.observed == "pending"
    if came:  # the placeholder promised a cause at the next check: the gradient came instead
        old = transition(old, CameBack, step=step).replace(
            status=old.status, first_step=old.first_step, last_step=old.last_step, steps_seen=old.steps_seen)
    if old.status in (Status.OPEN, Status.PENDING) or came and old.status == Status.INTERMITTENT:
        state.held.suspects.pop(pid, None)
        old = intermittent(old, clist.checks_of(pid), state.misses.get(pid, 0), step)
    elif not came:
        return []
    return [Verdict.set(old)]


def _stall_limit(state: GradientState, pid: int) -> int:
    return max(state.patience, STALLED_AFTER, 2 * state.longest.get(pid, 0))


def misses_by_name(state: GradientState, names: Mapping[int, str]) -> dict[str, int]:
    return {names[k]: v for k, v in state.misses.items() if k in names}


def restore(state: GradientState, misses: Mapping[str, int]) -> None:
    """Miss counts by name from a saved state, applied by :func:`apply_restored`."""
    state._restored = dict(misses)


def apply_restored(state: GradientState, view: FindingsView, names: Mapping[int, str]) -> None:
    """Map restored counts onto the tensors that carry those names now."""
    if not state._restored:
        return
    for pid, name in names.items():
        if name in state._restored:
            state.misses[pid] = state._restored[name]
            record = view.get(("missing_grad", name))
            if record is not None and record.status == Status.OPEN:
                # Still missing when saved: a gradient after the resume ends it as usual.
                state.streak[pid] = state.patience
    state._restored = {}


def _module_already_open(view: FindingsView, clist: CheckList, info: inventory.ParamInfo, out: Verdicts) -> bool:
    """Another parameter of the same module is already an open missing_grad error (or confirmed
    by this check's verdicts): the module is known not to run (a parameter handed to the
    optimizer later is no new LayerDrop suspicion)."""
    after = open_after(out, "missing_grad")
    return any(other is not None and other is not info and other.module == info.module
               and after.get(n, view.is_open(("missing_grad", n)))
               for n, other in zip(clist.names, clist.infos))


def _siblings_got_grads(clist: CheckList, info: inventory.ParamInfo) -> bool:
    """Another parameter of the same module, not shared with any other module (a tied weight
    gets its gradient through the module it is tied to), got a gradient."""
    return any(other is not None and other is not info and other.module == info.module and not other.aliases
               and q.grad is not None for q, other in zip(clist.params, clist.infos))


def _stalled(f: Finding, streak: int, limit: int, checks_of_p: int, misses: int) -> Finding:
    """An intermittent tensor without a gradient for ``limit`` checks or more: open again, as a warning."""
    if misses >= checks_of_p or streak < limit:
        return f
    return transition(f, Stalled, {"stalled_for": streak}, limit=limit).replace(
        status=Status.OPEN, severity=Severity.WARNING)


def no_gradient_at_all(evidence: Evidence, state: None, view: FindingsView, grads: GradientState) -> Verdicts | None:
    """``audit()``'s closing part (docs/architecture.md): with neither the loss nor forward hooks, a
    check where no checked tensor had a gradient (coverage 0) is one finding that says so (it
    ran before ``backward()`` or after ``zero_grad()``), not one per tensor."""
    missing = [f for f in view if f.kind == Kind.MISSING_GRAD and f.status == Status.OPEN]
    if any(f.reason.name == "silenced_loss" for f in missing):
        return None  # the loss whose requires_grad was set by hand is why: that finding says so
    if not grads.checked_now or len(grads.missing_now) != grads.checked_now or len(missing) < 2:
        return None
    names = [n for f in missing for n in (f.name, *f.aliases)]
    return [*(Verdict.merge(f.key) for f in missing), Verdict.open(no_grad_at_all(
        names, step=missing[0].last_step, optimizers=evidence[SEEN].cache.optimizers))]


def decide_held(evidence: Evidence, state: None, view: FindingsView, grads: GradientState) -> Verdicts:
    """At the end of the run: the steady findings' counts brought up to date, and each missing gradient
    still held (an EMA target that may move, a layer that may be dropped) decided."""
    out = refresh(grads, view, evidence[STEP])
    for f in view.pending():
        if f.kind == Kind.MISSING_GRAD:
            decided = held.decide(grads.held, f)
            out.append(Verdict.drop(f.key) if decided is None else Verdict.set(decided))
    return out


def read(evidence: Evidence, grads: GradientState, view: FindingsView) -> Verdicts | None:
    """The hot path, right after backward when every line runs cold: the misses of the one read of
    each ``p.grad``, with the loop watch's and the gradient state's gates read in place (each call costs
    microseconds). Leaves in its state what the later detectors read: the misses, and whether one is new."""
    seen, step, loss, inv = evidence[SEEN], evidence[STEP], evidence[LOSS], evidence[INVENTORY]
    cache, loop, arrivals, sentinels = seen.cache, grads.loop, seen.arrivals, seen.sentinels
    if grads.readings != cache.rebuilds and inv is not None:  # a new reading of the structure
        grads.readings = cache.rebuilds
        rebuilt(grads, inv)
        apply_restored(grads, view, inv.known_names())
    reachable: set[int] | None = None
    walked = loss is None  # the loss's graph is walked only when a tensor misses its gradient
    offset, streaks, force = 0, len(grads.streak), False
    skip: set[int] | None = None
    hand_set: Callable[[], Any] | None = None
    copied: Callable[[torch.Tensor], copies.Copy | None] | None = None
    out: Verdicts | None = None  # a healthy check makes no list
    grads.missing_now = missing_now = []
    for key, clist, missing in evidence[LISTS]:
        if arrivals.arrived or loop.cleared.ongoing or loop.cleared.all_cleared:
            missing, found = stepping.judge(loop, arrivals, view, clist, missing, key, step, cache.optimizers)
            out = found if out is None else out + found
        if key is not None and (clist.checks % LR_READ_EVERY == 0 or clist.checks == 1
                                or sentinels.alert or loop.skips.judged):  # the loop watch has work to do
            now, found = stepping.about_to_step(loop, sentinels, view, cache.optimizers[key], key, clist, step, inv)
            force |= now
            out = found if out is None else out + found
        if missing or grads.streak:
            if skip is None:
                # Watched tensors are reported under their watch name, replaced ones as stale_param.
                skip = {id(e.tensor()) for e in seen.watch_entries()} | cache.stale_ids
            if missing and not walked:
                reachable, walked = graph.reachable_leaf_ids(loss), True
            if hand_set is None:
                hand_set = silenced.finder(loss, lambda: {id(q) for _, c, _ in evidence[LISTS] for q in c.params} | skip,
                                           lambda: all(len(m) == len(c.params) for _, c, m in evidence[LISTS]),
                                           lambda: seen.observer.handed_loss)
            if copied is None:
                copied = copies.finder()
            grads.not_run = seen.observer.not_run
            found = update(grads, view, clist, missing, step, tracer=seen.tracer, reachable=reachable, skip=skip,
                           hand_set=hand_set, copied=copied)
            out = found if out is None else out + found
            missing_now.extend([i + offset for i in missing] if offset else missing)
        offset += len(clist.params)
    loop.force_values, grads.new_miss, grads.checked_now = force, len(grads.streak) > streaks, offset
    return out


# -- its words ---------------------------------------------------------------------------------
def missing_grad(name: str, t: torch.Tensor, *, step: int | None, explanation: Explanation,
                 info: inventory.ParamInfo | None = None, checks: int | None = None,
                 misses: int | None = None) -> Finding:
    """A trainable tensor without a gradient, for the reason ``explanation`` gives (what the hooks and
    the cut recorder saw, the loss's graph, or why nothing could be seen)."""
    details: dict[str, Any] = {}
    if explanation.group is not None:  # every tensor cut at one place is one mistake, said where it is
        details.update(group=explanation.group, location=explanation.location or explanation.group)
    elif explanation.reason.name == "loss_without_graph":  # one mistake: the loss, whichever tensors it misses
        details.update(group="the loss given", location="from the loss given")
    reason = explanation.reason
    if info is not None:
        details["module"] = info.module
        reason = dataclasses.replace(explanation.reason, module=info.module)
    if checks is not None:
        details.update(checks=checks, steps_without_grad=misses)
    return make(reason, name, "error", tensor=t, step=step, aliases=info.aliases if info else (), **details)


def _without_hooks(state: GradientState, info: inventory.ParamInfo | None, reachable: bool | str | None,
                   old: Finding | None) -> Explanation:
    """Why a tensor has no gradient when no hook explained it: from the loss given (``reachable``:
    whether backward from it reaches the tensor, ``"no_graph"``: that loss has no autograd graph),
    else pending while the hooks trace a step, else unknown, saying why leafwatch could not see more."""
    if reachable == "no_graph":
        return Explanation(LossWithoutGraph())
    if reachable is not None:
        return Explanation(Unreachable() if reachable is False else NotBackpropagated())
    traced_before = old is not None and old.reason.observed in _NO_CAUSE_YET[1:]
    if state.diagnose and info is not None and not traced_before:
        return Explanation(Pending(traced=info.module or "the model"))
    if traced_before:  # traced for a whole step and still nothing to say: the placeholder goes, the truth stays
        return Explanation(TracedNothing(traced=info.module if info else ""))
    if state.from_start and info is None:
        return Explanation(UnknownNotAParameter())
    return Explanation(UnknownHooksOff() if state.from_start else Unknown())


#: The fix of a miss whose cause is not known.
_USE_IT = "use {who} in the loss, or freeze it with `requires_grad_(False)` if that is intended"


class LossWithoutGraph(causes.Miss, name="loss_without_graph"):
    """The loss given has no autograd graph."""

    cause_text = ("the loss passed as `loss=` has no autograd graph (it does not require grad: computed "
                  "under `torch.no_grad()`, detached, or a constant), so no gradient can reach a tensor from it.")
    fix_text = "pass the loss that `backward()` is called on, computed with gradients on (its `grad_fn` is not None)"


class Unreachable(causes.Miss, name="unreachable"):
    """Backward from the loss given does not reach the tensor."""

    cause_text = ("{who} is not reachable from the loss: nothing in the loss depends on it (never used, or "
                  "cut off by `.detach()`, `torch.no_grad()`, a NumPy round trip or a `torch.tensor(...)` rewrap).")
    fix_text = ("if the forward uses {who}, keep its output in the graph: no `.detach()`, `torch.no_grad()`, "
                "`.item()`/NumPy round trip or `torch.tensor(...)` rewrap between it and the loss (a `Monitor` created "
                "before the first forward names the line); if it does not, call it in the forward or freeze it with "
                "`requires_grad_(False)`")


class NotBackpropagated(causes.Miss, name="not_backpropagated"):
    """The loss given reaches the tensor, and it has no gradient: the check ran before backward."""

    cause_text = ("{who} is reachable from the loss but has no gradient: backward() was not called "
                  "yet, was called with `inputs=` that leave it out, or the grad was cleared after it.")
    fix_text = "call audit()/check() after loss.backward() and before optimizer.step()/zero_grad()"


class UnknownNotAParameter(causes.Miss, name="unknown_not_a_parameter"):
    """No hook can see a tensor that is no parameter of the model."""

    cause_text = ("unknown: {who} is no parameter of the model, so leafwatch's module hooks cannot see "
                  "how it is used. Pass `loss=` to check() to walk the loss's graph.")
    fix_text = _USE_IT


class UnknownHooksOff(causes.Miss, name="unknown_hooks_off"):
    """The diagnostic hooks are off (``diagnose=False``)."""

    cause_text = ("unknown: the diagnostic hooks are off (`diagnose=False`). Pass `loss=` to check() to "
                  "walk the loss's graph.")
    fix_text = _USE_IT


class Unknown(causes.Miss, name="unknown"):
    """Only the end state was seen (no hook armed before the forward, no loss given)."""

    cause_text = UNKNOWN_CAUSE
    fix_text = _USE_IT


class Pending(causes.Miss, name="pending"):
    """The forward hooks were armed on ``traced`` and say why at the next check."""

    traced: str

    def words(self, m: Members) -> Words:
        return missing_words(m, f"being traced: leafwatch armed forward hooks on `{m.shared('traced', self.traced)}` "
                             "and will say why at the next check.", _USE_IT.format(who=m.who))


class TracedNothing(causes.Miss, name="traced_nothing"):
    """The forward hooks on ``traced`` saw a whole step and found no module-level cause."""

    traced: str

    def words(self, m: Members) -> Words:
        traced = m.shared("traced", self.traced)
        return missing_words(
            m, f"unknown: the forward hooks on {f'`{traced}`' if traced else 'the model'} saw the whole step and found "
            f"no module-level cause: {m.who} is probably used outside any module's forward (in a function or the "
            "training loop), where a `.detach()`, `torch.no_grad()` or a `torch.tensor(...)` rewrap "
            "cut it. Pass `loss=` to check() to walk the loss's graph.", _USE_IT.format(who=m.who))


class CameBack(Transition, kind="missing_grad", name="came_back", fixes="never"):
    """A tensor that got no gradient at first got one again at ``step``: used at some steps only."""

    step: int

    def words(self, m: Members) -> Words:
        before = self.before(m)
        return Words(before.message, f"{m.who} got no gradient at first and got one again at step {self.step}: it "
                     "is used at some steps only (routing, branches, alternating optimizers).", before.fix, before.remedy)


def no_grad_at_all(names: Sequence[str], *, step: int | None,
                   optimizers: Sequence[torch.optim.Optimizer] = ()) -> Finding:
    """One finding for a check that found no gradient on any trainable tensor (every name an alias,
    so ``ignore=`` patterns on parameter names still apply)."""
    variable = fixes.variable_for(optimizers[0]) if len(optimizers) == 1 else None
    return make(NoGradAtAll(count=len(names), optimizer_variable=variable), ALL_PARAMETERS, "error", step=step,
                aliases=tuple(names), count=len(names))


class NoGradAtAll(Reason, kind="missing_grad", name="no_grad_at_all"):
    """None of the ``count`` trainable tensors has a gradient at the check."""

    count: int
    optimizer_variable: str | None = None

    def words(self, m: Members) -> Words:
        clear, remedy = cleared_fix(self.optimizer_variable)
        return Words(
            f"none of the {self.count} trainable tensors has a gradient.",
            "no gradient exists at all: the check ran before `loss.backward()` or after "
            "`optimizer.zero_grad()`, or the training loop clears the gradients between `backward()` and "
            "`step()` (then nothing trains).",
            "check after `loss.backward()` and before the optimizer's `step()`; if that is where it runs, "
            + clear + ", never between `backward()` and `step()`", remedy)


def intermittent(finding: Finding, checks: int, misses: int, step: int | None) -> Finding:
    """``missing_grad``/``intermittent``: gradients at other steps; the cause and fix observed stay (its ``earlier``)."""
    return transition(finding, Intermittent, {"checks": checks, "steps_without_grad": misses}, checks=checks,
                      misses=misses).replace(severity="info", status="intermittent", last_step=step)


class Intermittent(Transition, kind="missing_grad", name="intermittent", fixes="never"):
    """A tensor that got no gradient in ``misses`` of ``checks`` checked steps (counters: the finding stays the same)."""

    checks: int = counter()
    misses: int = counter()

    def words(self, m: Members) -> Words:
        before = self.before(m)
        return Words(f"{m.who} got no gradient in {self.misses} of {self.checks} checked steps "
                     "(routing, LayerDrop, branches or alternation: expected for mixture-of-experts, dropped layers "
                     "and GANs).", before.cause, before.fix, before.remedy)


class Stalled(Transition, kind="missing_grad", name="stalled", fixes="never"):
    """An intermittent tensor without a gradient for ``limit`` checks or more in a row: it stopped training."""

    limit: int

    def words(self, m: Members) -> Words:
        before = self.before(m)
        return Words(f"{m.who} got gradients before, but none in {self.limit} or more checks in a row: "
                     "it stopped training.", before.cause, before.fix, before.remedy)

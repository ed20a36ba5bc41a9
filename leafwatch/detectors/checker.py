"""The check's parts and the owners of state they drive: what one check does, in order.

:class:`Checker` holds the small owners a check needs (the gradient tracker, the watched-tensor
tracker, the membership judge, the loss-graph leaves, the batched value check, dead gradients,
the loop watch and the diagnostic tracer) and the one ordered list of the check's parts, run by
a :class:`~leafwatch.detectors.pipeline.Pipeline` so that a part that fails leaves an ``incomplete``
finding. The :class:`~leafwatch.monitor.Monitor` owns the public surface (arguments, hooks on the
optimizers, sinks, strict mode, distributed merging) and asks its Checker to run a check.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..observe import graph, inventory, structure
from .. import watching
from ..observe.evidence import CheckState
from . import constructors as checks, ranks
from . import loop as stepping
from . import outside
from . import structure as structural
from .gradients import GradientTracker
from .membership import MembershipJudge
from .values import GradientValues
from .watched import WatchedTracker
from ..observe.diagnostics import Diagnostics
from ..observe.loop import ArrivalHooks, StepSentinels
from ..report.events import CheckEvent
from ..report.findings import Report
from ..report.history import FindingHistory
from ..observe.frames import stacklevel_outside
from ..options import LeafwatchWarning, WarnOnce, validate_int, warn_unmatched_ignore
from ..report.format import NOTHING_TO_CHECK
from .pipeline import Part, Pipeline
from ..report.verdicts import Verdict, Verdicts


class Checker:
    """The parts of a check, in their one order, and the state they keep across checks.

    Args:
        structure: The structure cache (names, optimizer sets, check lists).
        history: Where every finding is written.
        watches: The Monitor's own watched tensors (``tensors=``).
        patience: Checks without a gradient before ``missing_grad``.
        diagnose: Whether forward hooks explain missing gradients.
        check_values_every_n_steps: The NaN/Inf check's cadence (0: off).
        warn: Warns once per internal failure.
        request_check: Asked to check an optimizer that skipped many steps unchecked.
    """

    def _trainable_names(self) -> tuple[str, ...]:
        """The names of the model's trainable tensors (the history names mistakes by module):
        one tuple per structure reading and set of ``requires_grad`` flags."""
        inv = self.structure.inventory
        if inv is None:
            return ()
        names = inv.trainable_paths()
        if names != self._names:
            self._names = names
        return self._names

    def __init__(self, structure_: structure.StructureCache, history: FindingHistory, watches: watching.WatchSet, *,
                 patience: int, diagnose: bool, check_values_every_n_steps: int, warn: WarnOnce,
                 request_check: Callable[[torch.optim.Optimizer], Any]) -> None:
        self.structure = structure_
        self.history_store = history
        self.watches = watches
        self.check_values_every_n_steps = check_values_every_n_steps
        self._warn = warn
        #: The step of the current (or last) check.
        self.step = 0
        #: How many checks ran.
        self.checks = 0
        view = history.view  # what the detectors read; their verdicts come back through the pipeline
        self._grads = GradientTracker(view, patience, diagnose)
        self._watched = WatchedTracker(view)
        self._membership = MembershipJudge(view, lambda: self.checks)
        self.values = GradientValues(structure_, view, check_values_every_n_steps)
        self._loss_leaves = outside.LossLeaves()
        self._loop = loop = stepping.LoopWatch(view, ArrivalHooks(), StepSentinels(
            lambda o: loop.skips.wants_check(o) and request_check(o), lambda: self.step, warn))
        self.diagnostics = Diagnostics(structure_, self._grads, loop, diagnose, warn)
        self._tracer = self.diagnostics.tracer
        self._ignore_checked = False
        self._names: tuple[str, ...] = ()
        history.tensor_names = self._trainable_names
        self._state = state = CheckState(None, None)
        self._emitted = -1  # the first check's event counts as a change
        #: The history's revision when the last event was built (-1: none yet).
        self.emitted_revision = -1
        #: The one ordered list of the check's parts; a failing part leaves an ``incomplete`` finding.
        self.pipeline: Pipeline[CheckState] = Pipeline((
            Part("reading the model's structure", self._read_structure),
            Part("the gradient check", self._read_gradients),
            Part("the check of watched tensors", self._judge_watched,
                 when=((watching.DEFAULT, "by_name"), (watches, "by_name"), (self._watched, "may_be_open"))),
            Part("the loss-graph check", self._judge_loss_leaves, when=((state, "loss"),)),
            Part("the optimizer-membership check", self._membership.judge, when=((self._membership, "waiting"),)),
            Part("the NaN/Inf gradient check", self.values.judge),
            Part("the diagnostic hooks", self.diagnostics.retarget),
        ), history, warn)
        #: What a scan before any gradient reads.
        self.scanning: tuple[Part[Any], ...] = (Part("the structure scan", self._scan),)
        #: What the end of a run decides, in order.
        self.closing: tuple[Part[Any], ...] = (
            Part("the last NaN/Inf gradient check", self._last_values),
            Part("the end-of-run decisions", self._decide_pending),
            Part("the loss-graph check", self._undecided_loss_leaves),
        )

    # -- driven by the Monitor ------------------------------------------------------------------
    def arm(self) -> None:
        """At creation: diagnostic hooks on every module until the first check (never raises)."""
        snapshot = self.structure.snapshot()  # a layer replaced from now on is paired by name
        self._grads.from_start = snapshot is None or all(t.grad is None for t in snapshot.tensors.values())
        self.diagnostics.arm(snapshot)

    def run(self, optimizer: torch.optim.Optimizer | None, loss: torch.Tensor | None, step: int) -> None:
        """One check at ``step``: every part in order."""
        self.step = step
        self.checks += 1
        # One state object for every check (fresh lists: an event keeps the last check's).
        state = self._state
        state.optimizer, state.loss, state.streaks_before = optimizer, loss, len(self._grads.streak)
        state.step, state.inventory = step, self.structure.inventory
        state.index, state.lists, state.missing, state.entries, state.force_values = None, [], [], [], False
        self.pipeline.run(state, step)
        state.loss = None  # kept for the event, never the user's graph

    def failed_event(self, part: str, error: Exception) -> CheckEvent | None:
        """The event of a check that failed outside its parts: the report says so (``incomplete``)."""
        try:
            self.pipeline.failed(part, error, self.step)
            return self.event(None, failed=True)
        except Exception as again:  # the history itself failed: warn, keep the last report
            self._warn("Monitor.check", again)
            return None

    def report(self) -> Report:
        """The report after the last check (built once per change of the history)."""
        return self.history_store.report(self.step)

    def event(self, optimizer: torch.optim.Optimizer | None, *, failed: bool = False) -> CheckEvent:
        """What the sinks get after the last check (``failed``: it stopped outside its parts).

        ``changed`` compares with the last event built: a Monitor without sinks builds none.
        """
        history = self.history_store
        report = history.report(self.step)
        changed, self._emitted, self.emitted_revision = self._emitted != history.version, history.version, history.revision
        if failed:
            return CheckEvent(self.step, None, report, True, (), [], None)
        state = self._state
        lists = state.lists
        names = lists[0].names if len(lists) == 1 else self.structure.joined_names(lists)
        coverage = None if not names else 1.0 - len(state.missing) / len(names)
        index = state.index if optimizer is state.optimizer else self.structure.optimizer_index(optimizer)
        return CheckEvent(self.step, index, report, changed, names, state.missing, coverage)

    def scan(self) -> None:
        """Read the structure before any gradient exists (a failure is an ``incomplete`` finding)."""
        self.pipeline.run(None, self.step, self.scanning)

    def _scan(self, _: Any) -> Verdicts:
        out = self._rebuilt(self.structure.rebuild(self.step), before_gradients=True)
        entries = self._watch_entries()
        # No gradient can have arrived yet: only what is wrong already (a watched non-leaf).
        return out + [Verdict.open(f) for f in checks.watched_findings(
            entries, self.step, {e.name: True for e in entries}, self.structure.inventory)]

    def finish(self) -> None:
        """The end of the run: the last value check and every decision still pending."""
        self.pipeline.run(None, self.step, self.closing)

    def close(self) -> None:
        """Remove the diagnostic and loop hooks."""
        self.diagnostics.close()

    def wait_for_optimizers(self, checks_: int, waiting: Callable[[], list[torch.optim.Optimizer]] | None = None,
                            outside_roots: Callable[[], dict[int, tuple[str, str]]] | None = None,
                            variables: Callable[[], dict[int, str]] | None = None, values_until: int = 0) -> None:
        """See :meth:`leafwatch.Monitor.wait_for_optimizers`."""
        self.values.every_check_values_until = validate_int(values_until, "values_until", 0)
        self.structure.variables = variables
        self._membership.grace = validate_int(checks_, "checks", 0)
        self._membership.waiting_optimizers = waiting
        self._membership.outside_roots = outside_roots

    def misses_by_name(self) -> dict[str, int]:
        """Per-name counts of checks without a gradient, for ``state_dict()``."""
        inv = self.structure.inventory
        self.history_store.apply(self._grads.refresh(self.step))
        return self._grads.misses_by_name(inv.known_names() if inv else {})

    def restore(self, step: int, misses: dict[str, int]) -> None:
        """What ``load_state_dict()`` restores: the step and the per-name miss counts."""
        self.step = step
        self._grads.restore(misses)

    def stats(self) -> dict[str, int]:
        """Sizes of what the check keeps, for tests of its bounds and of its hot path."""
        return {"streaks": len(self._grads.streak), "miss_counts": len(self._grads.misses), **self.diagnostics.stats(),
                "watch_counts": self._watched.sizes(), **self.values.stats(),
                "step_watches": len(self._loop.sentinels.seen), "loss_graph_walks": self._loss_leaves.walks}

    # -- the parts, and what they share ---------------------------------------------------------
    def _watch_entries(self) -> list[watching.WatchEntry]:
        # Right after backward every distinct piece of Python code runs cold (tens of µs): with
        # nothing watched, don't even take the registries' locks.
        entries = watching.entries() if watching.any_watched() else []
        return entries + self.watches.entries() if self.watches else entries

    def _undecided_loss_leaves(self, _: Any) -> Verdicts:
        """A run of one check (``audit()``) cannot tell a persistent leaf of the loss from a fresh one."""
        if self.checks != 1:
            return []
        return [Verdict.open(f) for f in self._loss_leaves.undecided(self.step, self.structure.inventory)]

    def _last_values(self, _: Any) -> Verdicts:
        return self.values.finish(self.step)

    def _decide_pending(self, _: Any = None) -> Verdicts:
        """At the end of the run, whatever still waits for evidence is decided by the detector that held it."""
        inv = self.structure.inventory
        out = self._grads.refresh(self.step) + self._membership.escalate_late(self.step)
        for f in self.history_store.view.pending():
            if f.kind == "missing_grad":
                decided = self._grads.held.decide(f)
            elif f.details.get("source") == "watch":
                decided = self._watched.decide(f)
            else:
                decided = self._membership.decide(f, inv, self.step)
            out.append(Verdict.drop(f.key) if decided is None else Verdict.set(decided))
        return out

    def _rebuilt(self, inv: inventory.Inventory, before_gradients: bool = False) -> Verdicts:
        """After a rebuild of the structure: its verdicts, and what waited for the names."""
        self._grads.rebuilt(inv)
        self._membership.rebuilt(inv)
        shown, held = self._membership.split(
            structural.structural(inv, step=self.step, previous_names=self.structure.previous_names,
                                  stale=self.structure.stale, seen_frozen=self.structure.seen_frozen), inv,
            before_gradients=before_gradients)
        out = structural.verdicts(self.history_store.view, shown, self.step, held)
        sharded = ranks.sharded_finding(self.structure.grad_view, self.step)
        if sharded is not None and self.history_store.get(sharded.key) is None \
                and all(f.key != sharded.key for f in shown):
            out.append(Verdict.open(sharded))
        self._grads.apply_restored(inv.known_names())
        self._loop.sentinels.track(self.structure.optimizers, self.structure.lists, self.structure.stale_ids)
        if self.history_store.ignore and not self._ignore_checked:
            self._ignore_checked = True
            names = inv.all_names() | {e.name for e in self._watch_entries()}
            warn_unmatched_ignore(self.history_store.ignore, names)
        _say_if_nothing_to_check(self.history_store, inv, out, self._watch_entries)
        return out

    def _read_structure(self, state: CheckState) -> Verdicts | None:
        cache, optimizer = self.structure, state.optimizer
        if optimizer is not None:
            state.index = cache.index_of.get(id(optimizer))
            if state.index is None:  # an optimizer the Monitor was not given: adopt it
                cache.add_optimizer(optimizer)
                state.index = cache.optimizer_index(optimizer)
        inv = cache.refresh(self.step)
        if inv is not None:
            state.inventory = inv
        state.lists = cache.all_lists if optimizer is None else [cache.lists[state.index]]
        return self._rebuilt(inv) if inv is not None else None

    def _read_gradients(self, state: CheckState) -> Verdicts | None:
        # The hot path, right after backward when every line runs cold: one read of each p.grad,
        # and the loop watch's and the tracker's gates read in place (each call costs microseconds).
        cache, loop, grads = self.structure, self._loop, self._grads
        optimizer, loss = state.optimizer, state.loss
        keys = cache.lists if optimizer is None else (state.index,)
        reachable: set[int] | None = None
        walked = loss is None  # the loss's graph is walked only when a tensor misses its gradient
        offset = 0
        skip: set[int] | None = None
        out: Verdicts | None = None  # a healthy check makes no list
        for key, clist in zip(keys, state.lists):
            missing = [i for i, p in enumerate(clist.params) if p.grad is None]
            clist.checks += 1
            if loop.arrivals.arrived or loop.cleared.ongoing or loop.cleared.all_cleared:
                missing, found = loop.judge(clist, missing, key, self.step, cache.optimizers)
                out = found if out is None else out + found
            if key is not None and (clist.checks % stepping.LR_READ_EVERY == 0 or clist.checks == 1
                                    or loop.sentinels.alert or loop.skips.judged):  # the loop watch has work to do
                force, found = loop.about_to_step(cache.optimizers[key], key, clist, self.step, cache.inventory)
                state.force_values |= force
                out = found if out is None else out + found
            if missing or grads.streak:
                if skip is None:
                    # Watched tensors are reported under their watch name, replaced ones as stale_param.
                    skip = {id(e.tensor()) for e in self._watch_entries()} | cache.stale_ids
                if missing and not walked:
                    reachable, walked = graph.reachable_leaf_ids(loss), True
                found = grads.update(clist, missing, self.step, tracer=self._tracer, reachable=reachable, skip=skip)
                out = found if out is None else out + found
                state.missing.extend([i + offset for i in missing] if offset else missing)
            offset += len(clist.params)
        if grads.held.targets:  # (read in place: a target network's tensors are left out of the lists)
            cache.leave_out(grads.take_new_targets())
        return out

    def _judge_watched(self, state: CheckState) -> Verdicts | None:
        if not (watching.DEFAULT.by_name or self.watches.by_name or self._watched.may_be_open):
            return None  # nothing watched and no watched finding open
        entries = state.entries = self._watch_entries()
        if entries:
            self._watched.optimizers_version = (self.structure.rebuilds, structure.structure_generation())
        return self._watched.update(entries, self.step, self.structure.inventory, self._in_judging_optimizer)

    def _judge_loss_leaves(self, state: CheckState) -> Verdicts | None:
        loss, cache = state.loss, self.structure
        if loss is None or not self._loss_leaves.wants_walk(len(self._grads.streak) > state.streaks_before):
            return None
        return [Verdict.open(f) for f in self._loss_leaves.observe(
            loss, self.step, new_miss=True, inventory=cache.inventory, exclude=lambda: outside.judged_elsewhere(
                cache.inventory, [*cache.optimizers, *structure.stepping_optimizers()], state.entries))]

    def _in_judging_optimizer(self, entry: watching.WatchEntry) -> bool:
        """A Monitor's own ``tensors=`` are judged by its optimizers; ``watch()``-ed tensors by its
        optimizers and every optimizer seen stepping while a Monitor was open (never by one that only
        an ``audit()`` call was given). A Monitor without optimizers judges nothing."""
        own = any(e is entry for e in self.watches.entries())
        mine = self.structure.optimizers
        optimizers = mine if own or not mine else [*mine, *structure.stepping_optimizers()]
        return not optimizers or id(entry.tensor()) in outside.optimizer_ids(optimizers)


def _say_if_nothing_to_check(history: FindingHistory, inv: inventory.Inventory, found: Verdicts,
                             watched: Callable[[], list[Any]]) -> None:
    """No tensor requires grad, nothing is watched and the structure shows nothing: the report
    says "nothing to check", not "no findings", and a warning says so when it becomes true."""
    nothing = (not found and not any(t.requires_grad for t in inv.tensors.values())
               and not any(p.requires_grad for params in inv.optimizer_params for p in params)
               and not watched())
    if nothing and not history.nothing_to_check:
        warnings.warn(f"leafwatch: nothing to check: {NOTHING_TO_CHECK} (a model without parameters, "
                      "or every parameter frozen), so no finding can appear.",
                      LeafwatchWarning, stacklevel=stacklevel_outside())
    history.nothing_to_check = nothing

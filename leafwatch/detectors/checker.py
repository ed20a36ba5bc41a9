"""The runner of a check: its evidence read once, then the registry's detectors in order.

:class:`Checker` holds what the detectors keep across checks (the gradient state, the
watched tensors' state, the membership judge, the loss-graph leaves, the value checks and the values read (observe/), the
loop watch, and each registered detector's own state), the diagnostic hooks, and the pipeline it
builds from :data:`~leafwatch.detectors.registry.DETECTORS`, so that a part that fails leaves an
``incomplete`` finding. The :class:`~leafwatch.monitor.Monitor` owns the public surface (arguments,
hooks on the optimizers, sinks, strict mode, distributed merging) and asks its Checker to run a check.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..observe import changes, crashes, evidence as observed, inventory, structure
from ..observe.values import NamedValueCheck
from ..observe.frames import stacklevel_outside
from ..report.format import NOTHING_TO_CHECK
from ..report.findings import Status
from .. import watching
from ..observe.evidence import INDEX, LISTS, REBUILT, Evidence, Observation
from . import crashes as explained, gradients, held, loop as stepping, registry, unchecked
from ..options import warn_unmatched_ignore
from ..observe.diagnostics import Diagnostics
from ..observe.loop import ArrivalHooks, StepSentinels
from ..report.events import CheckEvent
from ..report.findings import Finding, Report
from ..report.history import FindingHistory
from ..options import LeafwatchWarning, WarnOnce, validate_int
from .pipeline import Part, Pipeline


#: The part that reads a check's evidence, as an ``incomplete`` finding names it.
READING = "reading the model's structure"


class Checker:
    """The detectors of a check, in the registry's order, and the state they keep across checks.

    Args:
        structure: The structure cache (names, optimizer sets, check lists).
        history: Where every finding is written.
        watches: The Monitor's own watched tensors (``tensors=``).
        patience: Checks without a gradient before ``missing_grad``.
        diagnose: Whether forward hooks explain missing gradients.
        check_values_every_n_steps: The NaN/Inf check's cadence (0: off).
        warn: Warns once per internal failure.
        request_check: Asked to check an optimizer that skipped many steps unchecked.
        detectors: What the check runs (None: :data:`~leafwatch.detectors.registry.DETECTORS`).
    """

    # Slots: past 30 attributes an instance gets a dict of its own, and the hot path's reads a slow path.
    __slots__ = ("structure", "history_store", "_warn", "step", "seen", "grads", "loop", "diagnostics", "tracer",
                 "ignore_checked", "_names", "_checked", "_emitted", "emitted_revision", "states", "merging",
                 "pipeline", "scanning", "closing", "one_look", "crashing")

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
                 request_check: Callable[[torch.optim.Optimizer], Any],
                 detectors: Sequence[registry.Detector] | None = None) -> None:
        self.structure = structure_
        self.history_store = history
        self._warn = warn
        #: The step of the current (or last) check.
        self.step = 0
        #: Each registered detector's own state, by its name.
        detectors = registry.ordered(registry.DETECTORS if detectors is None else detectors)
        config = registry.Config(patience, diagnose, check_values_every_n_steps)
        self.states = {d.name: d.state(config) for d in detectors if d.state is not None}
        #: The gradient check's state (its misses, streaks and loop watch): the diagnostic hooks follow its misses.
        self.grads: gradients.GradientState = self.states[registry.GRADIENTS]
        self.loop = loop = self.grads.loop
        arrivals, sentinels = ArrivalHooks(), StepSentinels(  # the loop hooks that ``loop`` judges
            lambda o: stepping.wants_check(loop.skips, o) and request_check(o), lambda: self.step, warn)
        structure_.watch_swaps(sentinels.swapped)  # a swapped sentinel is hooked again at the next reading
        self.diagnostics = Diagnostics(structure_, arrivals, sentinels, diagnose, warn)
        self.tracer = self.diagnostics.tracer
        #: What the detectors read of the Monitor's observing objects (each check's evidence holds it).
        self.seen = Observation(structure_, self.tracer, arrivals, sentinels, NamedValueCheck(track_zeros=True), watches,
                                watching.DEFAULT, {k: changes.HandUpdates() for k in ("watched", "membership", "loss")})
        self.ignore_checked = False
        self._names: tuple[str, ...] = ()
        history.tensor_names = self._trainable_names
        #: What the last check read: its optimizer, that optimizer's index and its check lists (never the loss).
        self._checked: tuple[Any, int | None, tuple[Any, ...]] = (None, None, ())
        self._emitted = -1  # the first check's event counts as a change
        #: The history's revision when the last event was built (-1: none yet).
        self.emitted_revision = -1
        stages: dict[str, list[Part[Any]]] = {registry.SCAN: [], registry.CHECK: [], registry.CLOSE: [],
                                              registry.ONE_LOOK: [], registry.CRASH: []}
        #: The merge of the ranks' findings: the Monitor's Gatherer runs it, on a history of its own.
        self.merging = tuple(d for d in detectors if d.stage == registry.RANKS)
        for d in detectors:
            if d.stage != registry.RANKS:  # (run by the Gatherer)
                state, needed = self.states.get(d.name), tuple(self.states[n] for n in d.needs)
                stages[d.stage].append(Part(d.name, d.judge, state, needed, d.when(state, self.seen, *needed) if d.when else ()))
        #: The check's detectors in their one order, then what observe/ is handed back (the diagnostic
        #: hooks re-aimed, targets left out); a failing part leaves an ``incomplete`` finding.
        self.pipeline: Pipeline[Evidence] = Pipeline(
            (*stages[registry.CHECK], Part("the diagnostic hooks", self._aim_diagnostics)), history, warn)
        #: What a scan before any gradient runs; what the end of a run decides, in order (and of one look).
        self.scanning, self.closing = tuple(stages[registry.SCAN]), tuple(stages[registry.CLOSE])
        self.one_look = tuple(stages[registry.ONE_LOOK])
        #: What explains an exception torch raised for a leaf mistake (the crash door, once per exception).
        self.crashing = tuple(stages[registry.CRASH])

    # -- driven by the Monitor ------------------------------------------------------------------
    def arm(self) -> None:
        """At creation: diagnostic hooks on every module until the first check (never raises)."""
        snapshot = self.structure.snapshot()  # a layer replaced from now on is paired by name
        self.grads.from_start = snapshot is None or all(t.grad is None for t in snapshot.tensors.values())
        if snapshot is not None:  # (the end of a run that no check saw tells a stepped model by them)
            unchecked.note(self.states[registry.UNCHECKED], snapshot.tensors)
        self.diagnostics.arm(snapshot)

    @property
    def checks(self) -> int:
        """How many checks ran."""
        return self.seen.checks

    def run(self, optimizer: torch.optim.Optimizer | None, loss: torch.Tensor | None, step: int) -> None:
        """One check at ``step``: its evidence read, then every part in order."""
        self.step = step
        seen, pipeline = self.seen, self.pipeline
        seen.checks += 1
        try:
            evidence = observed.read(seen, optimizer, loss, step)
        except Exception as error:  # noqa: BLE001 - (an `incomplete` finding says so) the parts judge what they keep
            pipeline.failed(READING, error, step)
            cache = self.structure
            evidence = step, optimizer, loss, cache.optimizer_index(optimizer), cache.inventory, None, (), seen
        else:
            if pipeline.failing:
                pipeline.ran(READING, step)
        pipeline.run(evidence, step)
        if evidence[REBUILT] is not None:
            self._read_anew(evidence[REBUILT])
        self._checked = optimizer, evidence[INDEX], evidence[LISTS]

    def _aim_diagnostics(self, check: Evidence, state: None, view: Any) -> None:
        """The check's last part: observe/ is handed what the detectors decided it should follow (the
        diagnostic hooks the misses and the cleared gradients; the structure cache the target networks
        to leave out of the per-step reads)."""
        grads, loop, tracer, optimizers = self.grads, self.loop, self.tracer, len(self.structure.optimizers)
        arrivals = self.seen.arrivals
        if tracer.handles or grads.streak or arrivals.handles or loop.cleared.ongoing or loop.cleared.all_cleared:
            cleared, loop.cleared_now = loop.cleared_now, []
            self.diagnostics.retarget(grads.changes, grads.streak, cleared, gradients.counted_only(grads))
        if optimizers > 1 or tracer.handles or tracer.records or tracer.armed_since_reset or tracer.order \
                or tracer.checked_in_round:  # (else the tracer has nothing to forget: no call)
            tracer.end_check(check[INDEX], optimizers)
        if grads.held.targets:  # (read in place: a target network's tensors are left out of the lists)
            self.structure.leave_out(held.take_new_targets(grads.held))

    def _read_anew(self, inv: inventory.Inventory) -> None:
        """After a new reading of the structure: the report says "nothing to check" when nothing can
        be found, and ``ignore`` patterns that match nothing are warned about once."""
        history = self.history_store
        if history.ignore and not self.ignore_checked:
            self.ignore_checked = True
            warn_unmatched_ignore(history.ignore, inv.all_names() | {e.name for e in self.seen.watch_entries()})
        shown = any(f.status != Status.PENDING for f in history.view)
        nothing = (not shown and not any(t.requires_grad for t in inv.tensors.values())
                   and not any(p.requires_grad for params in inv.optimizer_params for p in params)
                   and not self.seen.watch_entries())
        if nothing and not history.nothing_to_check:
            warnings.warn(f"leafwatch: nothing to check: {NOTHING_TO_CHECK} (a model without parameters, "
                          "or every parameter frozen), so no finding can appear.",
                          LeafwatchWarning, stacklevel=stacklevel_outside())
        history.nothing_to_check = nothing

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
        checked, index, lists = self._checked
        names = lists[0][1].names if len(lists) == 1 else self.structure.joined_names([clist for _, clist, _ in lists])
        index = index if optimizer is checked else self.structure.optimizer_index(optimizer)
        coverage = 1.0 - len(self.grads.missing_now) / len(names) if names else None  # (None: nothing was checked)
        return CheckEvent(self.step, index, report, changed, names, self.grads.missing_now, coverage,
                          self.structure.in_no_optimizer())

    def scan(self) -> None:
        """Read the structure before any gradient exists (a failure is an ``incomplete`` finding)."""
        try:
            inv = self.structure.rebuild(self.step)
        except Exception as error:  # noqa: BLE001 - the report says so
            self.pipeline.failed(READING, error, self.step)
            return
        self.pipeline.run(observed.at_rest(self.seen, self.step, inv), self.step, self.scanning)
        self._read_anew(inv)

    def finish(self, interrupted: bool = False) -> None:
        """The end of the run: the last value check and every decision still pending (``interrupted``: the run
        ended by an exception, and what waits for a later step stays undecided)."""
        self.seen.interrupted = interrupted
        self.pipeline.run(observed.at_rest(self.seen, self.step), self.step, self.closing)

    def crash(self, error: BaseException, contexts: Sequence[crashes.Context] = ()) -> list[Finding]:
        """An exception torch raised because of a leaf mistake: the crash entry run on what its traceback shows
        (and what this Monitor's hooks saw), through the pipeline onto the history; the findings it made.

        Raises:
            Exception: the traceback could not be read (the door warns: the exception goes on as it is).
        """
        if crashes.recognise(error) is None:
            return []
        seen = crashes.read(error, [*(c for c in contexts if c.tracer is not self.tracer), self.diagnostics.crash_context()])
        before = {f.key: f for f in self.history_store.view}
        self.pipeline.run((self.step, seen), self.step, self.crashing)
        return explained.together([f for f in self.history_store.view if f.details.get("crash")
                                    and before.get(f.key) is not f])

    def close(self) -> None:
        """Remove the diagnostic and loop hooks."""
        self.diagnostics.close()

    def wait_for_optimizers(self, checks_: int, waiting: Callable[[], list[torch.optim.Optimizer]] | None = None,
                            outside_roots: Callable[[], dict[int, tuple[str, str]]] | None = None,
                            variables: Callable[[], dict[int, str]] | None = None, values_until: int = 0) -> None:
        """See :meth:`leafwatch.Monitor.wait_for_optimizers` (the runner configures the states it built)."""
        values_, membership = self.states["the NaN/Inf gradient check"], self.states["the optimizer-membership check"]
        values_.every_check_values_until = validate_int(values_until, "values_until", 0)
        self.structure.variables = variables
        membership.grace = validate_int(checks_, "checks", 0)
        membership.waiting_optimizers = waiting
        membership.outside_roots = outside_roots
        self.states[registry.UNCHECKED].waiting = waiting

    def misses_by_name(self) -> dict[str, int]:
        """Per-name counts of checks without a gradient, for ``state_dict()``."""
        inv = self.structure.inventory
        self.history_store.apply(gradients.refresh(self.grads, self.history_store.view, self.step))
        return gradients.misses_by_name(self.grads, inv.known_names() if inv else {})

    def restore(self, step: int, misses: dict[str, int]) -> None:
        """What ``load_state_dict()`` restores: the step and the per-name miss counts."""
        self.step = step
        gradients.restore(self.grads, misses)

    def stats(self) -> dict[str, int]:
        """Sizes of what the check keeps, for tests of its bounds and of its hot path."""
        return {"streaks": len(self.grads.streak), "miss_counts": len(self.grads.misses), **self.diagnostics.stats(),
                "watch_counts": len(self.states["the check of watched tensors"].counts), **self.seen.values.stats(),
                "step_watches": len(self.seen.sentinels.seen),
                "loss_graph_walks": self.states["the loss-graph check"].walks}

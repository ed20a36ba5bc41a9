"""``Monitor``: the checks across steps, with history, patience and diagnostic hooks.

The Monitor orchestrates small owners of state: the :class:`~leafwatch.structure.StructureCache`
(names, optimizer sets, what is read per step; rebuilt only when a cheap fingerprint changes),
the :class:`~leafwatch.grads.GradientTracker` (streaks of missing gradients -> findings), the
:class:`~leafwatch.history.FindingHistory` (findings over time, a version per change), the
diagnostic :class:`~leafwatch.tracing.Tracer`, the batched value check and, when distributed,
the :class:`~leafwatch.integrations.distributed.Gatherer`. Per optimizer step it does only what
can change per step: one pass over a precomputed list reading ``p.grad``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import checks, graph, inventory, outside, stepping, structure, tracing, values, watching
from .console import NewFindingWarnings
from .dead import DeadGradTracker
from .events import CheckEvent
from .findings import Finding, Report, Status
from .grads import GradientTracker, WatchedTracker
from .history import FindingHistory, parse_state
from .membership import MembershipJudge
from .integrations import distributed as _distributed
from .options import WarnOnce, got, validate_bool, validate_ignore, validate_int, warn_unmatched_ignore
from .values import NamedValueCheck

#: The NaN/Inf check runs every this many checks: on a model of 1,000 small tensors one batched
#: check costs about 10% of a CPU training step (benchmarks/bench.py), so 20 keeps it near 0.5%.
DEFAULT_VALUE_CHECK_EVERY = 20


class Monitor:
    """Checks every optimizer step and keeps each finding's history.

    Create it before the first forward pass: until its first :meth:`check` it arms forward hooks
    on every module so that the first step's missing gradients are fully explained. Afterwards
    hooks stay only on modules that missed a gradient.

    Args:
        model: The model (DDP, ``torch.compile`` and Lightning Fabric wrappers are unwrapped: names
            are the user's own).
        optimizers: One optimizer or a sequence; without them every trainable parameter is checked.
            Wrappers (accelerate's ``AcceleratedOptimizer``, Fabric's, ``LightningOptimizer``, any
            object exposing the real optimizer as ``.optimizer``) are unwrapped once, here.
        tensors: Extra tensors to check, name -> tensor; only this Monitor checks them (unlike
            :func:`leafwatch.watch`, which every check consults).
        patience: Consecutive checks a trainable parameter may go without a gradient before
            ``missing_grad`` is reported.
        ignore: Patterns on names (``{"head.*": "why"}`` or ``["head.*"]``); matching findings
            are reported as ``ignored`` with the reason. A pattern equal to a name matches it
            literally, else it is a glob (``*``, ``?``, ``[...]``); the first match wins.
        check_values_every_n_steps: Run the batched NaN/Inf check every N checks (0 turns it off).
        writer: A ``SummaryWriter`` to log each check to TensorBoard.
        strict: Raise :class:`LeafwatchError` at the first check with an open error finding.
        diagnose: Arm the diagnostic forward hooks (on by default).
        sinks: Extra callables taking a :class:`~leafwatch.CheckEvent`.
        distributed: Merge the findings of every rank after each check (rank zero runs the
            sinks, every rank gets the merged report and raises in strict mode). None: when
            ``torch.distributed`` is initialized with more than one process.
        roots: Root modules to read instead of ``model``: a mapping name -> module, or a sequence
            of modules (one root gets no prefix, several their class name, as ``leafwatch run``
            names the roots it finds).
        verbose: Warn once about each new open finding as it appears (short: kind, name, fix).
            None: on once :meth:`attach` is called, off for explicit :meth:`check` calls.

    Example::

        >>> import torch, leafwatch
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> with leafwatch.Monitor(model, opt) as monitor:
        ...     model(torch.ones(4, 2)).sum().backward()
        ...     report = monitor.check()
        >>> report.findings
        []
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        *,
        tensors: Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | None = None,
        patience: int = 1,
        ignore: Mapping[str, str] | Sequence[str] | None = None,
        check_values_every_n_steps: int = DEFAULT_VALUE_CHECK_EVERY,
        writer: Any = None,
        strict: bool = False,
        diagnose: bool = True,
        sinks: Sequence[Callable[[CheckEvent], Any]] = (),
        distributed: bool | None = None,
        roots: Mapping[str, nn.Module] | Sequence[nn.Module] | None = None,
        verbose: bool | None = None,
    ) -> None:
        model = inventory.normalize_model(model)
        optimizers = inventory.normalize_optimizers(optimizers)
        named_roots = inventory.normalize_roots(roots)
        self.patience = validate_int(patience, "patience", 1)
        self.check_values_every_n_steps = validate_int(check_values_every_n_steps, "check_values_every_n_steps", 0)
        self.strict = validate_bool(strict, "strict")
        self.diagnose = validate_bool(diagnose, "diagnose")
        if verbose is not None:
            validate_bool(verbose, "verbose")
        if not isinstance(sinks, (list, tuple)) or not all(callable(s) for s in sinks):
            raise TypeError(f"`sinks` must be a sequence of callables taking a CheckEvent, got {got(sinks)}")
        if distributed is not None and not isinstance(distributed, bool):
            raise TypeError(f"`distributed` must be a bool or None, got {type(distributed).__name__}: {distributed!r}")
        self.history_store = FindingHistory(validate_ignore(ignore))
        self.structure = structure.StructureCache(model, optimizers, named_roots)
        self.watches = watching.WatchSet()
        for name, t in inventory.normalize_tensors(tensors).items():
            watching.add_watch(self.watches, t, name)
        self._sinks: list[Callable[[CheckEvent], Any]] = list(sinks)
        self.verbose = verbose
        if verbose:
            self._sinks.insert(0, NewFindingWarnings())
        if writer is not None:
            from .integrations.tensorboard import TensorBoardSink

            self._sinks.append(TensorBoardSink(writer))
        self.step = 0
        self._warn = WarnOnce()
        self._grads = GradientTracker(self.history_store, self.patience, self.diagnose)
        self._watched = WatchedTracker(self.history_store)
        self._membership = MembershipJudge(self.history_store)
        self._values = NamedValueCheck(track_zeros=True)
        self._dead = DeadGradTracker(self.history_store)
        self._loss_leaves = outside.LossLeaves()
        self._last_value_step = -1
        self._tracer = tracing.Tracer(on_error=self._warn)
        self._loop = stepping.LoopWatch(self.history_store, self._check_skipped, lambda: self.step, self._warn)
        self._report = Report(step=0)
        self._emitted = -1  # the first check's event counts as a change
        self._ignore_checked = False
        self._in_check = self._closed = False
        self._handles: list[Any] = []
        self._closure_steps: set[int] = set()
        self._retargeted: tuple[int, int] | None = None
        structure.REGISTRATION_HOOKS.acquire()
        self._gatherer = _distributed.make_gatherer(
            self.structure.source, self.structure.named_params, distributed, ignore=self.ignore)
        snapshot = self.structure.snapshot()  # a layer replaced from now on is paired by name
        self._grads.from_start = snapshot is None or all(t.grad is None for t in snapshot.tensors.values())
        if self.diagnose and snapshot is not None:
            try:
                self._tracer.arm(snapshot.modules)
                self._loop.arrivals.arm(t for t, _ in self.structure.named_params())
            except Exception as error:  # never stop training for a diagnostic
                self._warn("arming the diagnostic hooks", error)

    # -- configuration read by front-ends ------------------------------------------------------
    @property
    def model(self) -> nn.Module | None:
        return self.structure.model

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers checked (a copy: add one with :meth:`add_optimizer`)."""
        return list(self.structure.optimizers)

    @property
    def ignore(self) -> dict[str, str]:
        return self.history_store.ignore

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Check ``optimizer``'s parameters too from the next check on (a no-op if known)."""
        self.structure.add_optimizer(inventory.as_optimizer(optimizer))

    def set_roots(self, roots: Mapping[str, nn.Module] | Sequence[nn.Module]) -> None:
        """Read these root modules instead of the model from the next check on.

        Args:
            roots: A mapping name -> module, or a sequence of modules (one root gets no prefix,
                several their class name, as ``leafwatch run`` names them).

        Raises:
            TypeError: ``roots`` of another form.
        """
        named = inventory.normalize_roots(roots)
        self.structure.set_roots(named or {})

    # -- public ------------------------------------------------------------------------------
    def check(self, optimizer: torch.optim.Optimizer | None = None, *, step: int | None = None,
              loss: torch.Tensor | None = None) -> Report:
        """Check after ``backward()`` and before ``optimizer.step()``; returns the current report.

        Args:
            optimizer: The optimizer about to step: only its parameters are checked for a
                gradient (alternating GAN optimizers). None checks every optimizer's parameters.
            step: The step number to record (defaults to a count of checks).
            loss: The loss, if at hand: explains missing gradients by walking its graph.

        Raises:
            LeafwatchError: in strict mode, when an error finding is open.
            TypeError: an argument of the wrong type.
        """
        if optimizer is not None and self.structure.optimizer_index(optimizer) is None:
            # Unknown (a wrapper, or an optimizer to adopt): the real optimizer under it.
            try:
                optimizer = inventory.as_optimizer(optimizer)
            except TypeError:
                raise TypeError(f"`optimizer` must be a torch.optim.Optimizer or None, got {got(optimizer)} "
                                f"({inventory.WRAPPERS_ACCEPTED})") from None
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise TypeError(f"`step` must be an int or None, got {type(step).__name__}: {step!r:.80}")
        if loss is not None and not isinstance(loss, torch.Tensor):
            raise TypeError(f"`loss` must be a torch.Tensor or None, got {got(loss)}")
        if self._in_check or self._closed:
            return self._report
        self._in_check = True
        try:
            try:
                event: CheckEvent | None = self._check(optimizer, step, loss)
            except Exception as error:
                self._warn("Monitor.check", error)
                event = None
            if self._gatherer is not None:
                # Every rank takes part, even after a local failure, so that no rank waits forever.
                event = self._gatherer.merge_event(event, self._report, self.step,
                                                   self.structure.optimizer_index(optimizer), self._warn,
                                                   self.structure.grad_view.strategy)
            if event is None:
                return self._report
            if self._gatherer is None or self._gatherer.runs_sinks:
                # Still inside the guard: a sink that calls check() gets the current report back.
                self._emit(event)
        finally:
            self._in_check = False
        if self.strict:
            event.report.raise_for_findings("error")
        return event.report

    def scan(self) -> Report:
        """Read the structure now, before any gradient exists, and return the report.

        Finds what needs no backward pass (left out of the optimizer, frozen in it, stale,
        orphan tensors, device mismatches, watched non-leaves) at the current step; gradient
        checks wait for :meth:`check`. The diagnostic hooks stay armed.
        """
        if self._closed:
            return self._report
        try:
            self._rebuilt(self.structure.rebuild(self.step), before_gradients=True)
            entries = self._watch_entries()
            # No gradient can have arrived yet: only what is wrong already (a watched non-leaf).
            for f in checks.watched_findings(entries, self.step, {e.name: True for e in entries},
                                             self.structure.inventory):
                self.history_store.upsert(f)
            self._report = self.history_store.report(self.step)
        except Exception as error:
            self._warn("Monitor.scan", error)
        return self._report

    def attach(self) -> Monitor:
        """Check automatically before each ``optimizer.step()`` of the optimizers given.

        An optimizer stepped with a closure (``LBFGS``) computes its gradients inside ``step()``:
        it is checked right after the step instead.

        Returns:
            self, so that ``monitor = Monitor(model, opt).attach()`` reads naturally.
        """
        if not self.structure.optimizers:
            raise ValueError("`optimizers` must be given to attach(): got none")
        if self.verbose is None:
            self.verbose = True
            self._sinks.insert(0, NewFindingWarnings())
        for opt in self.structure.optimizers:
            self._handles.append(opt.register_step_pre_hook(self._before_step))
            self._handles.append(opt.register_step_post_hook(self._after_step))
        return self

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # A step hook gets the step's own arguments: ``args[0]`` is the optimizer, the closure follows.
        if (args[1] if len(args) > 1 else kwargs.get("closure")) is not None:
            self._closure_steps.add(id(optimizer))
            return
        self.check(optimizer)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if id(optimizer) in self._closure_steps:
            self._closure_steps.discard(id(optimizer))
            self.check(optimizer)

    @property
    def report(self) -> Report:
        """The report of the last check (merged across ranks when distributed)."""
        if self._gatherer is not None and self._gatherer.report is not None:
            return self._gatherer.report
        return self._report

    @property
    def is_distributed(self) -> bool:
        """Whether this Monitor merges its findings across ranks."""
        return self._gatherer is not None

    @property
    def history(self) -> dict[tuple[str, str], Finding]:
        """Every finding seen so far by ``(kind, name)``, with first/last step, status and ``ignore``."""
        return self.history_store.as_dict()

    def stats(self) -> dict[str, int]:
        """Sizes of what the Monitor holds, for tests of its bounds and of its hot path."""
        return {
            "findings": len(self.history_store),
            "streaks": len(self._grads.streak),
            "miss_counts": len(self._grads.misses),
            "checked": sum(len(c.params) for c in self.structure.lists.values()),
            "check_lists": len(self.structure.lists),
            "previous_names": len(self.structure.previous_names),
            "diagnostic_hooks": len(self._tracer.handles),
            "diagnostic_records": len(self._tracer.records),
            "diagnostic_inputs_kept": sum(len(r.detached_inputs) for r in self._tracer.records.values()),
            "diagnostic_max_calls": max((r.calls for r in self._tracer.records.values()), default=0),
            "watch_counts": self._watched.sizes(),
            "own_watches": len(self.watches.entries()),
            "value_checks_in_flight": len(self._values.checker.pending_steps()),
            "value_names_kept": self._values.launched(),
            "step_hooks": len(self._handles),
            "arrival_hooks": len(self._loop.arrivals.handles),
            "step_watches": len(self._loop.skips),
            "sinks": len(self._sinks),
            "loss_graph_walks": self._loss_leaves.walks,
        }

    def close(self) -> Report:
        """Remove every hook leafwatch installed, flush pending value checks, close sinks."""
        if self._closed:
            return self._report
        self._closed = True
        try:
            self._record_values(*self._values.flush())
            if self.check_values_every_n_steps and self.step > 0:
                self._final_values()
            self._decide_pending()
            self._report = self.history_store.report(self.step)
        except Exception as error:
            self._warn("Monitor.close", error)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._gatherer is not None:
            self._gatherer.close()
        self._tracer.disarm()
        self._loop.close()
        self.watches.clear()
        structure.REGISTRATION_HOOKS.release()
        for sink in self._sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                try:
                    close(self.report)
                except Exception as error:
                    self._warn(f"closing {type(sink).__name__}", error)
        return self.report

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """Plain data: the step, every finding's history and the per-name miss counts."""
        inv = self.structure.inventory
        self._grads.refresh(self.step)
        return {
            "step": self.step,
            "records": self.history_store.to_list(),
            "misses": self._grads.misses_by_name(inv.known_names() if inv else {}),
            "checks": self.structure.check_counts(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (a resumed run keeps its history).

        Raises:
            TypeError: ``state`` is not a mapping.
            ValueError: a part of it is not what ``state_dict()`` writes.
        """
        step, records, misses, checks_done = parse_state(state)
        # Only a state that is whole replaces the current one.
        self.step = step
        self.history_store.load(records)
        self._grads.restore(misses)
        self.structure.restore_checks(checks_done)
        self._report = self.history_store.report(self.step)

    # -- the check ---------------------------------------------------------------------------
    def _watch_entries(self) -> list[watching.WatchEntry]:
        # Right after backward every distinct piece of Python code runs cold (tens of µs): with
        # nothing watched, don't even take the registries' locks.
        entries = watching.entries() if watching.any_watched() else []
        return entries + self.watches.entries() if self.watches else entries

    def wait_for_optimizers(self, checks_: int,
                            waiting: Callable[[], list[torch.optim.Optimizer]] | None = None) -> None:
        """Keep ``not_in_optimizer`` pending for ``checks_`` checks: optimizers may step late.

        For front-ends that meet optimizers only when they step (``leafwatch run``): after that
        many checks a tensor no stepping optimizer holds is a warning, and an error at
        :meth:`close`. ``waiting`` returns the optimizers that exist but have not stepped.
        """
        self._membership.grace = validate_int(checks_, "checks", 0)
        self._membership.waiting_optimizers = waiting

    def _decide_pending(self) -> None:
        """At the end of the run, whatever still waits for evidence is decided."""
        inv = self.structure.inventory
        self._grads.refresh(self.step)
        self._membership.escalate_late(self.step)

        def decide(f: Finding) -> Finding | None:
            if f.kind == "missing_grad":
                return self._grads.decide(f)
            return self._membership.decide(f, inv, self._tracer, self.step)

        self.history_store.decide_pending(decide)

    def _rebuilt(self, inv: inventory.Inventory, before_gradients: bool = False) -> None:
        """After a rebuild of the structure: its findings, and what waited for the names."""
        view = self.structure.grad_view
        self._grads.rebuilt(inv)
        self._membership.rebuilt(inv)
        shown, held = self._membership.split(
            checks.structural(inv, step=self.step, previous_names=self.structure.previous_names,
                              stale=self.structure.stale, seen_frozen=self.structure.seen_frozen), inv,
            before_gradients=before_gradients)
        self.history_store.replace_structural(shown, self.step, held)
        if view.finding is not None and self.history_store.get(view.finding.key) is None:
            self.history_store.upsert(view.finding)
        self._grads.apply_restored(inv.known_names())
        self._loop.skips.track(self.structure.optimizers, self.structure.lists)
        if self.history_store.ignore and not self._ignore_checked:
            self._ignore_checked = True
            names = inv.all_names() | {e.name for e in self._watch_entries()}
            warn_unmatched_ignore(self.history_store.ignore, names)

    def _check(self, optimizer: torch.optim.Optimizer | None, step: int | None,
               loss: torch.Tensor | None) -> CheckEvent:
        self.step = step if step is not None else self.step + 1
        cache = self.structure
        if optimizer is not None:
            cache.add_optimizer(optimizer)  # an optimizer the Monitor was not given: adopt it
        inv = cache.refresh(self.step)
        if inv is not None:
            self._rebuilt(inv)
        lists = cache.lists_for(optimizer)
        keys = [cache.optimizer_index(optimizer)] if optimizer is not None else list(cache.lists)
        reachable: set[int] | None = None
        walked = loss is None  # the loss's graph is walked only when a tensor misses its gradient
        streaks_before = len(self._grads.streak)
        all_missing: list[int] = []
        offset = 0
        skip: set[int] | None = None
        force_values = False
        for key, clist in zip(keys, lists):
            # The hot path: one read of each p.grad.
            missing = [i for i, p in enumerate(clist.params) if p.grad is None]
            clist.checks += 1
            missing = self._loop.judge(clist, missing, key, self.step)
            if key is not None and self._loop.due(clist):
                force_values |= self._loop.about_to_step(cache.optimizers[key], key, clist, self.step,
                                                         cache.inventory)
            if missing or self._grads:
                if skip is None:
                    # Watched tensors are reported under their watch name, replaced ones as stale_param.
                    skip = {id(e.tensor()) for e in self._watch_entries()} | cache.stale_ids
                if missing and not walked:
                    reachable, walked = graph.reachable_leaf_ids(loss), True
                self._grads.update(clist, missing, self.step, tracer=self._tracer, reachable=reachable, skip=skip)
                all_missing.extend(i + offset for i in missing)
            offset += len(clist.params)
        if self._grads.targets:
            cache.leave_out(self._grads.take_new_targets())
        entries = self._watch_entries()
        if entries:
            self._watched.optimizers_version = (cache.rebuilds, structure.structure_generation())
        self._watched.update(entries, self.step, cache.inventory, self._in_judging_optimizer)
        if loss is not None and self._loss_leaves.wants_walk(len(self._grads.streak) > streaks_before):
            for f in self._loss_leaves.observe(
                    loss, self.step, new_miss=True, exclude=lambda: outside.judged_elsewhere(
                        cache.inventory, [*cache.optimizers, *structure.known_optimizers()], entries)):
                self.history_store.upsert(f)
        self._membership.judge(cache.inventory, self._tracer, self.step)
        every = self.check_values_every_n_steps
        if every and (self.step == 1 or self.step % every == 0 or force_values):
            try:
                self._check_values(lists)
            except Exception as error:  # the gradient checks above still count
                self._warn("the NaN/Inf gradient check", error)
        retarget = (self._grads.changes, cache.rebuilds)
        if self.diagnose and (self._tracer.handles or self._grads or self._loop.diagnosing) \
                and cache.inventory is not None and (retarget != self._retargeted or self._loop.diagnosing):
            self._retargeted = retarget
            # Keep hooks only on the modules (and their ancestors) owning a parameter that misses,
            # and arrival hooks only on the tensors that miss or whose gradient was cleared.
            missing_ids = self._grads.missing_ids(cache.lists.values())
            self._tracer.retarget(tracing.modules_owning(missing_ids, cache.inventory))
            self._loop.rearm(missing_ids, cache.inventory.tensors)
        self._tracer.end_check(cache.optimizer_index(optimizer), len(cache.optimizers))
        self._report = self.history_store.report(self.step)
        names = cache.joined_names(lists)
        coverage = None if not names else 1.0 - len(all_missing) / len(names)
        changed, self._emitted = self._emitted != self.history_store.version, self.history_store.version
        return CheckEvent(self.step, cache.optimizer_index(optimizer), self._report, changed, names,
                          all_missing, coverage)

    def _in_judging_optimizer(self, entry: watching.WatchEntry) -> bool:
        """A Monitor's own ``tensors=`` are judged by its optimizers; ``watch()``-ed tensors by every
        optimizer known in the process. A Monitor without optimizers judges nothing."""
        own = any(e is entry for e in self.watches.entries())
        mine = self.structure.optimizers
        optimizers = mine if own or not mine else [*mine, *structure.known_optimizers()]
        return not optimizers or id(entry.tensor()) in outside.optimizer_ids(optimizers)

    def _final_values(self) -> None:
        """At the end of a run: the gradients not checked since the last value check, and the
        parameters themselves (a short run may end between value checks, and gradients are often
        cleared by then: a NaN gradient that was applied left NaN in the parameter)."""
        lists = list(self.structure.lists.values())
        if self._last_value_step != self.step:
            self._check_values(lists)
            self._record_values(*self._values.flush())
        named = [(p, n) for c in lists for p, n in zip(c.params, c.names) if inventory.has_values(p)]
        params, names = [p for p, _ in named], [n for _, n in named]
        flagged = {f.name for f in self.history_store if f.kind == "nonfinite_grad" and f.status == Status.OPEN}
        for _, i in values.nonfinite(params, self.step):
            if names[i] not in flagged:
                self.history_store.upsert(checks.nonfinite_param(names[i], params[i], self.step))

    def _check_skipped(self, optimizer: torch.optim.Optimizer) -> None:
        """Asked at the end of a backward pass: ``optimizer`` skipped many steps and nothing checked it."""
        self.check(optimizer)

    def _check_values(self, lists: list[structure.CheckList]) -> None:
        self._last_value_step = self.step
        params = [p for c in lists for p in c.params]
        grads = [p.grad for p in params]
        if self.structure.grad_view.local_grads:
            grads = [_distributed.local_tensor(g) for g in grads]
        names = tuple(n for c in lists for n in c.names)
        self._record_values(*self._values.check(names, params, grads, self.step))

    def _record_values(self, completed: list[int], bad: list[tuple[int, str, torch.Tensor]]) -> None:
        flagged = set()
        for step, name, param in bad:
            flagged.add(name)
            self.history_store.upsert(checks.nonfinite_grad(name, param, step))
        if completed:
            latest = max(completed)
            self.history_store.resolve_where(
                lambda f: f.kind == "nonfinite_grad" and f.name not in flagged and (f.last_step or 0) < latest,
                latest)
        self._dead.record(self._values.take_zeros())

    # -- sinks --------------------------------------------------------------------------------
    def _emit(self, event: CheckEvent) -> None:
        for sink in self._sinks:
            try:
                sink(event)
            except Exception as error:
                self._warn(f"the {type(sink).__name__} sink", error)

"""``Monitor``: the checks across steps, with history, patience and diagnostic hooks.

The Monitor is the public surface: it validates its arguments, owns the
:class:`~leafwatch.observe.structure.StructureCache` (names, optimizer sets, what is read per step;
rebuilt only when a cheap fingerprint changes) and the
:class:`~leafwatch.report.history.FindingHistory` (findings over time, a version per change), hooks the
optimizers (:meth:`Monitor.attach`), runs the sinks, strict mode and, when distributed, the
:class:`~leafwatch.detectors.gatherer.Gatherer`. What one check does, in order, is its
:class:`~leafwatch.detectors.checker.Checker`'s: per optimizer step only what can change per step, one
pass over a precomputed list reading ``p.grad``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .detectors import crashes as _crashes
from .detectors import gatherer as _distributed
from .observe import inventory, structure
from .observe.crashes import Context
from .sinks import notes
from .observe.observer import Observer
from . import watching
from .detectors.checker import Checker
from .sinks.console import NewFindingWarnings
from .report.events import CheckEvent, Sinks
from .report.findings import Finding, Report
from .report.history import FindingHistory, parse_state
from .options import WarnOnce, got, validate_bool, validate_ignore, validate_int

#: The NaN/Inf check runs every this many checks: on a model of 1,000 small tensors one batched
#: check costs about 10% of a CPU training step (benchmarks/bench.py), so 20 keeps it near 0.5%.
DEFAULT_VALUE_CHECK_EVERY = 20


class Monitor:
    """Checks every optimizer step and keeps each finding's history.

    Create it before the first forward pass: until its first :meth:`check` it arms forward hooks on
    every module (the first step's missing gradients are explained), then only on those that missed one.

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
        roots: Root modules to read instead of ``model``: name -> module, or a sequence of modules
            (one root gets no prefix, several their class name, as ``leafwatch run`` names them).
        verbose: Warn once about each new open finding as it appears (short: kind, name, fix).
            None: on once :meth:`attach` is called, off for explicit :meth:`check` calls.
        observer: The global hooks' observations to take over (``leafwatch run``'s, from the script's
            first line); None: a new one of this Monitor's own.

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

    #: What an internal-failure warning says happens next (None: training goes on without the part).
    _goes_on: str | None = None
    _observes = True  #: holds the global registration and step hooks while open (audit(): none)

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
        observer: Observer | None = None,
    ) -> None:
        model = inventory.normalize_model(model)
        optimizers = inventory.normalize_optimizers(optimizers)
        named_roots = inventory.normalize_roots(roots)
        self.patience = validate_int(patience, "patience", 1)
        self.check_values_every_n_steps = validate_int(check_values_every_n_steps, "check_values_every_n_steps", 0)
        self.strict = validate_bool(strict, "strict")
        self.diagnose = validate_bool(diagnose, "diagnose")
        _validate_switches(sinks, distributed, verbose)
        self.history_store = FindingHistory(validate_ignore(ignore))
        #: What this Monitor's global hooks see (its own: nothing of it is shared with another Monitor).
        self.observer = observer if observer is not None else Observer(self.check, hooked=self._observes)
        self.structure = structure.StructureCache(model, optimizers, named_roots, self.observer)
        self.watches = watching.WatchSet()
        for name, t in inventory.normalize_tensors(tensors).items():
            watching.add_watch(self.watches, t, name)
        self._warn = WarnOnce() if self._goes_on is None else WarnOnce(self._goes_on)
        self._sinks = _build_sinks(sinks, verbose, writer, self._warn)
        self.verbose = verbose
        self._checker = Checker(self.structure, self.history_store, self.watches, patience=self.patience,
                                diagnose=self.diagnose, check_values_every_n_steps=self.check_values_every_n_steps,
                                warn=self._warn, request_check=self.check)
        if self._observes:  # an exception torch raises for a leaf mistake is explained while it is open
            self.observer.explain_crashes(self._checker.diagnostics.crash_context, self.crashed)
        self._report = Report(step=0)
        self._in_check = self._closed = False
        self._checked_optimizer: torch.optim.Optimizer | None = None  # the last one check() validated
        self._gatherer = _distributed.make_gatherer(self.structure.source, self.structure.named_params, distributed,
                                                    ignore=self.ignore, detectors=self._checker.merging, warn=self._warn)
        self._checker.arm()

    # -- configuration read by front-ends ------------------------------------------------------
    @property
    def step(self) -> int:
        """The step of the last check (its ``step=``, or a count of checks)."""
        return self._checker.step

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

    def set_roots(self, roots: Mapping[str, nn.Module] | Sequence[nn.Module],
                  variables: Callable[[], dict[int, str]] | None = None) -> None:
        """Read these root modules instead of the model from the next check on: a mapping name -> module, or a
        sequence of modules (one root gets no prefix, several their class name, as ``leafwatch run`` names them;
        any other form is a TypeError); ``variables``: object id -> the user's code for it (``trainer.loss``)."""
        self.structure.set_roots(inventory.normalize_roots(roots) or {}, variables)

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
        # The hot path, right after backward when every line runs cold: no call that a default check
        # does not need (an optimizer already checked and an int step pass as they are, the event is
        # built only for sinks that read it).
        if (optimizer is not None and optimizer is not self._checked_optimizer) or loss is not None \
                or (step is not None and type(step) is not int):
            optimizer = self._checked_optimizer = _check_arguments(self.structure, optimizer, step, loss)
        if self._in_check or self._closed:
            return self._report
        checker = self._checker
        self._in_check = True
        try:
            try:
                checker.run(optimizer, loss, step if step is not None else checker.step + 1)
                # No sink and no other rank to tell, or only changes-only sinks and the same report:
                # the report is all a check makes (no event built).
                quiet = self._gatherer is None and (not self._sinks.sinks or (self._sinks.changes_only
                                                    and self.history_store.revision == checker.emitted_revision))
                event: CheckEvent | None = None if quiet else checker.event(optimizer)
                report = checker.report() if event is None else event.report
            except Exception as error:
                event = checker.failed_event("the check", error)
                report = event.report if event is not None else None
            if report is not None:
                self._report = report
            if self._gatherer is not None:
                # Every rank takes part, even after a local failure, so that no rank waits forever.
                index, strategy = self.structure.optimizer_index(optimizer), self.structure.grad_view.strategy
                event = self._gatherer.merge_event(event, self._report, self.step, index, strategy)
                report = event.report if event is not None else None
            if report is None:
                return self._report
            if event is not None and (self._gatherer is None or self._gatherer.runs_sinks):
                # Still inside the guard: a sink that calls check() gets the current report back.
                self._sinks.emit(event)
        finally:
            self._in_check = False
        if self.strict:
            report.raise_for_findings("error")
        return report

    def scan(self) -> Report:
        """Read the structure now, before any gradient exists, and return the report: what needs no backward pass
        (left out of the optimizer, frozen in it, stale, orphans, device mismatches, watched non-leaves)."""
        if self._closed:
            return self._report
        self._checker.scan()
        self._report = self.history_store.report(self.step)
        return self._report

    def forward_begun(self, module: nn.Module) -> None:
        """``module``'s forward began before this Monitor's hooks were armed (``leafwatch run``): trace it."""
        self._checker.tracer.entered(module)

    def attach(self) -> Monitor:
        """Check automatically before each ``optimizer.step()`` of the optimizers given (right after it for a step
        with a closure, ``LBFGS``: its gradients are computed inside); self, so that ``Monitor(...).attach()`` reads."""
        if not self.structure.optimizers:
            raise ValueError("`optimizers` must be given to attach(): got none")
        if self.verbose is None:
            self.verbose = True
            self._sinks.add(NewFindingWarnings(), first=True)
        self.observer.install(self.structure.optimizers, self.structure.model, self.set_roots)
        return self

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
        return {"findings": len(self.history_store), **self.structure.stats(),
                "own_watches": len(self.watches.entries()), "step_hooks": len(self.observer),
                "sinks": len(self._sinks), **self._checker.stats()}

    def close(self, *, interrupted: bool = False) -> Report:
        """Remove every hook, flush pending value checks, close sinks (``interrupted``: ended by an exception)."""
        if self._closed:
            return self._report
        self._closed = True
        self._checker.finish(interrupted)
        try:
            self._report = self.history_store.report(self.step)
        except Exception as error:
            self._warn("Monitor.close", error)
        self.observer.close()
        if self._gatherer is not None:
            self._gatherer.close()
        self._checker.close()
        self.watches.clear()
        self._sinks.close(self.report)
        return self.report

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        if isinstance(exc[1], Exception):  # (its note is printed with its traceback, or by a door that sees it later)
            self.crashed(exc[1])
        self.close(interrupted=exc[0] is not None)

    def crashed(self, error: BaseException, contexts: Sequence[Context] = ()) -> list[str]:
        """The crash door (docs/architecture.md): where torch raised ``error`` for a leaf mistake, its findings go
        through the history and the sinks, and each is a note on it; the notes to print after its traceback."""
        try:
            found = [] if self._closed else self._checker.crash(error, contexts)
            if found:
                self._sinks.emit(self._checker.event(None))
                self._sinks.flush()
            return notes.add(error, found)
        except Exception as failure:  # never a new exception in place of the user's
            WarnOnce(_crashes.GOES_ON)("explaining the exception", failure)
            return []

    def state_dict(self) -> dict[str, Any]:
        """Plain data: the step, every finding's history and the per-name miss counts."""
        return {"step": self.step, "records": self.history_store.to_list(),
                "misses": self._checker.misses_by_name(), "checks": self.structure.check_counts()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (a resumed run keeps its history).

        Raises:
            TypeError: ``state`` is not a mapping.
            ValueError: a part of it is not what ``state_dict()`` writes.
        """
        step, records, misses, checks_done = parse_state(state)
        # Only a state that is whole replaces the current one.
        self._checker.restore(step, misses)
        self.history_store.load(records)
        self.structure.restore_checks(checks_done)
        self._report = self.history_store.report(self.step)

    def wait_for_optimizers(self, checks_: int, waiting: Callable[[], list[torch.optim.Optimizer]],
                            outside_roots: Callable[[], dict[int, tuple[str, str]]], values_until: int,
                            variables: Callable[[], dict[int, str]]) -> None:
        """For front-ends that meet optimizers only when they step (``leafwatch run``): keep
        ``not_in_optimizer`` pending for ``checks_`` checks (``waiting``: the optimizers that exist
        and have not stepped; ``outside_roots``: tensor id -> (root name, optimizer variable) of
        roots no optimizer holds), and check gradient values at every check up to ``values_until``;
        ``variables``: object id -> the script's variable for it, named by the fixes.
        """
        self._checker.wait_for_optimizers(checks_, waiting, outside_roots, variables, values_until)


def _check_arguments(structure_: structure.StructureCache, optimizer: Any, step: Any, loss: Any) -> Any:
    """``check()``'s arguments validated; the real optimizer under a wrapper the Monitor does not know."""
    if optimizer is not None and structure_.optimizer_index(optimizer) is None:
        try:
            optimizer = inventory.as_optimizer(optimizer)
        except TypeError:
            raise TypeError(f"`optimizer` must be a torch.optim.Optimizer or None, got {got(optimizer)} "
                            f"({inventory.WRAPPERS_ACCEPTED})") from None
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"`step` must be an int or None, got {type(step).__name__}: {step!r:.80}")
    if loss is not None and not isinstance(loss, torch.Tensor):
        raise TypeError(f"`loss` must be a torch.Tensor or None, got {got(loss)}")
    return optimizer


def _validate_switches(sinks: Any, distributed: Any, verbose: Any) -> None:
    """The Monitor's ``sinks``, ``distributed`` and ``verbose`` arguments, checked."""
    if verbose is not None:
        validate_bool(verbose, "verbose")
    if not isinstance(sinks, (list, tuple)) or not all(callable(s) for s in sinks):
        raise TypeError(f"`sinks` must be a sequence of callables taking a CheckEvent, got {got(sinks)}")
    if distributed is not None and not isinstance(distributed, bool):
        raise TypeError(f"`distributed` must be a bool or None, got {type(distributed).__name__}: {distributed!r}")


def _build_sinks(extra: Sequence[Callable[[CheckEvent], Any]], verbose: bool | None, writer: Any, warn: WarnOnce) -> Sinks:
    """The sinks a Monitor writes to: the console lines first (``verbose``), the user's, TensorBoard."""
    sinks = Sinks(extra, warn)
    if verbose:
        sinks.add(NewFindingWarnings(), first=True)
    if writer is not None:
        from .sinks.tensorboard import TensorBoardSink

        sinks.add(TensorBoardSink(writer))
    return sinks

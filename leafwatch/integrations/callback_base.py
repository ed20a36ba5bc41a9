"""The one callback base: what every training-framework callback does around its Monitor.

A front-end (Lightning, Hugging Face, and any later one: Fabric, accelerate) subclasses
:class:`CallbackBase` and maps its framework's events onto three calls, so that the lifecycle,
strict mode and the saved history are the same everywhere: :meth:`CallbackBase._start` at train
start, :meth:`CallbackBase._check` before each optimizer step, :meth:`CallbackBase._close` at
train end, on an exception or teardown. The scan at the start only reports: strict mode never
raises there, because findings such as ``not_in_optimizer`` are decided when gradients are seen
at the first check.

``report``, ``state_dict()`` and ``load_state_dict()`` mean the same in every callback: the
live report during training, the final one after it, the saved one before a resumed run starts.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..sinks.console import NewFindingWarnings
from ..report.findings import Report
from ..options import LeafwatchError, LeafwatchInternalWarning, validate_bool, validate_ignore, validate_int
from ..monitor import DEFAULT_VALUE_CHECK_EVERY, Monitor
from ..observe.discovery import Discovery, user_scope
from ..observe.frames import stacklevel_outside

class CallbackBase:
    """The options, lifecycle and saved history shared by every training-framework callback.

    The options are those of :class:`~leafwatch.LeafWatch`, validated here (TypeError or
    ValueError for one of the wrong type or out of range).
    """

    def __init__(
        self,
        *,
        strict: bool = False,
        patience: int = 1,
        ignore: Mapping[str, str] | Sequence[str] | None = None,
        check_values_every_n_steps: int = DEFAULT_VALUE_CHECK_EVERY,
        log_every_n_steps: int | None = None,
        verbose: bool = True,
    ) -> None:
        self.strict = validate_bool(strict, "strict")
        self.verbose = validate_bool(verbose, "verbose")
        self.patience = validate_int(patience, "patience", 1)
        self.ignore = validate_ignore(ignore)
        self.check_values_every_n_steps = validate_int(check_values_every_n_steps, "check_values_every_n_steps", 0)
        self.log_every_n_steps = log_every_n_steps if log_every_n_steps is None else validate_int(
            log_every_n_steps, "log_every_n_steps", 1)
        self.monitor: Monitor | None = None
        #: The modules a step runs beyond the model (a loss module, a head the trainer owns).
        self._step_modules: Discovery | None = None
        self._console: NewFindingWarnings | None = None
        self._pending_state: dict[str, Any] | None = None
        self._last_report: Report | None = None
        self._final_state: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that takes these options as they are gets this ``__init__`` under its own
        name, so that Python's TypeError for a wrong argument names it (``LeafWatch.__init__()``,
        also for the classes :func:`~leafwatch.integrations.lightning.callback_class` builds),
        not ``CallbackBase.__init__()``."""
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            base = CallbackBase.__init__
            init = types.FunctionType(base.__code__, base.__globals__, "__init__", base.__defaults__, base.__closure__)
            init.__kwdefaults__, init.__doc__ = base.__kwdefaults__, base.__doc__
            init.__annotations__, init.__module__ = base.__annotations__, base.__module__
            init.__qualname__ = f"{cls.__qualname__}.__init__"
            cls.__init__ = init  # type: ignore[misc]

    # -- the lifecycle -------------------------------------------------------------------------
    def _start(self, model: Any, prepare: Callable[[], tuple[Sequence[Any] | None, list[Any]]],
               saved: Mapping[str, Any] | None = None, owners: Callable[[], dict[str, Any]] = user_scope) -> None:
        """Build the Monitor at train start, take up ``saved`` and report the structural findings.

        The Monitor of an earlier run is closed first. Never raises: a failure of ``prepare`` or of the
        Monitor warns and training goes on without leafwatch; strict mode raises only from :meth:`_check`.

        Args:
            model: The model (an ``nn.Module``) handed to the Monitor.
            prepare: Returns the optimizers to check (None: the Monitor's default) and the sinks, called
                inside the guard that keeps training going (it may set :meth:`_sinks`' console and
                whatever :meth:`_release` frees).
            saved: A history from :meth:`state_dict` to go on from (a resumed run); None: the one
                given to :meth:`load_state_dict` before the start, if any.
            owners: Name -> object the user reaches modules through (``{"trainer": trainer}``):
                a module a step runs beyond the model is named by its path from them.
        """
        self._close(print_table=False)
        saved, self._pending_state = saved or self._pending_state, None
        try:
            optimizers, sinks = prepare()
            self.monitor = Monitor(model, optimizers, patience=self.patience, ignore=self.ignore, strict=self.strict,
                                   check_values_every_n_steps=self.check_values_every_n_steps, sinks=sinks)
            if saved:
                self.monitor.load_state_dict(saved.get("monitor", {}))
            self._step_modules = Discovery(model, owners)
            self._step_modules.arm()
        except Exception as error:  # never stop training for leafwatch
            self._close(print_table=False)
            warnings.warn(f"leafwatch: could not start on this model ({type(error).__name__}: {error}); "
                          "training goes on without it.", LeafwatchInternalWarning, stacklevel=stacklevel_outside())
            return
        report = self.monitor.scan()
        if self._console is not None:
            self._console.report(report)

    def _check(self, optimizer: Any, step: int) -> None:
        """Check before the optimizer step ``step``; in strict mode raise LeafwatchError on an open error."""
        monitor = self.monitor
        if monitor is None:
            return
        try:
            discovery = self._step_modules
            roots = discovery.update() if discovery is not None else None
            if roots is not None:
                monitor.set_roots(roots, discovery.paths)  # read from this check on, by the user's paths
            elif discovery is not None and not discovery.armed:  # stable, its hook gone: nothing more to read
                self._step_modules = None
            monitor.check(optimizer, step=step)
        except LeafwatchError:
            # Strict mode stops training here: remove the hooks and write the records first.
            self._close(print_table=False)
            raise

    def _close(self, *, print_table: bool, interrupted: bool = False) -> None:
        """Close the Monitor, keep its final report and history, print the table if asked (``interrupted``:
        training ended by an exception, see :meth:`leafwatch.Monitor.close`)."""
        monitor, self.monitor = self.monitor, None
        if self._step_modules is not None:
            self._step_modules.disarm()
            self._step_modules = None
        try:
            if monitor is not None:
                report = self._last_report = monitor.close(interrupted=interrupted)
                self._final_state = {"monitor": monitor.state_dict()}
                if print_table and self.verbose:
                    print(report)
        finally:
            self._release()

    def _release(self) -> None:
        """Free what the front-end holds besides the Monitor; called by every :meth:`_close`."""

    def _log_every(self, framework_default: Any) -> int:
        """The cadence of the scalars: ``log_every_n_steps``, else the framework's, else 50."""
        return self.log_every_n_steps or max(1, int(framework_default or 50))

    def _sinks(self, main: bool, more: Sequence[Any] = (), writers: Sequence[Any] = (), every: int = 50) -> list[Any]:
        """The console sink (one warning per new finding) on the main process when verbose, ``more``, and a
        TensorBoardSink per SummaryWriter of ``writers`` writing every ``every`` steps."""
        from ..sinks.tensorboard import TensorBoardSink

        self._console = NewFindingWarnings() if self.verbose and main else None
        console = [self._console] if self._console is not None else []
        return [*console, *more, *(TensorBoardSink(w, log_every_n_steps=every) for w in writers)]

    # -- the saved history ---------------------------------------------------------------------
    @property
    def report(self) -> Report:
        """The latest report: the live one during training, the final one after it, the saved one
        before a resumed run starts."""
        if self.monitor is not None:
            return self.monitor.report
        if self._last_report is not None:
            return self._last_report
        if self._pending_state is not None:
            saved = self._pending_state.get("monitor", {})
            return Report.from_dict({"findings": saved.get("records", []), "step": saved.get("step")})
        return Report()

    def state_dict(self) -> dict[str, Any]:
        """Plain data (the Monitor's history), JSON-ready; saved in checkpoints."""
        if self.monitor is not None:
            return {"monitor": self.monitor.state_dict()}
        return dict(self._pending_state if self._pending_state is not None else self._final_state)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take up a history from :meth:`state_dict` (at the next start if not training).

        Raises:
            TypeError: ``state_dict`` is not a mapping.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"`state_dict` must be a mapping from state_dict(), got {type(state_dict).__name__}")
        if not state_dict:
            return
        self._pending_state = dict(state_dict)
        if self.monitor is not None:
            self.monitor.load_state_dict(self._pending_state.get("monitor", {}))
            self._pending_state = None

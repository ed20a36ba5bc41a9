"""The PyTorch Lightning callback: Trainer events mapped onto a :class:`~leafwatch.Monitor`.

The callback stays thin: ``on_fit_start``, ``on_before_optimizer_step`` and ``on_fit_end`` /
``teardown`` / ``on_exception`` are the start, check and close of
:class:`~leafwatch.integrations.callback_base.CallbackBase`, shared with the Hugging Face callback.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from ..detectors import crashes
from ..observe.crashes import Context
from ..report import records
from ..sinks import notes
from ..observe.excepthook import print_notes
from .environment import install_command
from ..report.events import CheckEvent
from ..report.findings import KINDS
from .callback_base import CallbackBase
from ..observe.inventory import unwrap_optimizer

if TYPE_CHECKING:
    import pytorch_lightning as pl

#: The command that installs Lightning for the way leafwatch is installed (from a checkout:
#: ``pip install -e ".[lightning]"``; from PyPI: ``pip install "leafwatch[lightning]"``).
INSTALL_HINT = install_command("lightning")


def _callback_bases() -> tuple[type, ...]:
    bases: list[type] = []
    for namespace in ("pytorch_lightning", "lightning.pytorch"):
        try:
            bases.append(importlib.import_module(namespace).Callback)
        except ImportError:
            pass
    return tuple(bases)


#: ``trainer.global_step`` is compared with the progress counter read in its place at the first
#: read and every this many reads after it (any difference: ``global_step`` from then on).
VERIFY_STEP_EVERY = 64


def _step_counter(trainer: Any, pl_module: Any) -> Any:
    """The Lightning progress tracker whose ``completed`` count ``trainer.global_step`` returns, or None.

    ``global_step`` is six property calls deep (the fit loop, the epoch loop, the LightningModule
    through the strategy, its optimization mode, the progress counter): about 10 µs at every
    optimizer step, right after backward, when each call runs cold. Lightning updates that tracker
    in place, so the callback reads it directly (checked as :data:`VERIFY_STEP_EVERY` says).
    """
    try:
        loop = trainer.fit_loop.epoch_loop
        tracker = (loop.automatic_optimization.optim_progress.optimizer.step.total if pl_module.automatic_optimization
                   else loop.manual_optimization.optim_step_progress.total)
    except AttributeError:  # another Lightning layout
        return None
    return tracker if type(getattr(tracker, "completed", None)) is int else None


class _MetricsSink:
    """Logs the open findings per kind and the gradient coverage through ``logger.log_metrics``."""

    def __init__(self, loggers: Sequence[Any], log_every_n_steps: int) -> None:
        self.loggers = loggers
        self.log_every_n_steps = log_every_n_steps
        self._counts: dict[str, int] | None = None

    def __call__(self, event: CheckEvent) -> None:
        counts = event.report.counts()
        periodic = event.step == 1 or event.step % self.log_every_n_steps == 0
        if counts == self._counts and not periodic and not event.changed:
            return
        self._counts = counts
        metrics: dict[str, float] = {records.open_tag(kind): float(counts.get(kind, 0)) for kind in KINDS}
        if event.coverage is not None:
            metrics[records.GRAD_COVERAGE_TAG] = float(event.coverage)
        for logger in self.loggers:
            logger.log_metrics(metrics, step=event.step)


class _LeafWatchMixin(CallbackBase):
    """The callback's behaviour; :func:`callback_class` puts it on a Lightning ``Callback`` base."""

    #: The last optimizer wrapper met and the torch optimizer under it (until the Monitor closes).
    _unwrapped: tuple[Any, Any] | None = None
    #: The options the state key was made of, and the key.
    _state_key: tuple[tuple[Any, ...], str] | None = None
    #: The progress tracker read in place of ``trainer.global_step`` (None: not found yet or
    #: dropped, then ``global_step`` is read), and how many steps were read.
    _counter: Any = None
    _steps_read = 0
    #: The loss of the last backward, weakly (Lightning holds it until the optimizer step; leafwatch never
    #: keeps a graph alive), for the check that follows, which reads it only where no tensor got a
    #: gradient: a loss whose requires_grad was set by hand.
    _loss: Any = None

    # -- identity and state --------------------------------------------------------------------
    @property
    def state_key(self) -> str:
        # The Trainer reads it around every hook of every callback, batch after batch (its
        # profiler's name for the call): made once per set of options.
        options = (self.patience, self.check_values_every_n_steps, *self.ignore)
        known = self._state_key
        if known is None or known[0] != options:
            known = self._state_key = (options, self._generate_state_key(  # type: ignore[attr-defined]
                patience=self.patience, ignore=sorted(self.ignore),
                check_values_every_n_steps=self.check_values_every_n_steps))
        return known[1]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(monitor=None, _console=None, _pending_state=self.state_dict() or None, _last_report=None,
                     _final_state={}, _unwrapped=None, _counter=None, _steps_read=0,
                     _loss=None)
        return state

    # -- the Trainer hooks ---------------------------------------------------------------------
    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start(pl_module, lambda: (list(trainer.optimizers), self._trainer_sinks(trainer)))

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        # Kept for the check that follows, which looks at it only where no tensor got a gradient (a loss
        # made of no parameter, its requires_grad set by hand): nothing read here, on every step.
        self._loss = weakref.ref(loss) if isinstance(loss, torch.Tensor) else None

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self.monitor is None:
            return
        # A LightningOptimizer wraps the torch one: unwrapped once per wrapper, not at every step.
        unwrapped = self._unwrapped
        if unwrapped is None or unwrapped[0] is not optimizer:
            unwrapped = self._unwrapped = (optimizer, unwrap_optimizer(optimizer)[0])
        self._steps_read = reads = self._steps_read + 1
        counter = self._counter
        fast = counter is not None and reads % VERIFY_STEP_EVERY
        step = counter.completed if fast else self._verified_step(trainer, pl_module)
        # toggle_optimizer's saved flags, read in place at every step (a call only when there are some)
        saved = getattr(pl_module, "_param_requires_grad_state", None)
        toggled = self._untoggle(saved) if saved else []
        observer, loss, self._loss = self.monitor.observer, self._loss, None
        observer.handed_loss = loss() if loss is not None else None
        try:
            self._check(unwrapped[1], step + 1)
        finally:
            observer.handed_loss = None
            for p in toggled:
                p.requires_grad_(False)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close(print_table=bool(getattr(trainer, "is_global_zero", True)))

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._close(print_table=False)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning raises this very exception again: where torch raised it for a leaf mistake, it carries
        # leafwatch's note (printed here where it cannot, Python 3.10: the traceback comes later), and the
        # Monitor's history, so the record its close writes, holds the crash finding.
        context = Context((pl_module,), {id(pl_module): "self"})
        print_notes(self.monitor.crashed(exception, [context]) if self.monitor is not None
                    else notes.add(exception, crashes.explain(exception, [context])))
        self._close(print_table=False, interrupted=True)

    @override
    def _release(self) -> None:
        self._unwrapped = self._loss = None
        self._counter, self._steps_read = None, 0

    # -- helpers -------------------------------------------------------------------------------
    def _verified_step(self, trainer: Any, pl_module: Any) -> int:
        """``trainer.global_step``; the counter read in its place is kept only while it agrees."""
        step = int(trainer.global_step)
        if self._steps_read == 1:
            self._counter = _step_counter(trainer, pl_module)
        if self._counter is not None and self._counter.completed != step:
            self._counter = None  # another layout, or the optimization mode switched: no shortcut
        return step

    @staticmethod
    def _untoggle(saved: dict[Any, bool]) -> list[Any]:
        """Undo ``toggle_optimizer`` for the length of a check, so the structure is read as configured.

        ``toggle_optimizer`` sets ``requires_grad=False`` on the other optimizers' parameters (and
        saves their flags in ``saved``, the module's ``_param_requires_grad_state``); read at that
        moment, they would look frozen. Returns what to set back.
        """
        toggled = [p for p, requires in saved.items() if requires and not p.requires_grad]
        for p in toggled:
            p.requires_grad_(True)
        return toggled

    @staticmethod
    def _split_loggers(trainer: Any) -> tuple[list[Any], list[Any]]:
        """SummaryWriters of the TensorBoard loggers, and the other loggers."""
        writers, others = [], []
        for logger in getattr(trainer, "loggers", None) or []:
            try:
                experiment = logger.experiment
            except Exception:
                experiment = None
            if type(experiment).__name__ == "SummaryWriter" and all(
                    callable(getattr(experiment, attr, None)) for attr in ("add_scalar", "add_text")):
                writers.append(experiment)
            elif type(experiment).__name__ != "DummyExperiment":
                others.append(logger)
        return writers, others

    def _trainer_sinks(self, trainer: Any) -> list[Any]:
        """The console on global rank zero, the leafwatch scalars through ``log_metrics`` for the loggers
        that are not TensorBoard's, and a TensorBoardSink per TensorBoard logger."""
        every = self._log_every(getattr(trainer, "log_every_n_steps", None))
        writers, others = self._split_loggers(trainer)
        metrics = [_MetricsSink(others, every)] if others else []
        return self._sinks(bool(getattr(trainer, "is_global_zero", True)), metrics, writers, every)


_BASES = _callback_bases()
if not _BASES:
    raise ImportError(f"the leafwatch Lightning callback needs PyTorch Lightning: {INSTALL_HINT}")


class LeafWatch(_LeafWatchMixin, *_BASES):  # type: ignore[misc]  (the installed Callback bases)
    """Names every tensor that will not train during ``Trainer.fit``, says why, and gives the fix.

    A thin adapter: it builds a :class:`~leafwatch.Monitor` at fit start and checks at every
    optimizer step (after gradient accumulation and AMP unscaling, only the parameters of the
    optimizer about to step). Each new finding is warned once on rank zero, the summary table
    is printed at fit end, and the scalars go to the Trainer's loggers: a TensorBoard logger gets
    the full :class:`~leafwatch.TensorBoardSink` (scalars, findings table, Leafwatch tab records),
    any other logger ``leafwatch/open/<kind>`` and ``leafwatch/grad_coverage`` through
    ``log_metrics``. Steps are numbered ``trainer.global_step + 1`` (the optimizer step taken).
    The history is saved in checkpoints (``state_dict``), so a resumed run keeps it; a new
    ``fit`` that does not resume starts a fresh one.

    The class subclasses the ``Callback`` of every installed Lightning namespace, so it works
    with ``pytorch_lightning.Trainer`` and ``lightning.pytorch.Trainer`` alike;
    :func:`leafwatch.integrations.lightning.callback_class` builds it on one chosen base.

    Args:
        strict: Raise :class:`~leafwatch.LeafwatchError` (with the findings table) at the first
            check that has an open error finding (the fit-start scan only reports).
        patience: Consecutive checks a trainable parameter may go without a gradient before
            ``missing_grad`` is reported.
        ignore: Glob patterns on qualified names, ``{"pattern": "reason"}`` or ``["pattern"]``.
        check_values_every_n_steps: Run the NaN/Inf check on the gradients every N steps
            (0 turns it off).
        log_every_n_steps: Logging cadence of the scalars (default: the Trainer's).
        verbose: Warn about each new finding and print the table at fit end.

    Raises:
        TypeError, ValueError: an option of the wrong type or out of range.

    Example::

        >>> from pytorch_lightning import Trainer
        >>> from leafwatch import LeafWatch
        >>> trainer = Trainer(callbacks=[LeafWatch(strict=True)], max_steps=1, logger=False)
    """


def callback_class(base: type | tuple[type, ...], name: str = "LeafWatch") -> type:
    """The same callback on chosen ``Callback`` base(s), e.g. one namespace only.

    Args:
        base: ``pytorch_lightning.Callback``, ``lightning.pytorch.Callback``, or a tuple of them.
        name: The class name (it prefixes the checkpoint ``state_key``).

    Returns:
        A callback class taking the arguments of :class:`LeafWatch`.
    """
    bases = base if isinstance(base, tuple) else (base,)
    # Named at creation: its __init__ takes the class's name then (CallbackBase.__init_subclass__).
    return type(name, (_LeafWatchMixin, *bases), {"__doc__": LeafWatch.__doc__, "__module__": __name__})


__all__ = ["INSTALL_HINT", "LeafWatch", "callback_class"]

"""The Hugging Face ``Trainer`` callback: Trainer events mapped onto a :class:`~leafwatch.Monitor`.

The callback stays thin: ``on_train_begin``, ``on_pre_optimizer_step`` and ``on_train_end`` are
the start, check and close of :class:`~leafwatch.integrations.callback_base.CallbackBase`, shared
with the Lightning callback. Findings go to leafwatch's own TensorBoard records
(:class:`LeafWatchCallback` says where and why); the history travels in checkpoints through
transformers' ``ExportableState``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from ..observe import sharding as distributed
from ..options import LeafwatchInternalWarning
from ..monitor import DEFAULT_VALUE_CHECK_EVERY
from ..observe.discovery import user_scope
from ..observe.frames import every_frame, stacklevel_outside
from .callback_base import CallbackBase
from ..observe.inventory import unwrap_optimizer

INSTALL_HINT = 'pip install "leafwatch[transformers]"'

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState
except ImportError as error:  # pragma: no cover - the extra installs it
    raise ImportError(f"the leafwatch Trainer callback needs transformers: {INSTALL_HINT}") from error

if not hasattr(TrainerCallback, "on_pre_optimizer_step"):  # pragma: no cover - transformers < 4.46
    raise ImportError(f"the leafwatch Trainer callback needs transformers >= 4.46 (on_pre_optimizer_step): {INSTALL_HINT}")

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

#: The folder under ``args.output_dir`` the records go to (a TensorBoard run of its own).
LOG_SUBDIR = "leafwatch"


def _trainer_scope() -> dict[str, Any]:
    """The user's variables, led by the Trainer that runs the callback under the user's name for
    it (``trainer`` when no frame of the user's holds it): a module its ``compute_loss`` trains
    beyond the model is named by its path, ``trainer.loss.classifier``."""
    from transformers import Trainer

    scope = user_scope()
    trainer = next((f.f_locals["self"] for f in every_frame(2) if isinstance(f.f_locals.get("self"), Trainer)), None)
    if trainer is None:
        return scope
    name = next((k for k, v in scope.items() if v is trainer), "trainer")
    return {name: trainer, **scope}


def gradient_strategy(model: torch.nn.Module, optimizer: Any, args: Any = None) -> tuple[str | None, Any]:
    """How the gradients of ``model`` can be read, judged from the optimizer the Trainer steps.

    Args:
        model: The Trainer's model.
        optimizer: The Trainer's optimizer (wrapped or not), or None.
        args: The ``TrainingArguments`` (their ``deepspeed`` setting is read).

    Returns:
        ``(strategy, optimizer)``: None and the torch optimizer to check when it steps the model's
        own parameters; ``"deepspeed"`` or ``"master_copies"`` and None when it does not (see
        :func:`leafwatch.observe.sharding.declare_gradients`).
    """
    inner, deepspeed = unwrap_optimizer(optimizer)
    if deepspeed or getattr(args, "deepspeed", None) or getattr(args, "deepspeed_plugin", None):
        return "deepspeed", None
    if inner is None:
        return None, None
    if not isinstance(inner, torch.optim.Optimizer):
        return "master_copies", None
    own = {id(p) for p in model.parameters()}
    stepped = [p for group in inner.param_groups for p in group["params"]]
    return ("master_copies", None) if stepped and not any(id(p) in own for p in stepped) else (None, inner)


def ddp_find_unused_parameters(model: torch.nn.Module, args: Any = None) -> bool | None:
    """DDP's ``find_unused_parameters`` as the Trainer sets it, or None when it wraps no DDP.

    The Trainer hands callbacks its inner model, not the ``DistributedDataParallel`` around it;
    this repeats the Trainer's choice: ``args.ddp_find_unused_parameters`` when set, else True
    unless a ``PreTrainedModel`` uses activation checkpointing (``ddp_static_graph`` counts as
    True).

    Args:
        model: The Trainer's model.
        args: The ``TrainingArguments``.
    """
    if not distributed.is_distributed() or getattr(args, "deepspeed", None):
        return None
    named = [(id(p), p, n) for n, p in model.named_parameters()]
    if distributed.gradient_view(model, named).strategy != "plain":
        return None  # FSDP or DeepSpeed, not DDP
    if getattr(args, "ddp_static_graph", None):
        return True
    chosen = getattr(args, "ddp_find_unused_parameters", None)
    if chosen is not None:
        return bool(chosen)
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        return True
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:  # transformers 4
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    return not (checkpointing or getattr(args, "activation_checkpointing", False))


class LeafWatchCallback(CallbackBase, TrainerCallback, ExportableState):
    """Names every tensor that will not train during ``Trainer.train``, says why, and gives the fix.

    A thin adapter: it builds a :class:`~leafwatch.Monitor` at train begin and checks at every
    optimizer step (after gradient accumulation, unscaling and clipping; the parameters of the
    optimizer that steps). Each new finding is warned once on the main process, the summary
    table is printed at train end, and the findings are written as leafwatch's TensorBoard
    records (scalars, findings table, Leafwatch tab records) to ``<output_dir>/leafwatch``,
    whatever ``report_to`` is. Steps are numbered ``state.global_step + 1`` (the optimizer step
    taken). The history is saved in checkpoints (``trainer_state.json``), so
    ``resume_from_checkpoint`` keeps it; a ``train()`` that does not resume starts a fresh one.

    Under DeepSpeed, or with an optimizer that steps master copies of the parameters, the
    model's ``.grad`` cannot tell a missing gradient: the gradient check is skipped with one
    info finding. FSDP is handled as in :func:`leafwatch.observe.sharding.gradient_view`,
    and under DDP every rank checks its own gradients and the main process reports them merged;
    with ``find_unused_parameters`` (the Trainer's default for a ``PreTrainedModel``) a
    parameter that one rank skips is named with that rank.

    With ``restore_callback_states_from_checkpoint=True`` transformers replaces each stateful
    callback by a new instance when it resumes; read the report from that instance
    (``trainer.callback_handler.callbacks``) then.

    Args:
        strict: Raise :class:`~leafwatch.LeafwatchError` (with the findings table) at the first
            check that has an open error finding; training stops there (the train-begin scan
            only reports).
        patience: Consecutive checks a trainable parameter may go without a gradient before
            ``missing_grad`` is reported.
        ignore: Glob patterns on qualified names, ``{"pattern": "reason"}`` or ``["pattern"]``.
        check_values_every_n_steps: Run the NaN/Inf check on the gradients every N steps
            (0 turns it off).
        log_every_n_steps: Cadence of the TensorBoard scalars (default: ``logging_steps``).
        log_dir: Where the records go (default: ``<output_dir>/leafwatch``).
        verbose: Warn about each new finding and print the table at train end.

    Raises:
        TypeError, ValueError: an option of the wrong type or out of range.

    Example::

        >>> from leafwatch.transformers import LeafWatchCallback
        >>> callback = LeafWatchCallback(strict=True, ignore={"pooler.*": "not used by this head"})
        >>> callback.report.findings
        []
    """

    def __init__(
        self,
        *,
        strict: bool = False,
        patience: int = 1,
        ignore: Mapping[str, str] | Sequence[str] | None = None,
        check_values_every_n_steps: int = DEFAULT_VALUE_CHECK_EVERY,
        log_every_n_steps: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        verbose: bool = True,
    ) -> None:
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"`log_dir` must be a path or None, got {type(log_dir).__name__}: {log_dir!r:.80}")
        super().__init__(strict=strict, patience=patience, ignore=ignore,
                         check_values_every_n_steps=check_values_every_n_steps,
                         log_every_n_steps=log_every_n_steps, verbose=verbose)
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self._optimizer: torch.optim.Optimizer | None = None
        self._declared: torch.nn.Module | None = None
        self._writer: Any = None

    # -- identity and state --------------------------------------------------------------------
    @override
    def state(self) -> dict[str, Any]:
        """What ``Trainer`` saves in ``trainer_state.json`` (``ExportableState``)."""
        args = {"strict": self.strict, "patience": self.patience, "ignore": dict(self.ignore),
                "check_values_every_n_steps": self.check_values_every_n_steps,
                "log_every_n_steps": self.log_every_n_steps, "log_dir": self.log_dir, "verbose": self.verbose}
        return {"args": args, "attributes": {"_pending_state": self.state_dict() or None}}

    def _saved_in(self, state: TrainerState) -> dict[str, Any] | None:
        """The history this callback saved in the checkpoint ``state`` was loaded from."""
        saved = (getattr(state, "stateful_callbacks", None) or {}).get(type(self).__name__)
        if isinstance(saved, list):  # several instances of the callback: the one with our options
            mine = self.state()["args"]
            saved = next((s for s in saved if isinstance(s, Mapping) and s.get("args") == mine),
                         saved[0] if saved else None)
        if not isinstance(saved, Mapping):
            return None
        data = (saved.get("attributes") or {}).get("_pending_state")
        return dict(data) if isinstance(data, Mapping) and data else None

    # -- the Trainer hooks ---------------------------------------------------------------------
    @override
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        model = kwargs.get("model")
        if not isinstance(model, torch.nn.Module):
            self._close(print_table=False)
            self._pending_state = None
            warnings.warn(f"leafwatch: the Trainer passed no model to the callback (got {type(model).__name__}); "
                          "training goes on without leafwatch.", LeafwatchInternalWarning,
                          stacklevel=stacklevel_outside())
            return
        # A resumed run (its global step restored from the checkpoint) keeps the saved history,
        # and so does one given a history through load_state_dict(); a new one starts afresh.
        saved = self._saved_in(state) if state.global_step > 0 else None
        self._start(model, lambda: self._prepare(model, args, state, kwargs.get("optimizer")), saved,
                    owners=_trainer_scope)

    @override
    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any) -> None:
        self._check(self._optimizer, int(state.global_step) + 1)

    @override
    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._close(print_table=bool(getattr(state, "is_world_process_zero", True)))

    # -- helpers -------------------------------------------------------------------------------
    def _prepare(self, model: torch.nn.Module, args: TrainingArguments, state: TrainerState,
                 optimizer: Any) -> tuple[list[Any] | None, list[Any]]:
        """The optimizer to check and the sinks; declares how the model's gradients are kept."""
        strategy, self._optimizer = gradient_strategy(model, optimizer, args)
        sinks = self._trainer_sinks(args, state)
        if strategy is not None:
            distributed.declare_gradients(model, strategy)
            self._declared = model
        else:
            find_unused = ddp_find_unused_parameters(model, args)
            if find_unused is not None:
                distributed.declare_ddp(model, find_unused)
                self._declared = model
        return ([self._optimizer] if self._optimizer is not None else None), sinks

    def _trainer_sinks(self, args: TrainingArguments, state: TrainerState) -> list[Any]:
        """The console and TensorBoard sinks, on the main process only."""
        if not getattr(state, "is_world_process_zero", True):
            return self._sinks(False)
        log_dir = self.log_dir or os.path.join(str(getattr(args, "output_dir", None) or "."), LOG_SUBDIR)
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir)
        return self._sinks(True, (), [self._writer], self._log_every(getattr(state, "logging_steps", None)))

    @override
    def _release(self) -> None:
        writer, self._writer = self._writer, None
        declared, self._declared = self._declared, None
        self._optimizer = None
        try:
            if declared is not None:
                distributed.declare_gradients(declared, None)
                distributed.declare_ddp(declared, None)
        finally:
            if writer is not None:
                writer.close()


__all__ = ["INSTALL_HINT", "LOG_SUBDIR", "LeafWatchCallback", "ddp_find_unused_parameters", "gradient_strategy",
           "unwrap_optimizer"]

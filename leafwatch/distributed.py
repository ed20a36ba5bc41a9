"""Distributed training: each rank checks its own gradients, rank zero reports for all of them.

Two parts, both used by :class:`~leafwatch.Monitor`:

- :func:`gradient_view` tells, from the model alone, where ``p.grad`` cannot be read per
  parameter: FSDP's ``FullyShardedDataParallel`` (flat parameters, or original parameters
  whose gradients are shards filled with zeros where a parameter was unused) and DeepSpeed
  (gradients kept in the engine's partitioned buffers), or what a front-end that sees the
  optimizer declares (:func:`declare_gradients`: DeepSpeed ZeRO-1/2 behind a plain module, an
  optimizer that steps master copies). Those parameters are left out of the gradient check,
  and ONE info finding says why. ``fully_shard`` (FSDP2) needs nothing: its
  parameters are DTensors whose ``.grad`` stays None when unused, so it is read as is (the
  NaN/Inf check reads the local shard).
- :class:`Gatherer` merges the findings of every rank after each local check, so that rank
  zero logs each finding once with the ranks it was seen on, and strict mode raises on every
  rank at the same step. Collectives are issued on every rank or on none, on a gloo side group
  (CPU tensors: no GPU sync, and never paired with DDP's own collectives): the first check
  all-gathers the (small, plain-data) findings of every rank; afterwards each check starts ONE
  all-reduce of a single int ("did any rank's findings change?") without waiting for it, and
  reads it at the next check, where a yes (on every rank alike) triggers the next all-gather.

Under DDP with ``find_unused_parameters=True`` DDP fills the ``.grad`` of a parameter that a
rank did not use with the other ranks' average, so ``p.grad is None`` says nothing per rank;
the Gatherer then watches gradient accumulation (one post-accumulate-grad hook per parameter)
to know which parameters each rank really used.

This module is part of the core (the Monitor imports it; it imports nothing from
``leafwatch.integrations``); :mod:`leafwatch.integrations.distributed` re-exports its public
names. Its only module-level state is what the public API promises: the declarations made
through :func:`declare_gradients` and :func:`declare_ddp` (``_DECLARED``, ``_DDP_DECLARED``:
model -> declaration, held weakly). A front-end makes them before any Monitor exists, for a
model it has not handed over yet, so they cannot live in a Monitor; a Monitor reads them when
it builds its structure and its Gatherer, and the front-end withdraws them at the end of its run
(``strategy=None``).
"""

from __future__ import annotations

import dataclasses
import datetime
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .events import CheckEvent
from .report.findings import Finding, Report
from .options import LeafwatchWarning
from .inventory import describe_tensor
from .report.findings import apply_ignore

#: Timeout (seconds) of leafwatch's own gloo group. Ranks meet at a check right after DDP's
#: gradient all-reduce, so they are seconds apart at most; a Monitor made on one rank only
#: (``if rank == 0: Monitor(...)``) costs one stall of this length and a warning, not a hang.
DEFAULT_TIMEOUT_S = 300.0

_ACTIVE_STATUSES = ("open", "intermittent")

# Quoted without its end: Lightning rewrites any exception whose message holds DDP's full text.
DDP_NEXT_STEP_ERROR = "Expected to have finished reduction ..."
DDP_FIX = (
    "remove the parameter (or freeze it with `requires_grad_(False)` before wrapping the model in "
    "DDP); if it is unused on purpose, pass `find_unused_parameters=True` (or `static_graph=True` "
    "when the same parameters are unused at every step) to DistributedDataParallel "
    "(Lightning: `strategy=\"ddp_find_unused_parameters_true\"`)"
)


# -- where gradients can be read ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GradientView:
    """How the gradients of one model can be read.

    Attributes:
        strategy: ``"plain"``, ``"fsdp2"``, ``"fsdp"``, ``"fsdp_flat"``, ``"deepspeed"`` or
            ``"master_copies"`` (declared by a front-end, see :func:`declare_gradients`).
        skip: ids of the parameters whose ``.grad`` cannot tell a missing gradient.
        local_grads: The gradients are DTensors: value checks read their local shard.
        finding: The one info finding that says why ``skip`` is left out (None when empty).
    """

    strategy: str = "plain"
    skip: frozenset[int] = frozenset()
    local_grads: bool = False
    finding: Finding | None = None


PLAIN = GradientView()


def _skip_finding(strategy: str, name: str, count: int, cause: str, fix: str, step: int | None,
                  because: str | None = None) -> Finding:
    return Finding.new(
        "missing_grad", name, "info",
        f"{strategy}: the gradient check is skipped for {count} parameter(s): their .grad "
        "cannot tell a missing gradient from a zero one.",
        cause, fix, step=step, reason="sharded_gradients", strategy=strategy, parameters=count,
        ignored_because=because or f"gradients are sharded by {strategy}",
    ).replace(status="ignored")


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


def _is_deepspeed(model: Any, params: Iterable[torch.Tensor]) -> bool:
    if any(type(m).__name__ == "DeepSpeedEngine" for m in _chain(model)):
        return True
    return any(hasattr(p, "ds_id") for p in params)


def _chain(model: Any) -> list[Any]:
    """The model, the wrappers Lightning keeps around it, and nothing else."""
    out = [model]
    trainer = getattr(model, "_trainer", None)
    strategy = getattr(trainer, "strategy", None)
    wrapped = getattr(strategy, "model", None) if strategy is not None else None
    if wrapped is not None and wrapped is not model:
        out.append(wrapped)
    return out


#: Models whose gradients a front-end knows cannot be read per parameter (it sees the optimizer,
#: which the model does not show): model -> strategy, held weakly, set by :func:`declare_gradients`.
_DECLARED: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
#: The strategies :func:`declare_gradients` takes.
DECLARED_STRATEGIES = ("deepspeed", "master_copies")


def declare_gradients(model: nn.Module, strategy: str | None) -> None:
    """Say how the gradients of ``model`` are kept, when the model alone cannot show it.

    A front-end that sees the optimizer calls it before building the Monitor: under DeepSpeed
    ZeRO-1/2 the model is a plain module whose ``.grad`` the engine empties into its own
    buffers, and an optimizer that steps master copies of the parameters (fp32 copies, flat
    buffers) never reads the model's ``.grad``. :func:`gradient_view` then skips the model's
    parameters with one info finding. The model is held weakly and not modified.

    Args:
        model: The module handed to the Monitor.
        strategy: ``"deepspeed"``, ``"master_copies"``, or None to withdraw the declaration.

    Raises:
        TypeError: ``model`` is not a module.
        ValueError: an unknown ``strategy``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}: {model!r:.80}")
    if strategy is None:
        _DECLARED.pop(model, None)
        return
    if strategy not in DECLARED_STRATEGIES:
        raise ValueError(f"`strategy` can be {', '.join(DECLARED_STRATEGIES)} or None, got {strategy!r}")
    _DECLARED[model] = strategy


#: Models wrapped in DDP by a front-end that does not hand the wrapper over (the Hugging Face
#: Trainer gives callbacks the inner model): model -> DDP's find_unused_parameters, held weakly.
_DDP_DECLARED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def declare_ddp(model: nn.Module, find_unused_parameters: bool | None) -> None:
    """Say that ``model`` trains inside a ``DistributedDataParallel`` the Monitor cannot see.

    With ``find_unused_parameters=True`` DDP fills the ``.grad`` of a parameter a rank did not
    use; knowing it, the Monitor's :class:`Gatherer` watches which parameters each rank really
    used (as it does when it finds the wrapper itself). The model is held weakly and not
    modified.

    Args:
        model: The module handed to the Monitor.
        find_unused_parameters: DDP's setting (``static_graph=True`` counts as True), or None
            to withdraw the declaration.

    Raises:
        TypeError: ``model`` is not a module, or the setting not a bool or None.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}: {model!r:.80}")
    if find_unused_parameters is None:
        _DDP_DECLARED.pop(model, None)
        return
    if not isinstance(find_unused_parameters, bool):
        raise TypeError(f"`find_unused_parameters` must be a bool or None, got "
                        f"{type(find_unused_parameters).__name__}: {find_unused_parameters!r:.80}")
    _DDP_DECLARED[model] = find_unused_parameters


def _declared_ddp(model: Any) -> bool | None:
    models = list(model.values()) if isinstance(model, Mapping) else [model]
    for m in models:
        if isinstance(m, nn.Module) and m in _DDP_DECLARED:
            return _DDP_DECLARED[m]
    return None


def _declared(models: Sequence[Any]) -> str | None:
    for m in models:
        if isinstance(m, nn.Module) and m in _DECLARED:
            return _DECLARED[m]
    return None


@dataclasses.dataclass(frozen=True)
class _Sharded:
    """One way of keeping gradients whose ``.grad`` cannot tell a missing gradient: the words of
    its one info finding."""

    strategy: str
    label: str
    name: str
    cause: str
    fix: str
    because: str | None = None

    def view(self, skip: frozenset[int], step: int | None) -> GradientView:
        return GradientView(self.strategy, skip, False,
                            _skip_finding(self.label, self.name, len(skip), self.cause, self.fix, step, self.because))


_FSDP2_FIX = ("use `torch.distributed.fsdp.fully_shard` (FSDP2), whose unused parameters keep "
              ".grad None, or run a few steps with plain DDP to have every parameter checked")

_DEEPSPEED = _Sharded(
    "deepspeed", "DeepSpeed", "DeepSpeed gradients",
    "DeepSpeed keeps gradients in its own partitioned buffers (ZeRO), not in each "
    "parameter's .grad, so a missing .grad does not mean a missing gradient.",
    "nothing; to have leafwatch check gradients, run a few steps without DeepSpeed "
    "(or with plain DDP) once")
_MASTER_COPIES = _Sharded(
    "master_copies", "Master copies", "optimizer master copies",
    "the optimizer steps copies of the parameters (fp32 master weights or flat buffers), "
    "not the model's own tensors, and may move or clear the model's .grad before it "
    "steps, so a missing .grad does not mean a missing gradient.",
    "nothing; to have leafwatch check gradients, run a few steps with a plain torch "
    "optimizer over the model's parameters once",
    because="the optimizer steps master copies of the parameters")
#: FSDP1, tried in this order: the tensor attribute that marks a parameter it shards, and how.
_FSDP1 = (
    ("_is_flat_param", _Sharded(
        "fsdp_flat", "FSDP (use_orig_params=False)", "FSDP flat parameters",
        "FullyShardedDataParallel with use_orig_params=False flattens each wrapped module's "
        "parameters into one FlatParameter; its .grad is a shard of all of them, and the part "
        "of an unused parameter is filled with zeros.",
        _FSDP2_FIX)),
    ("_fsdp_flattened", _Sharded(
        "fsdp", "FSDP (use_orig_params=True)", "FSDP sharded parameters",
        "FullyShardedDataParallel gives each rank only its shard of each gradient: a "
        "parameter outside this rank's shard has .grad None even though it trains, and an "
        "unused parameter gets zeros on the rank that holds it.",
        _FSDP2_FIX)),
)


def gradient_view(model: Any, params: Sequence[tuple[int, torch.Tensor, str]],
                  step: int | None = None) -> GradientView:
    """Detect the sharding strategy of ``model`` and say which gradients can be read per parameter.

    Args:
        model: The model handed to the Monitor (a module, or a mapping name -> module).
        params: ``(id, tensor, name)`` of every parameter the Monitor knows.
        step: The step to put on the info finding.

    Returns:
        A :class:`GradientView`; :data:`PLAIN` when nothing is sharded.
    """
    entries = list(params)
    if not entries:
        return PLAIN
    tensors = [t for _, t, _ in entries]
    models = list(model.values()) if isinstance(model, Mapping) else [model]
    declared = _declared(models)
    everything = frozenset(k for k, _, _ in entries)
    if declared == "deepspeed" or any(_is_deepspeed(m, tensors) for m in models if m is not None):
        return _DEEPSPEED.view(everything, step)
    if declared == "master_copies":
        return _MASTER_COPIES.view(everything, step)
    for marker, sharded in _FSDP1:
        skip = frozenset(k for k, t, _ in entries if getattr(t, marker, False))
        if skip:
            return sharded.view(skip, step)
    if any(_is_dtensor(t) for t in tensors):
        return GradientView("fsdp2", frozenset(), True, None)
    return PLAIN


def local_tensor(t: torch.Tensor | None) -> torch.Tensor | None:
    """The local shard of a DTensor (no communication); any other tensor as it is."""
    if t is not None and _is_dtensor(t):
        return t.to_local()
    return t


# -- the process group --------------------------------------------------------------------------
def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` when there is none."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def is_distributed() -> bool:
    """True when ``torch.distributed`` is initialized with more than one process."""
    return world()[1] > 1


def find_ddp(model: Any) -> nn.Module | None:
    """The DistributedDataParallel wrapping ``model``: itself, or Lightning's ``strategy.model``."""
    for m in _chain(model):
        if isinstance(m, nn.parallel.DistributedDataParallel):
            return m
    return None


# -- merging -----------------------------------------------------------------------------------
def _ranks_words(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def merge(per_rank: Sequence[Sequence[Finding]], *, step: int | None = None,
          ddp_unused: bool | None = None, strategy: str = "plain") -> list[Finding]:
    """Merge the findings of every rank: one finding per ``(kind, name)`` with its ranks.

    A missing gradient on every rank is a dead parameter ("no gradient on any rank"). On some
    ranks only it is per-rank branching, a different bug: the forward pass takes a path that
    depends on the rank or its data. That is reported as intermittent (info), except under DDP
    without ``find_unused_parameters`` (``ddp_unused=False``), where it makes DDP hang.

    Args:
        per_rank: The findings of each rank, indexed by rank.
        step: The step of the merged report.
        ddp_unused: DDP's ``find_unused_parameters`` when the model is wrapped in DDP, else None.
        strategy: :attr:`GradientView.strategy`; DDP advice is given for ``"plain"`` only.

    Returns:
        The merged findings, each with ``ranks`` set, in :meth:`Finding.sort_key` order.
    """
    world_size = len(per_rank)
    by_key: dict[tuple[str, str], dict[int, Finding]] = {}
    for rank, findings in enumerate(per_rank):
        for f in findings:
            by_key.setdefault(f.key, {})[rank] = f
    out = []
    for key, seen in by_key.items():
        active = sorted(r for r, f in seen.items() if f.status in _ACTIVE_STATUSES)
        ranks = tuple(active) if active else tuple(sorted(seen))
        # The rank whose finding comes first in the one order of findings (Finding.sort_key).
        chosen = min(((r, seen[r]) for r in ranks), key=lambda rf: (rf[1].sort_key(), rf[0]))[1]
        merged = chosen.replace(ranks=ranks, step=step if step is not None else chosen.step)
        if key[0] == "missing_grad" and active:
            merged = _merged_missing(merged, active, world_size, ddp_unused,
                                     {r: seen[r].cause for r in active}, strategy == "plain")
        out.append(merged)
    out.sort(key=Finding.sort_key)
    return out


def _merged_missing(f: Finding, active: list[int], world_size: int, ddp_unused: bool | None,
                    causes: Mapping[int, str], plain: bool = True) -> Finding:
    name = f.name
    if f.details.get("reason") == "sharded_gradients":
        return f
    if len(active) == world_size:
        note, fix = "", f.fix
        if f.status == "open" and plain and ddp_unused is False:
            note = (f" Under DDP (find_unused_parameters=False) it stops training at the next step "
                    f"with \"{DDP_NEXT_STEP_ERROR}\".")
            fix = DDP_FIX
        elif f.status == "open" and plain and ddp_unused is None:
            note = (" If the model is wrapped in DDP without find_unused_parameters=True (the "
                    f"default), the next step fails with \"{DDP_NEXT_STEP_ERROR}\".")
            fix = (f"{f.fix}; under DDP, if it is unused on purpose, pass `find_unused_parameters=True` "
                   "(or `static_graph=True`) to DistributedDataParallel")
        return f.replace(
            message=f.message.rstrip(".") + " (no gradient on any rank).",
            cause=f"no gradient on any rank, so it is a dead parameter, not a per-rank branch: {f.cause}{note}",
            fix=fix,
            details={**f.details, "ranks_without_grad": list(active), "world_size": world_size},
        )
    others = [r for r in range(world_size) if r not in active]
    where = _ranks_words(active)
    message = (f"`{name}` got no gradient on {where} only (it got one on {_ranks_words(others)}): "
               "per-rank branching, a different bug from a dead layer.")
    cause = (f"the forward pass takes a rank-dependent path: on {where} `{name}` is not used "
             "(a branch on the rank, or data-dependent routing that differs between ranks). "
             f"On {where}: {causes[active[0]]}")
    if ddp_unused is False:
        return f.replace(
            severity="error", status="open", message=message,
            cause=cause + " DDP with find_unused_parameters=False waits for this gradient on the "
            "other ranks: it hangs or fails.",
            fix="make every rank run the same modules, or pass `find_unused_parameters=True` to "
            "DistributedDataParallel if the branching is intended",
            details={**f.details, "ranks_without_grad": active, "world_size": world_size,
                     "per_rank_branching": True})
    return f.replace(
        severity="info", status="intermittent", message=message, cause=cause,
        fix="nothing, if the branching is intended (DDP needs find_unused_parameters=True for it, "
        "and the parameter trains from the ranks that use it); otherwise make every rank run "
        "the same modules",
        details={**f.details, "ranks_without_grad": active, "world_size": world_size,
                 "per_rank_branching": True})


# -- the gatherer ------------------------------------------------------------------------------
class Gatherer:
    """Merges the reports of every rank after each check; one per Monitor.

    Args:
        model: The Monitor's model (its DDP wrapper, if any, is found through it).
        params: ``(tensor, name)`` of the parameters whose per-rank use is tracked when DDP
            fills unused gradients (``find_unused_parameters=True``).
        timeout_s: Timeout of leafwatch's own gloo group; None: :data:`DEFAULT_TIMEOUT_S`.
        ignore: The Monitor's ignore patterns, applied to the per-rank findings made here.
        pipelined: Start each check's flag all-reduce without waiting and read it at the next
            check, so a quiet step never waits on the network; a change is then merged one
            check later (the first check always exchanges at once). False: wait at each check.
    """

    def __init__(self, model: Any, params: Sequence[tuple[torch.Tensor, str]] = (),
                 timeout_s: float | None = None, ignore: Mapping[str, str] | None = None,
                 pipelined: bool = True) -> None:
        self.rank, self.world_size = world()
        self.ignore = dict(ignore or {})
        self.timeout_s = timeout_s
        self._group: Any = None
        self._disabled = False
        self._sent: Any = None
        self._merged: Report | None = None
        ddp = find_ddp(model)
        self.ddp_unused: bool | None = _declared_ddp(model) if ddp is None else bool(
            getattr(ddp, "find_unused_parameters", False) or getattr(ddp, "static_graph", False))
        self._handles: list[Any] = []
        self._tracked: list[tuple[Any, str]] = []
        self._used: set[int] = set()
        self.rounds = 0
        self.changed = False
        self.pipelined = pipelined
        self._pending: Any = None
        self._flag = torch.zeros(1, dtype=torch.int32)
        if self.ddp_unused:
            self._track_use(params)

    @property
    def is_zero(self) -> bool:
        return self.rank == 0

    @property
    def runs_sinks(self) -> bool:
        """Rank zero logs the merged findings; once gathering failed, every rank logs its own."""
        return self.rank == 0 or self._disabled

    @property
    def report(self) -> Report | None:
        """The last merged report (None before the first gather)."""
        return self._merged

    def _track_use(self, params: Sequence[tuple[torch.Tensor, str]]) -> None:
        used = self._used
        for p, name in params:
            if not p.requires_grad or not hasattr(p, "register_post_accumulate_grad_hook"):
                continue
            key = id(p)
            self._handles.append(p.register_post_accumulate_grad_hook(_marker(used, key)))
            self._tracked.append((weakref.ref(p), name))

    def _locally_unused(self, step: int) -> list[Finding]:
        """Parameters this rank did not use although DDP gave them a gradient."""
        if not self._tracked:
            return []
        out = []
        for ref, name in self._tracked:
            p = ref()
            if p is None or id(p) in self._used or p.grad is None or not p.requires_grad:
                continue
            out.append(Finding.new(
                "missing_grad", name, "error",
                f"`{name}` requires grad but got no gradient on this rank.",
                "its gradient was not computed on this rank in this step (its module did not "
                "run, or its output did not reach the loss); DDP (find_unused_parameters=True) "
                "filled its .grad with the average from the ranks that used it.",
                "", step=step, **describe_tensor(p), reason="unused_on_rank", source="ddp_use",
            ))
        self._used.clear()
        return out

    def _ensure_group(self) -> Any:
        if self._group is None:
            timeout = self.timeout_s if self.timeout_s is not None else DEFAULT_TIMEOUT_S
            self._group = torch.distributed.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=timeout))
        return self._group

    def gather(self, local: Report, step: int, warn: Callable[[str, BaseException], None],
               strategy: str = "plain") -> Report | None:
        """Merge ``local`` with every rank's report. Call it on every rank at every check.

        Args:
            local: This rank's report (after a local failure, the last one).
            step: The step of the check.
            warn: Where internal failures go (warned once, training goes on).
            strategy: :attr:`GradientView.strategy` of the model.

        Returns:
            The merged report, or None when gathering is off (it failed once).
        """
        if self._disabled:
            return None
        try:
            findings = local.tensors()  # merged per tensor, grouped again by the Report
            extra = self._locally_unused(step)
            if extra:

                extra = apply_ignore(extra, self.ignore)
                known = {f.key for f in findings}
                findings += [f for f in extra if f.key not in known]
            digest = hash(tuple(sorted((f.kind, f.name, f.status, f.severity, f.cause) for f in findings)))
            group = self._ensure_group()
            if self._merged is None:
                # The first check exchanges at once: DDP fails at the next step's forward pass.
                self.changed = True
            elif self.pipelined:
                # The flag all-reduced at the previous check is long done: reading it costs no wait.
                assert self._pending is not None
                self._pending.wait()
                self._pending = None
                self.changed = bool(self._flag.item())
            else:
                self._flag.fill_(0 if digest == self._sent else 1)
                torch.distributed.all_reduce(self._flag, op=torch.distributed.ReduceOp.MAX, group=group)
                self.changed = bool(self._flag.item())
            if self.changed:
                gathered: list[Any] = [None] * self.world_size
                torch.distributed.all_gather_object(gathered, [f.to_dict() for f in findings], group=group)
                per_rank = [[Finding.from_dict(d) for d in (g or [])] for g in gathered]
                self._merged = Report(merge(per_rank, step=step, ddp_unused=self.ddp_unused, strategy=strategy), step=step)
                self._sent = digest
                self.rounds += 1
            else:
                assert self._merged is not None
                self._merged.step = step
            if self.pipelined:
                self._flag.fill_(0 if digest == self._sent else 1)
                self._pending = torch.distributed.all_reduce(
                    self._flag, op=torch.distributed.ReduceOp.MAX, group=group, async_op=True)
            return self._merged
        except Exception as error:
            self._disabled = True
            self._pending = None
            warn("gathering findings across ranks (each rank must create its Monitor and check at "
                 "the same steps; otherwise pass `distributed=False`)", error)
            return None

    def merge_event(self, event: CheckEvent | None, report: Report, step: int, optimizer: int | None,
                    warn: Callable[[str, BaseException], None], strategy: str) -> CheckEvent | None:
        """The Monitor's event with the report merged across ranks (``report``: this rank's
        latest, used when the local check failed and ``event`` is None)."""
        merged = self.gather(event.report if event is not None else report, step, warn, strategy)
        if merged is None:
            return event if event is None else dataclasses.replace(event, report=self.alone(event.report))
        if event is None:
            return CheckEvent(step, optimizer, merged, self.changed, (), [], None)
        return dataclasses.replace(event, report=merged, changed=self.changed)

    def alone(self, report: Report) -> Report:
        """This rank's report with this rank on every finding, for when gathering failed."""
        return Report((f.replace(ranks=(self.rank,)) for f in report.tensors()), step=report.step)

    def close(self) -> None:
        """Remove the hooks; wait for the flag in flight (every rank started it at its last check)."""
        pending, self._pending = self._pending, None
        if pending is not None and not self._disabled:
            try:
                pending.wait()
            except Exception:  # a peer already gone: nothing left to agree on
                pass
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._tracked.clear()


def _marker(used: set[int], key: int) -> Callable[[torch.Tensor], None]:
    def mark(t: torch.Tensor) -> None:
        if t.grad is not None:  # torch calls the hook with no gradient too: that is no use
            used.add(key)

    return mark


def make_gatherer(model: Any, params: Callable[[], Sequence[tuple[torch.Tensor, str]]], distributed: bool | None,
                  timeout_s: float | None = None, ignore: Mapping[str, str] | None = None) -> Gatherer | None:
    """The Gatherer a Monitor needs: None when not distributed (or ``distributed=False``).

    ``params`` is called only when a Gatherer is made (it lists ``(tensor, name)``).
    """
    if distributed is False or not is_distributed():
        if distributed is True and not is_distributed():
            warnings.warn(
                "leafwatch: `distributed=True` but torch.distributed is not initialized with more "
                "than one process; findings are not gathered across ranks.",
                LeafwatchWarning, stacklevel=3)
        return None
    return Gatherer(model, params(), timeout_s, ignore)

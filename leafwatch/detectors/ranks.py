"""Distributed training, judged: rank zero reports for every rank.

- :func:`sharded_finding`: the one info finding that says why gradients that cannot be read
  per parameter (:func:`leafwatch.observe.sharding.gradient_view`) are left out of the check.
- :func:`merge`: one finding per ``(kind, name)`` with the ranks it was seen on; a gradient
  missing on some ranks only is per-rank branching (an error under DDP without
  ``find_unused_parameters``, where DDP hangs a step later).
- :class:`Gatherer` merges the findings of every rank after each local check, so that rank
  zero logs each finding once with the ranks it was seen on, and strict mode raises on every
  rank at the same step. Collectives are issued on every rank or on none, on a gloo side group
  (CPU tensors: no GPU sync, and never paired with DDP's own collectives): the first check
  all-gathers the (small, plain-data) findings of every rank; afterwards each check starts ONE
  all-reduce of a single int ("did any rank's findings change?") without waiting for it, and
  reads it at the next check, where a yes (on every rank alike) triggers the next all-gather.
  Under DDP with ``find_unused_parameters=True`` it reads which parameters this rank used from
  :class:`leafwatch.observe.sharding.UseTracker`.

Part of the core (the Monitor imports it); :mod:`leafwatch.integrations.distributed`
re-exports its public names. Set ``DEFAULT_TIMEOUT_S`` here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..observe.inventory import describe_tensor
from ..observe.sharding import GradientView, UseTracker, declared_ddp, find_ddp, is_distributed, world
from ..options import LeafwatchWarning
from ..report.events import CheckEvent
from ..report.findings import Finding, Report, apply_ignore
from .constructors import observed

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


@dataclasses.dataclass(frozen=True)
class _Sharded:
    """The words of the one info finding of a way of keeping gradients whose ``.grad`` cannot tell
    a missing gradient."""

    label: str
    name: str
    cause: str
    fix: str
    because: str | None = None


_FSDP2_FIX = ("use `torch.distributed.fsdp.fully_shard` (FSDP2), whose unused parameters keep "
              ".grad None, or run a few steps with plain DDP to have every parameter checked")

#: :attr:`GradientView.strategy` -> the words of its finding.
_SHARDED = {
    "deepspeed": _Sharded(
        "DeepSpeed", "DeepSpeed gradients",
        "DeepSpeed keeps gradients in its own partitioned buffers (ZeRO), not in each "
        "parameter's .grad, so a missing .grad does not mean a missing gradient.",
        "nothing; to have leafwatch check gradients, run a few steps without DeepSpeed "
        "(or with plain DDP) once"),
    "master_copies": _Sharded(
        "Master copies", "optimizer master copies",
        "the optimizer steps copies of the parameters (fp32 master weights or flat buffers), "
        "not the model's own tensors, and may move or clear the model's .grad before it "
        "steps, so a missing .grad does not mean a missing gradient.",
        "nothing; to have leafwatch check gradients, run a few steps with a plain torch "
        "optimizer over the model's parameters once",
        because="the optimizer steps master copies of the parameters"),
    "fsdp_flat": _Sharded(
        "FSDP (use_orig_params=False)", "FSDP flat parameters",
        "FullyShardedDataParallel with use_orig_params=False flattens each wrapped module's "
        "parameters into one FlatParameter; its .grad is a shard of all of them, and the part "
        "of an unused parameter is filled with zeros.",
        _FSDP2_FIX),
    "fsdp": _Sharded(
        "FSDP (use_orig_params=True)", "FSDP sharded parameters",
        "FullyShardedDataParallel gives each rank only its shard of each gradient: a "
        "parameter outside this rank's shard has .grad None even though it trains, and an "
        "unused parameter gets zeros on the rank that holds it.",
        _FSDP2_FIX),
}


def sharded_finding(view: GradientView, step: int | None) -> Finding | None:
    """The one info finding (``missing_grad``/``sharded_gradients``, ignored) that says why the
    gradients ``view.skip`` are left out of the gradient check; None when none are."""
    words = _SHARDED.get(view.strategy)
    if words is None or not view.skip:
        return None
    return Finding.new(
        "missing_grad", words.name, "info",
        f"{words.label}: the gradient check is skipped for {len(view.skip)} parameter(s): their .grad "
        "cannot tell a missing gradient from a zero one.",
        words.cause, words.fix, step=step, reason="sharded_gradients", strategy=words.label,
        parameters=len(view.skip), ignored_because=words.because or f"gradients are sharded by {words.label}",
    ).replace(status="ignored")


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
        chosen = seen[min(ranks, key=lambda r: (seen[r].sort_key(), r))]  # the first in the one order of findings
        merged = chosen.replace(ranks=ranks, step=step if step is not None else chosen.step)
        if key[0] == "missing_grad" and active:
            merged = _merged_missing(merged, active, world_size, ddp_unused,
                                     {r: seen[r].cause for r in active}, strategy == "plain")
        out.append(merged)
    out.sort(key=Finding.sort_key)
    return out


def _merged_missing(f: Finding, active: list[int], world_size: int, ddp_unused: bool | None,
                    causes: Mapping[int, str], plain: bool = True) -> Finding:
    if f.details.get("reason") == "sharded_gradients":
        return f
    details = {**f.details, "ranks_without_grad": list(active), "world_size": world_size}
    if len(active) == world_size and f.status != "open":
        return f.replace(details=details)  # intermittent on every rank: its own words stand
    details["observed"] = observed(f)
    if len(active) == world_size:
        note, fix = "", f.fix
        if plain and ddp_unused is False:
            note = (f" Under DDP (find_unused_parameters=False) it stops training at the next step "
                    f"with \"{DDP_NEXT_STEP_ERROR}\".")
            fix = DDP_FIX
        elif plain and ddp_unused is None:
            note = (" If the model is wrapped in DDP without find_unused_parameters=True (the "
                    f"default), the next step fails with \"{DDP_NEXT_STEP_ERROR}\".")
            fix = (f"{f.fix}; under DDP, if it is unused on purpose, pass `find_unused_parameters=True` "
                   "(or `static_graph=True`) to DistributedDataParallel")
        return f.replace(
            message=f.message.rstrip(".") + " (no gradient on any rank).",
            cause=f"no gradient on any rank, so it is a dead parameter, not a per-rank branch: {f.cause}{note}",
            fix=fix, details={**details, "reason": "no_grad_on_any_rank"})
    others = [r for r in range(world_size) if r not in active]
    where = _ranks_words(active)
    message = (f"`{f.name}` got no gradient on {where} only (it got one on {_ranks_words(others)}): "
               "per-rank branching, a different bug from a dead layer.")
    cause = (f"the forward pass takes a rank-dependent path: on {where} `{f.name}` is not used "
             "(a branch on the rank, or data-dependent routing that differs between ranks). "
             f"On {where}: {causes[active[0]]}")
    details["per_rank_branching"] = True
    if ddp_unused is False:
        return f.replace(
            severity="error", status="open", message=message,
            cause=cause + " DDP with find_unused_parameters=False waits for this gradient on the "
            "other ranks: it hangs or fails.",
            fix="make every rank run the same modules, or pass `find_unused_parameters=True` to "
            "DistributedDataParallel if the branching is intended",
            details={**details, "reason": "rank_branching_hangs"})
    return f.replace(
        severity="info", status="intermittent", message=message, cause=cause,
        fix="nothing, if the branching is intended (DDP needs find_unused_parameters=True for it, "
        "and the parameter trains from the ranks that use it); otherwise make every rank run "
        "the same modules",
        details={**details, "reason": "rank_branching"})


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
        #: The last merged report (None before the first gather).
        self.report: Report | None = None
        ddp = find_ddp(model)
        self.ddp_unused: bool | None = declared_ddp(model) if ddp is None else bool(
            getattr(ddp, "find_unused_parameters", False) or getattr(ddp, "static_graph", False))
        self._use = UseTracker(params) if self.ddp_unused else None
        self.rounds = 0
        self.changed = False
        self.pipelined = pipelined
        self._pending: Any = None
        self._flag = torch.zeros(1, dtype=torch.int32)

    @property
    def runs_sinks(self) -> bool:
        """Rank zero logs the merged findings; once gathering failed, every rank logs its own."""
        return self.rank == 0 or self._disabled

    def _locally_unused(self, step: int) -> list[Finding]:
        """Parameters this rank did not use although DDP gave them a gradient."""
        return [Finding.new(
            "missing_grad", name, "error",
            f"`{name}` requires grad but got no gradient on this rank.",
            "its gradient was not computed on this rank in this step (its module did not "
            "run, or its output did not reach the loss); DDP (find_unused_parameters=True) "
            "filled its .grad with the average from the ranks that used it.",
            "", step=step, **describe_tensor(p), reason="unused_on_rank", source="ddp_use",
        ) for p, name in (self._use.unused() if self._use is not None else ())]

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
                known = {f.key for f in findings}
                findings += [f for f in apply_ignore(extra, self.ignore) if f.key not in known]
            idle = local.nothing_to_check  # nothing to check on every rank: the merged report says so too
            digest = hash((idle, tuple(sorted((f.kind, f.name, f.status, f.severity, f.cause) for f in findings))))
            if self._group is None:
                timeout = self.timeout_s if self.timeout_s is not None else DEFAULT_TIMEOUT_S
                self._group = torch.distributed.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
            group = self._group
            if self.report is not None and self.pipelined:
                # The flag all-reduced at the previous check is long done: reading it costs no wait.
                self._pending.wait()
                self._pending = None
            elif self.report is not None:
                self._flag.fill_(0 if digest == self._sent else 1)
                torch.distributed.all_reduce(self._flag, op=torch.distributed.ReduceOp.MAX, group=group)
            # The first check exchanges at once: DDP fails at the next step's forward pass.
            self.changed = self.report is None or bool(self._flag.item())
            if self.changed:
                gathered: list[Any] = [None] * self.world_size
                torch.distributed.all_gather_object(gathered, (idle, [f.to_dict() for f in findings]), group=group)
                per_rank = [[Finding.from_dict(d) for d in (g[1] if g else [])] for g in gathered]
                self.report = Report(merge(per_rank, step=step, ddp_unused=self.ddp_unused, strategy=strategy),
                                      step=step, nothing_to_check=all(bool(g and g[0]) for g in gathered))
                self._sent = digest
                self.rounds += 1
            else:
                assert self.report is not None
                self.report.step = step
            if self.pipelined:
                self._flag.fill_(0 if digest == self._sent else 1)
                self._pending = torch.distributed.all_reduce(
                    self._flag, op=torch.distributed.ReduceOp.MAX, group=group, async_op=True)
            return self.report
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
            with contextlib.suppress(Exception):  # a peer already gone: nothing left to agree on
                pending.wait()
        if self._use is not None:
            self._use.close()


def make_gatherer(model: Any, params: Callable[[], Sequence[tuple[torch.Tensor, str]]], distributed: bool | None,
                  timeout_s: float | None = None, ignore: Mapping[str, str] | None = None) -> Gatherer | None:
    """The Gatherer a Monitor needs: None when not distributed (or ``distributed=False``).

    ``params`` is called only when a Gatherer is made (it lists ``(tensor, name)``).
    """
    if distributed is False or not is_distributed():
        if distributed is True:
            warnings.warn(
                "leafwatch: `distributed=True` but torch.distributed is not initialized with more "
                "than one process; findings are not gathered across ranks.",
                LeafwatchWarning, stacklevel=3)
        return None
    return Gatherer(model, params(), timeout_s, ignore)

"""Distributed training, judged: rank zero reports for every rank.

- :func:`sharded_finding`: the one info finding that says why gradients that cannot be read
  per parameter (:func:`leafwatch.observe.sharding.gradient_view`) are left out of the check.
- :func:`merge`: one finding per ``(kind, name)`` with the ranks it was seen on; a gradient
  missing on some ranks only is per-rank branching (an error under DDP without
  ``find_unused_parameters``, where DDP hangs a step later).
- :func:`judge`: the rank-merge detector (stage ``RANKS``), which the Monitor's
  :class:`~leafwatch.detectors.gatherer.Gatherer` runs on every rank's findings after each check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ..observe.sharding import GradientView
from ..report.findings import Finding
from ..report.history import FindingsView
from ..report.verdicts import Verdict, Verdicts
from .constructors import make, transition
from ..report.reasons import Reason, Transition, Written
from ..report.words import ADVICE, Members, Words

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
    return make(ShardedGradients(strategy=view.strategy, parameters=len(view.skip)), words.name, "info", step=step,
                strategy=words.label, parameters=len(view.skip),
                ignored_because=words.because or f"gradients are sharded by {words.label}").replace(status="ignored")


class ShardedGradients(Reason, kind="missing_grad", name="sharded_gradients", fixes="never"):
    """The ``parameters`` whose gradients ``strategy`` keeps where ``.grad`` cannot tell a missing one."""

    strategy: str
    parameters: int

    def words(self, m: Members) -> Words:
        words = _SHARDED[self.strategy]
        return Words(f"{words.label}: the gradient check is skipped for {self.parameters} parameter(s): their .grad "
                     "cannot tell a missing gradient from a zero one.", words.cause, words.fix)


def unused_on_rank(p: torch.Tensor, name: str, step: int) -> Finding:
    """A parameter this rank did not use although DDP (``find_unused_parameters=True``) gave it a gradient."""
    return make(UnusedOnRank(), name, "error", tensor=p, step=step, source="ddp_use")


class UnusedOnRank(Reason, kind="missing_grad", name="unused_on_rank", fixes="never"):
    """A parameter this rank did not use, whose ``.grad`` DDP filled with the other ranks' average."""

    def words(self, m: Members) -> Words:
        return Words(f"{m.who} requires grad but got no gradient on this rank.",
                     "its gradient was not computed on this rank in this step (its module did not "
                     "run, or its output did not reach the loss); DDP (find_unused_parameters=True) "
                     "filled its .grad with the average from the ranks that used it.", "")


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
            merged = _merged_missing(merged, active, world_size, ddp_unused, seen[active[0]], strategy == "plain")
        out.append(merged)
    out.sort(key=Finding.sort_key)
    return out


@dataclasses.dataclass(eq=False, slots=True)
class RankState:
    """What the rank merge knows of the run: DDP's ``find_unused_parameters`` (None: no DDP seen)."""

    ddp_unused: bool | None = None


def judge(gathered: tuple[int, Sequence[Sequence[Finding]], str], state: RankState, view: FindingsView) -> Verdicts:
    """The rank-merge detector: ``gathered`` (the step, every rank's findings, the gradient view's
    strategy) merged, as verdicts on the merged history; a finding no rank reports any more is resolved."""
    step, per_rank, strategy = gathered
    merged = merge(per_rank, step=step, ddp_unused=state.ddp_unused, strategy=strategy)
    keys = {f.key for f in merged}
    return [*map(Verdict.set, merged), *(Verdict.resolve(f.key, step) for f in view if f.key not in keys)]


def _merged_missing(f: Finding, active: list[int], world_size: int, ddp_unused: bool | None,
                    first_without: Finding, plain: bool) -> Finding:
    """A missing gradient merged across ranks: on every rank (a dead parameter), or on some only (per-rank
    branching); ``first_without``: the finding of the first rank without the gradient."""
    if f.reason.name == "sharded_gradients":
        return f
    details = {**f.details, "ranks_without_grad": list(active), "world_size": world_size}
    if len(active) == world_size and f.status != "open" or isinstance(f.reason, Written):
        return f.replace(details=details)  # intermittent on every rank (or made by hand): its own words stand
    if len(active) == world_size:
        ddp = None if not plain else "unused_false" if ddp_unused is False else "unknown" if ddp_unused is None else None
        return transition(f.replace(details=details), NoGradOnAnyRank, ddp=ddp)
    others = tuple(r for r in range(world_size) if r not in active)
    fields = {"active": tuple(active), "others": others, "on_first": first_without.reason}
    details["per_rank_branching"] = True
    if ddp_unused is False:
        return transition(f.replace(details=details), RankBranchingHangs, **fields).replace(severity="error",
                                                                                           status="open")
    return transition(f.replace(details=details), RankBranching, **fields).replace(severity="info",
                                                                                  status="intermittent")


class NoGradOnAnyRank(Transition, kind="missing_grad", name="no_grad_on_any_rank"):
    """No rank got a gradient for the tensor: a dead parameter, not a per-rank branch (``ddp``: what DDP does
    next, ``"unused_false"`` or ``"unknown"``; None: no DDP advice)."""

    ddp: str | None = None

    def words(self, m: Members) -> Words:
        before, ddp = self.before(m), self.ddp
        note, fix, remedy = "", before.fix, before.remedy
        if ddp == "unused_false":
            note = (f" Under DDP (find_unused_parameters=False) it stops training at the next step "
                    f"with \"{DDP_NEXT_STEP_ERROR}\".")
            fix, remedy = DDP_FIX, ADVICE
        elif ddp == "unknown":
            note = (" If the model is wrapped in DDP without find_unused_parameters=True (the "
                    f"default), the next step fails with \"{DDP_NEXT_STEP_ERROR}\".")
            fix = (f"{before.fix}; under DDP, if it is unused on purpose, pass `find_unused_parameters=True` "
                   "(or `static_graph=True`) to DistributedDataParallel")
        return Words(f"{m.who} requires grad but got no gradient on any rank: it does not train.",
                     f"no gradient on any rank, so it is a dead parameter, not a per-rank branch: {before.cause}{note}",
                     fix, remedy)


class Branching(Transition, kind="missing_grad"):
    """A gradient missing on the ranks ``active`` only (it came on ``others``); ``on_first``: the reason the
    first of them saw."""

    active: tuple[int, ...]
    others: tuple[int, ...]
    on_first: Reason

    def parts(self, m: Members) -> tuple[str, str]:
        """The message and cause of a gradient missing on some ranks only."""
        where = _ranks_words(self.active)
        cause = self.on_first.words(Members(m.names, [self.on_first] * len(m.names))).cause
        return (f"{m.who} got no gradient on {where} only (it got one on {_ranks_words(self.others)}): "
                "per-rank branching, a different bug from a dead layer.",
                f"the forward pass takes a rank-dependent path: on {where} {m.who} is not used "
                "(a branch on the rank, or data-dependent routing that differs between ranks). "
                f"On {where}: {cause}")


class RankBranchingHangs(Branching, name="rank_branching_hangs", fixes="never"):
    """Per-rank branching under DDP with ``find_unused_parameters=False``: it hangs or fails."""

    def words(self, m: Members) -> Words:
        message, cause = self.parts(m)
        return Words(message, cause + " DDP with find_unused_parameters=False waits for this gradient on the "
                     "other ranks: it hangs or fails.",
                     "make every rank run the same modules, or pass `find_unused_parameters=True` to "
                     "DistributedDataParallel if the branching is intended")


class RankBranching(Branching, name="rank_branching", fixes="never"):
    """Per-rank branching where DDP lets it be: info, if intended."""

    def words(self, m: Members) -> Words:
        message, cause = self.parts(m)
        return Words(message, cause, "nothing, if the branching is intended (DDP needs find_unused_parameters=True "
                     "for it, and the parameter trains from the ranks that use it); otherwise make every rank run "
                     "the same modules")

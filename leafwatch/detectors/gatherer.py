"""The rank merge, run: :class:`Gatherer` exchanges every rank's findings after each local check
and runs the registry's ``RANKS`` detectors on them (:func:`leafwatch.detectors.ranks.judge`)
through a pipeline and a history of its own, so that rank zero logs each finding once with the
ranks it was seen on, and strict mode raises on every rank at the same step.

Collectives are issued on every rank or on none, on a gloo side group (CPU tensors: no GPU sync,
and never paired with DDP's own collectives): the first check all-gathers the (small, plain-data)
findings of every rank; afterwards each check starts ONE all-reduce of a single int ("did any
rank's findings change?") without waiting for it, and reads it at the next check, where a yes (on
every rank alike) triggers the next all-gather. Under DDP with ``find_unused_parameters=True`` it
reads which parameters this rank used from :class:`leafwatch.observe.loop.UseTracker`.

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

from ..observe.loop import UseTracker
from ..observe.sharding import declared_ddp, find_ddp, is_distributed, world
from ..options import LeafwatchWarning, WarnOnce
from ..report.events import CheckEvent
from ..report.findings import Report, apply_ignore
from ..report.history import FindingHistory
from .pipeline import Part, Pipeline
from . import ranks
from .ranks import unused_on_rank

#: Timeout (seconds) of leafwatch's own gloo group. Ranks meet at a check right after DDP's
#: gradient all-reduce, so they are seconds apart at most; a Monitor made on one rank only
#: (``if rank == 0: Monitor(...)``) costs one stall of this length and a warning, not a hang.
DEFAULT_TIMEOUT_S = 300.0


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
        detectors: The registry's detectors of stage ``RANKS`` (each run as ``run(gatherer, gathered)``).
        warn: Warns once per internal failure (a failing detector also leaves an ``incomplete`` finding).
    """

    def __init__(self, model: Any, params: Sequence[tuple[torch.Tensor, str]] = (),
                 timeout_s: float | None = None, ignore: Mapping[str, str] | None = None,
                 pipelined: bool = True, detectors: Sequence[Any] = (), warn: WarnOnce | None = None) -> None:
        self.rank, self.world_size = world()
        #: What every rank found, merged: a history of its own, written only by the merge's verdicts.
        self.history = FindingHistory(ignore)
        self.timeout_s = timeout_s
        self._group: Any = None
        self._disabled = False
        self._sent: Any = None
        #: The last merged report (None before the first gather).
        self.report: Report | None = None
        ddp = find_ddp(model)
        self.ddp_unused: bool | None = declared_ddp(model) if ddp is None else bool(
            getattr(ddp, "find_unused_parameters", False) or getattr(ddp, "static_graph", False))
        self._use = UseTracker(params, model) if self.ddp_unused else None
        #: The merge's detectors (the registry's ``RANKS`` stage), each with what it knows of the run.
        self.pipeline: Pipeline[Any] = Pipeline([Part(d.name, d.judge, ranks.RankState(self.ddp_unused))
                                                 for d in detectors], self.history, warn or WarnOnce())
        self.rounds = 0
        self.changed = False
        self.pipelined = pipelined
        self._pending: Any = None
        self._flag = torch.zeros(1, dtype=torch.int32)

    @property
    def runs_sinks(self) -> bool:
        """Rank zero logs the merged findings; once gathering failed, every rank logs its own."""
        return self.rank == 0 or self._disabled

    def gather(self, local: Report, step: int, strategy: str = "plain") -> Report | None:
        """Merge ``local`` with every rank's report. Call it on every rank at every check.

        Args:
            local: This rank's report (after a local failure, the last one).
            step: The step of the check.
            strategy: :attr:`GradientView.strategy` of the model.

        Returns:
            The merged report, or None when gathering is off (it failed once).
        """
        if self._disabled:
            return None
        try:
            findings = local.tensors()  # merged per tensor, grouped again by the Report
            extra = [unused_on_rank(p, name, step) for p, name in (self._use.unused() if self._use is not None else ())]
            if extra:
                known = {f.key for f in findings}
                findings += [f for f in apply_ignore(extra, self.history.ignore) if f.key not in known]
            idle = local.nothing_to_check  # nothing to check on every rank: the merged report says so too
            digest = hash((idle, tuple(sorted((f.kind, f.name, f.status, f.severity, hash(f.reason.compared()))
                                              for f in findings))))
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
                torch.distributed.all_gather_object(gathered, (idle, findings), group=group)  # (pickled: data only)
                per_rank = [list(g[1]) if g else [] for g in gathered]
                self.history.nothing_to_check = all(bool(g and g[0]) for g in gathered)
                self.pipeline.run((step, per_rank, strategy), step)
                self._sent = None if self.pipeline.failing else digest  # a failed merge is tried again
                self.rounds += 1
            self.report = self.history.report(step)
            if self.pipelined:
                self._flag.fill_(0 if digest == self._sent else 1)
                self._pending = torch.distributed.all_reduce(
                    self._flag, op=torch.distributed.ReduceOp.MAX, group=group, async_op=True)
            return self.report
        except Exception as error:
            self._disabled = True
            self._pending = None
            self.pipeline.warn("gathering findings across ranks (each rank must create its Monitor and check at "
                 "the same steps; otherwise pass `distributed=False`)", error)
            return None

    def merge_event(self, event: CheckEvent | None, report: Report, step: int, optimizer: int | None,
                    strategy: str) -> CheckEvent | None:
        """The Monitor's event with the report merged across ranks (``report``: this rank's
        latest, used when the local check failed and ``event`` is None)."""
        merged = self.gather(event.report if event is not None else report, step, strategy)
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
                  timeout_s: float | None = None, ignore: Mapping[str, str] | None = None,
                  detectors: Sequence[Any] = (), warn: WarnOnce | None = None) -> Gatherer | None:
    """The Gatherer a Monitor needs: None when not distributed (or ``distributed=False``).

    ``params`` is called only when a Gatherer is made (it lists ``(tensor, name)``); ``detectors``
    and ``warn``: see :class:`Gatherer`.
    """
    if distributed is False or not is_distributed():
        if distributed is True:
            warnings.warn(
                "leafwatch: `distributed=True` but torch.distributed is not initialized with more "
                "than one process; findings are not gathered across ranks.",
                LeafwatchWarning, stacklevel=3)
        return None
    return Gatherer(model, params(), timeout_s, ignore, detectors=detectors, warn=warn)

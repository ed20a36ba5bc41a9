"""The evidence of one check: all it observed, read once before any detector runs.

:func:`read` takes the structure (read again only where it changed; the loop hooks then follow
the new optimizers) and makes the one read of each ``p.grad``. Every detector of the check gets the
same evidence, a plain tuple (read-only) whose fields the constants below name:
``evidence[LISTS]`` (a named tuple costs a construction and a descriptor call per read, each cold
right after backward). Its last field, :class:`Observation`, gives the detectors what the
Monitor's observing objects hold (the structure cache, the forward records and cuts, the loop
hooks, the value reads, the watched tensors, what the global hooks saw): they read it, never write
it. What a detector concludes goes into its verdicts or its own state, never back here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .changes import HandUpdates
    from .loop import ArrivalHooks, StepSentinels
    from .observer import Observer
    from .structure import StructureCache
    from .tracing import Tracer
    from .values import NamedValueCheck

#: A check's evidence: ``(step, optimizer, loss, index, inventory, rebuilt, lists, seen)``.
Evidence = tuple[Any, ...]
#: The step, the optimizer checked (None: every one), the loss, the optimizer's index among the Monitor's,
#: the structure as read and its new reading (None: unchanged), for each check list its key, the list
#: and the indices of its tensors whose ``.grad`` is None, and the :class:`Observation`.
STEP, OPTIMIZER, LOSS, INDEX, INVENTORY, REBUILT, LISTS, SEEN = range(8)


@dataclasses.dataclass(eq=False, slots=True)
class Observation:
    """What the Monitor's observing objects hold, as the detectors read it.

    Attributes:
        cache: The structure cache (the optimizers, the check lists, the old tensors, the gradient view).
        tracer: The forward hooks' records and the cuts the recorder saw.
        arrivals: Which gradients arrived in backward since the last check (the loop watch).
        sentinels: The optimizers' steps skipped in a row.
        values: The batched NaN/Inf and zero reads, at their cadence.
        watches: The Monitor's own watched tensors (``tensors=``).
        default_watches: The tensors flagged with ``watch()``: every Monitor judges them.
        hands: The value snapshots that tell a tensor updated by hand, by the detector that asked.
        checks: How many checks ran (this one included).
        interrupted: The run ended by an exception (read at its end): the checks that would decide what
            waits for a later step never came.
    """

    cache: StructureCache
    tracer: Tracer
    arrivals: ArrivalHooks
    sentinels: StepSentinels
    values: NamedValueCheck
    watches: Any
    default_watches: Any
    hands: Mapping[str, HandUpdates]
    checks: int = 0
    interrupted: bool = False

    @property
    def observer(self) -> Observer:
        """What the Monitor's global hooks saw (registrations, optimizers stepping)."""
        return self.cache.observer

    def watch_entries(self) -> list[Any]:
        """Every watched tensor this Monitor judges: ``watch()``-ed ones and its own ``tensors=``."""
        # Right after backward every distinct piece of Python code runs cold (tens of µs): with
        # nothing watched, don't even take the registries' locks.
        entries = self.default_watches.entries() if self.default_watches else []
        return entries + self.watches.entries() if self.watches else entries


def read(seen: Observation, optimizer: torch.optim.Optimizer | None, loss: torch.Tensor | None, step: int) -> Evidence:
    """The evidence of a check of ``optimizer`` (None: of every one) at ``step``."""
    cache, index = seen.cache, None
    if optimizer is not None:
        index = cache.index_of.get(id(optimizer))
        if index is None:  # an optimizer the Monitor was not given: adopt it
            cache.add_optimizer(optimizer)
            index = cache.optimizer_index(optimizer)
    rebuilt = cache.refresh(step)
    if rebuilt is not None:
        seen.sentinels.track(cache.optimizers, cache.lists, cache.stale_ids)
    found = []
    for key, clist in cache.lists.items() if optimizer is None else ((index, cache.lists[index]),):
        clist.checks += 1
        found.append((key, clist, [i for i, p in enumerate(clist.params) if p.grad is None]))
    return step, optimizer, loss, index, cache.inventory, rebuilt, tuple(found), seen


def at_rest(seen: Observation, step: int, rebuilt: Any = None) -> Evidence:
    """The evidence of a look without a step (the scan before any gradient, with the structure
    ``rebuilt`` for it; the end of a run): the structure as it is, no gradient read."""
    if rebuilt is not None:
        seen.sentinels.track(seen.cache.optimizers, seen.cache.lists, seen.cache.stale_ids)
    return step, None, None, None, seen.cache.inventory, rebuilt, (), seen


__all__ = ["INDEX", "INVENTORY", "LISTS", "LOSS", "OPTIMIZER", "REBUILT", "SEEN", "STEP", "Evidence", "Observation",
           "at_rest", "read"]

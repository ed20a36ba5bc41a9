"""The evidence of one check: what it observed, read once before any detector runs.

:func:`read` takes the structure (read again only where it changed) and makes the one read of
each ``p.grad``. Every detector of the check reads the same evidence, a plain tuple (read-only)
whose fields the constants below name: ``evidence[LISTS]`` (a named tuple costs a construction
and a descriptor call per read, each cold right after backward). What a detector concludes goes
into its verdicts or its own state, never back here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .structure import StructureCache

#: A check's evidence: ``(step, optimizer, loss, index, inventory, rebuilt, lists)``.
Evidence = tuple[Any, ...]
#: The step, the optimizer checked (None: every one), the loss, the optimizer's index among the Monitor's,
#: the structure as read and its new reading (None: unchanged), and for each check list its key, the list
#: and the indices of its tensors whose ``.grad`` is None.
STEP, OPTIMIZER, LOSS, INDEX, INVENTORY, REBUILT, LISTS = range(7)


def read(cache: StructureCache, optimizer: torch.optim.Optimizer | None, loss: torch.Tensor | None,
         step: int) -> Evidence:
    """The evidence of a check of ``optimizer`` (None: of every one) at ``step``."""
    index = None
    if optimizer is not None:
        index = cache.index_of.get(id(optimizer))
        if index is None:  # an optimizer the Monitor was not given: adopt it
            cache.add_optimizer(optimizer)
            index = cache.optimizer_index(optimizer)
    rebuilt = cache.refresh(step)
    found = []
    for key, clist in cache.lists.items() if optimizer is None else ((index, cache.lists[index]),):
        clist.checks += 1
        found.append((key, clist, [i for i, p in enumerate(clist.params) if p.grad is None]))
    return step, optimizer, loss, index, cache.inventory, rebuilt, tuple(found)


__all__ = ["INDEX", "INVENTORY", "LISTS", "LOSS", "OPTIMIZER", "REBUILT", "STEP", "Evidence", "read"]

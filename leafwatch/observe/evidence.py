"""The evidence of one check: what it observed, read once before any detector runs.

:func:`read` takes the structure (read again only where it changed) and makes the one read of
each ``p.grad`` of the check lists; the :class:`Evidence` it returns is frozen, and every
detector of the check reads the same one. What a detector concludes goes into its verdicts
(and, where a later detector of the same check needs it, into its own state), never back here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

    from .inventory import Inventory
    from .structure import CheckList, StructureCache


class Evidence(NamedTuple):
    """What one check observed (read-only: a tuple, cheap to make right after backward)."""

    step: int
    optimizer: torch.optim.Optimizer | None = None
    loss: torch.Tensor | None = None
    #: The index of ``optimizer`` among the Monitor's (None: every optimizer is checked).
    index: int | None = None
    #: The structure as read at this check, and the new reading when it changed at this check.
    inventory: Inventory | None = None
    rebuilt: Inventory | None = None
    #: For each check list: its key, the list, and the indices of its tensors whose ``.grad`` is None.
    lists: tuple[tuple[int | None, CheckList, list[int]], ...] = ()


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
    lists = tuple(found)
    # (tuple.__new__, not Evidence(...): no Python frame of its own right after backward)
    return tuple.__new__(Evidence, (step, optimizer, loss, index, cache.inventory, rebuilt, lists))


__all__ = ["Evidence", "read"]

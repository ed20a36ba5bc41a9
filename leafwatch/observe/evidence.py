"""The evidence of one check: what its parts have read so far, handed from one part to the next.

One object per check (the Checker reuses one instance), filled in order: the structure part sets
the inventory and the check lists, the gradient part the tensors that miss their gradient, and so
on. A part of the pipeline, or a detector it calls, reads what the parts before it found here
instead of asking its owners again (each such call runs cold right after backward).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .inventory import Inventory
    from .structure import CheckList
    from ..watching import WatchEntry


@dataclasses.dataclass
class CheckState:
    """What one check has read so far, handed from one part of the pipeline to the next."""

    optimizer: torch.optim.Optimizer | None
    loss: torch.Tensor | None
    #: The step of the check.
    step: int = 0
    #: The structure as read at this check (None: not read yet).
    inventory: Inventory | None = None
    streaks_before: int = 0
    #: The index of ``optimizer`` among the Monitor's (None: every optimizer is checked).
    index: int | None = None
    lists: list[CheckList] = dataclasses.field(default_factory=list)
    #: Indices into the joined names of the tensors without a gradient at this check.
    missing: list[int] = dataclasses.field(default_factory=list)
    entries: list[WatchEntry] = dataclasses.field(default_factory=list)
    #: A loop watch asked for the value check now (a step about to be skipped).
    force_values: bool = False


__all__ = ["CheckState"]

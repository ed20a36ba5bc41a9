"""Distributed training, at its earlier import path: re-exports :mod:`leafwatch.observe.sharding`
(what is sharded, the declarations), :mod:`leafwatch.detectors.ranks` (the merge) and
:mod:`leafwatch.detectors.gatherer` (the gatherer).

The gatherer, the gradient views of DDP / FSDP / DeepSpeed and the declarations a front-end
makes (:func:`declare_gradients`, :func:`declare_ddp`) are part of the core, which never imports
``leafwatch.integrations``; ``from leafwatch.integrations.distributed import merge`` keeps working.
Module constants are read where they are defined: set ``DEFAULT_TIMEOUT_S`` in :mod:`leafwatch.detectors.gatherer`.
"""

from __future__ import annotations

from ..detectors.gatherer import DEFAULT_TIMEOUT_S, Gatherer, make_gatherer
from ..detectors.ranks import DDP_FIX, DDP_NEXT_STEP_ERROR, merge
from ..observe.sharding import DECLARED_STRATEGIES, PLAIN, GradientView, declare_ddp, declare_gradients, find_ddp, gradient_view, is_distributed, local_tensor, world

__all__ = ["DDP_FIX", "DDP_NEXT_STEP_ERROR", "DECLARED_STRATEGIES", "DEFAULT_TIMEOUT_S", "PLAIN", "Gatherer",
           "GradientView", "declare_ddp", "declare_gradients", "find_ddp", "gradient_view", "is_distributed",
           "local_tensor", "make_gatherer", "merge", "world"]

"""Distributed training, observed: where gradients cannot be read per parameter, and which
parameters each rank used.

- :func:`gradient_view` tells, from the model alone, where ``p.grad`` cannot be read per
  parameter: FSDP's ``FullyShardedDataParallel`` (flat parameters, or original parameters
  whose gradients are shards filled with zeros where a parameter was unused) and DeepSpeed
  (gradients kept in the engine's partitioned buffers), or what a front-end that sees the
  optimizer declares (:func:`declare_gradients`: DeepSpeed ZeRO-1/2 behind a plain module, an
  optimizer that steps master copies). Those parameters are left out of the gradient check;
  :mod:`leafwatch.detectors.ranks` words the one info finding that says why. ``fully_shard``
  (FSDP2) needs nothing: its parameters are DTensors whose ``.grad`` stays None when unused,
  so it is read as is (the NaN/Inf check reads the local shard).
- Under DDP with ``find_unused_parameters=True`` DDP fills the ``.grad`` of a parameter that a
  rank did not use with the other ranks' average, so ``p.grad is None`` says nothing per rank:
  :class:`~leafwatch.observe.loop.UseTracker`'s arrival hooks record which parameters this rank
  really used.

Its only module-level state is what the public API promises: the declarations made through
:func:`declare_gradients` and :func:`declare_ddp` (``_DECLARED``, ``_DDP_DECLARED``: model ->
declaration, held weakly). A front-end makes them before any Monitor exists, for a model it
has not handed over yet, so they cannot live in a Monitor; a Monitor reads them when it builds
its structure and its Gatherer, and the front-end withdraws them at the end of its run
(``strategy=None``).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn


# -- where gradients can be read ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GradientView:
    """How the gradients of one model can be read.

    Attributes:
        strategy: ``"plain"``, ``"fsdp2"``, ``"fsdp"``, ``"fsdp_flat"``, ``"deepspeed"`` or
            ``"master_copies"`` (declared by a front-end, see :func:`declare_gradients`).
        skip: ids of the parameters whose ``.grad`` cannot tell a missing gradient.
        local_grads: The gradients are DTensors: value checks read their local shard.
    """

    strategy: str = "plain"
    skip: frozenset[int] = frozenset()
    local_grads: bool = False


PLAIN = GradientView()


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


def _chain(model: Any) -> list[Any]:
    """The model, the wrappers Lightning keeps around it, and nothing else."""
    wrapped = getattr(getattr(getattr(model, "_trainer", None), "strategy", None), "model", None)
    return [model, wrapped] if wrapped is not None and wrapped is not model else [model]


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


def declared_ddp(model: Any) -> bool | None:
    """What :func:`declare_ddp` said of ``model`` (or of the first module of a mapping it was said of), else None."""
    models = model.values() if isinstance(model, Mapping) else [model]
    return next((_DDP_DECLARED[m] for m in models if isinstance(m, nn.Module) and m in _DDP_DECLARED), None)


#: FSDP1, tried in this order: the tensor attribute that marks a parameter it shards, and how.
_FSDP1 = (("_is_flat_param", "fsdp_flat"), ("_fsdp_flattened", "fsdp"))


def gradient_view(model: Any, params: Sequence[tuple[int, torch.Tensor, str]]) -> GradientView:
    """Detect the sharding strategy of ``model`` and say which gradients can be read per parameter.

    Args:
        model: The model handed to the Monitor (a module, or a mapping name -> module).
        params: ``(id, tensor, name)`` of every parameter the Monitor knows.

    Returns:
        A :class:`GradientView`; :data:`PLAIN` when nothing is sharded.
    """
    entries = list(params)
    if not entries:
        return PLAIN
    tensors = [t for _, t, _ in entries]
    models = list(model.values()) if isinstance(model, Mapping) else [model]
    deepspeed = any(type(m).__name__ == "DeepSpeedEngine" for root in models for m in _chain(root)) \
        or any(hasattr(p, "ds_id") for p in tensors)
    if deepspeed:
        return GradientView("deepspeed", frozenset(k for k, _, _ in entries))
    declared = [m for m in models if isinstance(m, nn.Module) and m in _DECLARED]
    if declared:  # what a front-end declared, of the declared module's own parameters only
        own = {id(p) for m in declared for p in m.parameters()}
        return GradientView(_DECLARED[declared[0]], frozenset(k for k, t, _ in entries if id(t) in own))
    for marker, strategy in _FSDP1:
        skip = frozenset(k for k, t, _ in entries if getattr(t, marker, False))
        if skip:
            return GradientView(strategy, skip)
    return GradientView("fsdp2", frozenset(), True) if any(_is_dtensor(t) for t in tensors) else PLAIN


def local_tensor(t: torch.Tensor | None) -> torch.Tensor | None:
    """The local shard of a DTensor (no communication); any other tensor as it is."""
    return t.to_local() if t is not None and _is_dtensor(t) else t


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
    return next((m for m in _chain(model) if isinstance(m, nn.parallel.DistributedDataParallel)), None)

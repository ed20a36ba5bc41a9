"""Autograd introspection: why a tensor is not a leaf, and which leaves a graph reaches.

Everything here walks ``grad_fn`` nodes only when asked (for a tensor that failed, or once for
a loss), never on the per-step path, and returns plain data: no node or tensor is kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

# grad_fn class names (without the trailing version digit) -> what the user wrote (a copy: its device or dtype).
_KINDS = {
    "ToCopyBackward": "copy", "CloneBackward": "clone",
    **dict.fromkeys((
        "MulBackward", "DivBackward", "AddBackward", "SubBackward", "NegBackward", "PowBackward",
        "RsubBackward", "ExpBackward", "LogBackward", "SqrtBackward", "AbsBackward", "ClampBackward",
        "SigmoidBackward", "TanhBackward", "SoftplusBackward"), "arithmetic"),
    **dict.fromkeys((
        "ViewBackward", "SliceBackward", "SelectBackward", "UnsqueezeBackward", "SqueezeBackward",
        "TBackward", "TransposeBackward", "PermuteBackward", "ExpandBackward", "AsStridedBackward",
        "ReshapeAliasBackward", "UnsafeViewBackward", "IndexBackward", "NarrowBackward",
        "SplitBackward", "UnbindBackward", "AliasBackward", "UnfoldBackward", "DiagonalBackward"), "view"),
}

#: How many autograd nodes one walk may visit before it gives up.
MAX_NODES = 20_000


@dataclasses.dataclass(frozen=True)
class LeafInfo:
    shape: tuple[int, ...]
    dtype: str
    device: str
    is_parameter: bool
    tensor_id: int


@dataclasses.dataclass(frozen=True)
class Origin:
    """Why a tensor is a non-leaf, as data: the autograd op that made it, what the user wrote to
    make it (``kind``: ``device``, ``dtype``, ``copy``, ``clone``, ``arithmetic``, ``view`` or ``other``), the
    tensor's device and dtype, and the leaf that gets its gradient (the words: the detectors')."""

    op: str
    kind: str
    device: str
    dtype: str
    leaf: LeafInfo | None


def iter_nodes(root: object, limit: int, seen: set[int] | None = None) -> Iterator[object]:
    """Every autograd node reachable from ``root`` (depth first, each once, at most ``limit``).

    ``seen``: node ids already walked (by an earlier walk that shares it), passed over; the ids
    of the nodes this walk visits are added to it.
    """
    seen = set() if seen is None else seen
    limit += len(seen)
    stack = [root]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        for child, _ in getattr(node, "next_functions", ()):
            if child is not None and id(child) not in seen:
                stack.append(child)


def leaves_of(grad_fn: object, limit: int) -> tuple[list[torch.Tensor], bool]:
    """The leaf tensors a graph accumulates into, and whether the walk was complete."""
    leaves: list[torch.Tensor] = []
    count = 0
    for count, node in enumerate(iter_nodes(grad_fn, limit), 1):
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
    return leaves, count < limit


def computed_from(t: torch.Tensor, ids: set[int] | dict[int, object]) -> bool:
    """Whether the non-leaf ``t`` was computed from at least one tensor of ``ids`` (or its graph is too large
    to tell): an output or a loss kept, no tensor of its own."""
    leaves, complete = leaves_of(t.grad_fn, 2_000)
    return not complete or any(id(leaf) in ids for leaf in leaves)


#: What :func:`reachable_leaf_ids` returns for a loss with no autograd graph: no leaf is reached.
NO_GRAPH: frozenset[int] = frozenset()


def reachable_leaf_ids(loss: torch.Tensor) -> set[int] | frozenset[int] | None:
    """The ``id`` of every leaf that a backward from ``loss`` reaches; :data:`NO_GRAPH` for a loss
    that has no autograd graph (it does not require grad); None when unknown."""
    if isinstance(loss, torch.Tensor) and loss.grad_fn is None and not loss.requires_grad:
        return NO_GRAPH
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return None
    leaves, complete = leaves_of(loss.grad_fn, limit=10 * MAX_NODES)
    return {id(t) for t in leaves} if complete else None


def origin(tensor: torch.Tensor) -> Origin | None:
    """Explain a non-leaf: the op that made it and the leaf that receives its gradient."""
    grad_fn = tensor.grad_fn
    if grad_fn is None:
        return None
    op = type(grad_fn).__name__
    base = op.rstrip("0123456789")  # ToCopyBackward0 -> ToCopyBackward
    leaves, _ = leaves_of(grad_fn, limit=256)
    leaf = leaves[0] if leaves else None
    info = None if leaf is None else LeafInfo(tuple(leaf.shape), str(leaf.dtype).replace("torch.", ""),
                                              str(leaf.device), isinstance(leaf, torch.nn.Parameter), id(leaf))
    kind = _KINDS.get(base, "other")
    if kind == "copy" and leaf is not None and leaf.device != tensor.device:
        kind = "device"
    elif kind == "copy" and leaf is not None and leaf.dtype != tensor.dtype:
        kind = "dtype"
    return Origin(op=op, kind=kind, device=str(tensor.device), dtype=str(tensor.dtype), leaf=info)


def code_name(name: str) -> str | None:
    """``name`` when it can stand in code as a variable or attribute path, else None
    (``tensors[0]``, ``tensor@train.py:12``: names leafwatch made up)."""
    return name if all(part.isidentifier() for part in name.split(".")) else None

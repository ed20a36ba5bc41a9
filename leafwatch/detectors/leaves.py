"""The non-leaf finding: why a tensor is no leaf, and the fix that makes it one.

Two detectors decide it (a watched tensor, ``watched``; a non-leaf an optimizer holds, ``structure``)
and ``watch()`` warns with its words when it is called on a non-leaf; the orphan check says the same
cause for a module attribute that is a non-leaf. The op that made the tensor and the leaf that gets
its gradient instead are read once (:func:`leafwatch.observe.graph.origin`) and kept as plain data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from . import fixes
from ..observe import graph
from ..observe.inventory import Inventory
from ..report.findings import Finding
from ..report.reasons import Reason
from ..report.words import Members, Words
from .constructors import make


@dataclasses.dataclass(frozen=True)
class Leaf:
    """The leaf that gets a non-leaf's gradient: its shape, dtype, device, whether it is an ``nn.Parameter``,
    and the user's name for it (None: unknown)."""

    shape: tuple[int, ...]
    dtype: str
    device: str
    is_parameter: bool
    name: str | None = None


@dataclasses.dataclass(frozen=True)
class Origin:
    """Why a tensor is a non-leaf: the autograd op that made it, what the user wrote to make it (``kind``:
    ``device``, ``dtype``, ``copy``, ``clone``, ``arithmetic``, ``view`` or ``other``), its device and dtype,
    and the leaf that gets its gradient."""

    op: str
    kind: str
    device: str
    dtype: str
    leaf: Leaf | None = None


def non_leaf(name: str, t: torch.Tensor, *, step: int | None, inventory: Inventory | None = None,
             found: graph.Origin | None = None, where: str = "", watched: Iterable[Any] = (),
             location: str | None = None, hand_over: bool = False) -> Finding:
    """The non-leaf ``t`` as a finding; ``hand_over``: no optimizer holds it (a watched tensor), so the
    fix also gives the leaf it makes to the inventory's optimizer (pasting it leaves no second finding)."""
    found = found if found is not None else graph.origin(t)
    known = inventory.known_names() if inventory is not None else {}
    for entry in watched:  # a watched leaf has a name too
        leaf = entry.tensor()
        if leaf is not None and entry.is_leaf:
            known.setdefault(id(leaf), entry.name)
    target = (fixes.inventory_target(inventory) if hand_over and inventory is not None and inventory.optimizers
              else None)
    origin = origin_of(found, known)
    return make(NotALeaf(origin=origin, where=where, fix=fixes.leaf_fix_args(name, location, tensor=t, target=target,
                                                                             origin=origin)),
                name, "error", tensor=t, step=step, op=found.op if found else None)


def origin_of(found: graph.Origin | None, known: Mapping[int, str]) -> Origin | None:
    """A non-leaf's origin as a reason's field, its leaf named as the user names it when known."""
    if found is None:
        return None
    leaf = found.leaf
    return Origin(found.op, found.kind, found.device, found.dtype, None if leaf is None else Leaf(
        tuple(leaf.shape), leaf.dtype, leaf.device, leaf.is_parameter, known.get(leaf.tensor_id)))


_MADE_BY = {
    "device": "a device copy (`.to('{device}')` / `.{device_type}()`) made after `requires_grad=True`",
    "dtype": "a dtype conversion (`.to({dtype})`) made after `requires_grad=True`",
    "copy": "a copy (`.to(...)` / `.cuda()`) made after `requires_grad=True`",
    "clone": "`.clone()` of a tensor that requires grad",
    "arithmetic": "arithmetic on a leaf (for example `randn(..., requires_grad=True) * 0.01`)",
    "view": "a view, slice or reshape of a leaf (`t[0]`, `.view()`, `.t()`)",
    "other": "an operation on a tensor that requires grad",
}


def origin_cause(name: str | None, origin: Origin | None, described: str = "the tensor") -> str:
    """Why the tensor ``name`` is not a leaf: the op that made it and the leaf that gets its gradient
    instead; a tensor the user has no name for (``name`` None) is ``described`` in words."""
    who = f"`{name}`" if name else described
    if origin is None:
        return f"{who} is not a leaf."
    device = str(origin.device)
    what = _MADE_BY.get(origin.kind, _MADE_BY["other"]).format(
        device=device, device_type=device.split(":")[0], dtype=origin.dtype)
    text = f"{who} is the result of {what} (autograd op `{origin.op}`), so it is not a leaf"
    leaf = origin.leaf
    if leaf is None:
        return text + "."
    if leaf.name:
        gets = f"`{leaf.name}`"
    elif origin.kind == "view":
        gets = "the leaf it is a view of"  # usually a tensor the caller still holds
    else:
        gets = "an unnamed temporary leaf that nothing in your code holds"
    grad = f"`{name}.grad`" if name else "its .grad"
    return (f"{text}: backward() puts the gradient into {gets} (shape {tuple(leaf.shape)}, "
            f"{leaf.dtype}, {leaf.device}), and {grad} stays None.")


class NotALeaf(Reason, kind="non_leaf", name="not_a_leaf"):
    """A watched tensor, or one an optimizer holds, that is no leaf (``where``: how it was met)."""

    origin: Origin | None
    fix: fixes.LeafFix
    where: str = ""

    def words(self, m: Members) -> Words:
        name = None if m.described else m.name
        fix, remedy = fixes.leaf_fix(name, self.origin, self.fix)
        return Words(f"{m.who} is not a leaf tensor{self.where}: its .grad will stay None and it will never train.",
                     origin_cause(name, self.origin, m.name), fix, remedy)

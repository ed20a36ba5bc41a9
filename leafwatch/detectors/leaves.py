"""The non-leaf finding: why a tensor is no leaf, and the fix that makes it one.

Two detectors decide it (a watched tensor, ``watched``; a non-leaf an optimizer holds, ``structure``)
and ``watch()`` warns with its words when it is called on a non-leaf; the orphan check says the same
cause for a module attribute that is a non-leaf. The op that made the tensor and the leaf that gets
its gradient instead are read once (:func:`leafwatch.observe.graph.origin`) and kept as plain data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from . import fixes
from ..observe import graph
from ..observe.inventory import Inventory
from ..report.findings import Finding
from ..report.words import Members, Words, renders
from .constructors import make


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
    return make("non_leaf", name, "error", "not_a_leaf", {
        "origin": origin_args(found, known), "where": where, **fixes.leaf_fix_args(name, location, tensor=t, target=target)},
        tensor=t, step=step, op=found.op if found else None)


def origin_args(found: graph.Origin | None, known: Mapping[int, str]) -> dict[str, Any] | None:
    """A non-leaf's origin as a finding's argument, its leaf named as the user names it when known."""
    return None if found is None else found.to_args(known.get(found.leaf.tensor_id) if found.leaf else None)


_MADE_BY = {
    "device": "a device copy (`.to('{device}')` / `.{device_type}()`) made after `requires_grad=True`",
    "dtype": "a dtype conversion (`.to({dtype})`) made after `requires_grad=True`",
    "copy": "a copy (`.to(...)` / `.cuda()`) made after `requires_grad=True`",
    "clone": "`.clone()` of a tensor that requires grad",
    "arithmetic": "arithmetic on a leaf (for example `randn(..., requires_grad=True) * 0.01`)",
    "view": "a view, slice or reshape of a leaf (`t[0]`, `.view()`, `.t()`)",
    "other": "an operation on a tensor that requires grad",
}


def origin_cause(name: str, origin: Mapping[str, Any] | None) -> str:
    """Why ``name`` is not a leaf: the op that made it and the leaf that gets its gradient instead."""
    if origin is None:
        return f"`{name}` is not a leaf."
    device = str(origin["device"])
    what = _MADE_BY.get(origin["kind"], _MADE_BY["other"]).format(
        device=device, device_type=device.split(":")[0], dtype=origin["dtype"])
    text = f"`{name}` is the result of {what} (autograd op `{origin['op']}`), so it is not a leaf"
    leaf = origin["leaf"]
    if leaf is None:
        return text + "."
    if leaf["name"]:
        who = f"`{leaf['name']}`"
    elif origin["kind"] == "view":
        who = "the leaf it is a view of"  # usually a tensor the caller still holds
    else:
        who = "an unnamed temporary leaf that nothing in your code holds"
    return (f"{text}: backward() puts the gradient into {who} (shape {tuple(leaf['shape'])}, "
            f"{leaf['dtype']}, {leaf['device']}), and `{name}.grad` stays None.")


@renders("non_leaf", "not_a_leaf")
def _not_a_leaf(m: Members) -> Words:
    a = m.first
    fix, remedy = fixes.leaf_fix(m.name, a["origin"], a)
    return Words(f"{m.who} is not a leaf tensor{a['where']}: its .grad will stay None and it will never train.",
                 origin_cause(m.name, a["origin"]), fix, remedy)

"""Replaced parameters: which tensors an optimizer holds are what is left of a changed model.

A layer replaced or resized after the optimizer was built (``model.fc = nn.Linear(...)``,
nanoGPT's ``crop_block_size``, an embedding resized with a new ``nn.Parameter``, a whole network
swapped, ``model.to()`` under ``torch.__future__.set_overwrite_module_params_on_conversion``)
leaves the optimizer stepping the old tensors while the model's new ones are in no optimizer.
:func:`pair` matches each old tensor with the current parameter that replaced it:

1. by name, when leafwatch saw the model before the change (``previous_names``);
2. by position: an optimizer built from ``model.parameters()`` (or from groups that keep the
   model's order) holds tensors in the model's parameter order, so an old tensor sitting where a
   current parameter that is in no optimizer would sit is its predecessor;
3. by shape, for what is left.

An old tensor that pairs with nothing is "unpaired": it is reported in one finding per optimizer,
an error while some live parameter is in no optimizer, information ("harmless, costs memory")
once every live parameter is stepped (after the fix's ``add_param_group``, or a layer removed).
Pure functions over an :class:`~leafwatch.observe.inventory.Inventory`; nothing is kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .inventory import Inventory
from .names import ancestors


@dataclasses.dataclass
class Pair:
    """An old tensor an optimizer holds, and the current parameter that replaced it."""

    optimizer: int
    old: torch.Tensor
    name: str
    new: torch.Tensor
    how: str  # "name", "position" or "shape"


@dataclasses.dataclass
class Replaced:
    """What :func:`pair` found: the pairs, and per optimizer the old tensors left unpaired."""

    pairs: list[Pair] = dataclasses.field(default_factory=list)
    unpaired: dict[int, list[tuple[torch.Tensor, str | None]]] = dataclasses.field(default_factory=dict)
    #: Trainable parameters of the model left in no optimizer once the pairs are made (none: every
    #: live parameter is stepped, and the unpaired old tensors only cost memory).
    unstepped: int = 0
    #: Each trainable tensor of a module replaced by one with new tensors that pair with nothing (see
    #: :func:`_swapped`) -> the module's name and the optimizer that holds the old tensors.
    swapped: dict[int, tuple[str, int]] = dataclasses.field(default_factory=dict)

    def old_ids(self) -> set[int]:
        """The ids of every old tensor (paired or not): none of them gets a gradient."""
        return {id(p.old) for p in self.pairs} | {id(t) for ts in self.unpaired.values() for t, _ in ts}

    def names(self) -> dict[int, str]:
        """Old tensor id -> the current name it is reported under (paired ones only)."""
        return {id(p.old): p.name for p in self.pairs}


def pair(inv: Inventory, previous_names: Mapping[int, str] | None = None) -> Replaced:
    """Pair the optimizers' old tensors with the model's parameters that replaced them.

    An old tensor is a tensor an optimizer holds that the model does not register and that is
    either known by an old name (``previous_names``) or an ``nn.Parameter`` without a gradient
    (modules make Parameters; an extra Parameter that gets gradients, a learnable loss weight,
    is no old tensor). Plain tensors are the user's own and are never paired.

    Args:
        inv: The current inventory (with optimizers).
        previous_names: Names the tensors had when leafwatch last read the model.

    Returns:
        The pairs and the unpaired old tensors.
    """
    out = Replaced()
    if inv.model is None or not inv.optimizers:
        return out
    old = _old_tensors(inv, previous_names or {})
    # Current trainable parameters in no optimizer: the candidates to have replaced something.
    free = {k for k, t in inv.tensors.items() if k not in inv.in_optimizer and t.requires_grad}
    if old:
        by_name = {inv.params[k].name: k for k in free}
        rest = _pair_by(inv, old, free, out, "name", lambda i, j, p, name: by_name.get(name) if name is not None else None)
        rest = _pair_by(inv, rest, free, out, "position", _by_position(inv))
        _pair_by_shape(inv, rest, free, out)
        _swapped(inv, out, free)
    out.unstepped = len(free)
    return out


def _swapped(inv: Inventory, out: Replaced, free: set[int]) -> None:
    """The outermost module no optimizer holds a tensor of, holding both tensors that replaced old ones
    and new tensors nothing pairs with (``to_hetero``'s copies per edge type, a bigger head): all of
    its tensors are one replacement."""
    paired = {id(p.new): p.optimizer for p in out.pairs}
    held: dict[str, int | None] = {}
    for k in free:
        for name in ("", *reversed(ancestors(inv.params[k].name))):
            if k not in out.swapped and name not in held and name in inv.modules:
                ids = {id(p) for p in inv.modules[name].parameters()}
                held[name] = None if ids & inv.in_optimizer else next((paired[i] for i in ids if i in paired), None)
                if held[name] is not None:
                    out.swapped.update((i, (name, held[name])) for i in ids if inv.tensors[i].requires_grad)


_Old = tuple[int, int, torch.Tensor, "str | None"]  # (optimizer, index in it, tensor, old name)


def _old_tensors(inv: Inventory, previous_names: Mapping[int, str]) -> list[_Old]:
    """The tensors the optimizers hold that the model does not register and that look like its old ones."""
    old: list[_Old] = []
    for i, params in enumerate(inv.optimizer_params):
        for j, p in enumerate(params):
            if id(p) in inv.tensors:
                continue
            old_name = previous_names.get(id(p))
            if old_name is None and not (isinstance(p, nn.Parameter) and p.grad is None and p.requires_grad):
                continue
            old.append((i, j, p, old_name))
    return old


def _pair_by(inv: Inventory, old: list[_Old], free: set[int], out: Replaced, how: str,
             find: Callable[[int, int, torch.Tensor, str | None], int | None]) -> list[_Old]:
    """1. By the name it had, 2. by position: each old tensor paired with the free parameter ``find`` gives
    (``how``: which); returns the old tensors left."""
    rest = []
    for entry in old:
        k = find(*entry)
        if k is not None and k in free:
            free.discard(k)
            out.pairs.append(Pair(entry[0], entry[2], inv.params[k].name, inv.tensors[k], how))
        else:
            rest.append(entry)
    return rest


def _by_position(inv: Inventory) -> Callable[[int, int, torch.Tensor, str | None], int | None]:
    """The parameter at an old tensor's position, anchored on the nearest tensor before it that the model still
    holds (an uninitialized old tensor has no dimensions to compare: its place alone pairs it)."""
    model_order = list(inv.tensors)
    position = {k: i for i, k in enumerate(model_order)}

    def find(i: int, j: int, p: torch.Tensor, _: str | None) -> int | None:
        k = _at_position(inv.optimizer_params[i], j, inv, model_order, position)
        new = inv.tensors[k] if k is not None else None
        return k if new is not None and not is_lazy(new) and (is_lazy(p) or new.dim() == p.dim()) else None
    return find


def _pair_by_shape(inv: Inventory, old: list[_Old], free: set[int], out: Replaced) -> None:
    """3. By shape, for what is left; the rest is unpaired (when it is known to be old)."""
    # Before any backward, a Parameter without a gradient may yet get one: it is unpaired only when
    # the model's parameters have gradients (or it had a name in the model).
    grads_ready = any(t.grad is not None for t in inv.tensors.values())
    for i, _, p, old_name in old:
        k = None if is_lazy(p) else next((k for k in inv.tensors if k in free and not is_lazy(inv.tensors[k])
                                          and inv.tensors[k].shape == p.shape), None)
        if k is not None:
            free.discard(k)
            out.pairs.append(Pair(i, p, inv.params[k].name, inv.tensors[k], "shape"))
        elif old_name is not None or grads_ready:
            out.unpaired.setdefault(i, []).append((p, old_name))


def _at_position(params: list[torch.Tensor], j: int, inv: Inventory, model_order: list[int],
                 position: Mapping[int, int]) -> int | None:
    """The id of the model parameter that sits where ``params[j]`` sits in the model's order."""
    for a in range(j - 1, -1, -1):
        k = position.get(id(params[a]))
        if k is not None:
            m = k + (j - a)
            return model_order[m] if m < len(model_order) else None
    for b in range(j + 1, len(params)):
        k = position.get(id(params[b]))
        if k is not None:
            m = k - (b - j)
            return model_order[m] if 0 <= m else None
    return model_order[j] if j < len(model_order) else None

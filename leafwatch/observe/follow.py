"""Following a tensor without touching it: through the module or optimizer that holds it.

``torch.utils.swap_tensors`` refuses a tensor that has a weak reference, and it is how torch
changes a parameter in place of itself: ``module.to()``/``.half()``/``.float()`` with
``torch.__future__.set_swap_module_params_on_conversion(True)``, ``load_state_dict(...,
assign=True)`` with it, torchtune's ``FrozenNF4Linear`` swapping its weight for an NF4 tensor. A
swap keeps the tensor's Python object (its ``id``) and replaces what is inside it. So leafwatch
holds no weak reference to a tensor a module or an optimizer holds: it holds that module or
optimizer weakly (they are never swapped), the tensor's place there and its ``id``, and reads the
place again when asked. :class:`Held` is called like a weak reference: the tensor while it stays
in its place (swapped or not), else None. Only a tensor nothing leafwatch reads holds (a watched
tensor, a tensor of the script's module level, a leaf of the loss's graph outside the model) is
held by a weak reference (:func:`weakly`), and cannot be swapped while leafwatch follows it.

A hook leafwatch puts on a tensor stays with what a swap took out (torch keeps the tensor's hook
dict and wires it to the old contents): :func:`impl` tells a swapped tensor (its ``_cdata`` changed),
and :func:`release_hook_dict` takes away a hook dict leafwatch emptied, or wires one with the user's
hooks in it to the swapped tensor's new contents, so that a hook registered after the swap fires.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

#: What follows a tensor: called, it gives the tensor, or None once it is gone from where it was.
Ref = Callable[[], "torch.Tensor | None"]
#: The two hook dicts torch keeps on a tensor (``register_hook``, ``register_post_accumulate_grad_hook``).
BACKWARD_HOOKS, POST_ACCUMULATE_HOOKS = "_backward_hooks", "_post_accumulate_grad_hooks"


class Held:
    """A tensor followed through its holder: called, the tensor at the holder's place while it is the
    same object (``id``) as when followed, else None; the holder is held weakly. Made by
    :func:`in_module`, :func:`registered` and :func:`in_optimizer`.

    Example::

        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> weight = in_module(layer, layer.weight)
        >>> weight() is layer.weight
        True
        >>> layer.weight = nn.Parameter(torch.zeros(2, 2))  # replaced: not the tensor followed
        >>> weight() is None
        True
    """

    __slots__ = ("_holder", "_id")

    def __init__(self, holder: Any, tensor: torch.Tensor) -> None:
        self._holder = weakref.ref(holder)
        self._id = id(tensor)

    def __call__(self) -> torch.Tensor | None:
        raise NotImplementedError


class _InModule(Held):
    """In a module's ``_parameters`` or ``_buffers`` dict, by name."""

    __slots__ = ("_table", "_name")

    def __init__(self, module: nn.Module, table: str, name: str, tensor: torch.Tensor) -> None:
        super().__init__(module, tensor)
        self._table, self._name = table, name

    def __call__(self) -> torch.Tensor | None:
        module = self._holder()
        if module is None:
            return None
        found = module.__dict__.get(self._table, _NOTHING).get(self._name)
        return found if id(found) == self._id else None

    def __repr__(self) -> str:
        return f"Held(module.{self._table}[{self._name!r}])"


class _InOptimizer(Held):
    """In an optimizer's param groups, by group and position."""

    __slots__ = ("_group", "_index")

    def __init__(self, optimizer: Any, group: int, index: int, tensor: torch.Tensor) -> None:
        super().__init__(optimizer, tensor)
        self._group, self._index = group, index

    def __call__(self) -> torch.Tensor | None:
        optimizer = self._holder()
        if optimizer is None:
            return None
        try:
            found = optimizer.param_groups[self._group]["params"][self._index]
        except (LookupError, TypeError, AttributeError):  # the group or the place is gone
            return None
        return found if id(found) == self._id else None

    def __repr__(self) -> str:
        return f"Held(optimizer.param_groups[{self._group}]['params'][{self._index}])"


_NOTHING: dict[str, Any] = {}


def in_module(module: nn.Module, tensor: torch.Tensor, name: str | None = None) -> Held | None:
    """``tensor`` followed as a parameter or buffer of ``module`` itself (``name``: its attribute,
    when known), or None when ``module`` does not hold it so."""
    for table in ("_parameters", "_buffers"):
        held = vars(module).get(table) or {}
        key = name if name is not None else next((k for k, value in held.items() if value is tensor), None)
        if key is not None and held.get(key) is tensor:
            return _held(_InModule, module, table, key, tensor)
    return None


def registered(module: nn.Module, name: str, tensor: torch.Tensor) -> Held | None:
    """``tensor`` followed as the parameter ``name`` of ``module``, as it is being registered there (torch
    calls its registration hooks before the tensor is in ``module._parameters``)."""
    return _held(_InModule, module, "_parameters", name, tensor)


def in_optimizer(optimizer: Any, tensor: torch.Tensor) -> Held | None:
    """``tensor`` followed in ``optimizer``'s param groups, or None when it holds no such tensor."""
    for g, group in enumerate(getattr(optimizer, "param_groups", ())):
        for i, p in enumerate(group.get("params", ())):
            if p is tensor:
                return _held(_InOptimizer, optimizer, g, i, tensor)
    return None


def _held(kind: type[Held], holder: Any, *place: Any) -> Held | None:
    try:
        return kind(holder, *place)
    except TypeError:  # a holder that takes no weak reference
        return None


def weakly(tensor: torch.Tensor) -> Ref:
    """A weak reference to ``tensor``: for a tensor no module or optimizer leafwatch reads holds."""
    return weakref.ref(tensor)


def follow(tensor: torch.Tensor, modules: Iterable[nn.Module] = (), optimizers: Iterable[Any] = ()) -> Ref:
    """``tensor`` followed through the first of ``modules`` (their own parameters and buffers) or
    ``optimizers`` that holds it; held weakly when none does."""
    found = itertools.chain((in_module(m, tensor) for m in modules), (in_optimizer(o, tensor) for o in optimizers))
    return next((held for held in found if held is not None), None) or weakly(tensor)


def impl(tensor: torch.Tensor) -> int:
    """What a swap changes and nothing else does: the address of the tensor's C++ contents (``_cdata``)."""
    try:
        return int(tensor._cdata)
    except Exception:  # an exotic tensor subclass
        return 0


def makes_hook_dict(tensor: torch.Tensor, attribute: str) -> bool:
    """Whether a hook leafwatch puts on ``tensor`` now makes its hook dict ``attribute`` (none is there
    yet): only such a dict is leafwatch's to take away or to wire again (:func:`release_hook_dict`)."""
    return getattr(tensor, attribute, None) is None


def release_hook_dict(tensor: torch.Tensor | None, attribute: str, swapped: bool = False, made: bool = True) -> None:
    """After leafwatch removed its hook from ``tensor``'s hook dict ``attribute``, where leafwatch ``made``
    that dict (:func:`makes_hook_dict`; no hook of the user's was in it while leafwatch's fired): left
    empty, it is taken away, as if leafwatch had never hooked the tensor; where the tensor was ``swapped``
    since, it is wired to the new contents. torch leaves the dict with the tensor and its hooks with the
    old contents: without leafwatch the dict would not exist at the swap, and a hook the user registers
    after it would make a new one that fires. A dict the user made is left as torch leaves it (its hooks,
    and those added to it after a swap, stay with the old contents, as they do without leafwatch)."""
    if tensor is None or not made or not tensor.is_leaf:
        return
    with contextlib.suppress(Exception):
        hooks = getattr(tensor, attribute, None)
        if hooks is not None and (swapped or not hooks):
            setattr(tensor, attribute, hooks or None)  # (setting the dict wires it to the contents now)

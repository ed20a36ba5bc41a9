"""A library's functional copy of a module that ran in the module's place, on weights copied from it.

higher's ``innerloop_ctx`` (``monkeypatch``) makes a stateless copy of a module, ``fnet``, whose forward
runs on fast weights: with ``copy_initial_weights=True``, higher's default, the first fast weights are new
leaves holding the values of the module's parameters (``p.clone().detach().requires_grad_()``), so backward
stops at those copies and the module's own parameters get no gradient (MAML's meta-gradient is lost). What
is observed, not guessed: a module of an installed package's class (:func:`~leafwatch.observe.inventory.
functional_copy`) in the user's frames, whose weights come from leaves that are not the parameters, hold
exactly their values, and got the gradients. Read only when a parameter misses its gradient and the module
hooks, armed for the whole step, saw none of the model run (a cold path: the user's frames are read then,
never per step; on Python < 3.13 what they hold stays alive until the next read).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
from torch import nn

from . import frames, graph, inventory
from .discovery import user_scope

#: Leaves looked at per copy (each compared only with the missing parameters of its shape).
MAX_LEAVES = 1024


@dataclasses.dataclass(frozen=True)
class Copy:
    """The copy that ran in a module's place: the user's variable for it (``fnet``), its class and the
    library that made it."""

    variable: str
    cls: str
    library: str


def finder() -> Callable[[torch.Tensor], Copy | None]:
    """A look for the copy that ran in place of a parameter's module, for one check: the user's frames are
    read once, at the first parameter asked about."""
    copies = functools.cache(_copies_in_frames)

    def look(p: torch.Tensor) -> Copy | None:
        for variable, module, leaves in copies():
            if any(_copy_of(leaf, p) for leaf in leaves):
                return Copy(variable, type(module).__name__, frames.library_class(type(module)) or "")
        return None
    return look


def _copies_in_frames() -> list[tuple[str, nn.Module, list[torch.Tensor]]]:
    """The functional copies the user's variables hold, each with the leaves its weights come from."""
    out = []
    for variable, value in user_scope().items():
        if isinstance(value, nn.Module) and inventory.functional_copy(value):
            out.append((variable, value, _leaves(value)))
    return out


def _leaves(module: nn.Module) -> list[torch.Tensor]:
    """The leaf tensors that require grad and the copy's weights come from (the weights themselves when leaves)."""
    leaves: dict[int, torch.Tensor] = {}
    for m in module.modules():
        for t in m._parameters.values():
            if not isinstance(t, torch.Tensor) or not t.requires_grad:
                continue
            for leaf in ([t] if t.grad_fn is None else graph.leaves_of(t.grad_fn, limit=2_000)[0]):
                if leaf.requires_grad and len(leaves) < MAX_LEAVES:
                    leaves.setdefault(id(leaf), leaf)
    return list(leaves.values())


def _copy_of(leaf: torch.Tensor, p: torch.Tensor) -> bool:
    """Whether ``leaf`` is a detached copy of ``p`` that got the gradient: another tensor, of its values."""
    if leaf is p or leaf.grad is None or leaf.shape != p.shape or leaf.dtype != p.dtype or leaf.device != p.device:
        return False
    return bool(torch.equal(leaf.detach(), p.detach()))


"""The modules a step used without torch's module hooks seeing them run, and how, said only where it was seen.

``leafwatch run``'s global forward pre-hook watches the first steps; a module found in the user's frames at an
optimizer step that it never saw run is one of these (:class:`Unhooked`):

- its own tensors got gradients (``called_directly``): it was used without a call the hooks see. How is said
  only where it shows: a ``x.forward(...)`` call on it in the source of a frame on the stack (:func:`forward_calls`,
  its receiver read in that frame, never run), or its class's own ``__call__`` defined outside torch
  (:func:`own_call`: gpytorch's ``Module.__call__`` runs ``forward`` without torch's hooks); else its tensors were
  read directly (``emb.weight[idx]``), or it was called where no frame shows it;
- it owns tensors with no gradient (``not_run``): it never ran in that step.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import weakref
from types import FrameType
from typing import Any

from torch import nn

from . import frames
from .source import Source


class Unhooked:
    """The modules found in the frames that the hook, watching the step, never saw run (their ids)."""

    def __init__(self) -> None:
        #: Modules owning, themselves, a tensor stepped with a gradient: used without a call the hooks see.
        self.called_directly: set[int] = set()
        #: Module id -> ```x.forward(...)` at file:line``: a call on it seen in a frame's source at the step.
        self.forward_calls: dict[int, str] = {}
        #: Module id -> the class's own ``__call__`` it runs through (:func:`own_call`).
        self.own_calls: dict[int, str] = {}
        #: Module id (of :attr:`called_directly`) -> the module found in the frames that holds it, and its path there.
        self.paths: dict[int, tuple[weakref.ReferenceType, str]] = {}
        #: Modules owning tensors with no gradient that never ran while the hook watched (id -> weak reference).
        self.not_run: dict[int, weakref.ReferenceType] = {}

    def note(self, module: nn.Module, used: set[int], seen: dict[int, Any], stack: list[Any]) -> None:
        """``module``, found in the frames ``stack``, and its submodules not in ``seen`` (never seen running):
        ``used`` (the ids of those owning a tensor with a gradient) were used without a call the hooks see, the
        others that own tensors never ran."""
        self.called_directly |= used
        with contextlib.suppress(TypeError):  # a module class that refuses weak references
            top = weakref.ref(module)
            self.paths.update((id(m), (top, path)) for path, m in module.named_modules() if id(m) in used)
            for m in module.modules():
                if id(m) not in seen and id(m) not in used and next(m.parameters(recurse=False), None) is not None:
                    key = id(m)
                    self.not_run[key] = weakref.ref(m, lambda _, key=key: self.not_run.pop(key, None))
        if used:
            self.forward_calls.update((k, v) for k, v in forward_calls(stack).items() if k in used)
            self.own_calls.update((id(m), call) for m in module.modules() if id(m) in used
                                  and (call := own_call(m)) is not None)

    def ran(self, module_id: int) -> None:
        """A module found in the frames runs through ``module(x)`` after all."""
        self.called_directly.discard(module_id)
        self.not_run.pop(module_id, None)


def own_call(module: nn.Module) -> str | None:
    """``gpytorch.module.Module.__call__`` when ``module``'s class runs through a ``__call__`` of its own, defined
    outside torch (gpytorch's calls ``self.forward`` without torch's module hooks); None for torch's."""
    for klass in type(module).__mro__:
        if "__call__" in vars(klass):
            return None if klass.__module__.split(".")[0] == "torch" else f"{klass.__module__}.{klass.__qualname__}.__call__"
    return None


def forward_calls(stack: list[Any]) -> dict[int, str]:
    """Object id -> ``file:line`` of each ``x.forward(...)`` call in the source of the frames ``stack`` whose
    receiver ``x`` resolves, in its frame, to that object (names, attributes and constant indexes read without
    running code of the user's: never a property, a call or an arbitrary expression)."""
    found: dict[int, str] = {}
    source = Source()
    for frame in stack:
        node = source.scope(frame)
        for call in ast.walk(node) if node is not None else ():
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "forward":
                target = resolve(call.func.value, frame)
                if target is not UNRESOLVED:
                    found.setdefault(id(target), f"`{ast.unparse(call.func)}(...)` at "
                                                 f"{os.path.basename(frame.f_code.co_filename)}:{call.lineno}")
    return found


#: What :func:`resolve` gives for an expression it does not read.
UNRESOLVED = object()
#: The containers :func:`resolve` indexes with a constant.
_INDEXED = (list, tuple, dict, nn.ModuleList, nn.ParameterList, nn.Sequential, nn.ModuleDict, nn.ParameterDict)


def resolve(expr: ast.expr, frame: FrameType, depth: int = 0) -> Any:
    """The object a name, an attribute chain or a constant index of the user's line names in ``frame`` (``w``,
    ``self.w``, ``model.fc.weight``, ``params[0]``, a method: the function its class defines), read without
    running code of the user's (``vars()``, a module's registered tensors and children, a plain container);
    else :data:`UNRESOLVED`."""
    if depth > 8:
        return UNRESOLVED
    if isinstance(expr, ast.Name):
        scope = frame.f_locals if expr.id in frame.f_locals else frame.f_globals
        value = scope.get(expr.id, UNRESOLVED)
        return value if value is UNRESOLVED or frames.readable(value) else UNRESOLVED
    base = resolve(expr.value, frame, depth + 1) if isinstance(expr, (ast.Attribute, ast.Subscript)) else UNRESOLVED
    if base is UNRESOLVED or not frames.readable(base):
        return UNRESOLVED
    if isinstance(expr, ast.Attribute):
        if isinstance(base, nn.Module):
            for registered in (base._parameters, base._buffers, base._modules):
                if expr.attr in registered:
                    return registered[expr.attr]
        found = getattr(base, "__dict__", {}).get(expr.attr, UNRESOLVED)
        if found is UNRESOLVED and not inspect.ismodule(base):  # a method: the function its class defines
            found = inspect.getattr_static(type(base), expr.attr, UNRESOLVED)
            found = found if inspect.isfunction(found) else UNRESOLVED
        return found
    if isinstance(expr.slice, ast.Constant) and isinstance(base, _INDEXED):  # type: ignore[union-attr]
        try:
            return base[expr.slice.value]  # type: ignore[union-attr]
        except (IndexError, KeyError, TypeError):
            return UNRESOLVED
    return UNRESOLVED

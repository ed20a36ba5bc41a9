"""``watch()``: flag a tensor you expect to train; leafwatch holds it weakly and hooks it.

A watched leaf gets a post-accumulate-grad hook that counts the gradients it receives; a
watched non-leaf is reported at once (a warning at the caller's line) and gets a tensor hook
that counts the gradients flowing through it. Every ``audit()`` and ``Monitor`` check includes
the watched tensors that are still alive.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import threading
import warnings
import weakref
from typing import Any

import torch

from . import graph
from .findings import LeafwatchInternalWarning, LeafwatchWarning


@dataclasses.dataclass(eq=False)
class WatchEntry:
    """What leafwatch knows of one watched tensor; the tensor itself only through ``ref``."""

    name: str
    ref: weakref.ReferenceType
    expect_leaf: bool
    expect_grad: bool
    location: str
    is_leaf: bool
    origin: graph.Origin | None = None
    grads_seen: int = 0
    handle: Any = None

    def tensor(self) -> torch.Tensor | None:
        return self.ref()


_PACKAGE_DIR = os.path.dirname(__file__) + os.sep
_lock = threading.Lock()
_entries: dict[str, WatchEntry] = {}
# Weak-reference callbacks run wherever the garbage collector runs, also inside ``with _lock``
# in this very thread: they only queue the dead entry (deque.append is atomic), and the next
# locked call drops it.
_dead: collections.deque[tuple[str, weakref.ReferenceType]] = collections.deque()


def _purge_dead() -> None:
    """Drop the entries whose tensor was freed; call with ``_lock`` held."""
    while _dead:
        name, ref = _dead.popleft()
        entry = _entries.get(name)
        if entry is not None and entry.ref is ref:
            del _entries[name]


def _caller_location() -> str:
    """``file:line`` of the first frame outside leafwatch (``Monitor(tensors=...)`` watches too)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _stacklevel_outside() -> int:
    """The warnings stacklevel that points at the first frame outside leafwatch."""
    level = 1
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def watch(
    tensor: torch.Tensor,
    name: str | None = None,
    *,
    expect_leaf: bool = True,
    expect_grad: bool = True,
) -> torch.Tensor:
    """Flag a tensor that should train; returns the same tensor, so it can wrap an expression.

    Args:
        tensor: The tensor to watch. Held weakly: watching never keeps it alive.
        name: The name findings use; defaults to the caller's ``file:line``.
        expect_leaf: Report it as ``non_leaf`` when it is not a leaf (at once and at every check).
        expect_grad: Report ``missing_grad`` when no gradient reached it by a check.

    Returns:
        ``tensor`` itself.

    Raises:
        TypeError: ``tensor`` is not a tensor, or ``name`` not a string.
        ValueError: ``name`` already names another live watched tensor. Without ``name``, the
            tensor watched at the same line is another step's: the new tensor replaces it.

    Example::

        >>> import torch, leafwatch
        >>> w = leafwatch.watch(torch.zeros(3, requires_grad=True), name="w")
        >>> leafwatch.unwatch(w)
        True
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"`tensor` must be a torch.Tensor, got {type(tensor).__name__}: {tensor!r:.80}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"`name` must be a str or None, got {type(name).__name__}: {name!r:.80}")
    for arg, value in (("expect_leaf", expect_leaf), ("expect_grad", expect_grad)):
        if not isinstance(value, bool):
            raise TypeError(f"`{arg}` must be a bool, got {type(value).__name__}: {value!r:.80}")
    location = _caller_location()
    named_by_caller = name is not None
    name = name if name is not None else f"tensor@{location}"
    if not name:
        raise ValueError("`name` must not be empty, got ''")
    with _lock:
        _purge_dead()
        existing = _entries.get(name)
        if existing is not None:
            live = existing.tensor()
            if live is tensor:
                existing.expect_leaf, existing.expect_grad = expect_leaf, expect_grad
                return tensor
            if live is not None and named_by_caller:
                raise ValueError(
                    f"`name` {name!r} already names another watched tensor (watched at {existing.location}); "
                    "pick a unique name or unwatch() the other one first"
                )
            _remove(existing)
        entry = WatchEntry(
            name=name,
            ref=weakref.ref(tensor, _make_finalizer(name)),
            expect_leaf=expect_leaf,
            expect_grad=expect_grad,
            location=location,
            is_leaf=tensor.is_leaf,
            origin=graph.origin(tensor) if not tensor.is_leaf else None,
        )
        try:
            entry.handle = _install_hook(tensor, entry)
        except Exception as error:  # an exotic tensor subclass: watch without counting gradients
            hook_error = error
            if not entry.is_leaf:
                entry.expect_grad = False  # gradient flow through a non-leaf is known only from the hook
        else:
            hook_error = None
        _entries[name] = entry
    if hook_error is not None:
        warnings.warn(
            f"leafwatch: internal failure in watch({name!r}): cannot hook {type(tensor).__name__} "
            f"({type(hook_error).__name__}: {hook_error}); "
            + ("leafwatch checks only whether its .grad is set." if entry.is_leaf
               else "leafwatch cannot tell whether gradients flow through it."),
            LeafwatchInternalWarning,
            stacklevel=_stacklevel_outside(),
        )
    if expect_leaf and not tensor.is_leaf:
        cause = entry.origin.cause(name) if entry.origin else f"`{name}` is not a leaf."
        warnings.warn(
            f"leafwatch: watched tensor {name!r} is not a leaf and will never get a .grad. {cause} "
            f"Fix: {graph.fix_for_non_leaf(name, entry.origin)}",
            LeafwatchWarning,
            stacklevel=_stacklevel_outside(),
        )
    return tensor


def _make_finalizer(name: str):
    def finalize(ref: weakref.ReferenceType) -> None:
        _dead.append((name, ref))  # never take _lock here: the collector may run while it is held

    return finalize


def _install_hook(tensor: torch.Tensor, entry: WatchEntry) -> Any:
    if not tensor.requires_grad:
        return None
    entry_ref = weakref.ref(entry)

    def count(*_: Any) -> None:
        e = entry_ref()
        if e is not None:
            e.grads_seen += 1

    if tensor.is_leaf:
        return tensor.register_post_accumulate_grad_hook(count)
    return tensor.register_hook(count)


def _remove(entry: WatchEntry) -> None:
    if entry.handle is not None:
        try:
            entry.handle.remove()
        except Exception:
            pass
        entry.handle = None
    _entries.pop(entry.name, None)


def unwatch(tensor_or_name: torch.Tensor | str) -> bool:
    """Stop watching a tensor (by the tensor or its name); True when something was removed."""
    with _lock:
        _purge_dead()
        if isinstance(tensor_or_name, str):
            entry = _entries.get(tensor_or_name)
            if entry is None:
                return False
            _remove(entry)
            return True
        if not isinstance(tensor_or_name, torch.Tensor):
            raise TypeError(
                f"`tensor_or_name` must be a torch.Tensor or a str, got {type(tensor_or_name).__name__}: "
                f"{tensor_or_name!r:.80}"
            )
        removed = False
        for entry in list(_entries.values()):
            if entry.tensor() is tensor_or_name:
                _remove(entry)
                removed = True
        return removed


def unwatch_all() -> None:
    """Stop watching every tensor."""
    with _lock:
        _purge_dead()
        for entry in list(_entries.values()):
            _remove(entry)


def watched() -> dict[str, torch.Tensor]:
    """The watched tensors still alive, by name (a new dict of strong references: don't keep it)."""
    with _lock:
        _purge_dead()
        out = {}
        for name, entry in _entries.items():
            t = entry.tensor()
            if t is not None:
                out[name] = t
        return out


def any_watched() -> bool:
    """Whether anything is watched (dead entries included): a lock-free test for the hot path."""
    return bool(_entries)


def entries() -> list[WatchEntry]:
    with _lock:
        _purge_dead()
        return [e for e in _entries.values() if e.tensor() is not None]

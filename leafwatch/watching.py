"""``watch()``: flag a tensor you expect to train; leafwatch holds it weakly and hooks it.

A watched leaf gets a post-accumulate-grad hook that counts the gradients it receives; a
watched non-leaf is reported at once (a warning at the caller's line) and gets a tensor hook
that counts the gradients flowing through it. Every ``audit()`` and ``Monitor`` check includes
the watched tensors that are still alive.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import warnings
import weakref
from typing import Any

import torch

from .detectors import crashes as _crashes
from .detectors.leaves import non_leaf
from .observe import graph
from .observe.crashes import Context
from .observe import excepthook
from .sinks import notes
from .observe.frames import caller_location, stacklevel_outside
from .options import LeafwatchInternalWarning, LeafwatchWarning, validate_bool
from .report.format import warning_text


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


def _make_hook(tensor: torch.Tensor, entry: WatchEntry) -> Any:
    if not tensor.requires_grad:
        return None
    entry_ref = weakref.ref(entry)

    def count(grad: torch.Tensor | None) -> None:
        e = entry_ref()
        if e is not None and grad is not None:
            e.grads_seen += 1

    if tensor.is_leaf:
        # torch calls this hook when backward passed None too (a custom autograd.Function that
        # returns None for this input): only a gradient that exists counts.
        return tensor.register_post_accumulate_grad_hook(lambda t: count(t.grad))
    return tensor.register_hook(count)


class WatchSet:
    """Watched tensors by name, held weakly, each with a hook counting its gradients.

    ``leafwatch.watch()`` adds to the process-wide :data:`DEFAULT` set that every check consults;
    ``Monitor(tensors=...)`` keeps a set of its own that only that Monitor checks.
    """

    def __init__(self, *, explains_crashes: bool = False) -> None:
        self._lock = threading.Lock()
        #: While it watches something, an uncaught exception torch raises for a leaf mistake gets
        #: leafwatch's note (the excepthook's subscription; the default set's only).
        self._explains_crashes = explains_crashes
        self._crash_door: Any = None
        #: The entries by name (read-only outside this class; dead ones included until the next
        #: locked call): its truth is the hot path's lock-free "is anything watched?".
        self.by_name: dict[str, WatchEntry] = {}
        # Weak-reference callbacks run wherever the garbage collector runs, also inside
        # ``with self._lock`` in this very thread: they only queue the dead entry
        # (deque.append is atomic), and the next locked call drops it.
        self._dead: collections.deque[tuple[str, weakref.ReferenceType]] = collections.deque()

    def __bool__(self) -> bool:
        """Whether anything is watched (dead entries included): lock-free."""
        return bool(self.by_name)

    def _purge_dead(self) -> None:
        """Drop the entries whose tensor was freed; call with the lock held."""
        while self._dead:
            name, ref = self._dead.popleft()
            entry = self.by_name.get(name)
            if entry is not None and entry.ref is ref:
                del self.by_name[name]
        self._follow_crashes()

    def _follow_crashes(self) -> None:
        """Hold the excepthook's door while something is watched, and only then; call with the lock held."""
        if not self._explains_crashes or bool(self.by_name) == (self._crash_door is not None):
            return
        if self.by_name:
            self._crash_door = excepthook.HOOK.subscribe(Context, _explain_crash)
        else:
            door, self._crash_door = self._crash_door, None
            door.remove()

    def _finalizer(self, name: str) -> Any:
        dead = self._dead
        return lambda ref: dead.append((name, ref))  # never take the lock here: the collector may run while it is held

    def add(self, tensor: torch.Tensor, name: str, *, named_by_caller: bool, expect_leaf: bool,
            expect_grad: bool, location: str) -> tuple[WatchEntry, BaseException | None]:
        """Watch ``tensor`` as ``name``; the entry and the error of hooking it, if any.

        Raises:
            ValueError: ``name`` (given by the caller) names another live watched tensor.
        """
        with self._lock:
            self._purge_dead()
            existing = self.by_name.get(name)
            if existing is not None:
                live = existing.tensor()
                if live is tensor:
                    existing.expect_leaf, existing.expect_grad = expect_leaf, expect_grad
                    return existing, None
                if live is not None and named_by_caller:
                    raise ValueError(f"`name` {name!r} already names another watched tensor (watched at "
                                     f"{existing.location}); pick a unique name or unwatch() the other one first")
                self._remove(existing)
            entry = WatchEntry(name=name, ref=weakref.ref(tensor, self._finalizer(name)), expect_leaf=expect_leaf,
                               expect_grad=expect_grad, location=location, is_leaf=tensor.is_leaf,
                               origin=graph.origin(tensor) if not tensor.is_leaf else None)
            hook_error: BaseException | None = None
            try:
                entry.handle = _make_hook(tensor, entry)
            except Exception as error:  # an exotic tensor subclass: watch without counting gradients
                hook_error = error
                if not entry.is_leaf:
                    entry.expect_grad = False  # gradient flow through a non-leaf is known only from the hook
            self.by_name[name] = entry
            self._follow_crashes()
        return entry, hook_error

    def _remove(self, entry: WatchEntry) -> None:
        if entry.handle is not None:
            with contextlib.suppress(Exception):
                entry.handle.remove()
            entry.handle = None
        self.by_name.pop(entry.name, None)
        self._follow_crashes()

    def remove(self, tensor_or_name: torch.Tensor | str) -> bool:
        """Stop watching a tensor (by the tensor or its name); True when something was removed."""
        with self._lock:
            self._purge_dead()
            if isinstance(tensor_or_name, str):
                entry = self.by_name.get(tensor_or_name)
                if entry is not None:
                    self._remove(entry)
                return entry is not None
            if not isinstance(tensor_or_name, torch.Tensor):
                raise TypeError(f"`tensor_or_name` must be a torch.Tensor or a str, got "
                                f"{type(tensor_or_name).__name__}: {tensor_or_name!r:.80}")
            removed = [e for e in self.by_name.values() if e.tensor() is tensor_or_name]
            for entry in removed:
                self._remove(entry)
            return bool(removed)

    def clear(self) -> None:
        """Stop watching every tensor of this set."""
        with self._lock:
            self._purge_dead()
            for entry in list(self.by_name.values()):
                self._remove(entry)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The watched tensors still alive, by name (a new dict of strong references: don't keep it)."""
        with self._lock:
            self._purge_dead()
            return {name: t for name, entry in self.by_name.items() if (t := entry.tensor()) is not None}

    def entries(self) -> list[WatchEntry]:
        with self._lock:
            self._purge_dead()
            return [e for e in self.by_name.values() if e.tensor() is not None]


def _explain_crash(error: BaseException, contexts: Any) -> list[str]:
    """The crash door while a tensor is watched: the note alone (an open Monitor's door, :meth:`leafwatch.Monitor.crashed`,
    keeps the findings in its history too)."""
    return notes.add(error, _crashes.explain(error, contexts))


#: The set ``leafwatch.watch()`` adds to; every ``audit()`` and Monitor check consults it.
DEFAULT = WatchSet(explains_crashes=True)


def watch(tensor: torch.Tensor, name: str | None = None, *, expect_leaf: bool = True,
          expect_grad: bool = True) -> torch.Tensor:
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
    validate_bool(expect_leaf, "expect_leaf")
    validate_bool(expect_grad, "expect_grad")
    return add_watch(DEFAULT, tensor, name, expect_leaf=expect_leaf, expect_grad=expect_grad)


def add_watch(into: WatchSet, tensor: torch.Tensor, name: str | None, *, expect_leaf: bool = True,
              expect_grad: bool = True) -> torch.Tensor:
    """Watch ``tensor`` in the set ``into``; warns at the caller's line as :func:`watch` does."""
    location = caller_location()
    named_by_caller = name is not None
    name = name if name is not None else f"tensor@{location}"
    if not name:
        raise ValueError("`name` must not be empty, got ''")
    entry, hook_error = into.add(tensor, name, named_by_caller=named_by_caller, expect_leaf=expect_leaf,
                                 expect_grad=expect_grad, location=location)
    if hook_error is not None:
        warnings.warn(
            f"leafwatch: internal failure in watch({name!r}): cannot hook {type(tensor).__name__} "
            f"({type(hook_error).__name__}: {hook_error}); "
            + ("leafwatch checks only whether its .grad is set." if entry.is_leaf
               else "leafwatch cannot tell whether gradients flow through it."),
            LeafwatchInternalWarning, stacklevel=stacklevel_outside(frameworks=False))
    if expect_leaf and not tensor.is_leaf:
        found = non_leaf(name, tensor, step=None, found=entry.origin, location=entry.location)
        warnings.warn(warning_text(found), LeafwatchWarning, stacklevel=stacklevel_outside(frameworks=False))
    return tensor


def unwatch(tensor_or_name: torch.Tensor | str) -> bool:
    """Stop watching a tensor (by the tensor or its name); True when something was removed."""
    return DEFAULT.remove(tensor_or_name)


def unwatch_all() -> None:
    """Stop watching every tensor watched with :func:`watch`."""
    DEFAULT.clear()


def watched() -> dict[str, torch.Tensor]:
    """The watched tensors still alive, by name (a new dict of strong references: don't keep it)."""
    return DEFAULT.tensors()


def any_watched() -> bool:
    """Whether anything is watched with :func:`watch` (dead entries included): lock-free."""
    return bool(DEFAULT)

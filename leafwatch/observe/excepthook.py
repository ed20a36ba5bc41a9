"""The door of an uncaught exception: ``sys.excepthook`` (and IPython's handler of a cell's exception),
chained while at least one open Monitor or watched tensor holds it.

Python's excepthook is process-wide, so leafwatch installs one hook for everyone and counts its users
(:data:`HOOK`): the first subscription installs it in front of the hook that was there, the last one
gone puts that hook back (unless something installed a hook of its own in front since, which calls
leafwatch's, as ``torch.distributed.init_process_group`` does: then leafwatch's stays where it is,
passing everything on, and a later first subscriber finds it there instead of chaining it twice). A subscriber hands two things: what it knows beyond the
traceback (a callable giving a :class:`~leafwatch.observe.crashes.Context`), and the door that explains
(``door(error, contexts)``: the crash detector, the history and the note sink of a Monitor, injected by the
front-end, as the Monitor injects ``request_check``; it returns the lines to print after the traceback where
the exception cannot carry a note, Python 3.10). Both are held weakly when they are bound methods, so that a
Monitor never closed is no subscriber once it is gone. Every subscriber's door is called, each with every
subscriber's context (the first one's note is the exception's: the others find it noted). Nothing runs unless
an exception reaches the hook, and the hook always calls the one before it with the same arguments, whatever
happens inside it.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Callable, Sequence
from types import MethodType, TracebackType
from typing import Any

from .crashes import Context

#: ``door(error, contexts) -> lines to print after the traceback``.
Door = Callable[[BaseException, Sequence[Context]], Sequence[str]]


class Subscription:
    """One subscriber's hold on the :class:`ExceptHook`; :meth:`remove` ends it (idempotent)."""

    __slots__ = ("_hook", "_key", "__weakref__")

    def __init__(self, hook: ExceptHook, key: int) -> None:
        self._hook: ExceptHook | None = hook
        self._key = key

    def remove(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.unsubscribe(self._key)


class ExceptHook:
    """``sys.excepthook`` and IPython's custom exception handler, installed while subscribers hold them."""

    def __init__(self) -> None:
        self._subscribers: dict[int, tuple[Callable[[], Any], Callable[[], Door | None]]] = {}
        self._keys = itertools.count()
        self._previous: Callable[..., Any] | None = None
        self._ipython: tuple[Any, Any, Any] | None = None
        #: The hook put in ``sys.excepthook`` (one bound method, so that it is known again by identity).
        self._hook = self._excepthook
        self._running = False

    def __len__(self) -> int:
        return len(self._subscribers)

    @property
    def installed(self) -> bool:
        """Whether leafwatch's hook is in the chain: in front, or behind a hook installed since."""
        return self._previous is not None

    def subscribe(self, context: Callable[[], Context | None], door: Door) -> Subscription:
        """Explain an uncaught exception with ``door`` while this subscription lasts; ``context`` says what the
        subscriber knows then (each held weakly when it is a bound method)."""
        key = next(self._keys)
        self._subscribers[key] = (self._held(context, key), self._held(door, key))
        if len(self._subscribers) == 1:
            self._install()
        return Subscription(self, key)

    def _held(self, function: Callable[..., Any], key: int) -> Callable[[], Any]:
        """``function`` as a callable that gives it back: weakly for a bound method (its owner gone, the
        subscription ends)."""
        if isinstance(function, MethodType):
            weakref.finalize(function.__self__, self.unsubscribe, key)
            return weakref.WeakMethod(function)
        return lambda: function

    def unsubscribe(self, key: int) -> None:
        if self._subscribers.pop(key, None) is not None and not self._subscribers:
            self._uninstall()

    # -- installing --------------------------------------------------------------------------------
    def _install(self) -> None:
        if self._previous is None:  # (still in the chain behind a later hook: not chained a second time)
            self._previous, sys.excepthook = sys.excepthook, self._hook
        shell = _ipython_shell()
        if shell is not None and self._ipython is None:
            try:
                saved = (shell.custom_exceptions, shell.CustomTB)
                shell.set_custom_exc((Exception,), self._ipython_handler)  # (called with the shell first)
                self._ipython = (shell, *saved)
            except Exception:  # an IPython without the handler: the excepthook still explains scripts
                self._ipython = None

    def _uninstall(self) -> None:
        if sys.excepthook is self._hook and self._previous is not None:
            sys.excepthook, self._previous = self._previous, None
        # else a hook installed since calls leafwatch's: it stays in the chain, passing everything on
        if self._ipython is not None:
            shell, exceptions, handler = self._ipython
            self._ipython = None
            try:
                shell.custom_exceptions, shell.CustomTB = exceptions, handler
            except Exception:
                pass

    # -- an exception arrives ----------------------------------------------------------------------
    def explain(self, error: BaseException) -> Sequence[str]:
        """What the subscribers' doors say of ``error`` (notes added to it; the lines to print after its
        traceback returned); nothing when no subscriber is left or the doors fail (each warns itself)."""
        live = list(self._subscribers.values())
        if not live or not isinstance(error, Exception):
            return ()
        later: list[str] = []
        try:
            contexts = [c for c in (getter() for getter in (held() for held, _ in live) if getter is not None)
                        if c is not None]
            for door in (held() for _, held in live):
                said = door(error, contexts) if door is not None else ()
                later = later or list(said)
        except Exception:  # each door guards itself: this is the last line that keeps the hook safe
            pass
        return later

    def _excepthook(self, kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if self._running:  # hooks that call each other in a loop: Python's own prints it, once
            sys.__excepthook__(kind, error, tb)
            return
        self._running = True
        later: Sequence[str] = ()
        try:
            later = self.explain(error)
            (self._previous if self._previous is not None else sys.__excepthook__)(kind, error, tb)
        finally:
            self._running = False
            print_notes(later)

    def _ipython_handler(self, shell: Any, kind: type[BaseException], error: BaseException, tb: Any,
                         tb_offset: int | None = None) -> Any:
        later = self.explain(error)
        try:
            shell.showtraceback((kind, error, tb), tb_offset=tb_offset)
        finally:
            print_notes(later)


def print_notes(lines: Sequence[str]) -> None:
    """Print, after an exception's traceback, the notes it could not carry (Python 3.10); a closed stream is ignored."""
    for line in lines:
        try:
            print(line, file=sys.stderr)
        except Exception:
            return


def _ipython_shell() -> Any:
    """The running IPython shell (never imported here: only one that is running already)."""
    module = sys.modules.get("IPython")
    get = getattr(module, "get_ipython", None)
    try:
        shell = get() if callable(get) else None
    except Exception:
        return None
    return shell if shell is not None and hasattr(shell, "set_custom_exc") else None


#: The one excepthook of the process (Python has one): Monitors and ``watch()`` subscribe to it.
HOOK = ExceptHook()

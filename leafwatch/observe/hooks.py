"""torch's global hooks, each held by one leafwatch dispatcher that fans out to its subscribers.

torch calls its global optimizer step hooks and module registration hooks while it iterates their
dicts (``Optimizer.profile_hook_step``: ``for pre_hook in chain(_global_optimizer_pre_hooks.values(),
...)``): a hook added to or removed from that dict while the loop runs breaks the user's step with
``RuntimeError: OrderedDict mutated during iteration`` (as soon as the user has a global hook of
their own, a gradient-norm logger or torch's ``MemTracker``). So leafwatch registers one
dispatcher per dict, and every Monitor, session and front-end subscribes to it: a subscription
changes only leafwatch's own tuple of subscribers. torch's dict changes only when no dispatch of
that dispatcher is under way; a change asked for during one (a Monitor built or closed inside an
optimizer step) is made at the next subscription, dispatch or module forward outside it. Once the last subscriber
is gone and no step runs, torch's dicts are as they were.
"""

from __future__ import annotations

import functools
import threading
import weakref
from types import SimpleNamespace
from collections.abc import Callable
from typing import Any

import torch.nn.modules.module as _modules
import torch.optim.optimizer as _optimizers


class Subscription:
    """One subscriber's hold on a :class:`Dispatcher`; :meth:`remove` ends it (idempotent), as a
    ``RemovableHandle`` does."""

    __slots__ = ("_dispatcher", "_callback", "_finalizer")

    def __init__(self, dispatcher: Dispatcher, callback: Callable[..., Any], finalizer: Any = None) -> None:
        self._dispatcher: Dispatcher | None = dispatcher
        self._callback = callback
        self._finalizer = finalizer  # (a weak subscription's end when its object goes: not needed once removed)

    def remove(self) -> None:
        dispatcher, self._dispatcher = self._dispatcher, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if dispatcher is not None:
            dispatcher.unsubscribe(self._callback)


class Dispatcher:
    """One global torch hook of one kind, registered while leafwatch has subscribers for it.

    Args:
        name: What it is, for a reader (``"optimizer step pre-hook"``).
        register: torch's function that registers a global hook of this kind (returns its handle),
            or None where this torch has none.
    """

    def __init__(self, name: str, register: Callable[[Callable[..., Any]], Any] | None) -> None:
        self.name = name
        self._register = register
        self._subscribers: tuple[Callable[..., Any], ...] = ()
        self._handle: Any = None
        #: Dispatches under way (torch is iterating this hook's dict): its registration waits.
        self._busy = 0

    @property
    def registered(self) -> bool:
        """Whether the dispatcher is in torch's dict now."""
        return self._handle is not None

    def __len__(self) -> int:
        return len(self._subscribers)

    def subscribe(self, callback: Callable[..., Any], *, weakly: bool = False) -> Subscription:
        """Call ``callback`` with the hook's arguments at each call of this hook, from the next one on.

        ``weakly`` (``callback`` a bound method): the subscription holds its object weakly and ends when it is
        gone, so that a Monitor dropped without ``close()`` (its constructor or ``attach()`` raised, or it was
        never closed) leaves no global hook behind. What must outlive the user's reference (an attached
        Monitor's step hooks) subscribes strongly."""
        finalizer = None
        if weakly:
            owner, method = callback.__self__, weakref.WeakMethod(callback)  # type: ignore[attr-defined, arg-type]

            def callback(*args: Any) -> Any:  # noqa: F811 - the weak stand-in for the method
                found = method()
                return found(*args) if found is not None else None

            finalizer = weakref.finalize(owner, self.unsubscribe, callback)
            finalizer.atexit = False  # (nothing to undo when the interpreter exits)
            del owner
        with _LOCK:
            self._subscribers = (*self._subscribers, callback)
        settle()
        return Subscription(self, callback, finalizer)

    def unsubscribe(self, callback: Callable[..., Any]) -> None:
        with _LOCK:
            kept = self._subscribers
            found = next((i for i, known in enumerate(kept) if known is callback), None)
            if found is not None:
                self._subscribers = kept[:found] + kept[found + 1:]
        settle()

    def __call__(self, *args: Any) -> Any:
        self._busy += 1  # first: torch is iterating this very dict, which settle() must leave alone
        try:
            if _unsettled:
                settle()
            for callback in self._subscribers:  # (a tuple: one added now counts from the next call)
                callback(*args)
        finally:
            self._busy -= 1
        return None

    def _settle(self) -> bool:
        """Register or remove the dispatcher to match its subscribers; False when it must wait."""
        wanted = bool(self._subscribers) and self._register is not None
        if wanted == (self._handle is not None):
            return True
        if self._busy:
            return False
        if wanted:
            self._handle = self._register(self)  # type: ignore[misc]
        else:
            handle, self._handle = self._handle, None
            handle.remove()
        return True


_LOCK = threading.RLock()
#: A registration change had to wait for a dispatch to end: the next dispatch, subscription or
#: module forward makes it.
_unsettled = False
#: While a change waits: a global module forward pre-hook, the next safe moment (torch copies that
#: dict before calling its hooks, and no optimizer hook dict is iterated during a forward).
_at_next_forward: Any = None


def settle() -> None:
    """Bring every dispatcher's registration in line with its subscribers where no dispatch of
    it is under way; the rest wait for the next dispatch or module forward."""
    global _unsettled, _at_next_forward
    with _LOCK:
        _unsettled = not all([d._settle() for d in DISPATCHERS])
        if _unsettled and _at_next_forward is None:
            _at_next_forward = _modules.register_module_forward_pre_hook(lambda module, args: settle())
        elif not _unsettled and _at_next_forward is not None:
            handle, _at_next_forward = _at_next_forward, None
            handle.remove()


OPTIMIZER_STEP_PRE = Dispatcher("optimizer step pre-hook", getattr(
    _optimizers, "register_optimizer_step_pre_hook", None))
OPTIMIZER_STEP_POST = Dispatcher("optimizer step post-hook", getattr(
    _optimizers, "register_optimizer_step_post_hook", None))
MODULE_REGISTRATION = Dispatcher("module registration hook", getattr(
    _modules, "register_module_module_registration_hook", None))
PARAMETER_REGISTRATION = Dispatcher("parameter registration hook", getattr(
    _modules, "register_module_parameter_registration_hook", None))

def _on_optimizer_init(callback: Callable[..., Any]) -> Any:
    """torch has no hook for an optimizer being built: the base class's ``_patch_step_function``,
    which ``Optimizer.__init__`` calls first (and unpickling again), is wrapped to call
    ``callback(optimizer)``, and put back when the handle is removed. Not ``__init__`` itself: an
    exception it raises (``can't optimize a non-leaf Tensor``) would show leafwatch's frame in the
    user's traceback."""
    base = _optimizers.Optimizer
    original = base.__dict__.get("_patch_step_function")
    if original is None:  # (another torch: builds are not seen, the handover's mark stands in)
        return SimpleNamespace(remove=lambda: None)

    @functools.wraps(original)
    def built(self: Any) -> None:
        original(self)
        callback(self)

    base._patch_step_function = built  # type: ignore[method-assign]
    return SimpleNamespace(remove=lambda: setattr(base, "_patch_step_function", original)
                           if base.__dict__.get("_patch_step_function") is built else None)


#: Optimizers being built (no torch hook: ``Optimizer._patch_step_function`` wrapped while subscribed).
OPTIMIZER_BUILT = Dispatcher("optimizer built", _on_optimizer_init)

#: Every module's forward, before and after it (the diagnostic tracer, while it has modules armed: a hook
#: left on the user's module would travel into a ``copy.deepcopy`` and stop ``torch.save(model)``). ``Module._call_impl``
#: copies these dicts before calling them, so a change during a forward breaks nothing; torch calls a
#: global hook for every module of the process while it is registered, so only a tracer with armed
#: modules subscribes, and only an instrumented forward's needs the two hooks around the top modules.
MODULE_FORWARD_PRE = Dispatcher("module forward pre-hook", getattr(_modules, "register_module_forward_pre_hook", None))
MODULE_FORWARD = Dispatcher("module forward hook", getattr(_modules, "register_module_forward_hook", None))
MODULE_FORWARD_ALWAYS = Dispatcher("module forward hook (called when the forward raises too)", functools.partial(
    _modules.register_module_forward_hook, always_call=True) if hasattr(_modules, "register_module_forward_hook") else None)

#: Every dispatcher.
DISPATCHERS: tuple[Dispatcher, ...] = (OPTIMIZER_STEP_PRE, OPTIMIZER_STEP_POST, MODULE_REGISTRATION,
                                       PARAMETER_REGISTRATION, OPTIMIZER_BUILT, MODULE_FORWARD_PRE, MODULE_FORWARD,
                                       MODULE_FORWARD_ALWAYS)

"""What one Monitor observes of the process through torch's global hooks, held by that Monitor alone.

An :class:`Observer` subscribes to leafwatch's global dispatchers (:mod:`leafwatch.observe.hooks`)
and keeps what they tell it: each module and parameter registered (when, and from which line of
the user's code), a number that changes with every registration (the structure cache's cue to read
again), the optimizers seen stepping, and the step hooks that ask for the Monitor's checks. Nothing
of it is process-wide: two Monitors, or an ``audit()`` beside an open Monitor, never see each
other's observations (``audit()`` gets an Observer that subscribes to nothing: it observes no step).
"""

from __future__ import annotations

import ast
import itertools
import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from . import excepthook, follow, frames, hooks
from .discovery import Discovery, user_scope
from .source import Source

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
#: Registrations remembered at most (their line and function): a loop that builds layers forever stays bounded.
APPEARED_MAX = 50_000


class Observer:
    """The global hooks of one Monitor and what they saw.

    Args:
        check: Called with the optimizer about to step, once :meth:`install` or
            :meth:`install_global` asked for it.
        hooked: Subscribe to the registration and step hooks, and note where each optimizer is built from
            now on (a Monitor made before its optimizer, or ``leafwatch run`` from the script's first line,
            names that line); False for ``audit()``: one look, no step.
    """

    def __init__(self, check: Callable[[torch.optim.Optimizer], Any] | None = None, hooked: bool = True) -> None:
        self._check = check
        #: Changes with every module or parameter registered while hooked (read by the structure cache).
        self.generation = 0
        #: How many registrations were seen; :meth:`appeared` compares with :meth:`mark`.
        self._registrations = itertools.count(1)
        self._last = 0
        #: id -> (the tensor, followed through the module it was registered in: never a weak reference,
        #: which ``torch.utils.swap_tensors`` refuses; the registration's number; the user's ``path:line``;
        #: the user's function; the ``path:line`` of the user's frames from it outward).
        self._appeared: dict[int, tuple[follow.Held, int, str, str, tuple[str, ...]]] = {}
        self._stepping: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._last_stepping: weakref.ReferenceType[torch.optim.Optimizer] | None = None
        #: optimizer -> (the registration mark when it was built, the user's ``path:line``, the variable assigned)
        self._built: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, str, str]] = weakref.WeakKeyDictionary()
        #: optimizer -> (the library, the library's ``path:line`` that built it) for one a library's code built
        self._built_by: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[str, str]] = weakref.WeakKeyDictionary()
        #: The loss a framework handed over at its backward (the Lightning callback, until the check that
        #: follows): read only where no checked tensor got a gradient, for a loss set to require grad by hand.
        self.handed_loss: torch.Tensor | None = None
        #: ``leafwatch run``'s :class:`~leafwatch.observe.unhooked.Unhooked`: the modules its global forward hook
        #: watched and never saw run (read only where a gradient misses: :attr:`not_run`).
        self.unhooked: Any = None
        self._subscriptions: list[Any] = []
        self._step_handles: list[Any] = []
        self._closure_steps: set[int] = set()
        self._modules: Discovery | None = None
        self._set_roots: Callable[..., None] = lambda roots, paths: None
        if hooked:
            # (weakly: a Monitor dropped without close() leaves none of them behind)
            self._subscriptions = [hooks.PARAMETER_REGISTRATION.subscribe(self._on_parameter, weakly=True),
                                   hooks.MODULE_REGISTRATION.subscribe(self._on_module, weakly=True),
                                   hooks.OPTIMIZER_STEP_PRE.subscribe(self._saw_step, weakly=True),
                                   hooks.OPTIMIZER_BUILT.subscribe(self._saw_built, weakly=True)]

    def __len__(self) -> int:
        """The step hooks installed (for tests of what a Monitor holds)."""
        return len(self._step_handles)

    # -- registrations -----------------------------------------------------------------------
    def mark(self) -> int:
        """The number of the last registration seen: a tensor with a higher one came after now."""
        return self._last

    def appeared(self, t: torch.Tensor, after: int | None) -> tuple[str, str, tuple[str, ...]] | None:
        """``(path:line, function, outer)`` of the user's code that registered ``t`` after the mark
        ``after`` (noted when the optimizers were handed over, so after they were built): the innermost
        user frame's line and function, and the lines of the user's frames from it outward (the
        statement ``model = Hetero(model)`` that ran the ``__init__`` that registered it); None when
        not seen so."""
        found = self._appeared.get(id(t))
        if after is None or found is None or found[0]() is not t or found[1] <= after:
            return None
        return found[2], found[3], found[4]

    def _on_parameter(self, module: nn.Module, name: str, param: Any) -> None:
        self.generation += 1
        if param is not None:
            self._record([(module, name, param)])

    def _on_module(self, module: nn.Module, name: str, submodule: Any) -> None:
        self.generation += 1
        if isinstance(submodule, nn.Module):
            self._record((owner, attribute, p) for owner in submodule.modules()
                         for attribute, p in owner._parameters.items() if p is not None)

    def _record(self, registered: Iterable[tuple[nn.Module, str, torch.Tensor]]) -> None:
        """Where the user's code registered ``tensors``, if it did. It runs inside the user's
        ``self.x = ...``: a failure must never stop it (the tensor is then not known as late)."""
        try:
            frame = frames.user_frame()
            if frame is None or len(self._appeared) >= APPEARED_MAX:
                return
            where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
            function = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            outer = tuple(f"{f.f_code.co_filename}:{f.f_lineno}" for f in itertools.islice(frames.outside(frame), 8))
            self._last = number = next(self._registrations)
            for module, attribute, t in registered:
                known = self._appeared.get(id(t))
                if known is not None and known[0]() is t:
                    continue  # registered again (its module wrapped: DDP, Opacus's make_private): it appeared before
                held = follow.registered(module, attribute, t)
                if held is not None:
                    self._appeared[id(t)] = (held, number, where, function, outer)
        except Exception:
            pass

    @property
    def not_run(self) -> frozenset[int]:
        """Ids of the modules a global forward hook watches since before this step and never saw run (a module kept
        in a script's variable, never called): they never ran."""
        return frozenset(self.unhooked.not_run) if self.unhooked is not None else frozenset()

    # -- optimizers --------------------------------------------------------------------------
    def stepping_optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers seen stepping while this Observer was subscribed."""
        return list(self._stepping)

    def _saw_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # At every step: the WeakSet makes a weak reference at each add, so the last one seen is kept
        # (weakly) and a step of the same optimizer again costs one call of it.
        last = self._last_stepping
        if last is None or last() is not optimizer:
            self._stepping.add(optimizer)
            self._last_stepping = weakref.ref(optimizer)

    def _saw_built(self, optimizer: torch.optim.Optimizer) -> None:
        try:  # (inside the user's optimizer construction: never stop it)
            frame = frames.user_frame()
            if frame is not None and optimizer not in self._built:  # (zero_grad() may call it again)
                where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
                self._built[optimizer] = (self._last, where, _assigned_name(frame))
                builder = next((f for f in frames.every_frame() if not f.f_code.co_filename.startswith(_TORCH_DIR)), None)
                library = frames.library_of(builder.f_code.co_filename) if builder is not None else None
                if library is not None and builder is not frame:
                    self._built_by[optimizer] = (library[0], f"{library[1]}:{builder.f_lineno}")
        except Exception:
            pass

    def built_mark(self, optimizers: Sequence[torch.optim.Optimizer]) -> int:
        """The registration mark when the last of ``optimizers`` was built (when seen; else now)."""
        marks = [self._built[o][0] if o in self._built else self._last for o in optimizers]
        return max(marks, default=self._last)

    def built(self, optimizer: torch.optim.Optimizer) -> tuple[int, str, str] | None:
        """``(the registration mark then, path:line, the variable assigned)`` of the statement that built
        ``optimizer``, when seen."""
        return self._built.get(optimizer)

    def built_optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers seen built that still exist, stepped or not: an optimizer counts from its
        construction on (``leafwatch run``'s ``loss_optimizer``, stepped after the model's in each iteration)."""
        return list(self._built.keys())

    def built_by(self, optimizer: torch.optim.Optimizer) -> tuple[str, str] | None:
        """``(the library, its path:line)`` when a library's code built ``optimizer`` (Pyro's ``PyroOptim``
        builds one torch optimizer per parameter inside ``svi.step``), not the user's; None otherwise."""
        return self._built_by.get(optimizer)

    def install(self, optimizers: Sequence[torch.optim.Optimizer], model: Any = None,
                set_roots: Callable[..., None] | None = None) -> None:
        """Check before each step of ``optimizers`` (:meth:`leafwatch.Monitor.attach`); with a ``model``
        and ``set_roots``, the modules a step runs beyond the model are read too, by the user's paths."""
        ids = frozenset(id(opt) for opt in optimizers)
        self._step_handles += [
            hooks.OPTIMIZER_STEP_PRE.subscribe(lambda o, a, k: self._before_step(o, a, k) if id(o) in ids else None),
            hooks.OPTIMIZER_STEP_POST.subscribe(lambda o, a, k: self._after_step(o, a, k) if id(o) in ids else None)]
        if isinstance(model, nn.Module) and set_roots is not None:
            self._modules, self._set_roots = Discovery(model, user_scope), set_roots
            self._modules.arm()

    def install_global(self) -> None:
        """Check at every optimizer's step (``leafwatch run``: the optimizers are met as they step)."""
        self._step_handles += [hooks.OPTIMIZER_STEP_PRE.subscribe(self._before_step),
                               hooks.OPTIMIZER_STEP_POST.subscribe(self._after_step)]

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # A step hook gets the step's own arguments: ``args[0]`` is the optimizer, the closure follows.
        if (args[1] if len(args) > 1 else kwargs.get("closure")) is not None:
            self._closure_steps.add(id(optimizer))  # its gradients are computed inside step(): checked after
            return
        self._run_check(optimizer)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if id(optimizer) in self._closure_steps:
            self._closure_steps.discard(id(optimizer))
            self._run_check(optimizer)

    def _run_check(self, optimizer: torch.optim.Optimizer) -> None:
        roots = self._modules.update() if self._modules is not None else None
        if roots is not None:
            self._set_roots(roots, self._modules.paths)  # type: ignore[union-attr]
        if self._check is not None:
            self._check(optimizer)

    # -- a crash ------------------------------------------------------------------------------
    def explain_crashes(self, context: Any, door: excepthook.Door) -> None:
        """Explain an uncaught exception with ``door`` until :meth:`close` (the excepthook's subscription;
        ``context``: what the Monitor knows then, :meth:`~leafwatch.observe.diagnostics.Diagnostics.crash_context`)."""
        self._subscriptions.append(excepthook.HOOK.subscribe(context, door))

    # -- the end -----------------------------------------------------------------------------
    def close(self) -> None:
        """End every subscription (torch's dicts are back as they were once no step runs) and forget."""
        for handle in (*self._step_handles, *self._subscriptions):
            handle.remove()
        self._step_handles, self._subscriptions = [], []
        if self._modules is not None:
            self._modules.disarm()
        self._appeared.clear()
        self._stepping.clear()
        self._last_stepping = None


def _assigned_name(frame: Any) -> str:
    """The variable the statement running in ``frame`` assigns (``opt`` of ``opt = Adam(...)``), or ""."""
    tree, line = Source().tree(frame.f_code.co_filename), frame.f_lineno
    around = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno <= line <= (n.end_lineno or n.lineno)] \
        if tree is not None else []
    node = min(around, key=lambda n: (n.end_lineno or n.lineno) - n.lineno, default=None)
    return ast.unparse(node.targets[0]) if node is not None and len(node.targets) == 1 else ""

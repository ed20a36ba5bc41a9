"""The loop hooks: what the training loop did with the gradients between backward and step.

:class:`ArrivalHooks` records which tensors got a gradient in backward; :class:`StepSentinels`
counts per optimizer the steps skipped in a row, and where no step hook fires asks for a check
through the ``request_check`` callable its owner injects; :class:`UseTracker` tells which parameters
a DDP rank used (DDP fills the ``.grad`` of the others). Nothing here judges (``detectors/loop.py`` does).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import follow

from .structure import CheckList

#: An optimizer that skipped this many steps in a row is looked at (a few at the start are the
#: GradScaler finding its scale: 2**16 halves to 1 in 16 steps).
SKIPPED_AFTER = 30


class ArrivalHooks:
    """Post-accumulate-grad hooks on chosen tensors: which got a gradient in backward since last read
    (a ``.grad`` None at a check then tells "backward never reached it" from "the loop cleared it").

    The hooks hold only the tensor's id: nothing of the user's is kept alive. A tensor is followed
    through the module or optimizer that holds it (:mod:`leafwatch.observe.follow`): a swap
    (``torch.utils.swap_tensors``) keeps it, and leaves the hook with the old contents, where it never
    fires again; :meth:`rearm_swapped` hooks such a tensor again.
    """

    def __init__(self) -> None:
        self.arrived: set[int] = set()
        self.handles: dict[int, Any] = {}
        #: id -> (the tensor, followed; its contents when hooked: ``follow.impl``).
        self._hooked: dict[int, tuple[follow.Ref, int]] = {}
        #: The hooked tensors whose hook dict leafwatch did not make, or that held a hook of the user's
        #: while leafwatch's fired: left as torch leaves it (:func:`follow.release_hook_dict`).
        self._shared: set[int] = set()

    def arm(self, tensors: Iterable[torch.Tensor], follow_: Callable[[torch.Tensor], follow.Ref]) -> None:
        """Hook ``tensors`` (each followed with ``follow_``)."""
        for t in tensors:
            pid = id(t)
            if pid in self.handles or not (t.requires_grad and t.is_leaf) or torch.nn.parameter.is_lazy(t):
                continue  # a lazy parameter takes no hook before its first forward
            made = follow.makes_hook_dict(t, follow.POST_ACCUMULATE_HOOKS)
            try:
                self.handles[pid] = t.register_post_accumulate_grad_hook(self._make_hook(pid))
            except (RuntimeError, AttributeError):  # a tensor subclass that refuses the hook
                continue
            if not made:
                self._shared.add(pid)
            self._hooked[pid] = (follow_(t), follow.impl(t))

    def _make_hook(self, pid: int) -> Callable[[torch.Tensor], None]:
        def arrived(t: torch.Tensor) -> None:
            # torch calls the hook when backward passed None too (a custom autograd.Function
            # returning None for this input): no gradient arrived then.
            if t.grad is not None:
                self.arrived.add(pid)
            if pid not in self._shared and len(t._post_accumulate_grad_hooks or ()) > 1:
                self._shared.add(pid)  # a hook of the user's joined leafwatch's dict

        return arrived

    def retarget(self, wanted: Mapping[int, torch.Tensor], follow_: Callable[[torch.Tensor], follow.Ref]) -> None:
        """Keep hooks on exactly the tensors ``wanted`` (by id)."""
        self.disarm([pid for pid in self.handles if pid not in wanted])
        self.arm((t for pid, t in wanted.items() if pid not in self.handles), follow_)

    def rearm_swapped(self) -> set[int]:
        """The ids of the hooked tensors swapped since they were hooked (their hook sits on the old
        contents: what they got since is unknown), each hooked again."""
        swapped = set()
        for pid, (ref, contents) in list(self._hooked.items()):
            t = ref()
            if t is not None and follow.impl(t) != contents:
                self._rehook(pid, ref, t)
                swapped.add(pid)
        return swapped

    def _rehook(self, pid: int, ref: follow.Ref, t: torch.Tensor) -> None:
        """Hook ``t`` (swapped since it was hooked, its hook left with the old contents) again."""
        self._unhook(pid, swapped=True)
        self.arm([t], lambda _: ref)

    def disarm(self, ids: Iterable[int] | None = None) -> None:
        for pid in list(self.handles) if ids is None else list(ids):
            self._unhook(pid)
        if ids is None:
            self.arrived.clear()

    def _unhook(self, pid: int, swapped: bool = False) -> None:
        handle = self.handles.pop(pid, None)
        ref, _ = self._hooked.pop(pid, (None, 0))
        shared = pid in self._shared
        self._shared.discard(pid)
        if handle is not None:
            handle.remove()
            follow.release_hook_dict(ref() if ref is not None else None, follow.POST_ACCUMULATE_HOOKS, swapped,
                                     made=not shared)

    def take(self, ids: frozenset[int]) -> set[int]:
        """The tensors among ``ids`` whose gradient arrived since the last take (then forgotten)."""
        got = self.arrived & ids
        if got:
            self.arrived -= got
        return got


class UseTracker(ArrivalHooks):
    """Which parameters this rank used in its backward passes since the last :meth:`unused`.

    The arrival hooks (:class:`~leafwatch.observe.loop.ArrivalHooks`) on every parameter that requires grad
    (torch >= 2.2); each tensor is followed through the module of ``model`` that holds it (never a weak
    reference, which ``torch.utils.swap_tensors`` refuses), and the hooks go at :meth:`close`. A parameter
    swapped since its hook was put on (the hook stays with the old contents) is hooked again, and not named
    unused from what its old hook did not see.
    """

    def __init__(self, params: Sequence[tuple[torch.Tensor, str]], model: nn.Module | None = None) -> None:
        super().__init__()
        self._names = {id(p): name for p, name in params}
        owners = {id(p): m for m in (model.modules() if isinstance(model, nn.Module) else ())
                  for p in m._parameters.values() if p is not None}
        self.arm((p for p, _ in params), lambda p: (follow.in_module(owners[id(p)], p) if id(p) in owners else None)
                 or follow.weakly(p))

    def unused(self) -> list[tuple[torch.Tensor, str]]:
        """The tracked tensors this rank did not use although they hold a gradient; resets the record."""
        out = []
        for pid, (ref, contents) in list(self._hooked.items()):
            p = ref()
            if p is None or pid in self.arrived or p.grad is None or not p.requires_grad:
                continue
            if follow.impl(p) != contents:  # swapped: its hook saw nothing since; hooked again
                self._rehook(pid, ref, p)
                continue
            out.append((p, self._names[pid]))
        self.arrived.clear()
        return out

    def close(self) -> None:
        self.disarm()


@dataclasses.dataclass
class Skipping:
    """What the sentinel of one optimizer saw."""

    handle: Any  # the tensor hook on the sentinel
    sentinel: int  # id of the tensor whose hook counts the backward passes
    tensor: follow.Ref  # the sentinel, followed through the optimizer that holds it
    contents: int  # ``follow.impl`` of the sentinel when hooked: a swap leaves the hook on the old contents
    made: bool = True  # leafwatch made the sentinel's hook dict and no hook of the user's joined it
    version: int = -1  # the sentinel's ``_version`` at the start of the last backward pass
    skipped: int = 0  # backward passes in a row that started from a cleared gradient, the sentinel unchanged
    skipping_since: int = 0  # the step when the skipping began
    asked_step: int = -1  # the step that a check asked for will have


class StepSentinels:
    """Per optimizer (by id), the steps skipped in a row: a tensor hook on one tensor it holds (the
    sentinel) fires in every backward pass; a pass that starts from a cleared ``.grad`` with the
    sentinel's ``_version`` unchanged since the last one followed no step (a step updates its tensors
    in place). No optimizer hook is needed, and none is registered from inside one. A sentinel swapped
    (``torch.utils.swap_tensors``: its hook stays with the old contents) is hooked again at the next
    :meth:`track`; the structure cache reads :meth:`swapped` every few checks to ask for one.

    Args:
        request_check: Called with the optimizer at the end of a backward pass when it has skipped
            :data:`SKIPPED_AFTER` steps and nothing checked it since the skipping began.
        step_of: The step now (it moves at every check).
        on_error: Told of a failure inside a hook (which never stops the user's backward pass).
    """

    def __init__(self, request_check: Callable[[torch.optim.Optimizer], Any], step_of: Callable[[], int],
                 on_error: Callable[[str, BaseException], None]) -> None:
        self.request_check = request_check
        self.step_of = step_of
        self.on_error = on_error
        self.seen: dict[int, Skipping] = {}
        #: Optimizers (by id) that skipped :data:`SKIPPED_AFTER` steps or more in a row.
        self.alert: set[int] = set()

    def track(self, optimizers: list[torch.optim.Optimizer], lists: Mapping[int | None, CheckList],
              leftovers: frozenset[int] = frozenset()) -> None:
        """Hook a sentinel for each optimizer not hooked yet, or whose sentinel left it or became
        one of the ``leftovers`` (old tensors the model no longer uses: no backward reaches them)."""
        for i, opt in enumerate(optimizers):
            clist = lists.get(i)
            state = self.seen.get(id(opt))
            if clist is None or (state is not None and state.sentinel in clist.ids and state.sentinel not in leftovers
                                 and not _moved(state)):
                continue
            if state is not None:
                self._unhook(self.seen.pop(id(opt)), swapped=True)
                self.alert.discard(id(opt))
            candidates = [p for p in clist.params if p.requires_grad and p.is_leaf and id(p) not in leftovers
                          and not torch.nn.parameter.is_lazy(p)]
            # One without a hook dict of the user's first: leafwatch's hook then makes the dict.
            sentinel = next((p for p in candidates if follow.makes_hook_dict(p, follow.BACKWARD_HOOKS)),
                            candidates[0] if candidates else None)
            if sentinel is not None:
                self.seen[id(opt)] = self._hook_sentinel(opt, sentinel)

    def swapped(self) -> bool:
        """Whether a sentinel was swapped since it was hooked (its hook counts nothing any more)."""
        return any(_moved(state) for state in self.seen.values())

    @staticmethod
    def _unhook(state: Skipping, swapped: bool = False) -> None:
        state.handle.remove()
        follow.release_hook_dict(state.tensor(), follow.BACKWARD_HOOKS, swapped and _moved(state), state.made)

    def _hook_sentinel(self, opt: torch.optim.Optimizer, sentinel: torch.Tensor) -> Skipping:
        tensor_ref = follow.in_optimizer(opt, sentinel) or follow.weakly(sentinel)
        opt_ref, key = weakref.ref(opt), id(opt)
        state = Skipping(None, id(sentinel), tensor_ref, follow.impl(sentinel),
                         made=follow.makes_hook_dict(sentinel, follow.BACKWARD_HOOKS))

        # Marked unserializable: ``torch.save`` of a plain tensor the optimizer holds gives no warning for it.
        @torch.utils.hooks.unserializable_hook
        def counted(grad: torch.Tensor) -> None:
            t = tensor_ref()
            if t is None or t.grad is not None:
                return  # a second backward into the same gradients (accumulation)
            if state.made and len(t._backward_hooks or ()) > 1:
                state.made = False  # a hook of the user's joined leafwatch's dict: torch's to keep as it is
            version = t._version
            if version == state.version:
                state.skipped += 1
                if state.skipped == 1:
                    state.skipping_since = self.step_of()
            else:
                state.skipped = 0
                self.alert.discard(key)
            state.version = version
            if state.skipped < SKIPPED_AFTER:
                return
            self.alert.add(key)
            if self.step_of() in (state.skipping_since, state.asked_step):
                # No check but the ones asked for came (attach(), `leafwatch run`): ask for one.
                state.asked_step = self.step_of() + 1
                optimizer = opt_ref()
                try:
                    if optimizer is not None:
                        torch.autograd.Variable._execution_engine.queue_callback(  # type: ignore[attr-defined]
                            lambda: self.request_check(optimizer))
                except Exception as error:  # inside the user's backward: never stop it
                    self.on_error("the skipped-step hook", error)

        state.handle = sentinel.register_hook(counted)
        return state

    def close(self) -> None:
        for state in self.seen.values():
            self._unhook(state)
        self.seen.clear()
        self.alert.clear()


def _moved(state: Skipping) -> bool:
    """Whether the sentinel of ``state`` was swapped (or left its place) since it was hooked."""
    t = state.tensor()
    return t is None or follow.impl(t) != state.contents

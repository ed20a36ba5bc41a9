"""Whether the optimizer step applies the gradients that backward produced.

A tensor can be a healthy leaf, held by an optimizer and reached by backward, and still never
train because the training loop throws its gradient away. Three ways, each watched here at a cost
paid only when something is already off:

- **cleared between** ``backward()`` **and** ``step()``: :class:`ArrivalHooks` puts
  post-accumulate-grad hooks on the tensors that miss a gradient (on every trainable tensor only
  until a Monitor's first check), so that a ``.grad`` found None at the check tells "backward
  never reached it" from "it arrived and the loop cleared it". :class:`ClearedGradients` judges
  per optimizer about to step: all of its gradients cleared is one error (``zero_grad()`` in the
  wrong place); some of them is information (a schedule that withholds them on purpose);
- **a learning rate stuck at 0**: :class:`LearningRates` reads each param group's ``lr`` every
  :data:`LR_READ_EVERY` checks of its optimizer (never a pass over the parameters);
- **steps that are always skipped** (an AMP ``GradScaler`` while the gradients are non-finite):
  :class:`SkippedSteps` counts, per optimizer, the backward passes that start from a cleared
  gradient with the optimizer's tensors unchanged since the last one (one tensor hook on one
  tensor, and its ``_version``). A skipped step never calls ``optimizer.step()``, so where no
  check comes it asks for one at the end of that backward pass.

:class:`LoopWatch` holds the three for a :class:`~leafwatch.Monitor`.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ..report.findings import Status
from ..report.history import FindingsView
from ..observe.inventory import shape_text
from ..observe.structure import CheckList
from ..report.verdicts import Verdict, Verdicts
from . import constructors as checks

#: A param group's ``lr`` is read every this many checks of its optimizer (and at its first).
LR_READ_EVERY = 10
#: A learning rate at 0 for this many checks in a row (configured non-zero) is reported.
LR_ZERO_AFTER = 100
#: An optimizer that skipped this many steps in a row is reported (a few at the start are the
#: GradScaler finding its scale: 2**16 halves to 1 in 16 steps).
SKIPPED_AFTER = 30
#: Forced NaN/Inf checks (the result comes one check later on CUDA) before skipped steps with
#: finite gradients are let be.
_EVIDENCE_CHECKS = 3
_MAX_FRAMES = 40
_MAX_LOCALS = 500


def optimizer_name(index: int | None) -> str:
    """How findings name an optimizer: ``optimizers[0]``."""
    return f"optimizers[{index}]" if index is not None else "the checked parameters"


# -- gradients cleared between backward and step ----------------------------------------------
class ArrivalHooks:
    """Post-accumulate-grad hooks on chosen tensors: which got a gradient in backward since last read.

    The hooks hold only the tensor's id: nothing of the user's is kept alive.
    """

    def __init__(self) -> None:
        self.arrived: set[int] = set()
        self.handles: dict[int, Any] = {}

    def __bool__(self) -> bool:
        return bool(self.handles)

    def arm(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            pid = id(t)
            if pid in self.handles or not (t.requires_grad and t.is_leaf) or torch.nn.parameter.is_lazy(t):
                continue  # a lazy parameter takes no hook before its first forward
            try:
                self.handles[pid] = t.register_post_accumulate_grad_hook(self._make_hook(pid))
            except (RuntimeError, AttributeError):  # a tensor subclass that refuses the hook
                pass

    def _make_hook(self, pid: int) -> Callable[[torch.Tensor], None]:
        def arrived(t: torch.Tensor) -> None:
            # torch calls the hook when backward passed None too (a custom autograd.Function
            # returning None for this input): no gradient arrived then.
            if t.grad is not None:
                self.arrived.add(pid)

        return arrived

    def retarget(self, wanted: Mapping[int, torch.Tensor]) -> None:
        """Keep hooks on exactly the tensors ``wanted`` (by id)."""
        self.disarm([pid for pid in self.handles if pid not in wanted])
        self.arm(t for pid, t in wanted.items() if pid not in self.handles)

    def disarm(self, ids: Iterable[int] | None = None) -> None:
        for pid in list(self.handles) if ids is None else list(ids):
            handle = self.handles.pop(pid, None)
            if handle is not None:
                handle.remove()
        if ids is None:
            self.arrived.clear()

    def take(self, ids: frozenset[int]) -> set[int]:
        """The tensors among ``ids`` whose gradient arrived since the last take (then forgotten)."""
        got = self.arrived & ids
        if got:
            self.arrived -= got
        return got


class ClearedGradients:
    """Judges, per optimizer about to step, the tensors whose gradient arrived and was cleared.

    Args:
        view: The findings so far (read-only).
    """

    def __init__(self, view: FindingsView) -> None:
        self.view = view
        #: Tensors reported as cleared on purpose (information), by id -> name, while it lasts.
        self.ongoing: dict[int, str] = {}
        #: Optimizers with the error open, by name.
        self.all_cleared: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.ongoing or self.all_cleared)

    def judge(self, clist: CheckList, missing: list[int], arrived: set[int], where: str,
              step: int, optimizer: Any = None) -> tuple[list[int], list[int], Verdicts]:
        """One check of ``clist``: (the indices still missing, the cleared ids, the verdicts).

        ``missing`` are the indices whose ``.grad`` is None at the check, ``arrived`` the ids
        whose gradient arrived in backward since the last check of this list.
        """
        out: Verdicts = []
        cleared = [i for i in missing if id(clist.params[i]) in arrived]
        cleared_ids = {id(clist.params[i]) for i in cleared}
        if self.ongoing:
            missing_ids = {id(clist.params[i]) for i in missing}
            for pid in [k for k in self.ongoing if k in clist.ids and k not in cleared_ids]:
                out += self._resumed(pid, step, trained=pid not in missing_ids)
        everything = bool(cleared) and len(missing) == len(clist.params)
        if where in self.all_cleared and not everything:
            self.all_cleared.discard(where)
            out.append(Verdict.resolve(("grad_cleared", where), step))
        if not cleared:
            return missing, [], out
        for i in cleared:  # a suspicion or an earlier cause of these misses was wrong
            key = ("missing_grad", clist.names[i])
            if self.view.get(key) is not None:
                out.append(Verdict.resolve(key, step))
        if everything:
            self.all_cleared.add(where)
            out.append(Verdict.open(checks.grad_cleared_all(where, [clist.names[i] for i in cleared], step=step,
                                                            optimizer=optimizer)))
        else:
            for i in cleared:
                p, name = clist.params[i], clist.names[i]
                info = clist.infos[i]
                self.ongoing[id(p)] = name
                out.append(Verdict.open(checks.grad_cleared(name, p, where=where, step=step,
                                                            aliases=info.aliases if info else ())))
        keep = set(cleared)
        return [i for i in missing if i not in keep], sorted(cleared_ids), out

    def _resumed(self, pid: int, step: int, trained: bool) -> Verdicts:
        """A tensor cleared before is not now: it kept its gradient (the schedule ended), or
        backward no longer reached it (``missing_grad`` says so)."""
        name = self.ongoing.pop(pid)
        old = self.view.get(("grad_cleared", name))
        if old is None or old.status != Status.OPEN:
            return []
        since = "it has trained since" if trained else "backward has not reached it since"
        return [Verdict.set(old.replace(
                status=Status.RESOLVED, last_step=step,
                message=f"`{name}`'s gradient was cleared before the optimizer step from step "
                f"{old.first_step} to step {old.last_step}; {since}."))]


# -- a learning rate stuck at 0 ----------------------------------------------------------------
def _number(value: Any) -> float | None:
    """``value`` as a float when reading it costs nothing: a Python number or a CPU tensor."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.numel() == 1:
        return float(value)
    return None  # a CUDA tensor lr: reading it would wait for the device


@dataclasses.dataclass
class _GroupLR:
    built: float | None  # the lr when the Monitor first saw the group
    zero_since_check: int | None = None
    zero_since_step: int | None = None
    reported: str | None = None  # the finding's name while it is open


def _gets_gradients(params: Iterable[torch.Tensor]) -> bool:
    return any(p.requires_grad and p.grad is not None for p in params)


class LearningRates:
    """Each param group's learning rate, read every :data:`LR_READ_EVERY` checks of its optimizer.

    A group whose configured learning rate (``initial_lr`` when a scheduler manages it, else the
    value the Monitor first saw) is not 0 but whose ``lr`` has been 0 for :data:`LR_ZERO_AFTER`
    checks while its tensors get gradients is a ``no_update`` warning. Groups built with lr 0 (a
    deliberate freeze), warm-ups from 0 and decays that reach 0 at the last steps are not.
    """

    def __init__(self) -> None:
        self._groups: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[_GroupLR]] = weakref.WeakKeyDictionary()

    def read(self, optimizer: torch.optim.Optimizer, where: str, checks_done: int, step: int,
             names: Callable[[torch.Tensor], str | None]) -> Verdicts:
        """Read the lrs of ``optimizer`` (its ``checks_done``-th check): the verdicts on its groups."""
        out: Verdicts = []
        states = self._groups.get(optimizer)
        if states is None:
            states = self._groups[optimizer] = []
        for j, group in enumerate(optimizer.param_groups):
            lr = _number(group.get("lr"))
            if j == len(states):
                states.append(_GroupLR(lr))
            state = states[j]
            configured = _number(group.get("initial_lr", state.built))
            if lr is None or configured is None or configured == 0 or lr != 0 \
                    or not _gets_gradients(group["params"]):
                out += self._reset(state, step)
                continue
            if state.zero_since_check is None:
                state.zero_since_check, state.zero_since_step = checks_done, step
            if checks_done - state.zero_since_check >= LR_ZERO_AFTER and state.reported is None:
                params = [p for p in group["params"] if p.requires_grad]
                tensor_names = [names(p) or shape_text(p) for p in params]
                state.reported = f"{where}.param_groups[{j}]"
                out.append(Verdict.open(checks.zero_lr(
                    state.reported, tensor_names, configured=configured, since=state.zero_since_step,
                    steps=checks_done - state.zero_since_check, step=step,
                    scheduler=find_scheduler(optimizer), managed="initial_lr" in group)))
        return out

    @staticmethod
    def _reset(state: _GroupLR, step: int) -> Verdicts:
        state.zero_since_check = state.zero_since_step = None
        if state.reported is None:
            return []
        key, state.reported = ("no_update", state.reported), None
        return [Verdict.resolve(key, step)]


def find_scheduler(optimizer: torch.optim.Optimizer) -> str | None:
    """The class name of a learning-rate scheduler of ``optimizer`` that the calling code holds.

    torch keeps no reference from an optimizer to its schedulers: look in the calling frames'
    locals (and their ``self``'s attributes; a Lightning Trainer's ``lr_scheduler_configs``).
    Runs once, when a finding is made.
    """
    base = torch.optim.lr_scheduler.LRScheduler
    frame: Any = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        values = list(frame.f_locals.values())[:_MAX_LOCALS]
        owner = frame.f_locals.get("self")
        if owner is not None:
            try:
                values.extend(list(vars(owner).values())[:_MAX_LOCALS])
            except TypeError:
                pass
        for value in values:
            configs = getattr(value, "lr_scheduler_configs", None) if type(value).__name__ == "Trainer" else None
            candidates = [getattr(c, "scheduler", None) for c in configs or ()] or [value]
            for candidate in candidates:
                if isinstance(candidate, base) and getattr(candidate, "optimizer", None) is optimizer:
                    return type(candidate).__name__
        frame = frame.f_back
    return None


# -- steps that are always skipped -------------------------------------------------------------
@dataclasses.dataclass
class _OptimizerSteps:
    handle: Any  # the tensor hook on the sentinel
    sentinel: int  # id of the tensor whose hook counts the backward passes
    version: int = -1  # the sentinel's ``_version`` at the start of the last backward pass
    cycles: int = 0  # backward passes that started from a cleared gradient
    skipped: int = 0  # of those, the ones in a row after which the sentinel had not changed
    skipping_since: int = 0  # the Monitor's step when the skipping began
    asked_step: int = -1  # the Monitor's step that a check asked for will have
    reported: bool = False
    forced: int = 0  # NaN/Inf checks asked for while skipping, before the evidence came
    dismissed: bool = False  # skipping with finite gradients: not a GradScaler's skip


class SkippedSteps:
    """Per optimizer, the steps skipped in a row, read off one tensor it holds (the sentinel).

    A tensor hook on the sentinel fires in every backward pass; when its ``.grad`` is None then,
    a new iteration starts (the loop cleared the gradients), and if the sentinel's ``_version``
    has not moved since the last one, the optimizer did not step in between (a step updates
    its tensors in place). No optimizer hook is needed, and none is registered from inside one.

    Args:
        view: The findings so far (read-only).
        ask_check: Called with the optimizer at the end of a backward pass when it has skipped
            :data:`SKIPPED_AFTER` steps and nothing checked it since the skipping began.
        step_of: The Monitor's step now (it moves at every check).
        on_error: Told of a failure inside a hook (which never stops the user's backward pass).
    """

    def __init__(self, view: FindingsView, ask_check: Callable[[torch.optim.Optimizer], None],
                 step_of: Callable[[], int], on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.view = view
        self.ask_check = ask_check
        self.step_of = step_of
        self.on_error = on_error
        self._states: dict[int, _OptimizerSteps] = {}
        #: Optimizers (by id) with many steps skipped in a row or reported: the only ones a check
        #: looks at (a healthy check does not even look up its optimizer).
        self.alert: set[int] = set()

    def __len__(self) -> int:
        return len(self._states)

    def track(self, optimizers: list[torch.optim.Optimizer], lists: Mapping[int | None, CheckList],
              leftovers: frozenset[int] = frozenset()) -> None:
        """Hook a sentinel for each optimizer not hooked yet, or whose sentinel left it or became
        one of the ``leftovers`` (old tensors the model no longer uses: no backward reaches them)."""
        for i, opt in enumerate(optimizers):
            clist = lists.get(i)
            state = self._states.get(id(opt))
            if clist is None or (state is not None and state.sentinel in clist.ids and state.sentinel not in leftovers):
                continue
            if state is not None:
                state.handle.remove()
                del self._states[id(opt)]
            sentinel = next((p for p in clist.params if p.requires_grad and p.is_leaf and id(p) not in leftovers
                             and not torch.nn.parameter.is_lazy(p)), None)
            if sentinel is not None:
                self._states[id(opt)] = self._hook_sentinel(opt, sentinel)

    def _hook_sentinel(self, opt: torch.optim.Optimizer, sentinel: torch.Tensor) -> _OptimizerSteps:
        tensor_ref, opt_ref = weakref.ref(sentinel), weakref.ref(opt)
        state = _OptimizerSteps(None, id(sentinel))

        def counted(grad: torch.Tensor) -> None:
            t = tensor_ref()
            if t is None or t.grad is not None:
                return  # a second backward into the same gradients (accumulation)
            version = t._version
            if version == state.version:
                state.skipped += 1
                if state.skipped == 1:
                    state.skipping_since = self.step_of()
            else:
                state.skipped = 0
            state.version = version
            state.cycles += 1
            if state.skipped < SKIPPED_AFTER or state.reported or state.dismissed:
                return
            self.alert.add(id(opt_ref()))
            if self.step_of() in (state.skipping_since, state.asked_step):
                # No check but the ones asked for came (attach(), `leafwatch run`): ask for one.
                state.asked_step = self.step_of() + 1
                optimizer = opt_ref()
                try:
                    if optimizer is not None:
                        torch.autograd.Variable._execution_engine.queue_callback(  # type: ignore[attr-defined]
                            lambda: self.ask_check(optimizer))
                except Exception as error:  # inside the user's backward: never stop it
                    if self.on_error is not None:
                        self.on_error("the skipped-step hook", error)

        state.handle = sentinel.register_hook(counted)
        return state

    def note_check(self, optimizer: torch.optim.Optimizer, clist: CheckList, index: int,
                   step: int) -> tuple[bool, Verdicts]:
        """A check of ``optimizer`` before its step: (whether the NaN/Inf check should run now, the verdicts).

        Skipped steps are reported once the NaN/Inf check finds a non-finite gradient among the
        optimizer's tensors (the GradScaler's reason to skip); after :data:`_EVIDENCE_CHECKS`
        forced checks without one, the run of skipped steps is let be (a loop that computes
        gradients without stepping, on purpose).
        """
        state = self._states.get(id(optimizer))
        if state is None:
            self.alert.discard(id(optimizer))
            return False, []
        skipped = state.skipped
        if skipped < SKIPPED_AFTER:
            state.dismissed, state.forced = False, 0
            self.alert.discard(id(optimizer))
            if state.reported:
                state.reported = False
                return False, [Verdict.resolve(("no_update", optimizer_name(index)), step)]
            return False, []
        if state.reported or state.dismissed:
            return False, []
        if not self.view.open_names("nonfinite_grad").isdisjoint(clist.names):
            state.reported = True
            return False, [Verdict.open(checks.steps_skipped(optimizer_name(index), clist.names, skipped=skipped,
                                                             since=state.skipping_since, step=step))]
        state.forced += 1
        state.dismissed = state.forced > _EVIDENCE_CHECKS
        return not state.dismissed, []

    def close(self) -> None:
        for state in self._states.values():
            state.handle.remove()
        self._states.clear()
        self.alert.clear()


class LoopWatch:
    """The three watches of one Monitor, behind the few calls its check makes.

    Args:
        view: The findings so far (read-only).
        ask_check, step_of, on_error: See :class:`SkippedSteps`.
    """

    def __init__(self, view: FindingsView, ask_check: Callable[[torch.optim.Optimizer], None],
                 step_of: Callable[[], int], on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.arrivals = ArrivalHooks()
        self.cleared = ClearedGradients(view)
        self.lrs = LearningRates()
        self.skips = SkippedSteps(view, ask_check, step_of, on_error)
        self._cleared_now: list[int] = []

    def judge(self, clist: CheckList, missing: list[int], index: int | None, step: int,
              optimizer: Any = None) -> tuple[list[int], Verdicts]:
        """The missing indices left once the cleared gradients are told apart, and the verdicts
        (the hot path: a healthy step, with no hook armed and nothing cleared, returns at the
        first test, which the check also reads in place to skip the call)."""
        cleared = self.cleared
        if not (self.arrivals.arrived or cleared.ongoing or cleared.all_cleared):
            return missing, []
        arrived = self.arrivals.take(clist.ids)
        if not (missing or self.cleared):
            return missing, []
        missing, cleared_ids, out = self.cleared.judge(clist, missing, arrived, optimizer_name(index), step, optimizer)
        self._cleared_now += cleared_ids
        return missing, out

    def about_to_step(self, optimizer: torch.optim.Optimizer, index: int, clist: CheckList, step: int,
                      inv: Any) -> tuple[bool, Verdicts]:
        """A check of ``optimizer`` before its step, called only when there is loop work to do (its
        ``clist.checks`` is 1 or a multiple of :data:`LR_READ_EVERY`, or ``skips.alert`` names an
        optimizer; the check reads that in place): the lrs (every few checks) and the skipped
        steps: (whether the NaN/Inf check should run now, the verdicts)."""
        checks_done = clist.checks
        out: Verdicts = []
        if checks_done == 1 or checks_done % LR_READ_EVERY == 0:
            out = self.lrs.read(optimizer, optimizer_name(index), checks_done, step,
                                inv.name if inv is not None else (lambda t: None))
        if id(optimizer) not in self.skips.alert:
            return False, out
        force, skipped = self.skips.note_check(optimizer, clist, index, step)
        return force, out + skipped

    def take_cleared(self) -> tuple[int, ...]:
        """The gradients found cleared since the last call (then forgotten): :meth:`rearm` hooks them too."""
        cleared, self._cleared_now = tuple(self._cleared_now), []
        return cleared

    def rearm(self, missing_ids: list[int], tensors: Mapping[int, torch.Tensor], cleared: tuple[int, ...] = ()) -> None:
        """After a check: hooks on the tensors missing a gradient and on those cleared."""
        self.arrivals.retarget({pid: tensors[pid] for pid in (*missing_ids, *cleared) if pid in tensors})

    def close(self) -> None:
        self.arrivals.disarm()
        self.skips.close()

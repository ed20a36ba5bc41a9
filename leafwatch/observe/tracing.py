"""Diagnostic forward hooks: what happened to a module during the forward pass.

Armed on every module from a Monitor's creation until its first check, so the first step is
fully explained; afterwards only on the modules that own a parameter that missed a gradient.
A hook records plain facts (it ran, with grad mode on or off, its output required grad, and a
tensor hook on that output tells whether backward reached it); the causes are worked out only
for the parameters that failed, when they failed.

The hooks are torch's global module forward hooks (:mod:`leafwatch.observe.hooks`), subscribed
while a module is armed and filtered by the armed modules: nothing is left on the user's modules,
so ``torch.save(model)``, ``pickle`` and ``copy.deepcopy`` of a module work while it is diagnosed
and a copy carries no leafwatch hook. On a healthy step nothing is armed and nothing is subscribed.

On instrumented forwards (from creation to the first check, and after a new miss or a new
structure until the next check) the top armed modules also run their forward under the cut
recorder (:mod:`leafwatch.observe.cuts`), so a parameter cut by a ``.detach()`` is explained by that line.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import cuts, follow, frames, functions, hooks
from .names import ancestors

if TYPE_CHECKING:
    from .inventory import Inventory

_CHECKPOINT_FILE = "torch/utils/checkpoint.py"
_MAX_ORDER = 100_000


@dataclasses.dataclass
class RunRecord:
    name: str
    calls: int = 0
    grad_enabled: bool = False
    in_checkpoint: bool = False
    output_requires_grad: bool = False
    backward_reached: bool = False
    order: int = -1
    output_storage: int = 0
    detached_inputs: frozenset[int] = frozenset()
    output_opaque: bool = False  # its output held no tensor the hook could see
    #: Storages of the inputs that required grad (whose outputs this module used).
    grad_inputs: frozenset[int] = frozenset()
    #: Its forward ran with tensors in ``_parameters`` other than its registered parameters
    #: (``torch.func.functional_call``, a TensorDict's weights swapped in, a vmapped copy).
    substituted: bool = False
    #: It ran inside the forward of this custom autograd.Function (with grad off, or switched on again there
    #: by ``torch.enable_grad()``), and whether its own parameters were among the tensors given to its ``apply``.
    in_function: functions.FunctionCall | None = None
    function_inputs: bool = False


def _first_tensor(value: Any, depth: int = 0, requires_grad: bool = True) -> torch.Tensor | None:
    """The first tensor (that requires grad) of an output, or of the parts of a container output (sequence,
    mapping, dataclass)."""
    if isinstance(value, torch.Tensor):
        return value if value.requires_grad or not requires_grad else None
    items: Any = ()
    if depth <= 3 and isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
    elif depth <= 3 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    for item in items:
        found = _first_tensor(item, depth + 1, requires_grad)
        if found is not None:
            return found
    return None


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # tensor subclasses without storage
        return 0


class Tracer:
    """Forward hooks on chosen modules, and what they saw since the last :meth:`reset`."""

    def __init__(self, on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.on_error = on_error
        #: Called when the forward of a top armed module begins (the arrival hooks are re-armed then when
        #: a parameter was swapped since they were armed).
        self.on_forward: Callable[[], None] | None = None
        self.records: dict[str, RunRecord] = {}
        #: The armed modules by name (the global hooks fire for these only).
        self.handles: dict[str, nn.Module] = {}
        self.order = 0  # the last record's place in the forward
        # The modules armed since the last reset, so whose hooks saw the whole step: the ones
        # armed at creation, and at each reset every module still armed.
        self.armed_since_reset: set[str] = set()
        self.checked_in_round: set[int | None] = set()  # the optimizers checked since the last reset
        #: Whether the next forward is instrumented (the recorder runs over it); :meth:`_subscribe` follows it.
        self.ops_wanted = False
        self._ops_next = False
        #: Whether a forward ran whole under the recorder since the last reset: then a tensor
        #: upstream of no recorded cut was seen not to be cut inside the forward.
        self.ops_traced = False
        #: A compiled model (``torch.compile``): the recorder would force a recompile, so it never runs.
        self.compiled = False
        self._recorder_broken = False  # it failed once: warned, never run again
        self.cuts: list[cuts.Cut] = []
        #: Where an op of zero gradient ran on a tensor that requires grad (kept for the whole run:
        #: the value checks that find its gradient exactly zero come steps later), by site.
        self.zero_ops: dict[Any, cuts.Cut] = {}
        #: Leaf tensors a forward switched to ``requires_grad`` in place, and where (kept for the run).
        self.switched_on: dict[int, cuts.SwitchedOn] = {}
        self._cut_index: dict[int, cuts.Cut] | None = None
        self._recorder: cuts.CutRecorder | None = None
        self._depth = 0
        #: The names of the top armed modules (no armed ancestor): the cut recorder runs over their forward.
        self.tops: set[str] = set()
        #: ``id(module)`` -> its armed names, and the ids of the top ones (the armed modules are held in
        #: :attr:`handles`, so an id here stays theirs).
        self._armed: dict[int, tuple[str, ...]] = {}
        self._top_ids: set[int] = set()
        #: The subscriptions to the global forward hooks: the records', and the recorder's around the tops.
        self._records_hook: Any = None
        self._tops_hooks: tuple[Any, ...] = ()
        #: Each armed module's registered parameters (attribute -> id), to tell weights swapped in.
        self._own: dict[str, dict[str, int]] = {}

    def retarget(self, wanted: dict[str, nn.Module], instrument: bool) -> None:
        """Keep hooks on exactly the ``wanted`` modules (arming the new ones); with ``instrument``
        (a new miss, a new structure), the forward after the next reset runs under the recorder."""
        self.disarm(set(self.handles) - set(wanted))
        self.arm(wanted, instrument=False)  # (those armed already are passed over)
        # The registered parameters, read again between steps (none is swapped in then): a
        # parameter replaced since the hooks were armed is no weight swapped in for a call.
        self._own = {n: _own_parameters(m) for n, m in self.handles.items()}
        self._ops_next = self._ops_next or (instrument and bool(wanted))

    def end_check(self, optimizer_index: int | None, n_optimizers: int) -> None:
        """After a check: forget what the hooks saw once every optimizer has been checked (one forward
        can serve several optimizers checked one at a time; one checked again before the others starts
        a new round, so nothing piles up). ``Checker._aim_diagnostics`` skips the call when it would do
        nothing (one optimizer; nothing armed, recorded or in a round): change the two tests together.
        """
        if optimizer_index is None or optimizer_index in self.checked_in_round \
                or len(self.checked_in_round) + 1 >= n_optimizers:
            if self.handles or self.records or self.armed_since_reset or self.order:
                self.reset()  # else there is nothing to forget (the healthy check: no hook armed)
            if self.checked_in_round:
                self.checked_in_round.clear()
        else:
            self.checked_in_round.add(optimizer_index)

    def arm(self, modules: dict[str, nn.Module], instrument: bool = True) -> None:
        """Hooks on ``modules``; with ``instrument``, the next forward runs under the cut recorder too."""
        for name, module in modules.items():
            if name in self.handles:
                continue
            self.handles[name] = module
            self._armed[id(module)] = (*self._armed.get(id(module), ()), name)
            self._own[name] = _own_parameters(module)
            self.armed_since_reset.add(name)
            if type(module).__name__ == "OptimizedModule":
                self.compiled = True
        if instrument and modules:
            self.ops_wanted = True
        self._hook_roots()  # (subscribes the hooks around the top modules, which start the recorder)

    def disarm(self, names: set[str] | None = None) -> None:
        for name in list(self.handles) if names is None else list(names):
            module = self.handles.pop(name, None)
            self._own.pop(name, None)
            if module is not None:
                kept = tuple(n for n in self._armed.pop(id(module), ()) if n != name)
                if kept:
                    self._armed[id(module)] = kept
        if not self.handles:
            self._stop_recorder()
        self._hook_roots()

    def reset(self) -> None:
        """Forget what was seen; the armed modules stay armed and will see the whole next step."""
        self.records = {}
        self.order = 0
        self.armed_since_reset = set(self.handles)
        self._stop_recorder()  # a forward that raised before its end, never left on the stack
        # Instrument the next forward after a new miss or a new structure, or when the one
        # wanted never ran (no forward of the armed modules since).
        self.ops_wanted = self._ops_next or (self.ops_wanted and not self.ops_traced)
        self._ops_next = False
        self.ops_traced = False
        self.cuts = []
        self._cut_index = None
        self._subscribe()

    # -- the cut recorder -------------------------------------------------------------------------
    def _hook_roots(self) -> None:
        """The top armed modules: those with no armed ancestor (the recorder's enter/leave hooks fire for them)."""
        self.tops = {n for n in self.handles
                     if not ((n != "" and "" in self.handles) or any(a in self.handles for a in ancestors(n)))}
        self._top_ids = {id(self.handles[n]) for n in self.tops}
        self._subscribe()

    def _subscribe(self) -> None:
        """Hold the global forward hooks this tracer needs now, and no other: the records' while a module is
        armed, the two around the top modules while the next forward may run under the recorder."""
        records = bool(self.handles)
        tops = records and (self._recorder is not None or self.ops_wanted and not self.compiled and not self._recorder_broken)
        if records != (self._records_hook is not None):
            if records:
                self._records_hook = hooks.MODULE_FORWARD.subscribe(self._on_forward, weakly=True)
            else:
                self._records_hook, handle = None, self._records_hook
                handle.remove()
        if tops != bool(self._tops_hooks):
            if tops:
                self._tops_hooks = (hooks.MODULE_FORWARD_PRE.subscribe(self.entered, weakly=True),
                                    hooks.MODULE_FORWARD_ALWAYS.subscribe(self._on_forward_end, weakly=True))
            else:
                handles, self._tops_hooks = self._tops_hooks, ()
                for handle in handles:
                    handle.remove()

    def entered(self, module: nn.Module, args: Any = ()) -> None:
        """The forward of ``module`` begins (the global pre-hook): for an armed top module, the cut recorder
        starts. Called directly when the global pre-hook was read before the hooks were armed (``leafwatch run``
        arms them in the global pre-hook of the first forward)."""
        if id(module) not in self._top_ids:
            return
        try:
            if self._recorder is not None:
                self._depth += 1  # a root called inside another (or inside itself)
                return
            if self.on_forward is not None:
                self.on_forward()
            if not self.ops_wanted or self.compiled or self._recorder_broken or getattr(module, "_compiled_call_impl", None) is not None \
                    or not torch.is_grad_enabled() or torch.is_inference_mode_enabled() or cuts.compiling():
                return
            recorder = cuts.CutRecorder(first_order=len(self.cuts), follow=self._follow)
            recorder.__enter__()
            self._recorder, self._depth = recorder, 1
        except Exception as error:
            self._recorder_failed(error)

    def _on_forward_end(self, module: nn.Module, args: Any, output: Any) -> None:
        if id(module) not in self._top_ids or self._recorder is None:
            return
        self._depth -= 1
        if self._depth <= 0:
            self._stop_recorder(completed=True)

    def _stop_recorder(self, completed: bool = False) -> None:
        recorder, self._recorder, self._depth = self._recorder, None, 0
        if recorder is None:
            return
        try:
            cuts.leave(recorder)
            found = recorder.finish()
            if recorder.error is not None:
                raise recorder.error
        except Exception as error:
            self._recorder_failed(error)
            return
        if completed:
            self.cuts.extend(found)
            self._cut_index = None
            self.ops_traced = True
            for key, site in recorder.zero_ops.items():
                if len(self.zero_ops) < cuts.MAX_SITES:
                    self.zero_ops.setdefault(key, site)
            for key, seen in recorder.switched_on.items():
                if len(self.switched_on) < cuts.MAX_SITES:
                    self.switched_on[key] = seen

    def switched_on_by_library(self, t: torch.Tensor) -> cuts.Place | None:
        """Where a library's code (not the user's) switched ``t`` to ``requires_grad`` in place during an
        instrumented forward (vector-quantize-pytorch's ``loss = self.zero; loss.requires_grad_()``); None
        when that was not seen, or the user's own line did it."""
        seen = self.switched_on.get(id(t))
        if seen is None or seen.tensor() is not t or seen.called_from is None:
            return None
        return seen.place

    def added_to_a_loss(self, t: torch.Tensor) -> bool:
        """Whether an instrumented forward switched ``t`` to ``requires_grad`` in place and then only added it to
        other tensors (``loss = self.zero; loss.requires_grad_(); loss = loss + term``): a loss's starting value,
        whose gradient is the loss's own, the same at every step, whoever's line switched it on."""
        seen = self.switched_on.get(id(t))
        return seen is not None and seen.tensor() is t and seen.added_only

    def switched_on_by_user(self, t: torch.Tensor) -> cuts.Place | None:
        """Where the user's own line switched ``t`` to ``requires_grad`` in place during an instrumented forward."""
        seen = self.switched_on.get(id(t))
        return seen.place if seen is not None and seen.tensor() is t and seen.called_from is None else None

    def _recorder_failed(self, error: BaseException) -> None:
        """What the recorder saw is incomplete: no cut is named from it, and it stops for good (called
        with no recorder running: it failed to start, or :meth:`_stop_recorder` took it off)."""
        self._recorder_broken = True  # never instrument again: one warning, not one per step
        self.ops_wanted = False
        self._subscribe()
        if self.on_error is not None and isinstance(error, Exception):
            self.on_error("the cut recorder", error)

    def cut_of(self, tensor_id: int) -> cuts.Cut | None:
        """The cut recorded upstream of ``tensor_id`` since the last reset (the most telling one
        when several: the user's own line before a library's, a graph rewired by hand before a
        number read out, then the first seen)."""
        if self._cut_index is None:
            ordered = sorted(self.cuts, key=lambda c: (c.site.called_from is not None, c.site.rank, c.order),
                             reverse=True)
            self._cut_index = {leaf: cut for cut in ordered for leaf in cut.leaves}
        return self._cut_index.get(tensor_id)

    def _on_forward(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """The global forward hook: what an armed module's forward did (any other module: nothing)."""
        names = self._armed.get(id(module))
        if names is None:
            return
        for name in names:
            # The hook runs inside the user's forward: a failure here must never stop training.
            try:
                if functions.in_backward():
                    return  # re-run for a backward (an adjoint, a recomputation): not the step's forward
                self._record_run(name, module, args, output)
            except Exception as error:
                # What this hook saw is incomplete: explain nothing from it rather than guess.
                self.records.pop(name, None)
                self.armed_since_reset.discard(name)
                if self.on_error is not None:
                    self.on_error("a diagnostic forward hook", error)

    def _record_run(self, name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        grad_on = torch.is_grad_enabled()
        if not grad_on and not module.training:
            return  # an evaluation pass between steps (a fixed teacher): not what the training step did
        record = self.records.get(name)
        if record is None:
            record = self.records[name] = RunRecord(name)
        record.calls += 1
        record.substituted = record.substituted or _swapped_in(module, self._own.get(name))
        if self.order < _MAX_ORDER:
            self.order += 1
            record.order = self.order
        _observe_run(record, module, args, output, grad_on)

    def _follow(self, t: torch.Tensor) -> follow.Ref:
        """A tensor the recorder saw switched to requires_grad, followed through the armed module (or a
        module under a top one) that holds it, else weakly (a tensor made in the forward)."""
        tops = [self.handles[n] for n in self.tops if n in self.handles]
        return follow.follow(t, itertools.chain(self.handles.values(), *(top.modules() for top in tops)))


def _observe_run(record: RunRecord, module: nn.Module, args: tuple[Any, ...], output: Any, grad_on: bool) -> None:
    """What one forward of an armed module shows: its grad mode, its inputs, its output (and a hook on it)."""
    if grad_on:
        record.grad_enabled = True
        if record.calls == 1:  # (once per record: a Function's forward under torch.enable_grad())
            _read_function(record, module, sys._getframe(1))
    else:
        record.in_checkpoint = record.in_checkpoint or frames.on_stack(
            sys._getframe(1), 40, lambda f: f.replace("\\", "/").endswith(_CHECKPOINT_FILE))
        if record.in_function is None:
            _read_function(record, module, sys._getframe(1))
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    record.grad_inputs |= {_storage(a) for a in inputs if a.requires_grad}
    record.detached_inputs |= {_storage(a) for a in inputs if not a.requires_grad}
    produced = _first_tensor(output, requires_grad=False)
    if produced is not None:
        record.output_storage = _storage(produced)
    out = _first_tensor(output)
    if out is None and produced is None:
        record.output_opaque = True
    if out is not None and grad_on:
        record.output_requires_grad = True
        if out.is_leaf:
            # A module that returns a leaf (its own parameter): a hook there would stay on
            # that tensor for good. It is explained only when its .grad stays None, that
            # is when backward did not reach it.
            return
        try:
            out.register_hook(_reached(record))
        except RuntimeError:
            pass


def _read_function(record: RunRecord, module: nn.Module, frame: Any) -> None:
    """The custom autograd.Function whose forward a module runs inside, if any (torch's reentrant checkpoint
    keeps its own cause), and whether it was given the module's parameters: read for a module that runs with
    grad off, and at the first call of one that runs with grad on (``torch.enable_grad()`` in that forward)."""
    call = functions.function_call(frame)
    if call is not None and not call.checkpoint:
        own = {id(p) for p in module._parameters.values() if p is not None}
        record.in_function, record.function_inputs = call, bool(own) and own <= call.inputs


def _own_parameters(module: nn.Module) -> dict[str, int]:
    return {a: id(p) for a, p in module._parameters.items() if p is not None}


def _swapped_in(module: nn.Module, own: dict[str, int] | None) -> bool:
    """Whether the module runs with tensors other than its registered parameters (read at arming)."""
    return own is not None and any(p is not None and own.get(a) != id(p) for a, p in module._parameters.items())


def modules_owning(ids: Iterable[int], inv: Inventory) -> dict[str, nn.Module]:
    """The modules (with their ancestors) that own the parameters ``ids``, by qualified name."""
    wanted: dict[str, nn.Module] = {}
    for pid in ids:
        info = inv.params.get(pid)
        if info is None:
            continue
        for name in ("", *reversed(ancestors(info.module)), info.module):
            module = inv.modules.get(name)
            if module is not None:
                wanted[name] = module
    return wanted


def _reached(record: RunRecord):
    # Marked unserializable: a module output the user saves (``torch.save(features)``) gets no warning for it.
    @torch.utils.hooks.unserializable_hook
    def mark(grad: torch.Tensor | None) -> None:
        if grad is not None:  # torch calls tensor hooks with None too: that is no gradient
            record.backward_reached = True

    return mark

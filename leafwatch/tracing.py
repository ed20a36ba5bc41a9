"""Diagnostic forward hooks: what happened to a module during the forward pass.

Armed on every module from a Monitor's creation until its first check, so the first step is
fully explained; afterwards only on the modules that own a parameter that missed a gradient.
A hook records plain facts (it ran, with grad mode on or off, its output required grad, and a
tensor hook on that output tells whether backward reached it); the causes are worked out only
for the parameters that failed, when they failed.

On instrumented forwards (from creation to the first check, and after a new miss or a new
structure until the next check) the top armed modules also run their forward under the cut
recorder (:mod:`leafwatch.cuts`), so a parameter cut by a ``.detach()`` is explained by that line.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import cuts, fixes
from .report.names import ancestors

if TYPE_CHECKING:
    from .inventory import Inventory

_CHECKPOINT_FILE = "torch/utils/checkpoint.py"
_MAX_ORDER = 100_000


@dataclasses.dataclass
class RunRecord:
    name: str
    calls: int = 0
    grad_enabled: bool = False
    grad_disabled: bool = False
    in_checkpoint: bool = False
    output_requires_grad: bool = False
    inputs_require_grad: bool = False
    backward_reached: bool = False
    order: int = -1
    output_storage: int = 0
    detached_inputs: frozenset[int] = frozenset()
    output_opaque: bool = False  # its output held no tensor the hook could see
    #: Storages of the inputs that required grad (whose outputs this module used).
    grad_inputs: frozenset[int] = frozenset()


def _items(value: Any) -> list[Any] | None:
    """The parts of a container output (sequence, mapping, dataclass); None for anything else."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, dict):
        return list(value.values())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    return None


def _first_tensor(value: Any, depth: int = 0, requires_grad: bool = True) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value if value.requires_grad or not requires_grad else None
    items = _items(value) if depth <= 3 else None
    for item in items or ():
        found = _first_tensor(item, depth + 1, requires_grad)
        if found is not None:
            return found
    return None


def _inputs_require_grad(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # tensor subclasses without storage
        return 0


def _first_any_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def _in_reentrant_checkpoint() -> bool:
    frame = sys._getframe(2)
    for _ in range(40):
        if frame is None:
            return False
        if frame.f_code.co_filename.replace("\\", "/").endswith(_CHECKPOINT_FILE):
            return True
        frame = frame.f_back
    return False


class Tracer:
    """Forward hooks on chosen modules, and what they saw since the last :meth:`reset`."""

    def __init__(self, on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.on_error = on_error
        self.records: dict[str, RunRecord] = {}
        self.handles: dict[str, Any] = {}
        self._counter = 0
        # The modules armed since the last reset, so whose hooks saw the whole step: the ones
        # armed at creation, and at each reset every module still armed.
        self.armed_since_reset: set[str] = set()
        self._checked_in_round: set[int | None] = set()
        #: Modules that ran in eval mode under no_grad since the last reset (a fixed teacher).
        self.eval_runs: set[str] = set()
        # The cut recorder: a TorchFunctionMode over the forward of the top armed modules, on
        # instrumented forwards only (from creation, and after a new miss or a structure change,
        # until the next check).
        #: Whether the next forward is instrumented (the recorder runs over it).
        self.ops_wanted = False
        self._ops_next = False
        #: Whether a forward ran whole under the recorder since the last reset: then a tensor
        #: upstream of no recorded cut was seen not to be cut inside the forward.
        self.ops_traced = False
        #: A compiled model (``torch.compile``): the recorder would force a recompile, so it never runs.
        self.compiled = False
        self._recorder_broken = False  # it failed once: warned, never run again
        self.cuts: list[cuts.Cut] = []
        self._cut_index: dict[int, cuts.Cut] | None = None
        self._recorder: cuts.CutRecorder | None = None
        self._depth = 0
        self._root_handles: dict[str, tuple[Any, Any]] = {}
        self._modules: dict[str, nn.Module] = {}

    @property
    def armed(self) -> set[str]:
        return set(self.handles)

    def retarget(self, wanted: dict[str, nn.Module], instrument: bool = True) -> None:
        """Keep hooks on exactly the ``wanted`` modules (arming the new ones); with ``instrument``
        (a new miss, a new structure), the forward after the next reset runs under the recorder."""
        armed = self.armed
        self.disarm(armed - set(wanted))
        self.arm({k: v for k, v in wanted.items() if k not in armed}, instrument=False)
        self._ops_next = self._ops_next or (instrument and bool(wanted))

    def end_check(self, optimizer_index: int | None, n_optimizers: int) -> None:
        """After a check: forget what the hooks saw once every optimizer has been checked.

        With several optimizers checked one at a time, one forward pass can serve all their
        checks. An optimizer checked again before the others starts a new round, so what the
        hooks saw never piles up over steps (a loop that checks only one of its optimizers).
        """
        if optimizer_index is None or optimizer_index in self._checked_in_round \
                or len(self._checked_in_round) + 1 >= n_optimizers:
            if self.handles or self.records or self.eval_runs or self.armed_since_reset or self._counter:
                self.reset()  # else there is nothing to forget (the healthy check: no hook armed)
            if self._checked_in_round:
                self._checked_in_round.clear()
        else:
            self._checked_in_round.add(optimizer_index)

    def arm(self, modules: dict[str, nn.Module], instrument: bool = True) -> None:
        """Hooks on ``modules``; with ``instrument``, the next forward runs under the cut recorder too."""
        for name, module in modules.items():
            if name in self.handles:
                continue
            self.handles[name] = module.register_forward_hook(self._make_hook(name))
            self._modules[name] = module
            self.armed_since_reset.add(name)
            if type(module).__name__ == "OptimizedModule":
                self.compiled = True
        if instrument and modules:
            self.ops_wanted = True
        self._hook_roots()

    def disarm(self, names: set[str] | None = None) -> None:
        for name in list(self.handles) if names is None else list(names):
            handle = self.handles.pop(name, None)
            self._modules.pop(name, None)
            if handle is not None:
                handle.remove()
        self._hook_roots()
        if not self.handles:
            self._stop_recorder()

    def reset(self) -> None:
        """Forget what was seen; the armed modules stay armed and will see the whole next step."""
        self.records = {}
        self.eval_runs = set()
        self._counter = 0
        self.armed_since_reset = set(self.handles)
        self._stop_recorder()  # a forward that raised before its end, never left on the stack
        # Instrument the next forward after a new miss or a new structure, or when the one
        # wanted never ran (no forward of the armed modules since).
        self.ops_wanted = self._ops_next or (self.ops_wanted and not self.ops_traced)
        self._ops_next = False
        self.ops_traced = False
        self.cuts = []
        self._cut_index = None

    # -- the cut recorder -------------------------------------------------------------------------
    def _hook_roots(self) -> None:
        """Enter/leave hooks on the top armed modules: those with no armed ancestor."""
        tops = {n for n in self.handles if not (n != "" and "" in self.handles) or any(a in self.handles for a in ancestors(n))}
        for name in list(self._root_handles):
            if name not in tops:
                pre, post = self._root_handles.pop(name)
                pre.remove()
                post.remove()
        for name in tops - set(self._root_handles):
            module = self._modules[name]
            pre = module.register_forward_pre_hook(self._enter_forward)
            post = module.register_forward_hook(self._leave_forward, always_call=True)
            self._root_handles[name] = (pre, post)

    def _enter_forward(self, module: nn.Module, args: Any) -> None:
        try:
            if self._recorder is not None:
                self._depth += 1  # a root called inside another (or inside itself)
                return
            if not self.ops_wanted or self.compiled or self._recorder_broken or getattr(module, "_compiled_call_impl", None) is not None \
                    or not torch.is_grad_enabled() or torch.is_inference_mode_enabled() or cuts.compiling():
                return
            recorder = cuts.CutRecorder(first_order=len(self.cuts))
            recorder.__enter__()
            self._recorder, self._depth = recorder, 1
        except Exception as error:
            self._recorder_failed(error)

    def _leave_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._recorder is None:
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

    def _recorder_failed(self, error: BaseException) -> None:
        """What the recorder saw is incomplete: no cut is named from it, and it stops for good."""
        if self._recorder is not None:
            recorder, self._recorder, self._depth = self._recorder, None, 0
            try:
                cuts.leave(recorder)
            except Exception:
                pass
        self._recorder_broken = True  # never instrument again: one warning, not one per step
        self.ops_wanted = False
        if self.on_error is not None and isinstance(error, Exception):
            self.on_error("the cut recorder", error)

    def cut_of(self, tensor_id: int) -> cuts.Cut | None:
        """The cut recorded upstream of ``tensor_id`` since the last reset (the most telling one
        when several: the user's own line before a library's, a graph rewired by hand before a
        number read out, then the first seen)."""
        if self._cut_index is None:
            index: dict[int, cuts.Cut] = {}
            for cut in sorted(self.cuts, key=lambda c: (c.site.called_from is not None, c.site.rank, c.order),
                              reverse=True):
                index.update(dict.fromkeys(cut.leaves, cut))
            self._cut_index = index
        return self._cut_index.get(tensor_id)

    def _make_hook(self, name: str):
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            # The hook runs inside the user's forward: a failure here must never stop training.
            try:
                record_run(module, args, output)
            except Exception as error:
                # What this hook saw is incomplete: explain nothing from it rather than guess.
                self.records.pop(name, None)
                self.armed_since_reset.discard(name)
                if self.on_error is not None:
                    self.on_error("a diagnostic forward hook", error)

        def record_run(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            grad_on = torch.is_grad_enabled()
            if not grad_on and not module.training:
                self.eval_runs.add(name)
                return  # an evaluation pass between steps: not what the training step did
            record = self.records.get(name)
            if record is None:
                record = self.records[name] = RunRecord(name)
            record.calls += 1
            if self._counter < _MAX_ORDER:
                self._counter += 1
                record.order = self._counter
            if grad_on:
                record.grad_enabled = True
            else:
                record.grad_disabled = True
                record.in_checkpoint = record.in_checkpoint or _in_reentrant_checkpoint()
            if _inputs_require_grad(args):
                record.inputs_require_grad = True
            with_grad = {_storage(a) for a in args if isinstance(a, torch.Tensor) and a.requires_grad}
            if with_grad:
                record.grad_inputs = record.grad_inputs | with_grad
            no_grad = [a for a in args if isinstance(a, torch.Tensor) and not a.requires_grad]
            if no_grad:
                record.detached_inputs = record.detached_inputs | {_storage(a) for a in no_grad}
            produced = _first_any_tensor(output)
            if produced is None:
                produced = _first_tensor(output, requires_grad=False)  # a dict or dataclass output
            if produced is not None:
                record.output_storage = _storage(produced)
            out = _first_tensor(output)
            if out is None and _first_tensor(output, requires_grad=False) is None:
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

        return hook


def modules_owning(ids: Iterable[int], inv: Inventory) -> dict[str, nn.Module]:
    """The modules (with their ancestors) that own the parameters ``ids``, by qualified name."""
    wanted: dict[str, nn.Module] = {}
    for pid in ids:
        info = inv.params.get(pid)
        if info is None:
            continue
        parts = info.module.split(".") if info.module else []
        for depth in range(len(parts) + 1):
            name = ".".join(parts[:depth])
            module = inv.modules.get(name)
            if module is not None:
                wanted[name] = module
    return wanted


def _reached(record: RunRecord):
    def mark(grad: torch.Tensor | None) -> None:
        if grad is not None:  # torch calls tensor hooks with None too: that is no gradient
            record.backward_reached = True

    return mark


def _is_descendant(name: str, ancestor: str) -> bool:
    return ancestor == "" or name.startswith(ancestor + ".")


@dataclasses.dataclass(frozen=True)
class Explanation:
    cause: str
    fix: str
    #: A short stable tag: never_ran, grad_disabled, checkpoint, detached, data_access, rewrapped,
    #: unused, unused_output.
    reason: str
    #: The mistake this tensor shares with others (an observed cut: "`.detach()` at model.py:13").
    group: str | None = None


#: What to change at a cut's line, by op.
_CUT_FIXES = {
    "`.detach()`": "remove the `.detach()` at {at} (detach only a copy kept for logging or a target, "
                   "never the tensor that feeds the loss)",
    "`.detach_()`": "remove the `.detach_()` at {at} (it cuts the tensor in place: detach a copy for "
                    "logging or a target, never the tensor that feeds the loss)",
    "`.data`": "use the tensor itself, not `.data`, at {at}",
    "`torch.no_grad()`": "move the computation that feeds the loss out of the `torch.no_grad()` block at {at}",
    "`torch.inference_mode()`": "move the computation that feeds the loss out of the "
                                "`torch.inference_mode()` block at {at}",
    "`torch.set_grad_enabled(False)`": "keep grad mode on for the computation that feeds the loss: do not "
                                       "switch it off at {at}",
}
_VALUE_FIX = ("keep the values a tensor at {at}: use torch ops on the tensor itself, not {op} (a Python "
              "number, list or NumPy array has no autograd graph, and a tensor made from it is a new leaf)")
_GRAD_OFF_FIX = "keep grad mode on for the computation that feeds the loss: do not switch it off at {at}"
#: The reason tag of a cut, by op (the tags the module-level causes use).
_CUT_REASONS = {"`.detach()`": "detached", "`.detach_()`": "detached", "`.data`": "data_access",
                "`torch.no_grad()`": "detached", "`torch.inference_mode()`": "detached",
                "`torch.set_grad_enabled(False)`": "detached", "grad mode off": "detached"}


def explain_cut(param_name: str, cut: cuts.Cut, tensor_id: int, attribute: str = "") -> Explanation:
    """A parameter upstream of a cut the recorder saw: the op and its line, and what to change there."""
    site = cut.site
    at = str(site.place)
    fix = _CUT_FIXES.get(site.op, _VALUE_FIX if site.rank else _GRAD_OFF_FIX).format(at=at, op=site.op)
    if tensor_id in cut.direct and attribute and site.op in ("`.data`", "`.detach()`"):
        fix = f"use `{attribute}` itself, not `{attribute}{site.op.strip('`')}`, at {at}"
    if site.called_from is not None:
        fix = (f"{fix}: it runs inside a library, reached from your call at {site.called_from}; change that "
               "call (its arguments or where you call it) so its output keeps the graph")
    if _CUT_REASONS.get(site.op) == "detached" and "detach" not in site.op:
        how = "the ops run there on values computed from it record no autograd graph"
    else:
        how = "what comes out of that op carries no autograd graph back to it"
    return Explanation(
        cause=f"cut by {site.described()}: `{param_name}` is used before that point of the forward, and {how}, "
        "so backward never reaches it (leafwatch saw the op run).",
        fix=fix,
        reason=_CUT_REASONS.get(site.op, "rewrapped"),
        group=site.label,
    )


def called_directly(param_name: str, module_name: str) -> Explanation:
    """A module whose other parameters got gradients but whose forward hooks never fired: it is
    called through ``.forward()`` directly, where module hooks cannot see."""
    shown = f"`{module_name}`" if module_name else "the root module"
    return Explanation(
        cause=f"`{param_name}` is not used in the computation of the loss. {shown}'s other parameters got "
        f"gradients, but its forward hooks never ran: it is called through `.forward()` directly (or its "
        "parameters are used outside its forward), so leafwatch cannot say more about where.",
        fix=f"use `{param_name}` in the forward pass, or delete it (or freeze it with `requires_grad_(False)`); "
        "call the module itself, not its `.forward`, so that hooks see it",
        reason="unused",
    )


def explain_missing(
    param_name: str,
    module_name: str,
    attribute: str,
    records: dict[str, RunRecord],
    armed: set[str],
    modules: dict[str, nn.Module] | None = None,
    *,
    ops_traced: bool = False,
) -> Explanation | None:
    """Why a parameter of ``module_name`` got no gradient, from what the module hooks saw; None if
    unknown. ``ops_traced``: the cut recorder watched the forward and saw no cut upstream of it."""
    if module_name not in armed or not records:
        # Not watched for the whole step, or no armed module ran at all: the forward pass may
        # have happened before the hooks were armed, so nothing can be said.
        return None
    record = records.get(module_name)
    shown = f"`{module_name}`" if module_name else "the root module"
    if record is None:
        return _did_not_run(param_name, module_name, shown, records, modules)
    if not record.grad_enabled:
        return _ran_without_autograd(shown, record)
    if not record.output_requires_grad:
        if record.output_opaque:
            return None  # an output of a type the hook cannot look into: nothing to conclude
        return Explanation(
            cause=f"{shown} ran with gradients on, but its output does not require grad: `{param_name}` "
            "is used through `.data`, `.detach()` or a rewrap that makes a new tensor from its values "
            f"(`torch.tensor({attribute})`, `torch.tensor({attribute}.tolist())`, a NumPy round trip) inside its forward.",
            fix=f"use `{attribute}` itself in forward, not `{attribute}.data` / `{attribute}.detach()` / "
            f"`torch.tensor({attribute})`",
            reason="data_access",
        )
    if not record.backward_reached:
        return _not_reached(shown, record, records, ops_traced)
    return Explanation(
        cause=f"{shown} ran and backward reached its output, but its forward does not use `{attribute}` "
        f"itself: it is unused, or used through `.data`, `.detach()` or a rewrap that makes a new tensor "
        f"from its values (`torch.tensor({attribute}.tolist())`, `torch.tensor({attribute})`, a NumPy round trip).",
        fix=f"use `{attribute}` itself in {shown}'s forward (no `.data`/`.detach()`/`torch.tensor({attribute})`), or delete it",
        reason="unused",
    )

def _did_not_run(param_name: str, module_name: str, shown: str, records: dict[str, RunRecord],
                 modules: dict[str, nn.Module] | None) -> Explanation:
    """The module holding the parameter ran no forward of its own: unused, or never called."""
    ran_below = [r for n, r in records.items() if n != module_name and _is_descendant(n, module_name)]
    if ran_below or module_name == "":
        return Explanation(
            cause=f"`{param_name}` is never used in the computation of the loss "
            f"({shown} did not run a forward of its own that uses it).",
            fix=f"use `{param_name}` in the forward pass, or delete it (or set requires_grad=False if it is frozen on purpose)",
            reason="unused",
        )
    parents = [r for n, r in records.items() if _is_descendant(module_name, n) and n != module_name]
    parent = max(parents, key=lambda r: len(r.name), default=None)
    parent_name = f"`{parent.name}`" if parent and parent.name else "the root module"
    where = f" ({parent_name} ran, but did not call it)" if parent else ""
    call = f"`{fixes.module_code(fixes.module_to_call(module_name, records, modules))}`" if module_name else shown
    return Explanation(
        cause=f"module {shown} never ran in this step's forward{where}.",
        fix=f"call {call} in forward(), or remove it (or freeze it with requires_grad_(False) if that is intended)",
        reason="never_ran",
    )


def _ran_without_autograd(shown: str, record: RunRecord) -> Explanation:
    """The module ran with gradients disabled: ``no_grad`` / ``inference_mode``, or a reentrant checkpoint."""
    if record.in_checkpoint:
        return Explanation(
            cause=f"{shown} ran inside a reentrant `torch.utils.checkpoint` whose inputs do not "
            "require grad, so it ran without autograd and backward never recomputes it.",
            fix="pass `use_reentrant=False` to your `checkpoint` call, or make the checkpoint's input require grad",
            reason="checkpoint",
        )
    return Explanation(
        cause=f"{shown} ran with gradients disabled (inside `torch.no_grad()` or `torch.inference_mode()`).",
        fix=f"call {shown} outside `torch.no_grad()` during training",
        reason="grad_disabled",
    )


def _not_reached(shown: str, record: RunRecord, records: dict[str, RunRecord], ops_traced: bool) -> Explanation:
    """Backward never reached a module's output: what the module hooks saw of it, and that the exact
    point is unknown (a cut the recorder saw is named by :func:`explain_cut` instead)."""
    unseen = _UNSEEN_INSIDE if ops_traced else _UNSEEN
    cut = _detached_after(record, records)
    if cut is not None:
        return Explanation(
            cause=f"{shown} ran and its output required grad, but backward never reached that output: "
            f"`{cut.name}` received it detached (the same storage without grad). The cut is between {shown} "
            f"and `{cut.name}`: a `.detach()`, `torch.no_grad()` or a NumPy round trip (`.numpy()` and "
            f"`torch.from_numpy()` share the storage). {unseen}",
            fix=f"pass {shown}'s output to `{cut.name}` as it is: remove the `.detach()` / `torch.no_grad()` / NumPy step between them",
            reason="detached",
        )
    users = [r for r in _later(record, records) if record.output_storage and record.output_storage in r.grad_inputs]
    if users:
        user = min(users, key=lambda r: r.order)
        return Explanation(
            cause=f"{shown} ran and its output required grad, and `{user.name}` used it, but backward never "
            f"reached it: what `{user.name}` made from it does not reach the loss (nothing in the loss uses it, or "
            f"it was cut after `{user.name}`). {unseen}",
            fix=f"keep torch ops from `{user.name}`'s output to the loss: remove the `.detach()`/`.item()`/"
            "`.tolist()`/NumPy/`torch.tensor` rewrap step after it",
            reason="detached",
        )
    after = _next_module(record, records)
    if after is None:
        # No module the hooks watch ran after it: a cut and an unused output look the same to them.
        return Explanation(
            cause=f"{shown} ran and its output required grad, but backward never reached that output, and no "
            "module that leafwatch watches ran after it: it was cut from the loss outside any module, or "
            f"nothing in the loss uses it. {unseen}",
            fix=f"keep torch ops from {shown}'s output to the loss (remove the `.detach()`/`.item()`/NumPy/"
            f"`torch.tensor` rewrap step after it), or remove {shown} if its output is not needed",
            reason="detached",
        )
    between = f" between {shown} and `{after.name}` (the next module that ran)"
    return Explanation(
        cause=f"{shown} ran and its output required grad, but backward never reached that output: nothing in "
        f"the loss uses it (an output computed and ignored, like a pooler whose output the loss never reads), "
        f"or it was cut{between}. {unseen}",
        fix=f"use {shown}'s output in the loss, or remove {shown} (or ignore its parameters with "
        f"`ignore=[\"{record.name + '.*' if record.name else '*'}\"]`) if its output is not needed; if it should "
        f"feed the loss, look{between} for the cut",
        reason="unused_output",
    )


#: What the cut recorder adds to a cause it has no cut for.
_UNSEEN = ("Where exactly is unknown: leafwatch did not watch the ops of this step (it records the ops "
           "that cut a graph (`.detach()`, `.data`, `.item()`, `.tolist()`, `torch.tensor(...)`, "
           "`torch.no_grad()`) on the first step and after a new miss, inside the model's own forward, "
           "never in a compiled module), or the cut left no trace it can see (`torch.from_numpy`).")
_UNSEEN_INSIDE = ("No op that cuts a graph (`.detach()`, `.data`, `.item()`, `.tolist()`, `torch.tensor(...)`, "
                  "`torch.no_grad()`) ran on it inside the model's forward: where it was cut is unknown (outside "
                  "the forward, in the training loop, or by a step that leaves no trace such as `torch.from_numpy`).")


def _later(record: RunRecord, records: dict[str, RunRecord]) -> list[RunRecord]:
    return [r for r in records.values() if r.order > record.order
            and not _is_descendant(r.name, record.name) and not _is_descendant(record.name, r.name)]


def _next_module(record: RunRecord, records: dict[str, RunRecord]) -> RunRecord | None:
    return min(_later(record, records), key=lambda r: r.order, default=None)


def _detached_after(record: RunRecord, records: dict[str, RunRecord]) -> RunRecord | None:
    """The first later module that received ``record``'s output detached (the same storage without
    grad). A tensor of the same shape is no evidence: a rewrap is named only when the recorder saw it."""
    later = _later(record, records)
    if record.output_storage:
        detached = [r for r in later if record.output_storage in r.detached_inputs]
        if detached:
            return min(detached, key=lambda r: r.order)
    return None

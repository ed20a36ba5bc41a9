"""Diagnostic forward hooks: what happened to a module during the forward pass.

Armed on every module from a Monitor's creation until its first check, so the first step is
fully explained; afterwards only on the modules that own a parameter that missed a gradient.
A hook records plain facts (it ran, with grad mode on or off, its output required grad, and a
tensor hook on that output tells whether backward reached it); the causes are worked out only
for the parameters that failed, when they failed.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

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
    output_shape: tuple[int, ...] | None = None
    #: (shape, storage) of floating-point inputs without grad while grad was on.
    fresh_input_shapes: frozenset[tuple[tuple[int, ...], int]] = frozenset()
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

    @property
    def armed(self) -> set[str]:
        return set(self.handles)

    def retarget(self, wanted: dict[str, nn.Module]) -> None:
        """Keep hooks on exactly the ``wanted`` modules (arming the new ones)."""
        armed = self.armed
        self.disarm(armed - set(wanted))
        self.arm({k: v for k, v in wanted.items() if k not in armed})

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

    def arm(self, modules: dict[str, nn.Module]) -> None:
        for name, module in modules.items():
            if name in self.handles:
                continue
            self.handles[name] = module.register_forward_hook(self._make_hook(name))
            self.armed_since_reset.add(name)

    def disarm(self, names: set[str] | None = None) -> None:
        for name in list(self.handles) if names is None else list(names):
            handle = self.handles.pop(name, None)
            if handle is not None:
                handle.remove()

    def reset(self) -> None:
        """Forget what was seen; the armed modules stay armed and will see the whole next step."""
        self.records = {}
        self.eval_runs = set()
        self._counter = 0
        self.armed_since_reset = set(self.handles)

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
                if grad_on:
                    fresh = {(tuple(a.shape), _storage(a)) for a in no_grad if a.is_floating_point()}
                    if fresh:
                        record.fresh_input_shapes = record.fresh_input_shapes | fresh
            produced = _first_any_tensor(output)
            if produced is None:
                produced = _first_tensor(output, requires_grad=False)  # a dict or dataclass output
            if produced is not None:
                record.output_storage = _storage(produced)
                record.output_shape = tuple(produced.shape)
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
    def mark(grad: torch.Tensor) -> None:
        record.backward_reached = True

    return mark


def _is_descendant(name: str, ancestor: str) -> bool:
    return ancestor == "" or name.startswith(ancestor + ".")


@dataclasses.dataclass(frozen=True)
class Explanation:
    cause: str
    fix: str
    reason: str  # a short stable tag: never_ran, grad_disabled, checkpoint, detached, data_access, unused


def called_directly(param_name: str, module_name: str) -> Explanation:
    """A module whose other parameters got gradients but whose forward hooks never fired: it is
    called through ``.forward()`` directly, where module hooks cannot see."""
    shown = f"`{module_name}`" if module_name else "the root module"
    return Explanation(
        cause=f"`{param_name}` is not used in the computation of the loss. {shown}'s other parameters got "
        f"gradients, but its forward hooks never ran: it is called through `.forward()` directly (or its "
        "parameters are used outside its forward), so leafwatch cannot say more about where.",
        fix=f"use `{param_name}` in the forward pass, or delete it (or freeze it with `requires_grad_(False)`); "
        f"call the module itself (`{module_name or 'model'}(x)`, not `.forward(x)`) so that hooks see it",
        reason="unused",
    )


def explain_missing(
    param_name: str,
    module_name: str,
    attribute: str,
    records: dict[str, RunRecord],
    armed: set[str],
) -> Explanation | None:
    """Why a parameter of ``module_name`` got no gradient, from what the hooks saw; None if unknown."""
    if module_name not in armed or not records:
        # Not watched for the whole step, or no armed module ran at all: the forward pass may
        # have happened before the hooks were armed, so nothing can be said.
        return None
    record = records.get(module_name)
    shown = f"`{module_name}`" if module_name else "the root module"
    if record is None:
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
        return Explanation(
            cause=f"module {shown} never ran in this step's forward{where}.",
            fix=f"call {shown} in forward(), or remove it (or freeze it with requires_grad_(False) if that is intended)",
            reason="never_ran",
        )
    if not record.grad_enabled:
        if record.in_checkpoint:
            return Explanation(
                cause=f"{shown} ran inside a reentrant `torch.utils.checkpoint` whose inputs do not "
                "require grad, so it ran without autograd and backward never recomputes it.",
                fix="use `checkpoint(fn, x, use_reentrant=False)`, or make the checkpoint's input require grad",
                reason="checkpoint",
            )
        return Explanation(
            cause=f"{shown} ran with gradients disabled (inside `torch.no_grad()` or `torch.inference_mode()`).",
            fix=f"call {shown} outside `torch.no_grad()` during training",
            reason="grad_disabled",
        )
    if not record.output_requires_grad:
        if record.output_opaque:
            return None  # an output of a type the hook cannot look into: nothing to conclude
        return Explanation(
            cause=f"{shown} ran with gradients on, but its output does not require grad: `{param_name}` "
            "is used through `.data`, `.detach()` or a rewrap that makes a new tensor from its values "
            f"(`torch.tensor({attribute})`, `torch.tensor({attribute}.tolist())`, a NumPy round trip) inside its forward.",
            fix=f"use `{attribute}` itself in forward, not `{attribute}.data` / `{attribute}.detach()` / "
            f"`torch.tensor({attribute}...)`",
            reason="data_access",
        )
    if not record.backward_reached:
        return _not_reached(shown, record, records)
    return Explanation(
        cause=f"{shown} ran and backward reached its output, but its forward does not use `{attribute}` "
        f"itself: it is unused, or used through `.data`, `.detach()` or a rewrap that makes a new tensor "
        f"from its values (`torch.tensor({attribute}.tolist())`, `torch.tensor({attribute})`, a NumPy round trip).",
        fix=f"use `{attribute}` itself in {shown}'s forward (no `.data`/`.detach()`/`torch.tensor({attribute}...)`), or delete it",
        reason="unused",
    )


def _not_reached(shown: str, record: RunRecord, records: dict[str, RunRecord]) -> Explanation:
    """Backward never reached a module's output: a cut (named where the hooks saw it), or an
    output nothing used."""
    cut, how = _cut_after(record, records)
    if cut is not None and how == "detached":
        return Explanation(
            cause=f"{shown} ran and its output required grad, but backward never reached that output: "
            f"`{cut.name}` received it detached (the same storage without grad). The cut is between {shown} "
            f"and `{cut.name}`: a `.detach()`, `torch.no_grad()` or a NumPy round trip (`.numpy()` and "
            "`torch.from_numpy()` share the storage).",
            fix=f"pass {shown}'s output to `{cut.name}` as it is: remove the `.detach()` / `torch.no_grad()` / NumPy step between them",
            reason="detached",
        )
    if cut is not None:
        return Explanation(
            cause=f"{shown} ran and its output required grad, but backward never reached that output: "
            f"`{cut.name}` received a new tensor of the same shape made from its values (no grad, new "
            "storage): a `torch.tensor(x.tolist())`, `torch.from_numpy(x.numpy())` or `torch.tensor(x)` "
            f"rewrap between {shown} and `{cut.name}` made a new leaf and cut it from the loss.",
            fix=f"pass {shown}'s output to `{cut.name}` as a tensor: no `.tolist()`/`.numpy()`/`torch.tensor(...)` between them",
            reason="rewrapped",
        )
    users = [r for r in _later(record, records) if record.output_storage and record.output_storage in r.grad_inputs]
    if users:
        user = min(users, key=lambda r: r.order)
        return Explanation(
            cause=f"{shown} ran and its output required grad, and `{user.name}` used it, but backward never "
            f"reached it: the loss was cut after `{user.name}` (by `.detach()`, `torch.no_grad()`, a NumPy "
            "round trip or a `torch.tensor(...)` rewrap), so nothing before the cut trains.",
            fix=f"keep torch ops from `{user.name}`'s output to the loss: remove the `.detach()`/NumPy/`torch.tensor(...)` step after it",
            reason="detached",
        )
    after = _next_module(record, records)
    between = f" between {shown} and `{after.name}` (the next module that ran)" if after is not None else \
        f" after {shown}"
    if after is None:
        # Nothing ran after it: a cut and an unused output look the same to module hooks.
        return Explanation(
            cause=f"{shown} ran and its output required grad, but backward never reached that output, and "
            "no module ran after it. It was cut from the loss outside any module, where module hooks cannot "
            "see (`.detach()`, `torch.no_grad()`, a NumPy round trip (`.numpy()`, `.tolist()`, `.item()`) or "
            "a `torch.tensor(...)` rewrap), or nothing in the loss uses it.",
            fix=f"keep torch ops from {shown}'s output to the loss (remove the `.detach()`/NumPy/`torch.tensor(...)` "
            f"step after it), or remove {shown} if its output is not needed",
            reason="detached",
        )
    return Explanation(
        cause=f"{shown} ran and its output required grad, but backward never reached that output. Most "
        "likely nothing in the loss uses it (an output computed and ignored, like a pooler whose output "
        "the loss never reads); otherwise it was cut outside any module"
        f"{between}, where module hooks cannot see: by `.detach()`, `torch.no_grad()`, a NumPy round "
        "trip (`.numpy()`, `.tolist()`, `.item()`) or a `torch.tensor(...)` rewrap.",
        fix=f"use {shown}'s output in the loss, or remove {shown} (or ignore its parameters with `ignore=`) "
        f"if its output is not needed; if it should feed the loss, look{between} for the cut",
        reason="unused_output",
    )


def _later(record: RunRecord, records: dict[str, RunRecord]) -> list[RunRecord]:
    return [r for r in records.values() if r.order > record.order
            and not _is_descendant(r.name, record.name) and not _is_descendant(record.name, r.name)]


def _next_module(record: RunRecord, records: dict[str, RunRecord]) -> RunRecord | None:
    return min(_later(record, records), key=lambda r: r.order, default=None)


def _cut_after(record: RunRecord, records: dict[str, RunRecord]) -> tuple[RunRecord | None, str]:
    """The later module that received ``record``'s output cut: ``"detached"`` (the same storage
    without grad) or ``"rewrapped"`` (a fresh leaf of the same shape)."""
    later = _later(record, records)
    if record.output_storage:
        detached = [r for r in later if record.output_storage in r.detached_inputs]
        if detached:
            return min(detached, key=lambda r: r.order), "detached"
    if record.output_shape and not any(record.output_storage in r.grad_inputs for r in later):
        # A fresh tensor of the same shape that is no module's (detached) output: a rewrap of values.
        outputs = {r.output_storage for r in records.values()}
        rewrapped = [r for r in later if any(shape == record.output_shape and storage not in outputs
                                             for shape, storage in r.fresh_input_shapes)]
        if rewrapped:
            return min(rewrapped, key=lambda r: r.order), "rewrapped"
    return None, ""

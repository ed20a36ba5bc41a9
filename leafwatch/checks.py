"""The checks: pure functions from what leafwatch knows to a list of findings.

Structural checks (optimizer membership, orphans, devices, non-leaves) depend only on the
inventory and run when it is built; the gradient checks run per step on the few tensors that
missed a gradient. None of them keeps a tensor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from . import graph
from .findings import Finding
from .inventory import Inventory, Orphan, ParamInfo, describe_tensor
from .tracing import Explanation
from .watching import WatchEntry

UNKNOWN_CAUSE = (
    "unknown: leafwatch saw only the end state (no gradient after backward). To learn why, create "
    "`leafwatch.Monitor(model, optimizer)` before the first forward pass, or pass `loss=` to audit()."
)


def make(kind: str, name: str, severity: str, message: str, cause: str, fix: str, *,
         tensor: torch.Tensor | None = None, step: int | None = None,
         aliases: Iterable[str] = (), **details: Any) -> Finding:
    described = describe_tensor(tensor) if tensor is not None else {}
    return Finding(
        kind=kind, name=name, severity=severity, message=message, cause=cause, fix=fix, step=step,
        first_step=step, last_step=step, aliases=tuple(aliases),
        shape=described.get("shape"), dtype=described.get("dtype"), device=described.get("device"),
        details=details,
    )


# -- non-leaf ---------------------------------------------------------------------------------
def non_leaf(name: str, t: torch.Tensor, *, step: int | None, inventory: Inventory | None = None,
             found: graph.Origin | None = None, where: str = "", watched: Iterable[WatchEntry] = ()) -> Finding:
    found = found if found is not None else graph.origin(t)
    known = inventory.known_names() if inventory is not None else {}
    for entry in watched:  # a watched leaf has a name too
        leaf = entry.tensor()
        if leaf is not None and entry.is_leaf:
            known.setdefault(id(leaf), entry.name)
    cause = found.cause(name, known) if found is not None else f"`{name}` is not a leaf."
    return make(
        "non_leaf", name, "error",
        f"`{name}` is not a leaf tensor{where}: its .grad will stay None and it will never train.",
        cause, graph.fix_for_non_leaf(name, found, device=str(t.device)),
        tensor=t, step=step, op=found.op if found else None,
    )


def tensor_findings(tensors: Mapping[str, torch.Tensor], step: int | None,
                    inventory: Inventory | None = None, watched: Iterable[WatchEntry] = ()) -> list[Finding]:
    """Findings for tensors handed to ``audit(tensors=...)``: non-leaf or no gradient."""
    out = []
    for name, t in tensors.items():
        if not t.is_leaf:
            out.append(non_leaf(name, t, step=step, inventory=inventory, watched=watched))
        elif not t.requires_grad:
            out.append(make(
                "missing_grad", name, "error",
                f"`{name}` does not require grad: it will never get a gradient.",
                f"`{name}` does not require grad: it was created without `requires_grad=True`, or it is "
                "the result of `.detach()` (or of an op under `torch.no_grad()`), which returns a new "
                "leaf that does not require grad.",
                f"create it with `requires_grad=True`, or call `{name}.requires_grad_()` "
                "(drop the `.detach()` if it is meant to share the original's gradient)",
                tensor=t, step=step, reason="requires_grad_false",
            ))
        elif t.grad is None:
            out.append(missing_grad(name, t, step=step, explanation=None))
    return out


def watched_findings(entries: Iterable[WatchEntry], step: int | None,
                     got_grad: Mapping[str, bool], inventory: Inventory | None = None) -> list[Finding]:
    """Findings for tensors flagged with ``watch()``; ``got_grad`` says which saw a gradient."""
    out = []
    entries = list(entries)
    for entry in entries:
        t = entry.tensor()
        if t is None:
            continue
        if entry.expect_leaf and not entry.is_leaf:
            f = non_leaf(entry.name, t, step=step, inventory=inventory, found=entry.origin,
                         where=f" (watched at {entry.location})", watched=entries)
            out.append(f.replace(details={**f.details, "source": "watch"}))
            continue
        if not entry.expect_grad:
            continue
        if not t.requires_grad:
            out.append(make(
                "missing_grad", entry.name, "error",
                f"`{entry.name}` does not require grad: it will never get a gradient.",
                f"`{entry.name}` does not require grad: it was created without `requires_grad=True`, "
                "frozen with `requires_grad_(False)`, or it is the result of `.detach()` (or of an op "
                "under `torch.no_grad()`), which returns a new leaf that does not require grad.",
                f"create it with `requires_grad=True`, or call `{entry.name}.requires_grad_()`",
                tensor=t, step=step, reason="requires_grad_false", source="watch",
            ))
        elif not got_grad.get(entry.name, False):
            what = "no gradient reached it" if entry.is_leaf else "no gradient flowed through it"
            out.append(make(
                "missing_grad", entry.name, "error",
                f"watched tensor `{entry.name}`: {what} in this step.",
                "it is not used in the computation of the loss, or it is cut off from it "
                "(`.detach()`, `torch.no_grad()`, a NumPy round trip or a `torch.tensor(...)` rewrap).",
                f"use `{entry.name}` in the loss through torch ops only",
                tensor=t, step=step, reason="unused", source="watch",
            ))
    return out


# -- missing gradients ------------------------------------------------------------------------
def missing_grad(name: str, t: torch.Tensor, *, step: int | None, explanation: Explanation | None,
                 info: ParamInfo | None = None, reachable: bool | None = None,
                 checks: int | None = None, misses: int | None = None) -> Finding:
    if explanation is not None:
        cause, fix, reason = explanation.cause, explanation.fix, explanation.reason
    elif reachable is False:
        cause = (f"`{name}` is not reachable from the loss: nothing in the loss depends on it (never "
                 "used, or cut off by `.detach()`, `torch.no_grad()`, a NumPy round trip or a "
                 "`torch.tensor(...)` rewrap).")
        fix, reason = f"use `{name}` in the forward pass through torch ops only, or delete it", "unreachable"
    elif reachable is True:
        cause = (f"`{name}` is reachable from the loss but has no gradient: backward() was not called "
                 "yet, was called with `inputs=` that leave it out, or the grad was cleared after it.")
        fix, reason = "call audit()/check() after loss.backward() and before optimizer.step()/zero_grad()", "not_backpropagated"
    else:
        cause, fix, reason = UNKNOWN_CAUSE, f"use `{name}` in the loss, or freeze it with `requires_grad_(False)` if that is intended", "unknown"
    details: dict[str, Any] = {"reason": reason}
    if info is not None:
        details["module"] = info.module
    if checks is not None:
        details["checks"] = checks
        details["steps_without_grad"] = misses
    return make(
        "missing_grad", name, "error",
        f"`{name}` requires grad but got no gradient: it does not train.",
        cause, fix, tensor=t, step=step, aliases=info.aliases if info else (), **details,
    )


#: The name of the one finding that says no trainable tensor has a gradient at all.
ALL_PARAMETERS = "<every trainable parameter>"


def no_grad_at_all(names: Sequence[str], *, step: int | None) -> Finding:
    """One finding for a check that found no gradient on any trainable tensor (every name an alias,
    so ``ignore=`` patterns on parameter names still apply)."""
    return make(
        "missing_grad", ALL_PARAMETERS, "error",
        f"none of the {len(names)} trainable tensors has a gradient.",
        "no gradient exists at all: the check ran before `loss.backward()` or after "
        "`optimizer.zero_grad()`, or the training loop clears the gradients between `backward()` and "
        "`step()` (then nothing trains).",
        "check after `loss.backward()` and before `optimizer.step()`; if that is where it runs, call "
        "`optimizer.zero_grad()` before the forward pass (or right after `step()`), never between "
        "`backward()` and `step()`",
        step=step, aliases=tuple(names), reason="no_grad_at_all", count=len(names),
    )


def intermittent(finding: Finding, checks: int, misses: int, step: int | None) -> Finding:
    """A missing_grad finding for a tensor that did get gradients at other steps."""
    return finding.replace(
        severity="info",
        status="intermittent",
        message=f"`{finding.name}` got no gradient in {misses} of {checks} checked steps "
        "(routing, branches or alternation: expected for mixture-of-experts and GANs).",
        last_step=step,
        details={**finding.details, "checks": checks, "steps_without_grad": misses},
    )


def nonfinite_grad(name: str, t: torch.Tensor, step: int, aliases: Iterable[str] = ()) -> Finding:
    return make(
        "nonfinite_grad", name, "error",
        f"`{name}`.grad holds NaN or Inf at step {step}.",
        "the loss or an op in the forward pass overflowed or divided by zero (or the learning rate is too high).",
        "find the first op producing NaN/Inf (`torch.autograd.detect_anomaly()` for one step), "
        "lower the learning rate, clip gradients, or use a GradScaler with fp16",
        tensor=t, step=step, aliases=aliases,
    )


# -- structure --------------------------------------------------------------------------------
def structural(inventory: Inventory, *, step: int | None,
               previous_names: Mapping[int, str] | None = None) -> list[Finding]:
    """Optimizer membership, stale and frozen tensors, orphans and devices: no gradient needed."""
    out: list[Finding] = []
    out += _optimizer_membership(inventory, step, previous_names or {})
    out += _orphans(inventory, step)
    out += _devices(inventory, step)
    return out


def _optimizer_membership(inv: Inventory, step: int | None,
                          previous_names: Mapping[int, str]) -> list[Finding]:
    out: list[Finding] = []
    if not inv.optimizers:
        return out
    for i, params in enumerate(inv.optimizer_params):
        for j, p in enumerate(params):
            if not p.is_leaf:
                name = inv.name(p) or f"optimizers[{i}] param {j}"
                out.append(non_leaf(name, p, step=step, inventory=inv, where=" (held by an optimizer)"))
    excluded = {k: (info, inv.tensors[k]) for k, info in inv.params.items()
                if k not in inv.in_optimizer and inv.tensors[k].requires_grad}
    if inv.model is not None:
        # An optimizer tensor that was once a model parameter, or a Parameter of the same shape as
        # a parameter no optimizer holds, is what is left of a replaced parameter.
        unpaired = dict(excluded)
        for i, old in inv.foreign_optimizer_tensors():
            old_name = previous_names.get(id(old))
            match = None
            if old_name is not None:
                match = next((k for k, (info, _) in unpaired.items() if info.name == old_name), None)
            if match is None and isinstance(old, torch.nn.Parameter) and not torch.nn.parameter.is_lazy(old):
                match = next((k for k, (_, t) in unpaired.items()
                              if not torch.nn.parameter.is_lazy(t) and t.shape == old.shape), None)
            if match is None and old_name is None:
                continue
            info, new = unpaired.pop(match) if match is not None else (None, None)
            name = info.name if info is not None else old_name
            excluded.pop(match, None)
            out.append(make(
                "stale_param", name, "error",
                f"optimizer {i} still holds the old `{name}`: the model's current `{name}` is never stepped.",
                f"`{name}` was replaced (a new layer, a resize, pruning or a swapped module) after the "
                f"optimizer was built; the optimizer updates the old tensor (shape {tuple(old.shape)}), "
                "which the model no longer uses.",
                "build the optimizer after the last change to the model, or rebuild it after replacing layers",
                tensor=new if new is not None else old, step=step, optimizer=i,
                old_shape=list(old.shape),
            ))
    for info, p in excluded.values():
        out.append(make(
            "not_in_optimizer", info.name, "error",
            f"`{info.name}` requires grad but is in no optimizer: it gets gradients and never changes.",
            f"`{info.name}` was left out when the optimizer's parameter list was built.",
            "pass it to the optimizer (`torch.optim.AdamW(model.parameters())`, or return it from "
            "`configure_optimizers`), or freeze it with `requires_grad_(False)` if that is intended",
            tensor=p, step=step, aliases=info.aliases,
        ))
    for i, params in enumerate(inv.optimizer_params):
        for p in params:
            if p.requires_grad:
                continue
            name = inv.name(p)
            plain = not isinstance(p, torch.nn.Parameter)
            if name is None and not plain:
                continue
            name = name or f"optimizers[{i}] tensor of shape {tuple(p.shape)}"
            out.append(make(
                "frozen_in_optimizer", name, "error" if plain else "info",
                f"optimizer {i} holds `{name}`, which does not require grad: it will not train.",
                "a plain tensor created without `requires_grad=True` was passed to the optimizer"
                if plain else f"`{name}` is frozen (requires_grad=False) but still listed in the optimizer.",
                "create it with `requires_grad=True`" if plain
                else "nothing, if freezing is intended; to train it call `requires_grad_(True)`",
                tensor=p, step=step, optimizer=i,
            ))
    return out


def _orphans(inv: Inventory, step: int | None) -> list[Finding]:
    out = []
    for orphan in inv.orphans():
        out.append(_orphan_finding(orphan, inv, step))
    return out


def _orphan_finding(orphan: Orphan, inv: Inventory, step: int | None) -> Finding:
    t, name = orphan.tensor, orphan.name
    trains = id(t) in inv.in_optimizer
    severity = "warning" if trains else "error"
    effect = ("it trains, but `state_dict()` does not save it and `.to()` does not move it"
              if trains else "no optimizer built from `model.parameters()` sees it, so it never trains")
    if orphan.module_in_container:
        container = "a plain Python list" if orphan.container == "list" else "a plain Python dict"
        cls = "nn.ModuleList" if orphan.container == "list" else "nn.ModuleDict"
        return make(
            "orphan_tensor", name, severity,
            f"`{name}` belongs to a module kept in {container}: it is not registered, {effect}.",
            f"the module is stored in {container}, which `nn.Module` does not look into.",
            f"wrap the container: `self.{name.split('[')[0].split('.')[-1]} = {cls}(...)`",
            tensor=t, step=step, container=orphan.container,
        )
    if orphan.container in ("list", "dict"):
        cls = "nn.ParameterList" if orphan.container == "list" else "nn.ParameterDict"
        return make(
            "orphan_tensor", name, severity,
            f"`{name}` requires grad but sits in a plain Python {orphan.container}: it is not registered, {effect}.",
            f"tensors in a Python {orphan.container} are not parameters of the module.",
            f"use `{cls}` for the container", tensor=t, step=step, container=orphan.container,
        )
    if not t.is_leaf:
        found = graph.origin(t)
        cause = found.cause(name, inv.known_names()) if found else f"`{name}` is not a leaf."
        from_parameter = found is not None and found.leaf is not None and found.leaf.is_parameter
        if from_parameter and found.fix_hint in ("device", "dtype"):
            cause += (" Calling `.to()`/`.cuda()`/`.double()` on an `nn.Parameter` returns a plain non-leaf "
                      "tensor, not a Parameter.")
        moved = {"device": "t.to(device)", "dtype": "t.to(dtype)"}.get(found.fix_hint if found else "", "t.detach()")
        return make(
            "orphan_tensor", name, severity,
            f"module attribute `{name}` is a non-leaf tensor, not a Parameter: {effect}, and it has no .grad.",
            cause,
            f"register the converted tensor: `self.{name.split('.')[-1]} = nn.Parameter({moved})`",
            tensor=t, step=step, container="attribute", op=found.op if found else None,
        )
    return make(
        "orphan_tensor", name, severity,
        f"module attribute `{name}` requires grad but is a plain tensor, not an `nn.Parameter`: {effect}.",
        "a tensor assigned as a module attribute is not registered, even with `requires_grad=True`.",
        f"`self.{name.split('.')[-1]} = nn.Parameter(tensor)`",
        tensor=t, step=step, container="attribute",
    )


def _devices(inv: Inventory, step: int | None) -> list[Finding]:
    trainable = [(info, p) for info, p in inv.trainable() if p.is_floating_point()]
    if len(trainable) < 2:
        return []
    out = []
    devices = Counter(p.device for _, p in trainable)
    dtypes = Counter(p.dtype for _, p in trainable)
    main_device, main_dtype = devices.most_common(1)[0][0], dtypes.most_common(1)[0][0]
    for info, p in trainable:
        if p.device != main_device:
            what, fix = f"on {p.device} while the other trainable parameters are on {main_device}", "move it with the model: register it as a Parameter/buffer of the module and call `model.to(device)`"
        elif p.dtype != main_dtype:
            if _kept_in_float32(inv, info, p, main_dtype):
                continue
            what = f"{str(p.dtype).replace('torch.', '')} while the other trainable parameters are {str(main_dtype).replace('torch.', '')}"
            fix = f"create it with `dtype={main_dtype}`, or convert the model as a whole with `model.to(dtype)`"
        else:
            continue
        out.append(make(
            "device_mismatch", info.name, "warning",
            f"`{info.name}` is {what}.",
            "it was created or moved separately from the rest of the model.",
            fix, tensor=p, step=step, aliases=info.aliases,
        ))
    return out


_NORM_TYPES = (
    torch.nn.modules.batchnorm._NormBase,
    torch.nn.LayerNorm,
    torch.nn.GroupNorm,
    *((torch.nn.RMSNorm,) if hasattr(torch.nn, "RMSNorm") else ()),
)


def _kept_in_float32(inv: Inventory, info: ParamInfo, p: torch.Tensor, main_dtype: torch.dtype) -> bool:
    """A normalization layer kept in float32 in a half-precision model: common and intended."""
    if p.dtype != torch.float32 or main_dtype not in (torch.float16, torch.bfloat16):
        return False
    return isinstance(inv.modules.get(info.module), _NORM_TYPES)


# -- the loop applies no gradient -------------------------------------------------------------
_CLEARED_CAUSE = ("gradients arrived in backward and were cleared before the optimizer step: "
                  "`zero_grad()` is called between `backward()` and `step()`")
_CLEARED_FIX = "call `optimizer.zero_grad()` before the forward pass (or right after `step()`)"


def _listed(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def grad_cleared_all(where: str, names: list[str], *, step: int | None) -> Finding:
    """Every gradient of the optimizer about to step arrived in backward and was cleared."""
    n = len(names)
    return make(
        "grad_cleared", where, "error",
        f"`{where}` steps with no gradient: the gradients of its {n} tensor{'s' if n != 1 else ''} "
        f"({_listed(names)}) arrived in backward() and were gone at the step, so nothing trains.",
        _CLEARED_CAUSE + ".", _CLEARED_FIX,
        step=step, aliases=names, reason="cleared", tensors=n,
    )


def grad_cleared(name: str, t: torch.Tensor, *, where: str, step: int | None,
                 aliases: Iterable[str] = ()) -> Finding:
    """Some gradients of the optimizer about to step were cleared after backward (a schedule)."""
    return make(
        "grad_cleared", name, "info",
        f"`{name}` got its gradient in backward(), but it was cleared before `{where}` stepped: "
        "it does not train at this step.",
        f"backward reached `{name}`; the training loop cleared its gradient (`.grad = None` or "
        f"`zero_()`) before the step while the other tensors of `{where}` kept theirs: a schedule "
        "that withholds gradients on purpose (a layer frozen for the first epoch, a head held back "
        "during warm-up), which resumes later.",
        "nothing if it is a schedule: it trains once the loop stops clearing it; otherwise stop "
        f"clearing `{name}.grad` between backward() and step()",
        tensor=t, step=step, aliases=aliases, reason="cleared_on_purpose", optimizer=where,
    )


def zero_lr(where: str, names: list[str], *, configured: float, since: int | None, steps: int,
            step: int | None, scheduler: str | None, managed: bool) -> Finding:
    """A param group stepped with a learning rate of 0 for many checks while it gets gradients."""
    if scheduler is not None:
        cause = (f"its learning rate scheduler `{scheduler}` sets lr to 0 (its `initial_lr` is "
                 f"{configured:g}): the schedule returns 0 at every step.")
        fix = (f"check `{scheduler}`'s schedule: it should give a non-zero factor after warm-up "
               "(e.g. `LambdaLR` multiplies `initial_lr` by what its function returns)")
    elif managed:
        cause = (f"a learning rate scheduler sets lr to 0 (the group's `initial_lr` is {configured:g}): "
                 "the schedule returns 0 at every step.")
        fix = "check the scheduler's schedule: it should give a non-zero learning rate after warm-up"
    else:
        cause = f"the group's lr was {configured:g} when leafwatch first saw it and was set to 0 since."
        fix = "find what sets `param_group['lr'] = 0`, or freeze these tensors with `requires_grad_(False)` if that is intended"
    return make(
        "no_update", where, "warning",
        f"`{where}` ({_listed(names)}) has stepped with lr 0 for {steps} steps or more (0 at every "
        f"reading since step {since}): "
        "its tensors get gradients and never change.",
        cause, fix, step=step, aliases=names, reason="zero_lr", configured_lr=configured,
        zero_since_step=since, scheduler=scheduler,
    )


def steps_skipped(where: str, names: Iterable[str], *, skipped: int, since: int, step: int | None) -> Finding:
    """An optimizer whose step was skipped many times in a row (a GradScaler and NaN/Inf)."""
    seen = " (see the `nonfinite_grad` findings)"
    return make(
        "no_update", where, "warning",
        f"`{where}` has not stepped for {skipped} steps: backward ran, but `optimizer.step()` "
        "was not called, so its tensors do not change.",
        "an AMP `GradScaler` skips `optimizer.step()` whenever the gradients hold NaN or Inf and "
        f"halves its scale: the gradients have been non-finite at every step since step {since}{seen}, "
        "so the scale collapses and nothing trains.",
        "find the first op that gives NaN/Inf (`torch.autograd.detect_anomaly()` for one step): "
        "a too-high learning rate, a `log`/division of 0, an fp16 overflow (use bf16, or clip gradients after `scaler.unscale_()`)",
        step=step, aliases=tuple(names), reason="skipped_steps", skipped=skipped, since_step=since,
    )

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

from . import fixes, graph, replaced
from .findings import Finding
from .inventory import Inventory, Orphan, ParamInfo, describe_tensor, is_uninitialized, shape_of, shape_text
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
             found: graph.Origin | None = None, where: str = "", watched: Iterable[WatchEntry] = (),
             location: str | None = None) -> Finding:
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
        cause, fixes.non_leaf(name, found, location=location, tensor=t),
        tensor=t, step=step, op=found.op if found else None,
    )


def _requires_grad_call(name: str) -> str:
    """``call `temperature.requires_grad_()` `` when the name is the user's variable, else in words."""
    if graph.code_name(name):
        return f"call `{name}.requires_grad_()`"
    return "call `requires_grad_()` on your tensor"


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
                f"create it with `requires_grad=True`, or {_requires_grad_call(name)} "
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
                         where=f" (watched at {entry.location})", watched=entries, location=entry.location)
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
                f"create it with `requires_grad=True`, or {_requires_grad_call(entry.name)}",
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
                 checks: int | None = None, misses: int | None = None,
                 watched_from_start: bool = False) -> Finding:
    """A trainable tensor without a gradient.

    ``watched_from_start`` says that a Monitor watched the run from its start, so the audit's
    advice to create one would be wrong.
    """
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
    elif watched_from_start:
        cause = (f"unknown: `{name}` is no parameter of the model, so leafwatch's module hooks cannot see "
                 "how it is used. Pass `loss=` to check() to walk the loss's graph."
                 if info is None else
                 "unknown: the diagnostic hooks are off (`diagnose=False`). Pass `loss=` to check() to "
                 "walk the loss's graph.")
        fix, reason = f"use `{name}` in the loss, or freeze it with `requires_grad_(False)` if that is intended", "unknown"
    else:
        cause, fix, reason = UNKNOWN_CAUSE, f"use `{name}` in the loss, or freeze it with `requires_grad_(False)` if that is intended", "unknown"
    details: dict[str, Any] = {"reason": reason}
    if explanation is not None and explanation.group is not None:
        details["group"] = explanation.group  # every tensor cut at one place is one mistake
    if info is not None:
        details["module"] = info.module
        if reason in ("detached", "unused", "never_ran") or "group" in details:
            fix = f"{fix}; {silence_hint(name, info.module)}"
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


def no_grad_at_all(names: Sequence[str], *, step: int | None,
                   optimizers: Sequence[torch.optim.Optimizer] = ()) -> Finding:
    """One finding for a check that found no gradient on any trainable tensor (every name an alias,
    so ``ignore=`` patterns on parameter names still apply)."""
    return make(
        "missing_grad", ALL_PARAMETERS, "error",
        f"none of the {len(names)} trainable tensors has a gradient.",
        "no gradient exists at all: the check ran before `loss.backward()` or after "
        "`optimizer.zero_grad()`, or the training loop clears the gradients between `backward()` and "
        "`step()` (then nothing trains).",
        "check after `loss.backward()` and before the optimizer's `step()`; if that is where it runs, "
        + _cleared_fix(optimizers[0] if len(optimizers) == 1 else None) + ", never between `backward()` and `step()`",
        step=step, aliases=tuple(names), reason="no_grad_at_all", count=len(names),
    )


def intermittent(finding: Finding, checks: int, misses: int, step: int | None) -> Finding:
    """A missing_grad finding for a tensor that did get gradients at other steps."""
    return finding.replace(
        severity="info",
        status="intermittent",
        message=f"`{finding.name}` got no gradient in {misses} of {checks} checked steps "
        "(routing, LayerDrop, branches or alternation: expected for mixture-of-experts, dropped layers "
        "and GANs).",
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


def nonfinite_param(name: str, t: torch.Tensor, step: int, aliases: Iterable[str] = ()) -> Finding:
    """A parameter holding NaN/Inf at the end of a run (its gradient was not at hand to check)."""
    return make(
        "nonfinite_grad", name, "error",
        f"`{name}` holds NaN or Inf at the end of the run (step {step}): a non-finite gradient was applied to it.",
        "a gradient turned NaN or Inf between two value checks (the loss or an op in the forward pass "
        "overflowed or divided by zero, or the learning rate is too high) and the optimizer applied it.",
        "find the first op producing NaN/Inf (`torch.autograd.detect_anomaly()` for one step), "
        "lower the learning rate, clip gradients, or use a GradScaler with fp16; to catch it at the step "
        "it happens, lower `check_values_every_n_steps`",
        tensor=t, step=step, aliases=aliases, where="parameter",
    )


def dead_grad(name: str, checks: int, step: int) -> Finding:
    """A gradient that exists but was exactly zero at ``checks`` value checks in a row."""
    return make(
        "dead_grad", name, "warning",
        f"`{name}` gets a gradient, but it was exactly zero at {checks} value checks in a row: "
        "it does not train.",
        "every path from the loss to it is multiplied by zero (a gate or a scale stuck at 0, a mask "
        "that removes all of it, or gradients that underflow through a deep chain), a custom "
        "`autograd.Function` returns zeros for it, or DDP fills the gradient of a parameter unused on "
        "this rank with zeros.",
        f"find what zeroes the gradient of `{name}` (`torch.autograd.grad` of one step's loss with respect "
        "to the intermediate outputs); if it is unused on purpose, freeze it with `requires_grad_(False)`",
        step=step, zero_checks=checks,
    )


def outside_optimizer(name: str, t: torch.Tensor, step: int | None, severity: str, how: str, *,
                      inventory: Inventory | None = None, **details: Any) -> Finding:
    """A trainable tensor outside the model that gets gradients and is in no optimizer."""
    model = inventory.model if inventory is not None else None
    code = fixes.tensor_code(name) if graph.code_name(name) else None
    add = fixes.add_to_optimizer(f"[{code}]" if code else None, inventory.optimizers if inventory is not None else (),
                                 model=model, known=inventory.variables if inventory is not None else None,
                                 cache=inventory.fix_names if inventory is not None else None)
    frozen = f"`{code}.requires_grad_(False)`" if code else "call `requires_grad_(False)` on your tensor"
    return make(
        "not_in_optimizer", name, severity,
        f"`{name}` gets gradients but is in no optimizer: it never changes.",
        f"`{name}` {how}, and it was not passed to any optimizer (left out when the optimizer "
        "was built). If it is meant to stay fixed (a temperature, a teacher), it should not require grad.",
        f"{add} (better: make it an `nn.Parameter` of the model); or, if it is fixed, {frozen}",
        tensor=t, step=step, **{"source": "outside_model", "outside": True, **details},
    )


# -- structure --------------------------------------------------------------------------------
def structural(inventory: Inventory, *, step: int | None,
               previous_names: Mapping[int, str] | None = None,
               stale: replaced.Replaced | None = None,
               seen_frozen: set[int] | frozenset[int] = frozenset()) -> list[Finding]:
    """Optimizer membership, stale and frozen tensors, orphans and devices: no gradient needed.

    ``stale`` is :func:`leafwatch.replaced.pair` of this inventory when the caller has it already.
    """
    out: list[Finding] = []
    out += _optimizer_membership(inventory, step, previous_names or {}, stale, seen_frozen)
    out += _orphans(inventory, step)
    out += _devices(inventory, step)
    return out


def _optimizer_membership(inv: Inventory, step: int | None, previous_names: Mapping[int, str],
                          stale: replaced.Replaced | None,
                          seen_frozen: set[int] | frozenset[int] = frozenset()) -> list[Finding]:
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
    found = stale if stale is not None else replaced.pair(inv, previous_names)
    for pair in found.pairs:
        excluded.pop(id(pair.new), None)
        out.append(stale_param(pair, step, inv))
    for i, old in sorted(found.unpaired.items()):
        out.append(stale_group(i, old, step, inv, harmless=not found.unstepped))
    for k, (info, p) in excluded.items():
        if k in seen_frozen:
            out.append(make(
                "not_in_optimizer", info.name, "error",
                f"`{info.name}` requires grad but is in no optimizer: it gets gradients and never changes.",
                f"`{info.name}` was frozen when the optimizer was built and unfrozen after it "
                "(`requires_grad_(True)`), without being added to the optimizer.",
                _unfrozen_fix(info.name, inv),
                tensor=p, step=step, aliases=info.aliases, reason="unfrozen_after",
            ))
            continue
        out.append(not_in_optimizer(info, p, step=step, inventory=inv))
    for i, params in enumerate(inv.optimizer_params):
        for p in params:
            if p.requires_grad:
                continue
            name = inv.name(p)
            plain = not isinstance(p, torch.nn.Parameter)
            if name is None and not plain:
                continue
            name = name or f"optimizers[{i}] {shape_text(p)}"
            out.append(make(
                "frozen_in_optimizer", name, "error" if plain else "info",
                f"optimizer {i} holds `{name}`, which does not require grad: it will not train."
                if plain else f"optimizer {i} holds `{name}`, which is frozen (requires_grad=False): "
                "the optimizer skips it.",
                "a plain tensor created without `requires_grad=True` was passed to the optimizer"
                if plain else f"`{name}` is frozen (requires_grad=False) but still listed in the optimizer.",
                "create it with `requires_grad=True`" if plain
                else "nothing, if freezing is intended; to train it call `requires_grad_(True)`",
                tensor=p, step=step, optimizer=i,
            ))
    return out


def silence_hint(name: str, module: str | None = None) -> str:
    """The ``ignore=`` pattern that silences a finding that is true but intended."""
    pattern = f"{module}.*" if module else name
    return f'if that is intended, silence it: `ignore=["{pattern}"]`'


def _unfrozen_fix(name: str, inv: Inventory) -> str:
    """Add an unfrozen tensor to the optimizer (Lightning: the finetuning callback's helper)."""
    if fixes.framework(inv.model, inv.fix_names) == "lightning":
        return ("when unfreezing, add it to the optimizer too: Lightning's "
                "`BaseFinetuning.unfreeze_and_add_param_group` does both, for the modules you unfreeze")
    return "when unfreezing, " + fixes.give_to_optimizer([name], inv)


def not_in_optimizer(info: ParamInfo, p: torch.Tensor, *, step: int | None,
                     got_grad: bool | None = None, inventory: Inventory | None = None) -> Finding:
    """A trainable tensor no optimizer holds; ``got_grad``: what the check saw (None: no check yet)."""
    name = info.name
    if got_grad is None:
        message = f"`{name}` requires grad but is in no optimizer: nothing steps it."
    elif got_grad:
        message = f"`{name}` requires grad but is in no optimizer: it gets gradients and never changes."
    else:
        message = (f"`{name}` requires grad but is in no optimizer, and no gradient reached it at this "
                   "step either: it never trains.")
    return make(
        "not_in_optimizer", name, "error", message,
        f"`{name}` was left out when the optimizer's parameter list was built.",
        f"{_add_fix(name, inventory)}; or freeze it with `requires_grad_(False)`; "
        + silence_hint(name, info.module),
        tensor=p, step=step, aliases=info.aliases, reason="left_out",
        **({} if got_grad is None else {"got_grad": got_grad}),
    )


def _add_fix(name: str, inv: Inventory | None) -> str:
    """Give the model's tensor ``name`` to the user's optimizer: the module the user assigned when
    all of it is left out (``model.aux_head.parameters()``), else the tensor."""
    if inv is None:
        return fixes.add_to_optimizer(None)
    module = fixes.outside_module(name, inv)
    code = fixes.model_tensor_code(module, inv) if module else None
    if code is not None:
        return fixes.add_to_optimizer(f"{code}.parameters()", inv.optimizers, model=inv.model,
                                      known=inv.variables, cache=inv.fix_names)
    return fixes.give_to_optimizer([name], inv)


def _rebuild_fix(names: Sequence[str], inv: Inventory | None, optimizer: int | None) -> str:
    """Give the new tensors to the optimizer that holds the old ones, or rebuild it (same class and groups)."""
    model = inv.model if inv is not None else None
    optimizers = inv.optimizers if inv is not None else []
    chosen = [optimizers[optimizer]] if optimizer is not None and 0 <= optimizer < len(optimizers) else optimizers
    cache = inv.fix_names if inv is not None else None
    if fixes.framework(model, cache) == "lightning":
        return ("build the optimizer in `configure_optimizers` after the model is changed (in `setup` or "
                "`__init__`), so that it holds the new parameters")
    known = inv.variables if inv is not None else None
    variable = next((v for v in (fixes.variable_for(o, known, cache) for o in chosen) if v is not None), None)
    which = f"`{variable}`" if variable else "your optimizer"
    return (fixes.give_to_optimizer(names, inv, chosen, what="the new parameters")
            + f"; or rebuild {which} after the last change to the model, with the same class and groups")


def _regroup_fix(inv: Inventory | None, optimizer: int) -> str:
    """Old tensors no current parameter replaced: rebuild the optimizer that holds them."""
    model = inv.model if inv is not None else None
    held = inv.optimizers[optimizer] if inv is not None and 0 <= optimizer < len(inv.optimizers) else None
    cache = inv.fix_names if inv is not None else None
    if fixes.framework(model, cache) == "lightning":
        return ("build the optimizer in `configure_optimizers` after the model is changed (in `setup` or "
                "`__init__`), so that it holds the current parameters")
    variable = fixes.variable_for(held, inv.variables if inv is not None else None, cache)
    which = f"`{variable}` (your `{type(held).__name__}`)" if variable else "your optimizer"
    return (f"rebuild {which} after the last change to the model, with the same class, groups and settings, "
            "so that it holds the current parameters")


def stale_param(pair: replaced.Pair, step: int | None, inv: Inventory | None = None) -> Finding:
    """The optimizer steps the old tensor of ``pair.name``; the model's current one is in no optimizer."""
    name, old = pair.name, pair.old
    old_shape, new_shape = shape_of(old), shape_of(pair.new)
    if old_shape is None:
        cause = (f"the optimizer was built before the lazy module's first forward and the model was then "
                 f"copied or rebuilt: the optimizer holds the uninitialized original of `{name}`, which never "
                 "materializes and gets no gradient.")
    else:
        resized = "" if new_shape is None or old_shape == new_shape else f", resized from {old_shape} to {new_shape}"
        cause = (f"`{name}` was replaced after the optimizer was built{resized} (a new layer, a resize, a swapped "
                 "module, or `model.to()` making new Parameters); the optimizer updates the old tensor, which the "
                 "model no longer uses and which gets no gradient.")
    return make(
        "stale_param", name, "error",
        f"optimizer {pair.optimizer} still holds the old `{name}`: the model's current `{name}` is in no "
        "optimizer and never changes.",
        cause,
        _rebuild_fix([name], inv, pair.optimizer), tensor=pair.new, step=step, optimizer=pair.optimizer,
        old_shape=list(old_shape) if old_shape is not None else None, paired_by=pair.how,
        group=stale_group_key(pair.optimizer),
    )


def stale_group_key(optimizer: int) -> str:
    """The mistake every ``stale_param`` finding of one optimizer belongs to: the stale optimizer."""
    return f"optimizers[{optimizer}]"


def stale_group(optimizer: int, old: list[tuple[torch.Tensor, str | None]], step: int | None,
                inv: Inventory | None = None, harmless: bool = False) -> Finding:
    """The old tensors of one optimizer that no current parameter replaced: one finding for all.

    ``harmless``: every live parameter of the model is stepped (the fix was applied, or layers were
    only removed): the leftovers get no gradient and the optimizer skips them; information.
    """
    n = len(old)
    if harmless:
        return _stale_leftovers(optimizer, old, step, inv)
    names = [name for _, name in old if name is not None]
    known = f" (formerly {', '.join(f'`{x}`' for x in names[:5])}{', ...' if len(names) > 5 else ''})" if names else ""
    lazy = sum(1 for t, _ in old if is_uninitialized(t))
    cause = ("the model changed after the optimizer was built (layers removed, replaced or swapped); the "
             "optimizer still holds the old tensors, which nothing uses.")
    if lazy:
        cause += (f" {lazy} of them {'are' if lazy != 1 else 'is'} still uninitialized: the optimizer was built "
                  "before the lazy modules' first forward and the model was then copied or rebuilt, so "
                  f"{'they' if lazy != 1 else 'it'} will never materialize.")
    return make(
        "stale_param", f"optimizers[{optimizer}]", "error",
        f"optimizer {optimizer} holds {n} tensor{'s' if n != 1 else ''} that "
        f"{'are' if n != 1 else 'is'} no longer {'parameters' if n != 1 else 'a parameter'} of the model "
        f"and get{'s' if n == 1 else ''} no gradient{known}.",
        cause, _regroup_fix(inv, optimizer), step=step, optimizer=optimizer, count=n, old_names=names, uninitialized=lazy,
        group=stale_group_key(optimizer), old_shapes=[None if s is None else list(s) for s in (shape_of(t) for t, _ in old)],
    )


def _stale_leftovers(optimizer: int, old: list[tuple[torch.Tensor, str | None]], step: int | None,
                     inv: Inventory | None = None) -> Finding:
    """Old tensors an optimizer still holds once every live parameter is stepped: harmless, costs memory."""
    n = len(old)
    names = [name for _, name in old if name is not None]
    known = f" (formerly {', '.join(f'`{x}`' for x in names[:5])}{', ...' if len(names) > 5 else ''})" if names else ""
    lazy = sum(1 for t, _ in old if is_uninitialized(t))
    them = "them" if n != 1 else "it"
    cause = (f"the model changed after the optimizer was built and every parameter it uses now is stepped; the "
             f"old tensor{'s' if n != 1 else ''} stay{'' if n != 1 else 's'} in optimizer {optimizer}, which "
             f"skips {them} (no gradient). Harmless, but {them} and {'their' if n != 1 else 'its'} optimizer "
             "state cost memory.")
    if lazy:
        cause += f" {lazy} of them {'are' if lazy != 1 else 'is'} uninitialized lazy parameters that can no longer materialize."
    return make(
        "stale_param", stale_group_key(optimizer), "info",
        f"optimizer {optimizer} still holds {n} old tensor{'s' if n != 1 else ''} the model no longer "
        f"uses{known}: harmless, costs memory.",
        cause,
        "nothing needed; to free the memory, " + _regroup_fix(inv, optimizer),
        step=step, optimizer=optimizer, count=n, old_names=names, uninitialized=lazy, leftovers=True,
        old_shapes=[None if s is None else list(s) for s in (shape_of(t) for t, _ in old)],
        group=stale_group_key(optimizer),
    )


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
    kinds = orphan.containers or ((orphan.container,) if orphan.container != "attribute" else ())
    attr = name.split("[")[0].split(".")[-1]
    if orphan.module_in_container:
        where = _describe_containers(kinds)
        return make(
            "orphan_tensor", name, severity,
            f"`{name}` belongs to a module kept in {where}: it is not registered, {effect}.",
            f"the module is stored in {where}, which `nn.Module` does not look into.",
            fixes.container_fix(_owner(inv, name), attr, kinds, modules=True),
            tensor=t, step=step, container=orphan.container, containers=list(kinds),
        )
    if kinds:
        where = _describe_containers(kinds)
        return make(
            "orphan_tensor", name, severity,
            f"`{name}` requires grad but sits in {where}: it is not registered, {effect}.",
            f"tensors in {where} are not parameters of the module.",
            fixes.container_fix(_owner(inv, name), attr, kinds, modules=False), tensor=t, step=step, container=orphan.container,
            containers=list(kinds),
        )
    if not t.is_leaf:
        found = graph.origin(t)
        cause = found.cause(name, inv.known_names()) if found else f"`{name}` is not a leaf."
        from_parameter = found is not None and found.leaf is not None and found.leaf.is_parameter
        if from_parameter and found.fix_hint in ("device", "dtype"):
            cause += (" Calling `.to()`/`.cuda()`/`.double()` on an `nn.Parameter` returns a plain non-leaf "
                      "tensor, not a Parameter.")
        return make(
            "orphan_tensor", name, severity,
            f"module attribute `{name}` is a non-leaf tensor, not a Parameter: {effect}, and it has no .grad.",
            cause,
            fixes.parameter_fix(_owner(inv, name), name.split(".")[-1]),
            tensor=t, step=step, container="attribute", op=found.op if found else None,
        )
    return make(
        "orphan_tensor", name, severity,
        f"module attribute `{name}` requires grad but is a plain tensor, not an `nn.Parameter`: {effect}.",
        "a tensor assigned as a module attribute is not registered, even with `requires_grad=True`.",
        fixes.parameter_fix(_owner(inv, name), name.split(".")[-1]),
        tensor=t, step=step, container="attribute",
    )


_CONTAINER_WORDS = {"list": "a plain Python list", "dict": "a plain Python dict",
                    "dataclass": "a dataclass", "namedtuple": "a namedtuple"}


def _describe_containers(kinds: tuple[str, ...]) -> str:
    """``("dict", "dict")`` -> "a plain Python dict inside a plain Python dict" (innermost first)."""
    return " inside ".join(_CONTAINER_WORDS.get(k, k) for k in reversed(kinds))


def _owner(inv: Inventory, name: str) -> Any:
    """The module that holds the attribute an orphan's name starts with (``sub.blocks[0].w`` -> ``sub``)."""
    path = name.split("[")[0]
    return inv.modules.get(path.rpartition(".")[0] if "." in path else "")


def _devices(inv: Inventory, step: int | None) -> list[Finding]:
    """Device and dtype differences that silently change training (see :func:`device_on_purpose`,
    :func:`dtype_changes_training`); deliberate ones (an fp32 island in a half model, a module
    placed on another device) are no finding."""
    trainable = [(info, p) for info, p in inv.trainable() if p.is_floating_point()]
    if len(trainable) < 2:
        return []
    out = []
    devices = Counter(p.device for _, p in trainable)
    dtypes = Counter(p.dtype for _, p in trainable)
    main_device, main_dtype = devices.most_common(1)[0][0], dtypes.most_common(1)[0][0]
    below: dict[str, set[str]] = {}
    if len(devices) > 1:
        for info, p in trainable:
            parts = info.module.split(".") if info.module else []
            for depth in range(len(parts) + 1):
                below.setdefault(".".join(parts[:depth]), set()).add(str(p.device))
    spread = spread_on_purpose(inv)
    for info, p in trainable:
        if p.device != main_device:
            if device_on_purpose(info.module, str(p.device), below, spread):
                continue
            what = f"on {p.device} while the other trainable parameters are on {main_device}"
            cause = ("it was created or moved separately from the rest of its module: a tensor on "
                     "another device than the module it belongs to is no placement plan (device_map "
                     "and pipeline stages place whole modules), and a 0-dim one is silently moved "
                     "at every use.")
            fix = ("move it with the model: register it as a Parameter/buffer of the module and "
                   + _model_to(inv, repr(str(main_device))))
        elif p.dtype != main_dtype:
            if not dtype_changes_training(p.dtype, main_dtype):
                continue
            short, main_short = str(p.dtype).replace("torch.", ""), str(main_dtype).replace("torch.", "")
            what = f"{short} while the other trainable parameters are {main_short}"
            if p.dtype == torch.float64:
                cause = ("it was created separately from the rest of the model (a NumPy array is "
                         "float64): it promotes whatever it touches to float64.")
            else:
                cause = (f"it was created or converted separately from the rest of the model: its updates "
                         f"are rounded to {short}, so steps smaller than its resolution are lost "
                         "without an error.")
            fix = f"create it with `dtype={main_dtype}`, or convert the model as a whole: " + _model_to(inv, str(main_dtype))
        else:
            continue
        out.append(make(
            "device_mismatch", info.name, "warning", f"`{info.name}` is {what}.",
            cause, fix, tensor=p, step=step, aliases=info.aliases,
        ))
    return out


def _model_to(inv: Inventory, where: str) -> str:
    """``model.to('cuda:0')`` on the user's variable for the model, else in words."""
    variable = fixes.variable_for(inv.model, inv.variables, inv.fix_names) if inv.model is not None else None
    if variable is not None and fixes.is_code(f"{variable}.to({where})"):
        return f"`{variable}.to({where})`"
    return f"call `.to({where})` on your model"


def spread_on_purpose(inv: Inventory) -> bool:
    """Whether a root module says it was spread over devices on purpose (``device_map``)."""
    roots = inv.modules.get("")
    candidates = [roots] if roots is not None else [m for n, m in inv.modules.items() if "." not in n]
    return any(getattr(m, "hf_device_map", None) for m in candidates if m is not None)


def device_on_purpose(module: str, device: str, below: dict[str, set[str]], spread: bool) -> bool:
    """A parameter on another device than most is placed there on purpose when the model says
    so (``spread``: a ``device_map``), or when its whole module (every trainable tensor below
    it) lives on that device and that module is not the root: pipeline stages, CPU-offloaded
    embeddings. A tensor that differs from its own module, or a parameter of the root alone,
    was moved by accident.

    Args:
        module: The qualified name of the module that owns the parameter ("" for the root).
        device: The parameter's device, as a string.
        below: Module name -> the devices of every trainable tensor at or below it.
        spread: Whether the model declares a device map.
    """
    if spread:
        return True
    return module != "" and below.get(module) == {device}


def dtype_changes_training(dtype: torch.dtype, main_dtype: torch.dtype) -> bool:
    """Whether a parameter kept in ``dtype`` in a model of ``main_dtype`` trains differently unsaid.

    A more precise island in a half-precision model (float32 norms, router gates, `wo`, lm
    heads, embeddings, CLIP's `logit_scale`) is what libraries do on purpose: no. A less precise
    parameter loses its small updates (a float16 tensor in a float32 model): yes. A float64 one
    (born from NumPy) promotes what it touches: yes.
    """
    if dtype == main_dtype or not (dtype.is_floating_point and main_dtype.is_floating_point):
        return False
    if dtype == torch.float64:
        return True
    return torch.finfo(dtype).eps > torch.finfo(main_dtype).eps



# -- the loop applies no gradient -------------------------------------------------------------
_CLEARED_CAUSE = ("gradients arrived in backward and were cleared before the optimizer step: "
                  "`zero_grad()` is called between `backward()` and `step()`")
def _cleared_fix(optimizer: Any = None, variables: Any = None) -> str:
    """Where ``zero_grad()`` belongs, on the user's optimizer variable when known."""
    variable = fixes.variable_for(optimizer, variables) if optimizer is not None else None
    if variable is not None:
        return f"call `{variable}.zero_grad()` before the forward pass (or right after `{variable}.step()`)"
    return "call your optimizer's `zero_grad()` before the forward pass (or right after its `step()`)"


def _listed(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def grad_cleared_all(where: str, names: list[str], *, step: int | None, optimizer: Any = None) -> Finding:
    """Every gradient of the optimizer about to step arrived in backward and was cleared."""
    n = len(names)
    return make(
        "grad_cleared", where, "error",
        f"`{where}` steps with no gradient: the gradients of its {n} tensor{'s' if n != 1 else ''} "
        f"({_listed(names)}) arrived in backward() and were gone at the step, so nothing trains.",
        _CLEARED_CAUSE + ".", _cleared_fix(optimizer),
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
        fix = "find what sets the group's `\"lr\"` to 0, or freeze these tensors with `requires_grad_(False)` if that is intended"
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

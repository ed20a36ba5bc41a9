"""What each detector says: one constructor per finding, its message, cause and fix.

Every finding a detector opens is made here (through :func:`make`), so that a kind reads the same
whichever detector found it: a non-leaf, a missing gradient (with the explanation the diagnostic
hooks observed), an intermittent one, a NaN/Inf or dead gradient, a tensor outside every
optimizer, a cleared gradient, a learning rate stuck at 0, skipped steps. Pure functions; none
keeps a tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from . import fixes
from ..observe import graph
from ..report.findings import Finding
from ..observe.inventory import Inventory, ParamInfo, describe_tensor
from .causes import Explanation
from ..watching import WatchEntry

UNKNOWN_CAUSE = (
    "unknown: leafwatch saw only the end state (no gradient after backward). To learn why, create "
    "`leafwatch.Monitor(model, optimizer)` before the first forward pass, or pass `loss=` to audit()."
)


def make(kind: str, name: str, severity: str, message: str, cause: str, fix: str, *, reason: str,
         tensor: torch.Tensor | None = None, step: int | None = None,
         aliases: Iterable[str] = (), **details: Any) -> Finding:
    """A finding with its words. ``reason`` is required: each ``(kind, reason)`` has one builder,
    listed in :data:`leafwatch.detectors.registry.VOICES`."""
    described = describe_tensor(tensor) if tensor is not None else {}
    return Finding.new(kind, name, severity, message, cause, fix, step=step, aliases=aliases, reason=reason,
                       **described, **details)


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
        tensor=t, step=step, op=found.op if found else None, reason="not_a_leaf"
    )


def _requires_grad_call(t: torch.Tensor) -> str:
    """``call `temperature.requires_grad_()` `` on the user's variable for ``t``, else in words."""
    variable = fixes.variable_for(t)
    return f"call `{variable}.requires_grad_()`" if variable else "call `requires_grad_()` on your tensor"


def not_requiring_grad(name: str, t: torch.Tensor, step: int | None, **details: Any) -> Finding:
    """``missing_grad``/``requires_grad_false``: a tensor handed or watched to train that does not
    require grad."""
    return make(
        "missing_grad", name, "error",
        f"`{name}` does not require grad: it will never get a gradient.",
        f"`{name}` does not require grad: it was created without `requires_grad=True`, frozen with "
        "`requires_grad_(False)`, or it is the result of `.detach()` (or of an op under `torch.no_grad()`), "
        "which returns a new leaf that does not require grad.",
        f"create it with `requires_grad=True`, or {_requires_grad_call(t)} "
        "(drop the `.detach()` if it is meant to share the original's gradient)",
        tensor=t, step=step, reason="requires_grad_false", **details)


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
            out.append(not_requiring_grad(entry.name, t, step, source="watch"))
        elif not got_grad.get(entry.name, False):
            what = "no gradient reached it" if entry.is_leaf else "no gradient flowed through it"
            out.append(make(
                "missing_grad", entry.name, "error",
                f"watched tensor `{entry.name}`: {what} in this step.",
                "it is not used in the computation of the loss, or it is cut off from it "
                "(`.detach()`, `torch.no_grad()`, a NumPy round trip or a `torch.tensor(...)` rewrap).",
                f"use `{entry.name}` in the loss through torch ops only",
                tensor=t, step=step, reason="watched_unused", source="watch",
            ))
    return out


# -- missing gradients ------------------------------------------------------------------------
def missing_grad(name: str, t: torch.Tensor, *, step: int | None, explanation: Explanation | None,
                 info: ParamInfo | None = None, reachable: bool | str | None = None,
                 checks: int | None = None, misses: int | None = None,
                 watched_from_start: bool = False) -> Finding:
    """A trainable tensor without a gradient.

    ``reachable``: whether backward from the loss given reaches it (``"no_graph"``: that loss has
    no autograd graph). ``watched_from_start`` says that a Monitor watched the run from its start,
    so the audit's advice to create one would be wrong.
    """
    explained = explanation or _without_hooks(name, info, reachable, watched_from_start)
    cause, fix, reason = explained.cause, explained.fix, explained.reason
    details: dict[str, Any] = {"reason": reason}
    if explanation is not None and explanation.group is not None:
        details["group"] = explanation.group  # every tensor cut at one place is one mistake
    elif reason == "loss_without_graph":
        details["group"] = "the loss given"  # one mistake: the loss, whichever tensors it misses
    if info is not None:
        details["module"] = info.module
        if reason in ("detached", "unused", "never_ran") or "group" in details and reason != "loss_without_graph":
            fix = f"{fix}; {silence_hint(name, info.module)}"
    if checks is not None:
        details.update(checks=checks, steps_without_grad=misses)
    return make(
        "missing_grad", name, "error",
        f"`{name}` requires grad but got no gradient: it does not train.",
        cause, fix, tensor=t, step=step, aliases=info.aliases if info else (), **details,
    )


def _without_hooks(name: str, info: ParamInfo | None, reachable: bool | str | None,
                   watched_from_start: bool) -> Explanation:
    """Why a tensor has no gradient when no hook explained it: from the loss given (``reachable``),
    else unknown, saying why leafwatch could not see more."""
    use = f"use `{name}` in the loss, or freeze it with `requires_grad_(False)` if that is intended"
    if reachable == "no_graph":
        return Explanation(
            cause="the loss passed as `loss=` has no autograd graph (it does not require grad: computed "
            "under `torch.no_grad()`, detached, or a constant), so no gradient can reach a tensor from it.",
            fix="pass the loss that `backward()` is called on, computed with gradients on (its `grad_fn` is not None)",
            reason="loss_without_graph")
    if reachable is False:
        return Explanation(
            cause=f"`{name}` is not reachable from the loss: nothing in the loss depends on it (never used, or "
            "cut off by `.detach()`, `torch.no_grad()`, a NumPy round trip or a `torch.tensor(...)` rewrap).",
            fix=f"use `{name}` in the forward pass through torch ops only, or delete it", reason="unreachable")
    if reachable is True:
        return Explanation(
            cause=f"`{name}` is reachable from the loss but has no gradient: backward() was not called "
            "yet, was called with `inputs=` that leave it out, or the grad was cleared after it.",
            fix="call audit()/check() after loss.backward() and before optimizer.step()/zero_grad()",
            reason="not_backpropagated")
    if watched_from_start and info is None:
        return Explanation(
            cause=f"unknown: `{name}` is no parameter of the model, so leafwatch's module hooks cannot see "
            "how it is used. Pass `loss=` to check() to walk the loss's graph.", fix=use, reason="unknown_not_a_parameter")
    if watched_from_start:
        return Explanation(
            cause="unknown: the diagnostic hooks are off (`diagnose=False`). Pass `loss=` to check() to "
            "walk the loss's graph.", fix=use, reason="unknown_hooks_off")
    return Explanation(cause=UNKNOWN_CAUSE, fix=use, reason="unknown")


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


def observed(finding: Finding) -> str | None:
    """The reason a missing gradient was observed with, also under a later transition's reason."""
    return finding.details.get("observed", finding.details.get("reason"))


def intermittent(finding: Finding, checks: int, misses: int, step: int | None) -> Finding:
    """``missing_grad``/``intermittent``: gradients at other steps; the cause and fix observed stay (``details["observed"]``)."""
    return finding.replace(
        severity="info", status="intermittent", last_step=step, cause=finding.cause, fix=finding.fix,
        message=f"`{finding.name}` got no gradient in {misses} of {checks} checked steps "
        "(routing, LayerDrop, branches or alternation: expected for mixture-of-experts, dropped layers and GANs).",
        details={**{k: v for k, v in finding.details.items() if k != "pending"}, "checks": checks,  # it waits for nothing
                 "steps_without_grad": misses, "reason": "intermittent", "observed": observed(finding)})


def nonfinite_grad(name: str, t: torch.Tensor, step: int, aliases: Iterable[str] = ()) -> Finding:
    return make(
        "nonfinite_grad", name, "error",
        f"`{name}`.grad holds NaN or Inf at step {step}.",
        "the loss or an op in the forward pass overflowed or divided by zero (or the learning rate is too high).",
        "find the first op producing NaN/Inf (`torch.autograd.detect_anomaly()` for one step), "
        "lower the learning rate, clip gradients, or use a GradScaler with fp16",
        tensor=t, step=step, aliases=aliases, reason="nan_or_inf"
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
        tensor=t, step=step, aliases=aliases, where="parameter", reason="nan_or_inf_value"
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
        step=step, zero_checks=checks, reason="zero_streak"
    )


def outside_optimizer(name: str, t: torch.Tensor, step: int | None, severity: str, how: str, *,
                      inventory: Inventory | None = None, **details: Any) -> Finding:
    """A trainable tensor outside the model that gets gradients and is in no optimizer."""
    code = fixes.tensor_code(name) if graph.code_name(name) else None
    add = fixes.add_to_optimizer(f"[{code}]" if code else None, getattr(inventory, "optimizers", ()),
                                 model=getattr(inventory, "model", None), known=getattr(inventory, "variables", None),
                                 cache=getattr(inventory, "fix_names", None))
    frozen = f"`{code}.requires_grad_(False)`" if code else "call `requires_grad_(False)` on your tensor"
    return make(
        "not_in_optimizer", name, severity,
        f"`{name}` gets gradients but is in no optimizer: it never changes.",
        f"`{name}` {how}, and it was not passed to any optimizer (left out when the optimizer "
        "was built). If it is meant to stay fixed (a temperature, a teacher), it should not require grad.",
        f"{add} (better: make it an `nn.Parameter` of the model); or, if it is fixed, {frozen}",
        tensor=t, step=step, **{"source": "outside_model", "outside": True, **details}, reason="outside_model"
    )


# -- structure --------------------------------------------------------------------------------
def silence_hint(name: str, module: str | None = None) -> str:
    """The ``ignore=`` pattern that silences a finding that is true but intended."""
    pattern = f"{module}.*" if module else name
    return f'if that is intended, silence it: `ignore=["{pattern}"]`'


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

"""The words of the findings whose detector has no module of its own to hold them, and :func:`make`.

Each builder here is the one voice of a ``(kind, reason)`` a registry entry decides (the watched
tensors' non-leaf, missing gradient and outside-optimizer findings, the NaN/Inf and dead
gradients); the gradient tracker and the loop watch keep their builders in their own modules.
:func:`make` is how every detector makes a finding, its reason required. Pure functions; none
keeps a tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from . import fixes
from ..observe import graph
from ..report.findings import Finding
from ..observe.inventory import Inventory, describe_tensor
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


#: The name of the one finding that says no trainable tensor has a gradient at all.
ALL_PARAMETERS = "<every trainable parameter>"


def observed(finding: Finding) -> str | None:
    """The reason a missing gradient was observed with, also under a later transition's reason."""
    return finding.details.get("observed", finding.details.get("reason"))


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

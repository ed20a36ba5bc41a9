"""Why a tensor missed its gradient, in words: the cause and the fix read from the tracer's records.

The tracer (:mod:`leafwatch.observe.tracing`) records plain facts during the forward pass; this
module turns the records of the modules that own a missing tensor into one explanation (the op
that cut the graph, the module that never ran or ran under ``no_grad``, the backward that never
reached it) and its one-line fix.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from ..observe import cuts
from ..observe.inventory import ParamInfo
from ..observe.names import ancestors
from ..observe.tracing import RunRecord
from . import fixes


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


_GRAD_OFF_FIX = "keep grad mode on for the computation that feeds the loss: do not switch it off at {at}"
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
    "`torch.set_grad_enabled(False)`": _GRAD_OFF_FIX,
}
_VALUE_FIX = ("keep the values a tensor at {at}: use torch ops on the tensor itself, not {op} (a Python "
              "number, list or NumPy array has no autograd graph, and a tensor made from it is a new leaf)")
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
        reason="called_directly",
    )


def explain_missing(param_name: str, module_name: str, attribute: str, records: dict[str, RunRecord], armed: set[str],
                    modules: dict[str, nn.Module] | None = None, *, ops_traced: bool = False) -> Explanation | None:
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
    if record.substituted:
        return substituted(param_name, shown)
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

def substituted(param_name: str, shown: str) -> Explanation:
    """The module's forward ran with weights swapped in for its registered parameters."""
    return Explanation(
        cause=f"{shown}'s forward ran with other tensors in place of its registered parameters "
        "(`torch.func.functional_call`, a TensorDict's weights swapped in, a vmapped copy): the "
        f"gradient went to those tensors, not to `{param_name}`.",
        fix="nothing in the forward: give the optimizer the tensors the module is called with (those passed "
        f"to `functional_call` or swapped in); if `{param_name}` itself is meant to train, call the module "
        "with its own parameters",
        reason="substituted_weights")


def _did_not_run(param_name: str, module_name: str, shown: str, records: dict[str, RunRecord],
                 modules: dict[str, nn.Module] | None) -> Explanation:
    """The module holding the parameter ran no forward of its own: unused, or never called."""
    ran_below = [r for n, r in records.items() if n != module_name and _is_descendant(n, module_name)]
    if ran_below or module_name == "":
        return Explanation(
            cause=f"`{param_name}` is never used in the computation of the loss "
            f"({shown} did not run a forward of its own that uses it).",
            fix=f"use `{param_name}` in the forward pass, or delete it (or set requires_grad=False if it is frozen on purpose)",
            reason="no_forward_of_its_own",
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
    storage = record.output_storage
    # The modules that ran after it (neither below nor above it), in their order.
    later = sorted((r for r in records.values() if r.order > record.order and not _is_descendant(r.name, record.name)
                    and not _is_descendant(record.name, r.name)), key=lambda r: r.order)
    # A tensor of the same shape is no evidence: a rewrap is named only when the recorder saw it.
    cut = next((r for r in later if storage and storage in r.detached_inputs), None)
    if cut is not None:
        return Explanation(
            cause=f"{shown} ran and its output required grad, but backward never reached that output: "
            f"`{cut.name}` received it detached (the same storage without grad). The cut is between {shown} "
            f"and `{cut.name}`: a `.detach()`, `torch.no_grad()` or a NumPy round trip (`.numpy()` and "
            f"`torch.from_numpy()` share the storage). {unseen}",
            fix=f"pass {shown}'s output to `{cut.name}` as it is: remove the `.detach()` / `torch.no_grad()` / NumPy step between them",
            reason="detached",
        )
    user = next((r for r in later if storage and storage in r.grad_inputs), None)
    if user is not None:
        return Explanation(
            cause=f"{shown} ran and its output required grad, and `{user.name}` used it, but backward never "
            f"reached it: what `{user.name}` made from it does not reach the loss (nothing in the loss uses it, or "
            f"it was cut after `{user.name}`). {unseen}",
            fix=f"keep torch ops from `{user.name}`'s output to the loss: remove the `.detach()`/`.item()`/"
            "`.tolist()`/NumPy/`torch.tensor` rewrap step after it",
            reason="detached",
        )
    if not later:
        # No module the hooks watch ran after it: a cut and an unused output look the same to them.
        return Explanation(
            cause=f"{shown} ran and its output required grad, but backward never reached that output, and no "
            "module that leafwatch watches ran after it: it was cut from the loss outside any module, or "
            f"nothing in the loss uses it. {unseen}",
            fix=f"keep torch ops from {shown}'s output to the loss (remove the `.detach()`/`.item()`/NumPy/"
            f"`torch.tensor` rewrap step after it), or remove {shown} if its output is not needed",
            reason="detached",
        )
    between = f" between {shown} and `{later[0].name}` (the next module that ran)"
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


def at_the_only_step(info: ParamInfo, ran: set[str]) -> Explanation:
    """Why a tensor got no gradient at its optimizer's only step, from the modules seen running."""
    if info.module not in ran and ("" in ran or any(n in ran for n in ancestors(info.module))):
        shown = f"`{info.module}`"
        call = f"`{fixes.module_code(fixes.module_to_call(info.module, ran))}`"
        return Explanation(
            cause=f"module {shown} never ran in a forward pass of this run (its optimizer stepped once).",
            fix=f"call {call} in forward(), or remove it (or freeze it with requires_grad_(False) if that is intended)",
            reason="never_ran_at_the_only_step")
    return Explanation(
        cause=f"`{info.name}` had no gradient when its optimizer stepped, at the only step of this run; "
        "the cause is worked out from a second step on (or use leafwatch.assert_trains / a Monitor "
        "created before the first forward pass).",
        fix=f"use `{info.name}` in the loss, or freeze it with `requires_grad_(False)` if that is intended",
        reason="unknown_at_the_only_step")

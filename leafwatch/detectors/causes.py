"""Why a tensor missed its gradient: the cause read from the tracer's records, as data, and its words.

The tracer (:mod:`leafwatch.observe.tracing`) records plain facts during the forward pass; this
module turns the records of the modules that own a missing tensor into one :class:`Explanation`
(the op that cut the graph, the module that never ran or ran under ``no_grad``, the backward that
never reached it): a reason and its arguments. The renderers of those reasons, below, write the
cause and the one-line fix of the ``missing_grad`` finding they explain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import nn

from ..observe import copies, cuts, functions, unhooked
from ..observe.tracing import RunRecord
from ..report.words import Members, Words, renders
from . import fixes
from .constructors import missing_words


def _is_descendant(name: str, ancestor: str) -> bool:
    return ancestor == "" or name.startswith(ancestor + ".")


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Why a tensor got no gradient: a reason (never_ran, grad_disabled, checkpoint, detached,
    data_access, rewrapped, unused, unused_output, ...), the arguments its renderer reads, and the
    mistake the tensor shares with others (an observed cut: "`.detach()` at model.py:13")."""

    reason: str
    args: Mapping[str, Any]
    group: str | None = None


def shown(module: str) -> str:
    """How a module is named in the words: `` `encoder.0` ``, or "the root module"."""
    return f"`{module}`" if module else "the root module"


def module_of(m: Members) -> str:
    """The module the tensors of ``m`` sit in: theirs when they share it, else the mistake's group
    (the module that holds them all), else the first one's."""
    module = m.shared("module")
    if module is not None or m.single:
        return module if module is not None else m.first.get("module", "")
    group = m.group
    if group and all(str(a.get("module", "")).startswith(group) for a in m.args):
        return group
    return m.first.get("module", "")


# -- a cut the recorder saw ------------------------------------------------------------------------
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


def place_args(place: cuts.Place | None) -> dict[str, Any] | None:
    return None if place is None else {"file": place.file, "line": place.line, "function": place.function}


def short_at(place: Mapping[str, Any]) -> str:
    """``deep.py:13``."""
    return f"{place['file'].replace(chr(92), '/').rsplit('/', 1)[-1]}:{place['line']}"


def at_in(place: Mapping[str, Any]) -> str:
    """``deep.py:13 (in `Deep.forward`)``."""
    function = place["function"]
    return f"{short_at(place)} (in `{function}`)" if function and not function.startswith("<") else short_at(place)


def explain_cut(cut: cuts.Cut, tensor_id: int, attribute: str = "") -> Explanation:
    """A parameter upstream of a cut the recorder saw: the op and its line, and what to change there."""
    site = cut.site
    group = f"{site.op.strip('`')} at {short_at(place_args(site.called_from or site.place))}"  # type: ignore[arg-type]
    if cut.integer is not None:
        return Explanation("integer_cut", {"op": site.op, "place": place_args(site.place), "dtype": cut.integer,
                                           "called_from": place_args(site.called_from), "steps": list(cut.steps)}, group)
    return Explanation(_CUT_REASONS.get(site.op, "rewrapped"), {
        "op": site.op, "place": place_args(site.place), "called_from": place_args(site.called_from), "rank": site.rank,
        "direct": tensor_id in cut.direct, "attribute": attribute}, group)


def _cut_words(m: Members) -> Words:
    a = m.first
    op, place, called_from = a["op"], a["place"], a["called_from"]
    at = short_at(place)
    fix = _CUT_FIXES.get(op, _VALUE_FIX if a["rank"] else _GRAD_OFF_FIX).format(at=at, op=op)
    attribute = a["attribute"] if m.single else m.shared("attribute")
    if a["direct"] and attribute and op in ("`.data`", "`.detach()`") and m.shared("direct"):
        fix = f"use `{attribute}` itself, not `{attribute}{op.strip('`')}`, at {at}"
    if called_from is not None:
        fix = (f"{fix}: it runs inside a library, reached from your call at {short_at(called_from)}; change that "
               "call (its arguments or where you call it) so its output keeps the graph")
    if _CUT_REASONS.get(op) == "detached" and "detach" not in op:
        how = "the ops run there on values computed from it record no autograd graph"
    else:
        how = "what comes out of that op carries no autograd graph back to it"
    described = f"{op} at {at_in(place)}" + (f", called from {at_in(called_from)}" if called_from is not None else "")
    return missing_words(m, f"cut by {described}: {m.who} is used before that point of the forward, and {how}, "
                         "so backward never reaches it (leafwatch saw the op run).", fix, silenced=True)


@renders("missing_grad", "integer_cut", fixes="never")
def _integer_cut(m: Members) -> Words:
    """The values became integers (indices, sizes): no op carries a gradient through them, so the fix is
    no other op at that line but float values all the way (a differentiable resampling)."""
    a = m.first
    op, place, called_from, steps = a["op"], a["place"], a["called_from"], m.shared("steps", a["steps"])
    described = f"{op} at {at_in(place)}" + (f", called from {at_in(called_from)}" if called_from is not None else "")
    rounded = f" (rounded on the way: {', '.join(f'`{s}()`' for s in steps)}, whose gradient is zero)" if steps else ""
    library = f" (it runs inside a library, reached from your call at {short_at(called_from)})" if called_from else ""
    return missing_words(
        m, f"cut by {described}: the values computed from {'it' if m.single else 'them'}{rounded} become integers "
        f"(`{a['dtype']}`) there, such as pixel indices or crop sizes, and integer indexing cuts the gradient: an "
        "integer tensor carries no gradient in any form, so backward never reaches "
        f"{'it' if m.single else 'them'} (leafwatch saw the op run).",
        f"no torch op carries a gradient through integers{library}: to learn {m.who}, let it act through float "
        "values, by a differentiable resampling (sample at float coordinates with `torch.nn.functional.grid_sample`, "
        "an interpolating crop, no rounding) or a straight-through estimator; if it is not meant to train, freeze it "
        "with `requires_grad_(False)`", silenced=True)


@renders("missing_grad", "detached", "rewrapped")
def _detached(m: Members) -> Words:
    if "op" in m.first:
        return _cut_words(m)
    return _not_reached_words(m)


# -- what the module hooks saw ---------------------------------------------------------------------
def called_directly(module_name: str, module: nn.Module | None = None) -> Explanation:
    """A module whose other parameters got gradients but whose forward hooks never fired: it is called
    through ``.forward()`` directly, where module hooks cannot see, or its class runs through a ``__call__``
    of its own that skips them (gpytorch's ``Module.__call__``: ``own_call``)."""
    own = unhooked.own_call(module) if module is not None else None
    return Explanation("called_directly", {"own_call": own} if own else {})


@renders("missing_grad", "called_directly", fixes="never")
def _called_directly(m: Members) -> Words:
    own = m.shared("own_call", m.first.get("own_call"))
    if own:
        return missing_words(
            m, f"{m.who} is not used in the computation of the loss. {shown(module_of(m))}'s other parameters got "
            f"gradients, but its forward hooks never ran: its class's own `__call__` (`{own}`) runs `forward` without "
            "torch's module hooks, so leafwatch cannot say more about where.",
            f"use {m.who} in the forward pass, or delete it (or freeze it with `requires_grad_(False)`)")
    return missing_words(
        m, f"{m.who} is not used in the computation of the loss. {shown(module_of(m))}'s other parameters got "
        "gradients, but its forward hooks never ran: it is called through `.forward()` directly (or its "
        "parameters are used outside its forward), so leafwatch cannot say more about where.",
        f"use {m.who} in the forward pass, or delete it (or freeze it with `requires_grad_(False)`); "
        "call the module itself, not its `.forward`, so that hooks see it")


def explain_missing(module_name: str, attribute: str, records: dict[str, RunRecord], armed: set[str],
                    modules: dict[str, nn.Module] | None = None, *, ops_traced: bool = False) -> Explanation | None:
    """Why a parameter of ``module_name`` got no gradient, from what the module hooks saw; None if
    unknown. ``ops_traced``: the cut recorder watched the forward and saw no cut upstream of it."""
    if module_name not in armed or not records:
        # Not watched for the whole step, or no armed module ran at all: the forward pass may
        # have happened before the hooks were armed, so nothing can be said.
        return None
    record = records.get(module_name)
    if record is None:
        return _did_not_run(module_name, records, modules)
    if record.in_function is not None and not record.function_inputs:
        return inside_function(record.in_function, grad_on=record.grad_enabled)
    if not record.grad_enabled:
        return Explanation("checkpoint" if record.in_checkpoint else "grad_disabled", {})
    if record.substituted:
        return Explanation("substituted_weights", {})
    if not record.output_requires_grad:
        if record.output_opaque:
            return None  # an output of a type the hook cannot look into: nothing to conclude
        return Explanation("data_access", {"attribute": attribute})
    if not record.backward_reached:
        return _not_reached(record, records, ops_traced)
    return Explanation("unused", {"attribute": attribute})


@renders("missing_grad", "data_access")
def _data_access(m: Members) -> Words:
    if "op" in m.first:
        return _cut_words(m)
    attribute = m.first["attribute"]
    return missing_words(
        m, f"{shown(module_of(m))} ran with gradients on, but its output does not require grad: {m.who} "
        "is used through `.data`, `.detach()` or a rewrap that makes a new tensor from its values "
        f"(`torch.tensor({attribute})`, `torch.tensor({attribute}.tolist())`, a NumPy round trip) inside its forward.",
        f"use `{attribute}` itself in forward, not `{attribute}.data` / `{attribute}.detach()` / "
        f"`torch.tensor({attribute})`")


@renders("missing_grad", "unused")
def _unused(m: Members) -> Words:
    attribute, module = m.first["attribute"], shown(module_of(m))
    return missing_words(
        m, f"{module} ran and backward reached its output, but its forward does not use `{attribute}` "
        f"itself: it is unused, or used through `.data`, `.detach()` or a rewrap that makes a new tensor "
        f"from its values (`torch.tensor({attribute}.tolist())`, `torch.tensor({attribute})`, a NumPy round trip).",
        f"use `{attribute}` itself in {module}'s forward (no `.data`/`.detach()`/`torch.tensor({attribute})`), "
        "or delete it", silenced=True)


@renders("missing_grad", "substituted_weights", fixes="never")
def _substituted(m: Members) -> Words:
    """The module's forward ran with weights swapped in for its registered parameters."""
    return missing_words(
        m, f"{shown(module_of(m))}'s forward ran with other tensors in place of its registered parameters "
        "(`torch.func.functional_call`, a TensorDict's weights swapped in, a vmapped copy): the "
        f"gradient went to those tensors, not to {m.who}.",
        "nothing in the forward: give the optimizer the tensors the module is called with (those passed "
        f"to `functional_call` or swapped in); if {m.who} itself is meant to train, call the module "
        "with its own parameters")


def never_called(module_name: str) -> Explanation:
    """A module a global forward hook watched over the whole step and never saw run (``leafwatch run``'s module
    kept in a script's variable and never called): ``never_ran``, no parent that ran known."""
    return Explanation("never_ran", {"parent": None, "call": fixes.module_code(module_name) if module_name else None})


def _did_not_run(module_name: str, records: dict[str, RunRecord], modules: dict[str, nn.Module] | None) -> Explanation:
    """The module holding the parameter ran no forward of its own: unused, or never called."""
    ran_below = [r for n, r in records.items() if n != module_name and _is_descendant(n, module_name)]
    if ran_below or module_name == "":
        return Explanation("no_forward_of_its_own", {})
    parents = [r for n, r in records.items() if _is_descendant(module_name, n) and n != module_name]
    parent = max(parents, key=lambda r: len(r.name), default=None)
    call = fixes.module_code(fixes.module_to_call(module_name, records, modules)) if module_name else None
    return Explanation("never_ran", {"parent": None if parent is None else parent.name, "call": call})


@renders("missing_grad", "no_forward_of_its_own", fixes="never")
def _no_forward_of_its_own(m: Members) -> Words:
    return missing_words(
        m, f"{m.who} is never used in the computation of the loss "
        f"({shown(module_of(m))} did not run a forward of its own that uses it).",
        f"use {m.who} in the forward pass, or delete it (or set requires_grad=False if it is frozen on purpose)")


@renders("missing_grad", "never_ran", fixes="never")
def _never_ran(m: Members) -> Words:
    module = module_of(m)
    parent = m.shared("parent", m.first["parent"])
    where = "" if parent is None else f" ({shown(parent)} ran, but did not call it)"
    call = m.shared("call", m.first["call"])
    return missing_words(
        m, f"module {shown(module)} never ran in this step's forward{where}.",
        f"call {f'`{call}`' if call else shown(module)} in forward(), or remove it (or freeze it with "
        "requires_grad_(False) if that is intended)", silenced=True)


def inside_function(call: functions.FunctionCall, *, grad_on: bool = False) -> Explanation:
    """A module that ran only inside the forward of a custom autograd.Function not given its parameters
    (``grad_on``: under ``torch.enable_grad()`` there, its output detached by the Function)."""
    return Explanation("inside_function", {
        "function": call.name, "library": call.module.split(".")[0], "place": place_args(call.place),
        "called_from": place_args(call.called_from), "holder": call.holder, "grad_on": grad_on},
        f"inside `{call.name}` at {short_at(place_args(call.called_from or call.place))}")  # type: ignore[arg-type]


def copied_weights(copy: copies.Copy) -> Explanation:
    """A module that never ran, a library's copy of it ran in its place on weights copied from its parameters
    as new leaves (higher's ``copy_initial_weights=True``): those copies got the gradients."""
    return Explanation("copied_weights", {"variable": copy.variable, "class": copy.cls, "library": copy.library},
                       f"weights copied into `{copy.variable}`")


@renders("missing_grad", "copied_weights", fixes="never")
def _copied_weights(m: Members) -> Words:
    a = m.first
    module, library, variable = shown(_common_module(m)), a["library"], a["variable"]
    made = f"`{library}`'s copy of it" if library else "a library's copy of it"
    higher = library == "higher"
    how = ("`copy_initial_weights=True`, higher's default for `higher.innerloop_ctx` and `higher.monkeypatch`, "
           "makes them new leaves" if higher else "they are new leaves")
    cause = (f"{module} never ran in this step: {made}, `{variable}` (a `{a['class']}`), ran in its place, on weights "
             f"that start as copies of its parameters' values ({how}). Backward stops at those copies (they got the "
             f"gradients), so no gradient reaches {m.who}.")
    if higher:
        fix = ("pass `copy_initial_weights=False` to `higher.innerloop_ctx(...)` (or `higher.monkeypatch(...)`): the "
               f"fast weights of `{variable}` then start from {module}'s own parameters, and the meta-gradient "
               "reaches them")
    else:
        fix = (f"make the weights of `{variable}` start from {module}'s own parameters, not from detached copies "
               f"of them, so that backward reaches them; or give the optimizer the tensors `{variable}` trains on")
    return missing_words(m, cause, fix)


def _common_module(m: Members) -> str:
    """The innermost module that holds every tensor of ``m`` (``net`` for ``net.0`` and ``net.2``)."""
    parts = [str(a.get("module", "")).split(".") for a in m.args]
    common = []
    for names in zip(*parts):
        if any(n != names[0] for n in names):
            break
        common.append(names[0])
    return ".".join(common)


@renders("missing_grad", "inside_function", fixes="never")
def _inside_function(m: Members) -> Words:
    a = m.first
    module, function = shown(_common_module(m)), a["function"]
    at = f"at {short_at(a['place'])}" + (f", reached from your call at {short_at(a['called_from'])}"
                                         if a["called_from"] else "")
    if a.get("grad_on"):
        how = ("It ran there under `torch.enable_grad()`, but the graph it built ends inside that forward: what "
               f"`{function}` returns carries only its own backward node, and torch sends gradients back only "
               f"through `{function}`'s backward, to the tensors given to `{function}.apply`: ")
    else:
        how = ("torch runs a Function's forward without autograd and sends gradients back only through its backward, "
               f"to the tensors given to `{function}.apply`: ")
    cause = (f"{module} ran only inside the forward of the custom autograd.Function `{function}` (applied {at}). "
             + how + (f"{m.who} was not among them, so no gradient reaches it." if m.single else
                      f"none of `{m.name}` was among them, so no gradient reaches them."))
    holder = f"`{a['holder']}`" if a["holder"] else None
    if a["library"] == "torchdiffeq":
        fix = (f"register {module} as a submodule of {holder or 'the module you pass to `odeint_adjoint`'}, the "
               "module you integrate (an attribute of it, so that `odeint_adjoint` finds its parameters), or pass "
               "its parameters in `adjoint_params=`")
    else:
        given = f" (register {module} in {holder}, the module it receives)" if holder else ""
        fix = f"give {module}'s parameters to `{function}.apply` as inputs{given}: its backward returns gradients only for its inputs"
    return missing_words(m, cause, fix, silenced=True)


@renders("missing_grad", "checkpoint", fixes="never")
def _checkpoint(m: Members) -> Words:
    module = shown(module_of(m))
    return missing_words(
        m, f"{module} ran inside a reentrant `torch.utils.checkpoint` whose inputs do not "
        "require grad, so it ran without autograd and backward never recomputes it.",
        "pass `use_reentrant=False` to your `checkpoint` call, or make the checkpoint's input require grad")


@renders("missing_grad", "grad_disabled", fixes="never")
def _grad_disabled(m: Members) -> Words:
    module = shown(module_of(m))
    return missing_words(m, f"{module} ran with gradients disabled (inside `torch.no_grad()` or `torch.inference_mode()`).",
                         f"call {module} outside `torch.no_grad()` during training")


def _not_reached(record: RunRecord, records: dict[str, RunRecord], ops_traced: bool) -> Explanation:
    """Backward never reached a module's output: what the module hooks saw of it, and that the exact
    point is unknown (a cut the recorder saw is named by :func:`explain_cut` instead)."""
    storage = record.output_storage
    # The modules that ran after it (neither below nor above it), in their order.
    later = sorted((r for r in records.values() if r.order > record.order and not _is_descendant(r.name, record.name)
                    and not _is_descendant(record.name, r.name)), key=lambda r: r.order)
    # A tensor of the same shape is no evidence: a rewrap is named only when the recorder saw it.
    cut = next((r for r in later if storage and storage in r.detached_inputs), None)
    args: dict[str, Any] = {"ops_traced": ops_traced}
    if cut is not None:
        return Explanation("detached", {**args, "received_detached": cut.name})
    user = next((r for r in later if storage and storage in r.grad_inputs), None)
    if user is not None:
        return Explanation("detached", {**args, "used_by": user.name})
    if not later:
        return Explanation("detached", args)
    return Explanation("unused_output", {**args, "next": later[0].name, "record": record.name})


#: What the cut recorder adds to a cause it has no cut for.
_UNSEEN = ("Where exactly is unknown: leafwatch did not watch the ops of this step (it records the ops "
           "that cut a graph (`.detach()`, `.data`, `.item()`, `.tolist()`, `torch.tensor(...)`, "
           "`torch.no_grad()`) on the first step and after a new miss, inside the model's own forward, "
           "never in a compiled module), or the cut left no trace it can see (`torch.from_numpy`).")
_UNSEEN_INSIDE = ("No op that cuts a graph (`.detach()`, `.data`, `.item()`, `.tolist()`, `torch.tensor(...)`, "
                  "`torch.no_grad()`) ran on it inside the model's forward: where it was cut is unknown (outside "
                  "the forward, in the training loop, or by a step that leaves no trace such as `torch.from_numpy`).")


def _not_reached_words(m: Members) -> Words:
    a, module = m.first, shown(module_of(m))
    unseen = _UNSEEN_INSIDE if a["ops_traced"] else _UNSEEN
    if "received_detached" in a:
        cut = a["received_detached"]
        return missing_words(
            m, f"{module} ran and its output required grad, but backward never reached that output: "
            f"`{cut}` received it detached (the same storage without grad). The cut is between {module} "
            f"and `{cut}`: a `.detach()`, `torch.no_grad()` or a NumPy round trip (`.numpy()` and "
            f"`torch.from_numpy()` share the storage). {unseen}",
            f"pass {module}'s output to `{cut}` as it is: remove the `.detach()` / `torch.no_grad()` / NumPy step "
            "between them", silenced=True)
    if "used_by" in a:
        user = a["used_by"]
        return missing_words(
            m, f"{module} ran and its output required grad, and `{user}` used it, but backward never "
            f"reached it: what `{user}` made from it does not reach the loss (nothing in the loss uses it, or "
            f"it was cut after `{user}`). {unseen}",
            f"keep torch ops from `{user}`'s output to the loss: remove the `.detach()`/`.item()`/"
            "`.tolist()`/NumPy/`torch.tensor` rewrap step after it", silenced=True)
    # No module that the hooks watch ran after it: a cut and an unused output look the same to them.
    return missing_words(
        m, f"{module} ran and its output required grad, but backward never reached that output, and no "
        "module that leafwatch watches ran after it: it was cut from the loss outside any module, or "
        f"nothing in the loss uses it. {unseen}",
        f"keep torch ops from {module}'s output to the loss (remove the `.detach()`/`.item()`/NumPy/"
        f"`torch.tensor` rewrap step after it), or remove {module} if its output is not needed", silenced=True)


@renders("missing_grad", "unused_output", fixes="never")
def _unused_output(m: Members) -> Words:
    a, module = m.first, shown(module_of(m))
    unseen = _UNSEEN_INSIDE if a["ops_traced"] else _UNSEEN
    between = f" between {module} and `{a['next']}` (the next module that ran)"
    record = a["record"]
    return missing_words(
        m, f"{module} ran and its output required grad, but backward never reached that output: nothing in "
        f"the loss uses it (an output computed and ignored, like a pooler whose output the loss never reads), "
        f"or it was cut{between}. {unseen}",
        f"use {module}'s output in the loss, or remove {module} (or ignore its parameters with "
        f"`ignore=[\"{record + '.*' if record else '*'}\"]`) if its output is not needed; if it should "
        f"feed the loss, look{between} for the cut")

"""The crash explanation: what the traceback of an exception torch raised shows of a leaf mistake.

Most users meet leafwatch's bug class as an exception. Where torch raises because of a leaf mistake, a
door (the excepthook while a Monitor is open or a tensor watched, ``leafwatch run``, the Lightning
callback) hands the exception to :func:`explain`: the traceback is read
(:func:`leafwatch.observe.crashes.read`: the tensor, the user's name for it, the op that made it, the
statement that assigned it) and :func:`judge` decides what it shows, one finding per mistake, whose words
the renderers below write (message, cause, fix); the note sink adds them to the very exception.

- ``non_leaf`` / ``optimized_non_leaf``: ``can't optimize a non-leaf Tensor``: the tensor handed to the
  optimizer, the op that made it, the statement that assigned it rewritten to make a leaf;
- ``non_leaf`` / ``persistent_non_leaf``: ``Trying to backward through the graph a second time``, only
  where a non-leaf kept across steps (a module attribute, a variable of the user's frames, not made from
  the model's parameters) was reached by this backward and its graph freed by an earlier one; that error
  has other causes (a hidden state carried across steps), of which nothing is said;
- ``non_leaf`` / ``in_place_on_leaf``: ``a leaf Variable that requires grad is being used in an in-place
  operation``: the receiver on the failing line, and the same change under ``torch.no_grad()``. The kind
  is ``non_leaf`` because autograd refuses to make a leaf it accumulates into a non-leaf;
- ``missing_grad`` / ``all_frozen`` and ``backward_of_no_graph``: ``element 0 of tensors does not require
  grad``: no parameter of the user's modules requires grad, or the loss was made without a graph (and
  where, only when a Monitor's hooks saw it). ``missing_grad``: nothing gets a gradient.

The registry lists this detector at a stage of its own (``CRASH``) that no check runs: the door calls
:func:`explain` once per exception. A failure here is a ``LeafwatchInternalWarning``; the exception is
raised as it is.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..observe import crashes
from ..options import WarnOnce
from ..report.findings import Finding
from ..report.verdicts import Verdict
from ..report.words import ADVICE, Edit, Members, Words, code, renders
from . import fixes
from .causes import at_in, place_args
from .constructors import make
from .leaves import origin_args, origin_cause

#: What a failure to explain a crash says happens next.
GOES_ON = "the exception is raised as it is, without leafwatch's note."


def explain(error: BaseException, contexts: Iterable[crashes.Context] = ()) -> list[Finding]:
    """The findings that explain ``error`` (none for an exception that is no leaf mistake leafwatch
    recognises, or one whose traceback does not show it); never raises: a failure is warned once."""
    if crashes.recognise(error) is None:
        return []
    try:
        return [v.finding for v in judge(crashes.read(error, contexts), None, None) if v.finding is not None]
    except Exception as failure:
        WarnOnce(GOES_ON)("explaining the exception", failure)
        return []


def judge(crash: crashes.Crash | None, state: None, view: Any) -> list[Verdict]:
    """The registry's entry (stage ``CRASH``): the findings a crash's observation shows, opened."""
    if isinstance(crash, crashes.OptimizedNonLeaf):
        found = [_optimized(crash)]
    elif isinstance(crash, crashes.FreedGraph):
        found = [_persistent(crash.place, t) for t in crash.tensors]
    elif isinstance(crash, crashes.NoGraph):
        found = [_no_graph(crash)]
    elif isinstance(crash, crashes.InPlaceOnLeaf):
        found = [_in_place(crash)]
    else:
        found = []
    return [Verdict.open(f) for f in found]


def _short(location: str | None) -> str | None:
    return fixes.short_place(location) if location else None


def _origin(t: crashes.NonLeaf) -> dict[str, Any] | None:
    leaf = t.origin.leaf if t.origin is not None else None
    return origin_args(t.origin, {leaf.tensor_id: t.leaf_name} if leaf is not None and t.leaf_name else {})


def _optimized(crash: crashes.OptimizedNonLeaf) -> Finding:
    t = crash.tensor
    name = t.path or f"<a tensor given to {crash.optimizer}>"
    args = {"optimizer": crash.optimizer, "place": crash.place, "named": bool(t.path), "origin": _origin(t),
            "made_at": _short(t.assigned_at), **fixes.leaf_fix_args(name, t.assigned_at)}
    return make("non_leaf", name, "error", "optimized_non_leaf", args)


@renders("non_leaf", "optimized_non_leaf")
def _optimized_non_leaf(m: Members) -> Words:
    a = m.first
    who = m.who if a["named"] else f"a tensor given to `{a['optimizer']}`"
    made = f" (assigned at {a['made_at']})" if a["made_at"] else ""
    message = (f"{who}{made} is not a leaf tensor, so `{a['optimizer']}` at {_short(a['place'])} cannot optimize it: "
               "an optimizer steps leaves only, and a non-leaf's .grad stays None.")
    if not a["named"]:
        return Words(message, origin_cause("the tensor", a["origin"]),
                     "make the tensor a leaf before you give it to the optimizer: create it with its final dtype "
                     "and device, then ask for grad (`.requires_grad_()` last), or register it as an `nn.Parameter`")
    fix, remedy = fixes.leaf_fix(m.name, a["origin"], a)
    return Words(message, origin_cause(m.name, a["origin"]), fix, remedy)


# -- a non-leaf kept across steps ------------------------------------------------------------------------
def _persistent(place: str, t: crashes.NonLeaf) -> Finding:
    code_name = fixes.attribute_path(t.path, t.owner) if t.owner else None
    name = code_name or t.path
    if t.module is not None and t.attr is not None:
        own = fixes.parameter_args(t.module, t.attr)
        at = own["at"]
        args = {**own, "made_at": f"{os.path.basename(at['path'])}:{at['start']}" if at else None}
    else:
        target = fixes.optimizer_target(optimizers) if (optimizers := fixes.user_optimizers()) else None
        args = {**fixes.leaf_fix_args(name, t.assigned_at, target=target), "made_at": _short(t.assigned_at)}
    args.update(place=place, origin=_origin(t), attribute=t.module is not None and t.attr is not None)
    return make("non_leaf", name, "error", "persistent_non_leaf", args)


@renders("non_leaf", "persistent_non_leaf")
def _persistent_non_leaf(m: Members) -> Words:
    a = m.first
    made = f" (made at {a['made_at']})" if a["made_at"] else ""
    message = (f"{m.who}{made} is a non-leaf tensor kept from one step to the next: an earlier backward() freed "
               f"the graph that made it, and the backward() at {_short(a['place'])} goes through that graph again.")
    cause = f"{origin_cause(m.name, a['origin'])} Its graph is made once and freed by the first backward() through it"
    if a["attribute"]:
        words, remedy = fixes.parameter_fix(a)
        fix = f"{words}; a Parameter is a leaf: no graph is kept from one step to the next, and the optimizer can hold it"
    else:
        fix, remedy = fixes.leaf_fix(m.name, a["origin"], a)
    return Words(message, cause + ".", fix, remedy)


# -- an in-place op on a leaf ------------------------------------------------------------------------------
def _in_place(crash: crashes.InPlaceOnLeaf) -> Finding:
    args = {"place": crash.place, "parameter": crash.is_parameter, "method": crash.method,
            "arguments": list(crash.arguments), "keywords": crash.keywords, "statement": crash.statement,
            "whole": crash.whole, "torch": crash.torch_name, "nn": crash.nn_name, "at": fixes.statement_span(crash.place)}
    return make("non_leaf", crash.receiver, "error", "in_place_on_leaf", args)


def _in_place_fix(name: str, a: Mapping[str, Any]) -> tuple[str, Any]:
    """``nn.init.normal_(w)`` in place of ``w.normal_()`` (torch.nn.init runs under no_grad), else the
    statement under ``torch.no_grad()``."""
    at, statement, method = a["at"], a["statement"], a["method"]
    single = "\n" not in statement
    guarded = f"with {a['torch']}.no_grad(): {statement}" if a["torch"] and single else None
    if guarded is not None and not fixes.is_code(guarded):
        guarded = None
    initialiser = crashes.INITIALISERS.get(method or "")
    if initialiser and a["nn"] and a["whole"] and not a["keywords"]:
        snippet = f"{a['nn']}.init.{initialiser}({', '.join([name, *a['arguments']])})"
        if fixes.is_code(snippet):
            edit = None if at is None else Edit(at["path"], at["start"], at["end"], "replace", f"{at['indent']}{snippet}\n")
            also = f" (or `{guarded}`)" if guarded else ""
            return f"initialise it with `torch.nn.init`, which runs under `torch.no_grad()`: `{snippet}`{also}", code(snippet, edit)
    if guarded is not None:
        edit = None if at is None else Edit(at["path"], at["start"], at["end"], "replace",
                                            f"{at['indent']}with {a['torch']}.no_grad():\n{at['indent']}    {statement}\n")
        return f"change it without autograd: `{guarded}`", code(guarded, edit)
    return "run that change inside a `with torch.no_grad():` block (or use the functions of `torch.nn.init`)", ADVICE


@renders("non_leaf", "in_place_on_leaf")
def _in_place_on_leaf(m: Members) -> Words:
    a = m.first
    what = "an `nn.Parameter`" if a["parameter"] else "a tensor that requires grad"
    op = f"`.{a['method']}()`" if a["method"] else f"`{a['statement']}`" if "\n" not in a["statement"] else "the statement"
    message = (f"{m.who} is {what}, a leaf: torch refuses the in-place {op} at {_short(a['place'])} with grad mode on, "
               f"since autograd cannot record an in-place change of a leaf it accumulates gradients into.")
    cause = (f"{op} changes {m.who} in place while autograd records: an initialisation or a hand-made update of a "
             "parameter must run without autograd (under `torch.no_grad()`, as the functions of `torch.nn.init` do).")
    fix, remedy = _in_place_fix(m.name, a)
    return Words(message, cause, fix, remedy)


# -- a backward of a tensor without a graph ----------------------------------------------------------------
def _model_code(model: crashes.Model) -> str:
    return model.name if model.name and fixes.is_code(model.name) else f"your `{model.cls}`"


def _no_graph(crash: crashes.NoGraph) -> Finding:
    models = [{"name": _model_code(m), "code": bool(m.name and fixes.is_code(m.name)), "parameters": m.parameters,
               "trainable": m.trainable} for m in crash.models]
    base = {"place": crash.place, "loss": crash.loss}
    if models and not any(m["trainable"] for m in models):
        return make("missing_grad", models[0]["name"], "error", "all_frozen", {**base, "models": models})
    grad_off = [fixes.attribute_path(name, owner) or name if owner else name or "the model" for owner, name in crash.grad_off]
    args = {**base, "inference": crash.inference, "models": [m for m in models if m["trainable"]], "grad_off": grad_off,
            "cuts": [{"op": s.op, "place": place_args(s.place), "called_from": place_args(s.called_from)}
                     for s in crash.cuts]}
    return make("missing_grad", crash.loss or "<the loss>", "error", "backward_of_no_graph", args)


def _loss(a: Mapping[str, Any]) -> str:
    return f"`{a['loss']}`" if a["loss"] else "the tensor backward() was called on"


def _listed(models: Sequence[Mapping[str, Any]]) -> str:
    names = [f"`{m['name']}`" if m["code"] else str(m["name"]) for m in models]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


@renders("missing_grad", "all_frozen", fixes="never")
def _all_frozen(m: Members) -> Words:
    a = m.first
    models, count = a["models"], sum(model["parameters"] for model in a["models"])
    message = (f"every parameter of {_listed(models)} is frozen, so {_loss(a)} has no autograd graph and the "
               f"backward() at {_short(a['place'])} has nothing to differentiate: nothing trains.")
    cause = (f"none of the {count} parameter tensors of {_listed(models)} requires grad (`requires_grad=False` on each), "
             "so nothing computed from them records a graph.")
    first = models[0]
    whole = f"`{first['name']}.requires_grad_(True)` for the whole model, or " if first["code"] else ""
    fix = (f"unfreeze what should train before the forward pass: {whole}`requires_grad_(True)` on the part that "
           "should train (and give it to your optimizer)")
    return Words(message, cause, fix, ADVICE)


def _no_graph_cause(a: Mapping[str, Any]) -> tuple[str, str]:
    """What was observed of where the graph was lost, and the fix that goes with it."""
    keep = ("compute the loss from the model's outputs with grad mode on, keeping them tensors all the way (no "
            "`.item()`, `.tolist()`, NumPy or `torch.tensor(...)` between the model and the loss); to log a number, "
            "call `loss.item()` after `loss.backward()`")
    if a["inference"]:
        return (f"{_loss(a)} is an inference tensor: it was computed under `torch.inference_mode()`, which records "
                "no graph.", "run the forward and the loss outside `torch.inference_mode()`")
    if a["grad_off"]:
        modules = ", ".join(f"`{name}`" for name in a["grad_off"])
        return (f"leafwatch's hooks saw {modules} run with grad mode off only since the last check (under "
                "`torch.no_grad()`, `torch.inference_mode()` or `torch.set_grad_enabled(False)`), so its outputs "
                "carry no graph.", f"run the forward of {modules} with grad mode on: out of the `torch.no_grad()` block")
    if a["cuts"]:
        seen = "; ".join(f"{c['op']} at {at_in(c['place'])}" + (f", called from {at_in(c['called_from'])}"
                                                               if c["called_from"] else "") for c in a["cuts"])
        return (f"leafwatch saw the last forward leave autograd at {seen}: what comes out of there carries no "
                "graph.", keep)
    return ("leafwatch did not see where the graph was lost: a loss has none when it is computed under "
            "`torch.no_grad()` or `torch.inference_mode()`, from numbers (`.item()`, `.tolist()`, NumPy, "
            "`torch.tensor(...)` of values) or from `.detach()`ed tensors; a `leafwatch.Monitor` created before "
            "the forward sees where.", keep)


@renders("missing_grad", "backward_of_no_graph", fixes="never")
def _backward_of_no_graph(m: Members) -> Words:
    a = m.first
    trainable = a["models"]
    having = (f" while {_listed(trainable)} {'has' if len(trainable) == 1 else 'have'} parameters that require "
              "grad: it was not computed from them through autograd") if trainable else ""
    message = (f"{_loss(a)} has no autograd graph (no `grad_fn`, `requires_grad=False`), so the backward() at "
               f"{_short(a['place'])} fails{having}.")
    cause, fix = _no_graph_cause(a)
    return Words(message, cause, fix, ADVICE)

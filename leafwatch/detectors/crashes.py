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

import linecache
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..observe import crashes, exhausted
from ..observe import stepped as stepped_crash
from ..options import WarnOnce
from ..report.findings import Finding, group_findings
from ..report.verdicts import Verdict
from ..report.words import ADVICE, Edit, Members, Words, code, renders
from . import fixes, freed, graphless, stepped
from .causes import at_in, place_args
from .constructors import make
from .leaves import origin_args, origin_cause

#: What a failure to explain a crash says happens next.
GOES_ON = "the exception is raised as it is, without leafwatch's note."


def explain(error: BaseException, contexts: Iterable[crashes.Context] = ()) -> list[Finding]:
    """The findings that explain ``error`` (none for an exception that is no leaf mistake leafwatch
    recognises, or one whose traceback does not show it), one per mistake; never raises: a failure is
    warned once."""
    if crashes.recognise(error) is None:
        return []
    try:
        found = [v.finding for v in judge(crashes.read(error, contexts), None, None) if v.finding is not None]
        together = [f for f in found if "group" in f.details]  # the non-leaves handed to one optimizer
        return [f for f in found if "group" not in f.details] + (group_findings(together) if together else [])
    except Exception as failure:
        WarnOnce(GOES_ON)("explaining the exception", failure)
        return []


def judge(crash: crashes.Crash | None, state: None, view: Any) -> list[Verdict]:
    """The registry's entry (stage ``CRASH``): the findings a crash's observation shows, opened."""
    if isinstance(crash, crashes.OptimizedNonLeaf):
        found = _optimized(crash)
    elif isinstance(crash, crashes.FreedGraph):
        found = [*(freed.carried(crash.place, c) for c in crash.carried),
                 *(freed.freed_by_earlier(crash.place, e) for e in crash.earlier),
                 *(freed.computed_once(crash.place, c) for c in crash.once),
                 *(_persistent(crash.place, t) for t in crash.tensors)]
    elif isinstance(crash, crashes.NoGraph):
        found = [_no_graph(crash)]
    elif isinstance(crash, crashes.InPlaceOnLeaf):
        found = [_in_place(crash)]
    elif isinstance(crash, stepped_crash.SteppedBeforeBackward):
        found = [stepped.judge(crash)]
    elif isinstance(crash, exhausted.ExhaustedIterator):
        found = [_exhausted(crash)]
    else:
        found = []
    return [Verdict.open(f) for f in found]


def _short(location: str | None) -> str | None:
    return fixes.short_place(location) if location else None


def _origin(t: crashes.NonLeaf) -> dict[str, Any] | None:
    leaf = t.origin.leaf if t.origin is not None else None
    return origin_args(t.origin, {leaf.tensor_id: t.leaf_name} if leaf is not None and t.leaf_name else {})


def _optimized(crash: crashes.OptimizedNonLeaf) -> list[Finding]:
    """One finding per non-leaf handed to the optimizer; several make one mistake, whose fix makes each a leaf
    (torch refuses the first it meets, then the next)."""
    made = []
    for t in crash.tensors:
        name = t.path or f"<a tensor given to {crash.optimizer}>"
        made.append((name, {"optimizer": crash.optimizer, "place": crash.place, "named": bool(t.path),
                            "origin": _origin(t), "made_at": _short(t.assigned_at),
                            **fixes.leaf_fix_args(name, t.assigned_at)}))
    if len(made) == 1:
        return [make("non_leaf", made[0][0], "error", "optimized_non_leaf", made[0][1])]
    together = _together([a for _, a in made])
    group = f"{crash.optimizer} at {_short(crash.place)}"
    return [make("non_leaf", name, "error", "optimized_non_leaf", {**args, "together": together}, group=group)
            for name, args in made]


def _together(made: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One code fix for several non-leaves: each assignment rewritten to make a leaf, as one edit from the first
    to the last (the lines between as they are); None when one of them has no rewrite, or they are in two files."""
    if any(a["leaf_code"] is None or a["at"] is None for a in made) or len({a["at"]["path"] for a in made}) != 1:
        return None
    spans = sorted(made, key=lambda a: a["at"]["start"])
    if any(b["at"]["start"] <= a["at"]["end"] for a, b in zip(spans, spans[1:])):
        return None
    path = spans[0]["at"]["path"]
    lines, text, line = linecache.getlines(path), "", spans[0]["at"]["start"]
    for a in spans:
        text += "".join(lines[line - 1:a["at"]["start"] - 1]) + f"{a['at']['indent']}{a['leaf_code']}\n"
        line = a["at"]["end"] + 1
    edit = Edit(path, spans[0]["at"]["start"], spans[-1]["at"]["end"], "replace", text)
    return {"code": "\n".join(a["leaf_code"] for a in made), "edit": edit.to_dict()}


@renders("non_leaf", "optimized_non_leaf")
def _optimized_non_leaf(m: Members) -> Words:
    a = m.first
    if not m.single:
        return _optimized_together(m)
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


def _optimized_together(m: Members) -> Words:
    """Several non-leaves handed to one optimizer: each named, one fix for all."""
    a = m.first
    named = [f"`{name}` (assigned at {b['made_at']})" if b["made_at"] else f"`{name}`" for name, b in zip(m.names, m.args)]
    listed = ", ".join(named[:-1]) + f" and {named[-1]}"
    message = (f"{listed} are not leaf tensors, so `{a['optimizer']}` at {_short(a['place'])} cannot optimize them: "
               "torch refuses the first it meets, and would refuse the next once that one is fixed; an optimizer "
               "steps leaves only.")
    cause = " ".join(origin_cause(name, b["origin"]) for name, b in zip(m.names, m.args))
    together = a.get("together")
    if together is None:
        return Words(message, cause, "make each of them a leaf where it is made: create it with its final value, "
                                     "then ask for grad (`.requires_grad_()` last)", ADVICE)
    snippets = "; ".join(f"`{line}`" for line in together["code"].splitlines())
    return Words(message, cause, f"make each a leaf where it is made: {snippets}",
                 code(together["code"], Edit.from_dict(together["edit"])))


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
    if crash.others:
        decorator = f"@{crash.torch_name}.no_grad()"
        at = crash.decorate
        guarded = crash.guarded
        args.update(others=[[_short(place), statement] for place, statement in crash.others], routine=crash.routine,
                    decorator=decorator if at is not None else None,
                    all=Edit(at.path, at.start - 1, at.start - 1, "insert_after", f"{at.indent}{decorator}\n").to_dict()
                    if at is not None else Edit(guarded[0].path, guarded[0].start, guarded[0].end, "replace",
                                                guarded[1]).to_dict() if guarded is not None else None,
                    guarded=guarded[1] if guarded is not None and at is None else None)
    return make("non_leaf", crash.receiver, "error", "in_place_on_leaf", args)


def _in_place_all(a: Mapping[str, Any]) -> tuple[str, Any]:
    """One fix for every in-place change of a leaf in one routine: the routine under ``@torch.no_grad()``, or the
    statements under one ``with torch.no_grad():``."""
    if a["decorator"] and a["all"]:
        return (f"run `{a['routine']}` without autograd, as an initialisation: decorate it with `{a['decorator']}` "
                "(every in-place change in it then runs under `torch.no_grad()`), or use the functions of "
                "`torch.nn.init`"), code(a["decorator"], Edit.from_dict(a["all"]))
    if a["guarded"] and a["all"]:
        return ("run these lines without autograd, under one `with torch.no_grad():` block (or use the functions of "
                "`torch.nn.init`)"), code(a["guarded"].strip("\n"), Edit.from_dict(a["all"]))
    return ("run each of these changes inside a `with torch.no_grad():` block (or use the functions of "
            "`torch.nn.init`)"), ADVICE


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
    others = a.get("others") or []
    lines = "; ".join(f"`{statement}` at {place}" if "\n" not in statement else f"the statement at {place}"
                      for place, statement in others)
    where = f"`{a['routine']}`" if a.get("routine") else "The same code"
    also = f" {where} changes a leaf in place again: {lines} would be refused next." if others else ""
    message = (f"{m.who} is {what}, a leaf: torch refuses the in-place {op} at {_short(a['place'])} with grad mode on, "
               f"since autograd cannot record an in-place change of a leaf it accumulates gradients into.{also}")
    cause = (f"{op} changes {m.who} in place while autograd records: an initialisation or a hand-made update of a "
             "parameter must run without autograd (under `torch.no_grad()`, as the functions of `torch.nn.init` do).")
    fix, remedy = _in_place_all(a) if others else _in_place_fix(m.name, a)
    return Words(message, cause, fix, remedy)


# -- a backward of a tensor without a graph ----------------------------------------------------------------
def _model_code(model: crashes.Model) -> str:
    return model.name if model.name and fixes.is_code(model.name) else f"your `{model.cls}`"


def _no_graph(crash: crashes.NoGraph) -> Finding:
    models = [{"name": _model_code(m), "code": bool(m.name and fixes.is_code(m.name)), "parameters": m.parameters,
               "trainable": m.trainable} for m in crash.models]
    base = {"place": crash.place, "loss": crash.loss}
    if models and not any(m["trainable"] for m in models):
        return make("missing_grad", models[0]["name"], "error", "all_frozen",
                    {**base, "models": models, **_meant(crash.frozen)})
    if crash.function is not None:
        return graphless.grad_off(crash.place, crash.loss, [m for m in models if m["trainable"]], crash.function)
    if crash.detached is not None:
        return graphless.detached(crash.place, crash.loss, [m for m in models if m["trainable"]], crash.detached)
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


def _meant(frozen: Any) -> dict[str, Any]:
    """What a fully frozen script meant to train, as a finding's arguments: the modules it tried to unfreeze with
    a plain attribute (and where), the parts its optimizer was given, and the placed unfreeze."""
    if frozen is None:
        return {"unfrozen": [], "parts": [], "whole": False, "optimizer": None, "snippet": None, "edit": None}
    unfrozen = [{"module": u.module, "at": _short(u.at), "statement": u.statement} for u in frozen.unfrozen]
    targets = [u.module for u in frozen.unfrozen] or list(frozen.parts)
    snippet = "\n".join(f"{t}.requires_grad_(True)" for t in targets) if targets else None
    edit = None
    spans = [u.span for u in frozen.unfrozen if u.span is not None]
    if snippet and frozen.unfrozen and len(spans) == len(frozen.unfrozen) == 1:
        at = spans[0]
        edit = Edit(at.path, at.start, at.end, "replace", f"{at.indent}{snippet}\n").to_dict()
    elif snippet and not frozen.unfrozen and frozen.after is not None:
        at = frozen.after
        edit = Edit(at.path, at.end, at.end, "insert_after",
                    "".join(f"{at.indent}{line}\n" for line in snippet.splitlines())).to_dict()
    return {"unfrozen": unfrozen, "parts": list(frozen.parts), "whole": frozen.whole, "optimizer": frozen.optimizer,
            "snippet": snippet, "edit": edit}


@renders("missing_grad", "all_frozen")
def _all_frozen(m: Members) -> Words:
    a = m.first
    models, count = a["models"], sum(model["parameters"] for model in a["models"])
    unfrozen, parts, snippet = a.get("unfrozen") or [], a.get("parts") or [], a.get("snippet")
    message = (f"every parameter of {_listed(models)} is frozen, so {_loss(a)} has no autograd graph and the "
               f"backward() at {_short(a['place'])} has nothing to differentiate: nothing trains.")
    if unfrozen:
        said = "; ".join(f"`{u['statement']}` at {u['at']}" if u["at"] else f"`{u['module']}.requires_grad = True`"
                         for u in unfrozen)
        also = (f" {said} sets a plain attribute of the module, which PyTorch ignores: its parameters keep "
                "`requires_grad=False`.")
    elif parts and not a["whole"]:
        also = f" `{a['optimizer']}` was given the parameters of {', '.join(f'`{p}`' for p in parts)}, frozen too."
    else:
        also = ""
    cause = (f"none of the {count} parameter tensors of {_listed(models)} requires grad (`requires_grad=False` on each), "
             f"so nothing computed from them records a graph.{also}")
    if not snippet:
        first = models[0]
        whole = f"`{first['name']}.requires_grad_(True)` for the whole model, or " if first["code"] else ""
        return Words(message, cause, f"unfreeze what should train before the forward pass: {whole}`requires_grad_(True)` "
                                     "on the part that should train (and give it to your optimizer)", ADVICE)
    shown = "; ".join(snippet.splitlines())
    remedy = code(snippet, Edit.from_dict(a["edit"]) if a["edit"] else None)
    if unfrozen:
        fix = f"unfreeze its parameters with the module's method: `{shown}`"
    elif not a["whole"]:
        fix = (f"unfreeze what `{a['optimizer']}` trains, before the forward pass: `{shown}` (not `requires_grad_(True)` "
               "on the whole model, which would also train what should stay frozen)")
    else:
        fix = (f"unfreeze what should train before the forward pass: `{shown}` (`{a['optimizer']}` was given every "
               "parameter of it); if a part should stay frozen (a pretrained backbone), unfreeze only the part that "
               "should train")
    return Words(message, cause, fix, remedy)


# -- an optimizer handed an iterator used up already ---------------------------------------------------------
def _exhausted(crash: exhausted.ExhaustedIterator) -> Finding:
    snippet = f"{crash.name} = list({crash.value})" if crash.value is not None else None
    at = crash.at
    edit = Edit(at.path, at.start, at.end, "replace", f"{at.indent}{snippet}\n").to_dict() \
        if snippet is not None and at is not None and fixes.is_code(snippet) else None
    args = {"place": crash.place, "optimizer": crash.optimizer, "kind": crash.kind, "made_at": _short(crash.made_at),
            "used_at": _short(crash.used_at), "used": crash.used, "snippet": snippet if edit else None, "edit": edit}
    return make("not_in_optimizer", crash.name, "error", "exhausted_iterator", args)


@renders("not_in_optimizer", "exhausted_iterator")
def _exhausted_iterator(m: Members) -> Words:
    a = m.first
    made = f" (made at {a['made_at']})" if a["made_at"] else ""
    used = (f"`{a['used']}` at {a['used_at']}" if a["used"] and "\n" not in a["used"] else
            f"the statement at {a['used_at']}" if a["used_at"] else "an earlier statement")
    message = (f"{m.who}{made} is a one-shot `{a['kind']}` iterator, used up by {used} before `{a['optimizer']}` at "
               f"{_short(a['place'])} got it: the optimizer got no parameter, and nothing would train.")
    cause = (f"a `{a['kind']}` (like a generator, or `model.parameters()`) yields its items once: the first pass over "
             f"{m.who} took them all, so nothing was left for the optimizer.")
    if a["snippet"]:
        return Words(message, cause, f"make it a list where it is made: `{a['snippet']}`",
                     code(a["snippet"], Edit.from_dict(a["edit"])))
    return Words(message, cause, f"make {m.who} a list where it is made (`list(...)`), so that it can be read twice",
                 ADVICE)


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

"""``element 0 of tensors does not require grad`` where the script shows how the graph was lost, and the words
(the observation: :mod:`leafwatch.observe.graphless`):

- ``missing_grad`` / ``grad_off_function``: the loss computed through a function decorated with
  ``@torch.no_grad()`` (an evaluation helper used in the training step): the function and its decorator's line,
  never "a ``no_grad`` block"; the fix takes the decorator away;
- ``missing_grad`` / ``detached_loss``: a LightningModule's ``training_step`` that returns its loss
  ``.detach()``-ed: the ``.detach()`` and its line; the fix returns the loss itself.

Every parameter frozen stays ``all_frozen`` (``detectors/crashes.py``), which names the part the script meant to
train. The edits are worked out here, when the finding is decided.
"""

from __future__ import annotations

from typing import Any

from ..observe import graphless
from ..report.findings import Finding
from ..report.words import Edit, Members, Words, code, renders
from . import fixes
from .constructors import make


def _short(location: str) -> str:
    return fixes.short_place(location)


def _trainable(models: list[dict[str, Any]]) -> str:
    names = [f"`{m['name']}`" if m["code"] else str(m["name"]) for m in models]
    if not names:
        return ""
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
    return f" while {listed} {'has' if len(names) == 1 else 'have'} parameters that require grad"


def grad_off(place: str, loss: str | None, models: list[dict[str, Any]], f: graphless.GradOffFunction) -> Finding:
    at = f.span
    args = {"place": place, "loss": loss, "models": models, "function": f.function, "decorator": f.decorator,
            "at": _short(f.at), "called_at": _short(f.called_at), "definition": f.definition,
            "edit": Edit(at.path, at.start, at.end, "replace", f.kept).to_dict()}
    return make("missing_grad", loss or "<the loss>", "error", "grad_off_function", args)


@renders("missing_grad", "grad_off_function", fixes="always")
def _grad_off_function(m: Members) -> Words:
    a = m.first
    loss = f"`{a['loss']}`" if a["loss"] else "the tensor backward() was called on"
    message = (f"{loss} has no autograd graph (no `grad_fn`, `requires_grad=False`), so the backward() at "
               f"{_short(a['place'])} fails{_trainable(a['models'])}: it was computed through `{a['function']}` "
               f"(called at {a['called_at']}), which `{a['decorator']}` at {a['at']} runs with grad mode off.")
    cause = (f"`{a['decorator']}` turns autograd off for every call of `{a['function']}`: what it returns has no "
             "graph, and neither has anything computed from it, so no parameter gets a gradient.")
    fix = (f"remove `{a['decorator']}` from `{a['function']}` (at {a['at']}): it runs in the training step too; "
           f"where you call it to evaluate, call it under `with torch.no_grad():`")
    return Words(message, cause, fix, code(a["definition"], Edit.from_dict(a["edit"])))


def detached(place: str, loss: str | None, models: list[dict[str, Any]], d: graphless.DetachedReturn) -> Finding:
    at = d.span
    args = {"place": place, "models": models, "cls": d.cls, "method": d.method, "at": _short(d.at),
            "call": d.call, "fixed": d.fixed.strip(), "edit": Edit(at.path, at.start, at.end, "replace", d.fixed).to_dict()}
    return make("missing_grad", loss or "<the loss>", "error", "detached_loss", args)


@renders("missing_grad", "detached_loss", fixes="always")
def _detached_loss(m: Members) -> Words:
    a = m.first
    message = (f"`{a['cls']}.{a['method']}` returns its loss as `{a['call']}` at {a['at']}: the tensor Lightning "
               f"calls backward() on (in the run started at {_short(a['place'])}) has no autograd graph, so that "
               f"backward() fails{_trainable(a['models'])}.")
    cause = (f"`.detach()` gives a tensor cut from the graph, and Lightning runs backward() on the loss "
             f"`{a['method']}` returns: nothing trains. To log the loss, detach only the copy you log.")
    shown = f": `{a['fixed']}`" if "\n" not in a["fixed"] else ""
    fix = f"return the loss itself, not `{a['call']}`{shown}"
    return Words(message, cause, fix, code(a["fixed"], Edit.from_dict(a["edit"])))

"""``Trying to backward through the graph a second time`` in the forms users meet, and their words (the
observation: :mod:`leafwatch.observe.freed`). Every finding here is a ``non_leaf`` kept past the backward()
that freed its graph, named by the user's variable, with a placed code fix:

- ``carried_state``: a variable carried across iterations with its graph (a recurrent hidden state): detach it at
  the top of the loop (``h_state = h_state.detach()``; ``repackage_hidden(hidden)`` for a tuple);
- ``computed_once``: a value computed once from a parameter that trains (``std = log_std.exp()``, prototypes
  normalised in ``__init__``): compute it inside the step; never an ``nn.Parameter``, which would stop its source
  from training;
- ``freed_by_earlier_backward``: one output used by two losses (a GAN's ``fake``): ``.detach()`` it where it feeds
  the other network's loss, or ``retain_graph=True`` where both losses truly need its graph.

The edits are worked out here, when the finding is decided; the renderers write words from the arguments alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..observe import freed
from ..report.findings import Finding
from ..report.words import ADVICE, Edit, Members, Remedy, Words, code, renders
from . import fixes
from .constructors import make
from .leaves import origin_args


def _short(location: str | None) -> str | None:
    return fixes.short_place(location) if location else None


def _edit(action: str, at: Any, text: str) -> dict[str, Any] | None:
    """An :class:`Edit` as a finding's argument: ``insert_after`` the line before ``at`` starts, or ``replace`` its
    lines (``at``: an :class:`~leafwatch.observe.source.Span`)."""
    if at is None:
        return None
    if action == "insert_before":
        return Edit(at.path, at.start - 1, at.start - 1, "insert_after", text).to_dict()
    return Edit(at.path, at.start, at.end, "replace", text).to_dict()


def _remedy(snippet: str, edit: Mapping[str, Any] | None) -> Remedy:
    return code(snippet, Edit.from_dict(edit) if edit else None)


# -- a variable carried across iterations ------------------------------------------------------------------
def carried(place: str, c: freed.Carried) -> Finding:
    name = c.name
    if c.count is None:
        value = f"{name}.detach()"
    else:
        value = f"{c.helper}({name})" if c.helper else f"tuple(t.detach() for t in {name})"
    if c.maybe_none:
        value = f"None if {name} is None else {value}"
    snippet = f"{name} = {value}"
    top = c.top
    args = {"place": place, "carried_at": c.carried_at, "statement": c.statement, "tuple": c.count is not None,
            "snippet": snippet, "top": _short(f"{top.path}:{top.start}") if top else None,
            "edit": _edit("insert_before", top, f"{top.indent}{snippet}\n") if top else None}
    return make("non_leaf", name, "error", "carried_state", args)


@renders("non_leaf", "carried_state", fixes="always")
def _carried_state(m: Members) -> Words:
    a = m.first
    single = "\n" not in a["statement"]
    statement = f"`{a['statement']}` at {_short(a['carried_at'])}" if single else f"the statement at {_short(a['carried_at'])}"
    message = (f"{m.who} carries the autograd graph of the previous iteration into this one: {statement} makes it "
               f"from its own value of the iteration before, never detached, so the backward() at {_short(a['place'])} "
               "goes back into the earlier iteration's graph, which that iteration's backward() freed.")
    cause = (f"a value carried from one iteration to the next (a recurrent hidden state, a running sum) keeps the graph "
             f"of every iteration that made it: each backward() frees the graph it went through, and the next one "
             f"reaches it again through {m.who}, whose values are to be carried over, not their history.")
    where = f" (before {a['top']})" if a["top"] else ""
    fix = (f"cut its history at the top of the loop, keeping its value: `{a['snippet']}` as the loop's first "
           f"statement{where}")
    return Words(message, cause, fix, _remedy(a["snippet"], a["edit"]))


# -- a value computed once from a parameter --------------------------------------------------------------
def computed_once(place: str, c: freed.ComputedOnce) -> Finding:
    args: dict[str, Any] = {"place": place, "sources": list(c.sources), "made_at": _short(c.made_at),
                            "statement": c.statement, "origin": origin_args(c.origin, {}), "attribute": c.attr is not None,
                            "owner": c.owner, "attr": c.attr, "snippet": None, "edit": None, "top": None}
    if c.attr is None and c.top is not None and c.statement and "\n" not in c.statement:
        args.update(snippet=c.statement, top=_short(f"{c.top.path}:{c.top.start}"),
                    edit=_edit("insert_before", c.top, f"{c.top.indent}{c.statement}\n"))
    elif c.attr is not None and c.value is not None and c.at is not None and "\n" not in c.value:
        indent = c.indent
        body = (f"\n{indent}@property\n{indent}def {c.attr}({c.me}):\n{indent}    return {c.value}\n")
        args.update(snippet=body.strip("\n"), value=c.value,
                    edit=Edit(c.at.path, c.at.start, c.at.start + len(c.rest.splitlines()) + (c.at.end - c.at.start),
                              "replace", c.rest + body).to_dict())
    return make("non_leaf", c.name, "error", "computed_once", args)


def _sources(a: Mapping[str, Any]) -> str:
    names = [f"`{n}`" for n in a["sources"]]
    if not names:
        return "a parameter that trains"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


@renders("non_leaf", "computed_once")
def _computed_once(m: Members) -> Words:
    a = m.first
    made = f" (made at {a['made_at']} from {_sources(a)})" if a["made_at"] else f" (made from {_sources(a)})"
    when = "in `__init__`" if a["attribute"] else "before the loop"
    message = (f"{m.who}{made} is computed once, {when}, and used at every step: the first backward() freed the "
               f"graph that made it, and the backward() at {_short(a['place'])} goes through it again.")
    op = f" (autograd op `{a['origin']['op']}`)" if a["origin"] else ""
    trains = "train" if len(a["sources"]) > 1 else "trains"
    cause = (f"its graph{op} is made once, from {_sources(a)}, which {trains}, and the first backward() through it "
             "freed it: each backward() needs a graph made in its own step.")
    never = f"never make it an `nn.Parameter` (or a `.detach()`ed copy): {_sources(a)} would stop training"
    if a["snippet"] and a["attribute"]:
        fix = (f"compute it at each step, from {_sources(a)}: make `{a['attr']}` a property of `{a['owner']}` that "
               f"returns `{a['value']}`, in place of the tensor made in `__init__`; {never}")
        return Words(message, cause, fix, _remedy(a["snippet"], a["edit"]))
    if a["snippet"]:
        fix = (f"compute it inside the step: repeat `{a['snippet']}` at the top of the loop (before {a['top']}), so "
               f"that each backward() has a graph of its own; {never}")
        return Words(message, cause, fix, _remedy(a["snippet"], a["edit"]))
    fix = f"compute it inside the step (in `forward`, or at the top of the training loop) from {_sources(a)}; {never}"
    return Words(message, cause, fix, ADVICE)


# -- one output, two losses -----------------------------------------------------------------------------
def freed_by_earlier(place: str, f: freed.FreedByEarlier) -> Finding:
    detach = retain = None
    if f.detach is not None:
        at, text = f.detach
        detach = {"code": text.strip() if "\n" not in text.strip() else text, "edit": _edit("replace", at, text)}
    if f.retain is not None:
        at, text = f.retain
        retain = {"code": text.strip(), "edit": _edit("replace", at, text)}
    args = {"place": place, "made_at": _short(f.made_at), "earlier": f.earlier, "earlier_at": _short(f.earlier_at),
            "used_at": [_short(u) for u in f.used_at], "optimizers": list(f.optimizers) if f.optimizers else None,
            "detach": detach, "retain": retain}
    return make("non_leaf", f.name, "error", "freed_by_earlier_backward", args)


@renders("non_leaf", "freed_by_earlier_backward")
def _freed_by_earlier_backward(m: Members) -> Words:
    a = m.first
    used = f" at {', '.join(a['used_at'])}" if a["used_at"] else ""
    message = (f"{m.who} (made at {a['made_at']}) is used by two losses: `{a['earlier']}.backward()` at "
               f"{a['earlier_at']} freed its graph, and the backward() at {_short(a['place'])} goes through it again.")
    cause = (f"{m.who} feeds `{a['earlier']}`{used} and the loss of this backward(); a backward() frees the graph it "
             "goes through, so the first one freed the part the two losses share.")
    detach, retain = a["detach"], a["retain"]
    if a["optimizers"] and detach is not None:
        mine, theirs = a["optimizers"]
        shown = f": `{detach['code']}`" if "\n" not in detach["code"] else ""
        fix = (f"keep `{a['earlier']}` (trained by `{theirs}`) off the network that made {m.who} (trained by `{mine}`): "
               f"use `{m.name}.detach()` where it feeds `{a['earlier']}`{shown}; `retain_graph=True` only where both "
               "losses truly need the graph")
        return Words(message, cause, fix, _remedy(detach["code"], detach["edit"]))
    if retain is not None:
        fix = (f"if both losses need the graph of {m.who}, keep it for the second: `{retain['code']}`; if "
               f"`{a['earlier']}` should not train what made {m.who}, use `{m.name}.detach()` where it feeds it")
        return Words(message, cause, fix, _remedy(retain["code"], retain["edit"]))
    return Words(message, cause, f"use `{m.name}.detach()` where it feeds `{a['earlier']}`, or `retain_graph=True` in "
                                 "its backward() where both losses need the graph", ADVICE)

"""``Trying to backward through the graph a second time`` in the forms users meet, and their reasons (the
observation: :mod:`leafwatch.observe.freed`). Every finding here is a ``non_leaf`` kept past the backward()
that freed its graph, named by the user's variable, with a placed code fix:

- ``carried_state`` (:class:`CarriedState`): a variable carried across iterations with its graph (a recurrent
  hidden state): detach it at the top of the loop (``h_state = h_state.detach()``; ``repackage_hidden(hidden)``
  for a tuple);
- ``computed_once`` (:class:`ComputedOnce`): a value computed once from a parameter that trains (``std =
  log_std.exp()``, prototypes normalised in ``__init__``): compute it inside the step; never an
  ``nn.Parameter``, which would stop its source from training;
- ``freed_by_earlier_backward`` (:class:`FreedByEarlier`): one output used by two losses (a GAN's ``fake``):
  ``.detach()`` it where it feeds the other network's loss, or ``retain_graph=True`` where both losses truly
  need its graph.

The edits are worked out here, when the finding is decided; the reasons write words from their fields alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..observe import freed
from ..report.findings import Finding
from ..report.reasons import Reason
from ..report.words import ADVICE, Edit, Members, Words, code
from . import fixes
from .constructors import make
from .leaves import Origin, origin_of


def short(location: str | None) -> str | None:
    """``train.py:12`` of ``/path/to/train.py:12`` (None for None)."""
    return fixes.short_place(location) if location else None


def edit_at(action: str, at: Any, text: str) -> Edit | None:
    """An :class:`Edit`: ``insert_after`` the line before ``at`` starts, or ``replace`` its lines (``at``: an
    :class:`~leafwatch.observe.source.Span`; None for None)."""
    if at is None:
        return None
    if action == "insert_before":
        return Edit(at.path, at.start - 1, at.start - 1, "insert_after", text)
    return Edit(at.path, at.start, at.end, "replace", text)


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
    return make(CarriedState(place=place, carried_at=c.carried_at, statement=c.statement, several=c.count is not None,
                             snippet=snippet, top=short(f"{top.path}:{top.start}") if top else None,
                             edit=edit_at("insert_before", top, f"{top.indent}{snippet}\n") if top else None),
                name, "error")


class CarriedState(Reason, kind="non_leaf", name="carried_state", fixes="always"):
    """A variable carried from one iteration to the next with its graph: the statement that carries it
    (``statement`` at ``carried_at``), the backward at ``place``, the detach (``snippet``) placed at the top of
    the loop (``top``, ``edit``); ``several``: a tuple of tensors (an LSTM's ``(h, c)``)."""

    place: str
    carried_at: str
    statement: str
    snippet: str
    several: bool = False
    top: str | None = None
    edit: Edit | None = None

    def words(self, m: Members) -> Words:
        single = "\n" not in self.statement
        statement = (f"`{self.statement}` at {short(self.carried_at)}" if single
                     else f"the statement at {short(self.carried_at)}")
        message = (f"{m.who} carries the autograd graph of the previous iteration into this one: {statement} makes it "
                   f"from its own value of the iteration before, never detached, so the backward() at "
                   f"{short(self.place)} goes back into the earlier iteration's graph, which that iteration's "
                   "backward() freed.")
        cause = (f"a value carried from one iteration to the next (a recurrent hidden state, a running sum) keeps the "
                 f"graph of every iteration that made it: each backward() frees the graph it went through, and the "
                 f"next one reaches it again through {m.who}, whose values are to be carried over, not their history.")
        where = f" (before {self.top})" if self.top else ""
        fix = (f"cut its history at the top of the loop, keeping its value: `{self.snippet}` as the loop's first "
               f"statement{where}")
        return Words(message, cause, fix, code(self.snippet, self.edit))


# -- a value computed once from a parameter --------------------------------------------------------------
def computed_once(place: str, c: freed.ComputedOnce) -> Finding:
    fields: dict[str, Any] = {}
    if c.attr is None and c.top is not None and c.statement and "\n" not in c.statement:
        fields.update(snippet=c.statement, top=short(f"{c.top.path}:{c.top.start}"),
                      edit=edit_at("insert_before", c.top, f"{c.top.indent}{c.statement}\n"))
    elif c.attr is not None and c.value is not None and c.at is not None and "\n" not in c.value:
        indent = c.indent
        body = f"\n{indent}@property\n{indent}def {c.attr}({c.me}):\n{indent}    return {c.value}\n"
        fields.update(snippet=body.strip("\n"), value=c.value,
                      edit=Edit(c.at.path, c.at.start, c.at.start + len(c.rest.splitlines()) + (c.at.end - c.at.start),
                                "replace", c.rest + body))
    return make(ComputedOnce(place=place, sources=tuple(c.sources), made_at=short(c.made_at), statement=c.statement,
                             origin=origin_of(c.origin, {}), attribute=c.attr is not None, owner=c.owner, attr=c.attr,
                             **fields), c.name, "error")


class ComputedOnce(Reason, kind="non_leaf", name="computed_once"):
    """A value computed once (before the loop, or in ``__init__``: ``attribute``, ``owner``'s ``attr``) from the
    parameters ``sources``, used at every step: its graph was freed by the first backward. Its code fix
    (``snippet``, ``edit``): the statement again at the top of the loop (``top``), or a property that returns
    ``value``."""

    place: str
    sources: tuple[str, ...] = ()
    made_at: str | None = None
    statement: str | None = None
    origin: Origin | None = None
    attribute: bool = False
    owner: str | None = None
    attr: str | None = None
    snippet: str | None = None
    value: str | None = None
    top: str | None = None
    edit: Edit | None = None

    def _sources(self) -> str:
        names = [f"`{n}`" for n in self.sources]
        if not names:
            return "a parameter that trains"
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"

    def words(self, m: Members) -> Words:
        sources = self._sources()
        made = f" (made at {self.made_at} from {sources})" if self.made_at else f" (made from {sources})"
        when = "in `__init__`" if self.attribute else "before the loop"
        message = (f"{m.who}{made} is computed once, {when}, and used at every step: the first backward() freed the "
                   f"graph that made it, and the backward() at {short(self.place)} goes through it again.")
        op = f" (autograd op `{self.origin.op}`)" if self.origin is not None else ""
        trains = "train" if len(self.sources) > 1 else "trains"
        cause = (f"its graph{op} is made once, from {sources}, which {trains}, and the first backward() through it "
                 "freed it: each backward() needs a graph made in its own step.")
        never = f"never make it an `nn.Parameter` (or a `.detach()`ed copy): {sources} would stop training"
        if self.snippet and self.attribute:
            fix = (f"compute it at each step, from {sources}: make `{self.attr}` a property of `{self.owner}` that "
                   f"returns `{self.value}`, in place of the tensor made in `__init__`; {never}")
            return Words(message, cause, fix, code(self.snippet, self.edit))
        if self.snippet:
            fix = (f"compute it inside the step: repeat `{self.snippet}` at the top of the loop (before {self.top}), "
                   f"so that each backward() has a graph of its own; {never}")
            return Words(message, cause, fix, code(self.snippet, self.edit))
        fix = f"compute it inside the step (in `forward`, or at the top of the training loop) from {sources}; {never}"
        return Words(message, cause, fix, ADVICE)


# -- one output, two losses -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Rewrite:
    """A placed code fix: the code shown and the edit of the user's file."""

    code: str
    edit: Edit | None = None


def freed_by_earlier(place: str, f: freed.FreedByEarlier) -> Finding:
    detach = retain = None
    if f.detach is not None:
        at, text = f.detach
        detach = Rewrite(text.strip() if "\n" not in text.strip() else text, edit_at("replace", at, text))
    if f.retain is not None:
        at, text = f.retain
        retain = Rewrite(text.strip(), edit_at("replace", at, text))
    return make(FreedByEarlier(place=place, made_at=short(f.made_at), earlier=f.earlier, earlier_at=short(f.earlier_at),
                               used_at=tuple(short(u) for u in f.used_at),  # type: ignore[misc]
                               optimizers=tuple(f.optimizers) if f.optimizers else None, detach=detach, retain=retain),
                f.name, "error")


class FreedByEarlier(Reason, kind="non_leaf", name="freed_by_earlier_backward"):
    """One tensor (made at ``made_at``) used by two losses: ``earlier``'s backward (at ``earlier_at``) freed its
    graph before the backward at ``place``; ``optimizers``: the one that trains what made it and the one that
    trains ``earlier``'s network; the placed ``.detach()`` (``detach``) or ``retain_graph=True`` (``retain``)."""

    place: str
    earlier: str
    made_at: str | None = None
    earlier_at: str | None = None
    used_at: tuple[str, ...] = ()
    optimizers: tuple[str, str] | None = None
    detach: Rewrite | None = None
    retain: Rewrite | None = None

    def words(self, m: Members) -> Words:
        used = f" at {', '.join(self.used_at)}" if self.used_at else ""
        message = (f"{m.who} (made at {self.made_at}) is used by two losses: `{self.earlier}.backward()` at "
                   f"{self.earlier_at} freed its graph, and the backward() at {short(self.place)} goes through it "
                   "again.")
        cause = (f"{m.who} feeds `{self.earlier}`{used} and the loss of this backward(); a backward() frees the graph "
                 "it goes through, so the first one freed the part the two losses share.")
        detach, retain = self.detach, self.retain
        if self.optimizers and detach is not None:
            mine, theirs = self.optimizers
            shown = f": `{detach.code}`" if "\n" not in detach.code else ""
            fix = (f"keep `{self.earlier}` (trained by `{theirs}`) off the network that made {m.who} (trained by "
                   f"`{mine}`): use `{m.name}.detach()` where it feeds `{self.earlier}`{shown}; `retain_graph=True` "
                   "only where both losses truly need the graph")
            return Words(message, cause, fix, code(detach.code, detach.edit))
        if retain is not None:
            fix = (f"if both losses need the graph of {m.who}, keep it for the second: `{retain.code}`; if "
                   f"`{self.earlier}` should not train what made {m.who}, use `{m.name}.detach()` where it feeds it")
            return Words(message, cause, fix, code(retain.code, retain.edit))
        return Words(message, cause, f"use `{m.name}.detach()` where it feeds `{self.earlier}`, or `retain_graph=True` "
                                     "in its backward() where both losses need the graph", ADVICE)

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
  grad``: no parameter of the user's modules requires grad (and what the script meant to train: a module it
  unfroze with a plain attribute, the part it gave the optimizer), or the loss was made without a graph (and
  where, only when a Monitor's hooks saw it). ``missing_grad``: nothing gets a gradient;
- ``not_in_optimizer`` / ``exhausted_iterator``: ``optimizer got an empty parameter list`` where an earlier
  statement used up the one-shot iterator handed to it.

The forms of ``backward through the graph a second time`` (``freed.py``), of ``does not require grad`` where the
script shows how the graph was lost (``graphless.py``) and of an optimizer step before a backward (``stepped.py``)
have their reasons in modules of their own; this detector hands each its observation.

The registry lists this detector at a stage of its own (``CRASH``) that no check runs: a Monitor's door
(:meth:`leafwatch.Monitor.crashed`) runs it once per exception through its pipeline, onto its history, so the
crash finding reaches the record, the tab and the patch like any other; the note on the exception is one more
sink. Without a Monitor (a watched tensor), :func:`explain` gives the findings for the note alone. A failure
here is a ``LeafwatchInternalWarning``; the exception is raised as it is.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
from collections.abc import Iterable, Sequence
from typing import Any

from ..observe import crashes, exhausted
from ..observe import stepped as stepped_crash
from ..options import WarnOnce
from ..report.findings import Finding, group_findings
from ..report.reasons import Place, Reason, Span
from ..report.verdicts import Verdict
from ..report.words import ADVICE, Edit, Members, Remedy, Words, code
from . import fixes, freed, graphless, stepped
from .causes import place_of
from .constructors import make
from .freed import edit_at, short
from .graphless import Model
from .leaves import Origin, origin_cause, origin_of

#: What a failure to explain a crash says happens next.
GOES_ON = "the exception is raised as it is, without leafwatch's note."


def explain(error: BaseException, contexts: Iterable[crashes.Context] = ()) -> list[Finding]:
    """The findings that explain ``error``, with no history to keep them in (the door of a watched tensor,
    with no Monitor open): none for an exception that is no leaf mistake leafwatch recognises, or one whose
    traceback does not show it; never raises: a failure is warned once."""
    if crashes.recognise(error) is None:
        return []
    try:
        return together([v.finding for v in judge((None, crashes.read(error, contexts)), None, None)
                         if v.finding is not None])
    except Exception as failure:
        WarnOnce(GOES_ON)("explaining the exception", failure)
        return []


def together(found: Sequence[Finding]) -> list[Finding]:
    """``found`` with the findings that make one mistake (the non-leaves handed to one optimizer: ``group`` in
    their details) as one finding listing them."""
    grouped = [f for f in found if "group" in f.details]
    return [f for f in found if "group" not in f.details] + (group_findings(grouped) if grouped else [])


def judge(seen: tuple[int | None, crashes.Crash | None], state: None, view: Any) -> list[Verdict]:
    """The registry's entry (stage ``CRASH``): the findings a crash's observation shows at ``step`` (``seen``:
    the step and the observation), opened; each marked ``crash`` (the note on the exception says it)."""
    step, crash = seen
    if isinstance(crash, crashes.OptimizedNonLeaf):
        found = _optimized(crash)
    elif isinstance(crash, crashes.FreedGraph):
        found = [*(freed.carried(crash.place, c) for c in crash.carried),
                 *(freed.freed_by_earlier(crash.place, e) for e in crash.earlier),
                 *(freed.computed_once(crash.place, c) for c in crash.once),
                 *(_persistent(crash.place, t) for t in crash.tensors)]
    else:  # one finding, or none for no observation
        one: Any = {crashes.NoGraph: _no_graph, crashes.InPlaceOnLeaf: _in_place,
                    exhausted.ExhaustedIterator: _exhausted, stepped_crash.SteppedBeforeBackward: stepped.judge}.get(type(crash))
        found = [one(crash)] if one is not None else []
    return [Verdict.open(f.replace(step=step, first_step=step, last_step=step, details={**f.details, "crash": True}))
            for f in found]


def _origin(t: crashes.NonLeaf) -> Origin | None:
    leaf = t.origin.leaf if t.origin is not None else None
    return origin_of(t.origin, {leaf.tensor_id: t.leaf_name} if leaf is not None and t.leaf_name else {})


_COPIES = {"dtype": "the {dtype} copy", "device": "the {device} copy", "copy": "the copy", "clone": "the clone",
           "arithmetic": "the result of arithmetic", "view": "the view"}


def described(origin: Origin | None, optimizer: str, place: str) -> str:
    """A tensor the user holds under no name, in words: ``the float64 copy passed to `Adam` at train.py:3``."""
    what = _COPIES.get(origin.kind, "the tensor") if origin is not None else "the tensor"
    dtype, device = (origin.dtype, origin.device) if origin is not None else ("", "")
    return f"{what.format(dtype=dtype.removeprefix('torch.'), device=device)} passed to `{optimizer}` at {short(place)}"


def _optimized(crash: crashes.OptimizedNonLeaf) -> list[Finding]:
    """One finding per non-leaf handed to the optimizer; several make one mistake (said where they were handed
    over), whose one fix makes each a leaf (torch refuses the first it meets, then the next)."""
    made = []
    for t in crash.tensors:
        origin = _origin(t)
        fix = fixes.leaf_fix_args(t.path, t.assigned_at, origin=origin) if t.path else fixes.LeafFix()
        made.append((OptimizedNonLeaf(optimizer=crash.optimizer, place=crash.place, named=bool(t.path), origin=origin,
                                      made_at=short(t.assigned_at), fix=fix),
                     t.path or described(origin, crash.optimizer, crash.place)))  # no variable: in words, never a name
    if len(made) == 1:
        reason, name = made[0]
        return [make(reason, name, "error", **({} if reason.named else {"described": True}))]
    rewrite = _together([r.fix for r, _ in made])
    where = f"`{crash.optimizer}` at {short(crash.place)}"
    return [make(dataclasses.replace(reason, together=rewrite), name, "error",
                 group=f"{crash.optimizer} at {short(crash.place)}", location=f"given to {where}")
            for reason, name in made]


def _together(made: Sequence[fixes.LeafFix]) -> freed.Rewrite | None:
    """One code fix for several non-leaves: each assignment rewritten to make a leaf, as one edit from the first
    to the last (the lines between as they are); None when one of them has no rewrite, or they are in two files."""
    if any(f.leaf_code is None or f.at is None for f in made) or len({f.at.path for f in made}) != 1:  # type: ignore[union-attr]
        return None
    spans = sorted(made, key=lambda f: f.at.start)  # type: ignore[union-attr]
    if any(b.at.start <= a.at.end for a, b in zip(spans, spans[1:])):  # type: ignore[union-attr]
        return None
    path = spans[0].at.path  # type: ignore[union-attr]
    lines, text, line = linecache.getlines(path), "", spans[0].at.start  # type: ignore[union-attr]
    for f in spans:
        text += "".join(lines[line - 1:f.at.start - 1]) + f"{f.at.indent}{f.leaf_code}\n"  # type: ignore[union-attr]
        line = f.at.end + 1  # type: ignore[union-attr]
    edit = Edit(path, spans[0].at.start, spans[-1].at.end, "replace", text)  # type: ignore[union-attr]
    return freed.Rewrite("\n".join(f.leaf_code for f in made), edit)  # type: ignore[misc]


class OptimizedNonLeaf(Reason, kind="non_leaf", name="optimized_non_leaf"):
    """``can't optimize a non-leaf Tensor``: the tensor handed to ``optimizer`` at ``place`` (``named``: the user
    holds it in a variable), what made it, the statement that assigned it and its fix."""

    optimizer: str
    place: str
    origin: Origin | None = None
    named: bool = False
    made_at: str | None = None
    fix: fixes.LeafFix = fixes.LeafFix()
    together: freed.Rewrite | None = None

    def _words_together(self, m: Members) -> Words:
        """Several non-leaves handed to one optimizer: each named, one fix for all."""
        named = [(f"`{name}`" if r.named else name) + (f" (assigned at {r.made_at})" if r.made_at else "")
                 for name, r in zip(m.names, m.reasons)]
        listed = ", ".join(named[:-1]) + f" and {named[-1]}"
        message = (f"{listed} are not leaf tensors, so `{self.optimizer}` at {short(self.place)} cannot optimize "
                   "them: torch refuses the first it meets, and would refuse the next once that one is fixed; an "
                   "optimizer steps leaves only.")
        cause = " ".join(origin_cause(name if r.named else None, r.origin, name) for name, r in zip(m.names, m.reasons))
        if self.together is None:
            return Words(message, cause, "make each of them a leaf where it is made: create it with its final value, "
                                         "then ask for grad (`.requires_grad_()` last)", ADVICE)
        snippets = "; ".join(f"`{line}`" for line in self.together.code.splitlines())
        return Words(message, cause, f"make each a leaf where it is made: {snippets}",
                     code(self.together.code, self.together.edit))

    def words(self, m: Members) -> Words:
        if not m.single:
            return self._words_together(m)
        who = m.who if self.named else f"a tensor given to `{self.optimizer}`"
        made = f" (assigned at {self.made_at})" if self.made_at else ""
        message = (f"{who}{made} is not a leaf tensor, so `{self.optimizer}` at {short(self.place)} cannot optimize "
                   "it: an optimizer steps leaves only, and a non-leaf's .grad stays None.")
        if not self.named:
            return Words(message, origin_cause(None, self.origin),
                         "make the tensor a leaf before you give it to the optimizer: create it with its final dtype "
                         "and device, then ask for grad (`.requires_grad_()` last), or register it as an `nn.Parameter`")
        fix, remedy = fixes.leaf_fix(m.name, self.origin, self.fix)
        return Words(message, origin_cause(m.name, self.origin), fix, remedy)


# -- a non-leaf kept across steps ------------------------------------------------------------------------
def _persistent(place: str, t: crashes.NonLeaf) -> Finding:
    code_name = fixes.attribute_path(t.path, t.owner) if t.owner else None
    name, origin = code_name or t.path, _origin(t)
    if t.module is not None and t.attr is not None:
        own = fixes.parameter_args(t.module, t.attr)
        made = f"{os.path.basename(own.at.path)}:{own.at.start}" if own.at else None
        return make(PersistentNonLeaf(place=place, origin=origin, made_at=made, attribute=own), name, "error")
    target = fixes.optimizer_target(optimizers) if (optimizers := fixes.user_optimizers()) else None
    fix = fixes.leaf_fix_args(name, t.assigned_at, target=target, origin=origin)
    return make(PersistentNonLeaf(place=place, origin=origin, made_at=short(t.assigned_at), fix=fix), name, "error")


class PersistentNonLeaf(Reason, kind="non_leaf", name="persistent_non_leaf"):
    """``backward through the graph a second time``: a non-leaf kept across steps, reached by the backward at
    ``place``, whose graph an earlier backward freed; its fix registers the attribute (``attribute``) or makes
    the variable a leaf (``fix``)."""

    place: str
    origin: Origin | None = None
    made_at: str | None = None
    attribute: fixes.Assigned | None = None
    fix: fixes.LeafFix = fixes.LeafFix()

    def words(self, m: Members) -> Words:
        made = f" (made at {self.made_at})" if self.made_at else ""
        message = (f"{m.who}{made} is a non-leaf tensor kept from one step to the next: an earlier backward() freed "
                   f"the graph that made it, and the backward() at {short(self.place)} goes through that graph again.")
        cause = f"{origin_cause(m.name, self.origin)} Its graph is made once and freed by the first backward() through it"
        if self.attribute is not None:
            words, remedy = fixes.parameter_fix(self.attribute)
            fix = f"{words}; a Parameter is a leaf: no graph is kept from one step to the next, and the optimizer can hold it"
        else:
            fix, remedy = fixes.leaf_fix(m.name, self.origin, self.fix)
        return Words(message, cause + ".", fix, remedy)


# -- an in-place op on a leaf ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Other:
    """Another statement of the same routine that changes a leaf in place: its line and its text."""

    place: str
    statement: str


def _in_place(crash: crashes.InPlaceOnLeaf) -> Finding:
    also: dict[str, Any] = {}
    if crash.others:
        decorator, at, guarded = f"@{crash.torch_name}.no_grad()", crash.decorate, crash.guarded
        also = {"others": tuple(Other(short(place), statement) for place, statement in crash.others),  # type: ignore[arg-type]
                "routine": crash.routine, "decorator": decorator if at is not None else None,
                "all": edit_at("insert_before", at, f"{at.indent}{decorator}\n") if at is not None
                else edit_at("replace", guarded[0], guarded[1]) if guarded is not None else None,
                "guarded": guarded[1] if guarded is not None and at is None else None}
    return make(InPlaceOnLeaf(place=crash.place, parameter=crash.is_parameter, method=crash.method,
                              arguments=tuple(crash.arguments), keywords=crash.keywords, statement=crash.statement,
                              whole=crash.whole, torch=crash.torch_name, nn=crash.nn_name,
                              at=fixes.statement_span(crash.place), **also), crash.receiver, "error")


class InPlaceOnLeaf(Reason, kind="non_leaf", name="in_place_on_leaf"):
    """``a leaf Variable that requires grad is being used in an in-place operation``: the statement at ``place``
    (``method``: the in-place method called, with its ``arguments``; ``whole``: the statement is that call) and
    how the user's module spells ``torch`` and ``torch.nn``."""

    place: str
    parameter: bool
    statement: str
    method: str | None = None
    arguments: tuple[str, ...] = ()
    keywords: bool = False
    whole: bool = False
    torch: str | None = None
    nn: str | None = None
    at: Span | None = None
    others: tuple[Other, ...] = ()
    routine: str | None = None
    decorator: str | None = None
    all: Edit | None = None
    guarded: str | None = None

    def _fix_all(self) -> tuple[str, Remedy]:
        """One fix for every in-place change of a leaf in one routine: the routine under ``@torch.no_grad()``, or
        the statements under one ``with torch.no_grad():``."""
        if self.decorator and self.all:
            return (f"run `{self.routine}` without autograd, as an initialisation: decorate it with `{self.decorator}` "
                    "(every in-place change in it then runs under `torch.no_grad()`), or use the functions of "
                    "`torch.nn.init`"), code(self.decorator, self.all)
        if self.guarded and self.all:
            return ("run these lines without autograd, under one `with torch.no_grad():` block (or use the functions "
                    "of `torch.nn.init`)"), code(self.guarded.strip("\n"), self.all)
        return ("run each of these changes inside a `with torch.no_grad():` block (or use the functions of "
                "`torch.nn.init`)"), ADVICE

    def _fix(self, name: str) -> tuple[str, Remedy]:
        """``nn.init.normal_(w)`` in place of ``w.normal_()`` (torch.nn.init runs under no_grad), else the
        statement under ``torch.no_grad()``."""
        at, statement = self.at, self.statement
        guarded = f"with {self.torch}.no_grad(): {statement}" if self.torch and "\n" not in statement else None
        if guarded is not None and not fixes.is_code(guarded):
            guarded = None
        initialiser = crashes.INITIALISERS.get(self.method or "")
        if initialiser and self.nn and self.whole and not self.keywords:
            snippet = f"{self.nn}.init.{initialiser}({', '.join([name, *self.arguments])})"
            if fixes.is_code(snippet):
                also = f" (or `{guarded}`)" if guarded else ""
                return (f"initialise it with `torch.nn.init`, which runs under `torch.no_grad()`: `{snippet}`{also}",
                        code(snippet, None if at is None else at.put(snippet, "replace")))
        if guarded is not None:
            edit = None if at is None else at.edit(
                "replace", f"{at.indent}with {self.torch}.no_grad():\n{at.indent}    {statement}\n")
            return f"change it without autograd: `{guarded}`", code(guarded, edit)
        return "run that change inside a `with torch.no_grad():` block (or use the functions of `torch.nn.init`)", ADVICE

    def words(self, m: Members) -> Words:
        what = "an `nn.Parameter`" if self.parameter else "a tensor that requires grad"
        op = (f"`.{self.method}()`" if self.method else f"`{self.statement}`" if "\n" not in self.statement
              else "the statement")
        lines = "; ".join(f"`{o.statement}` at {o.place}" if "\n" not in o.statement else f"the statement at {o.place}"
                          for o in self.others)
        where = f"`{self.routine}`" if self.routine else "The same code"
        also = f" {where} changes a leaf in place again: {lines} would be refused next." if self.others else ""
        message = (f"{m.who} is {what}, a leaf: torch refuses the in-place {op} at {short(self.place)} with grad mode "
                   f"on, since autograd cannot record an in-place change of a leaf it accumulates gradients into.{also}")
        cause = (f"{op} changes {m.who} in place while autograd records: an initialisation or a hand-made update of a "
                 "parameter must run without autograd (under `torch.no_grad()`, as the functions of `torch.nn.init` do).")
        fix, remedy = self._fix_all() if self.others else self._fix(m.name)
        return Words(message, cause, fix, remedy)


# -- a backward of a tensor without a graph ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Seen:
    """A cut a Monitor's recorder saw in the last forward: the op, its line and the user's call into it."""

    op: str
    place: Place | None
    called_from: Place | None = None


def _model(model: crashes.Model) -> Model:
    named = bool(model.name and fixes.is_code(model.name))
    return Model(model.name if named else f"your `{model.cls}`", named, model.parameters, model.trainable)  # type: ignore[arg-type]


def _no_graph(crash: crashes.NoGraph) -> Finding:
    models = tuple(_model(m) for m in crash.models)
    if models and not any(m.trainable for m in models):
        return make(AllFrozen(place=crash.place, loss=crash.loss, models=models, **_meant(crash.frozen)),
                    models[0].name, "error", **({} if models[0].code else {"described": True}))
    trainable = tuple(m for m in models if m.trainable)
    if crash.function is not None:
        return graphless.grad_off(crash.place, crash.loss, trainable, crash.function)
    if crash.detached is not None:
        return graphless.detached(crash.place, crash.loss, trainable, crash.detached)
    grad_off = tuple(fixes.attribute_path(name, owner) or name if owner else name or "the model"
                     for owner, name in crash.grad_off)
    reason = BackwardOfNoGraph(place=crash.place, loss=crash.loss, inference=crash.inference, models=trainable,
                               grad_off=grad_off, cuts=tuple(Seen(s.op, place_of(s.place), place_of(s.called_from))
                                                             for s in crash.cuts))
    if crash.loss:
        return make(reason, crash.loss, "error")
    return make(reason, f"the tensor backward() was called on at {short(crash.place)}", "error", described=True)


def _loss(loss: str | None) -> str:
    return f"`{loss}`" if loss else "the tensor backward() was called on"


def _listed(models: Sequence[Model]) -> str:
    names = [f"`{m.name}`" if m.code else m.name for m in models]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


@dataclasses.dataclass(frozen=True)
class Unfrozen:
    """``module.requires_grad = True`` as the script wrote it: the module (its code), the line, the statement."""

    module: str
    at: str | None = None
    statement: str | None = None


def _meant(frozen: Any) -> dict[str, Any]:
    """What a fully frozen script meant to train, as the fields of :class:`AllFrozen`: the modules it tried to
    unfreeze with a plain attribute (and where), the parts its optimizer was given, and the placed unfreeze."""
    if frozen is None:
        return {}
    unfrozen = tuple(Unfrozen(u.module, short(u.at), u.statement) for u in frozen.unfrozen)
    targets = [u.module for u in frozen.unfrozen] or list(frozen.parts)
    snippet = "\n".join(f"{t}.requires_grad_(True)" for t in targets) if targets else None
    edit = None
    spans = [u.span for u in frozen.unfrozen if u.span is not None]
    if snippet and frozen.unfrozen and len(spans) == len(frozen.unfrozen) == 1:
        edit = edit_at("replace", spans[0], f"{spans[0].indent}{snippet}\n")
    elif snippet and not frozen.unfrozen and frozen.after is not None:
        at = frozen.after
        edit = Edit(at.path, at.end, at.end, "insert_after", "".join(f"{at.indent}{line}\n" for line in snippet.splitlines()))
    return {"unfrozen": unfrozen, "parts": tuple(frozen.parts), "whole": frozen.whole, "optimizer": frozen.optimizer,
            "snippet": snippet, "edit": edit}


class AllFrozen(Reason, kind="missing_grad", name="all_frozen"):
    """``element 0 of tensors does not require grad``: every parameter of the user's models is frozen; what the
    script meant to train: the modules it unfroze with a plain attribute (``unfrozen``), the parts of the model
    ``optimizer`` was given (``parts``; ``whole``: all of it), and the unfreeze (``snippet``) placed by ``edit``."""

    place: str
    models: tuple[Model, ...]
    loss: str | None = None
    unfrozen: tuple[Unfrozen, ...] = ()
    parts: tuple[str, ...] = ()
    whole: bool = False
    optimizer: str | None = None
    snippet: str | None = None
    edit: Edit | None = None

    def _also(self) -> str:
        if self.unfrozen:
            said = "; ".join(f"`{u.statement}` at {u.at}" if u.at else f"`{u.module}.requires_grad = True`"
                             for u in self.unfrozen)
            return (f" {said} sets a plain attribute of the module, which PyTorch ignores: its parameters keep "
                    "`requires_grad=False`.")
        if self.parts and not self.whole:
            return f" `{self.optimizer}` was given the parameters of {', '.join(f'`{p}`' for p in self.parts)}, frozen too."
        return ""

    def words(self, m: Members) -> Words:
        models, count = self.models, sum(model.parameters for model in self.models)
        message = (f"every parameter of {_listed(models)} is frozen, so {_loss(self.loss)} has no autograd graph and "
                   f"the backward() at {short(self.place)} has nothing to differentiate: nothing trains.")
        cause = (f"none of the {count} parameter tensors of {_listed(models)} requires grad (`requires_grad=False` on "
                 f"each), so nothing computed from them records a graph.{self._also()}")
        if not self.snippet:
            first = models[0]
            whole = f"`{first.name}.requires_grad_(True)` for the whole model, or " if first.code else ""
            fix = (f"unfreeze what should train before the forward pass: {whole}`requires_grad_(True)` on the part "
                   "that should train (and give it to your optimizer)")
            return Words(message, cause, fix, ADVICE)
        shown = "; ".join(self.snippet.splitlines())
        if self.unfrozen:
            fix = f"unfreeze its parameters with the module's method: `{shown}`"
        elif not self.whole:
            fix = (f"unfreeze what `{self.optimizer}` trains, before the forward pass: `{shown}` (not "
                   "`requires_grad_(True)` on the whole model, which would also train what should stay frozen)")
        else:
            fix = (f"unfreeze what should train before the forward pass: `{shown}` (`{self.optimizer}` was given every "
                   "parameter of it); if a part should stay frozen (a pretrained backbone), unfreeze only the part "
                   "that should train")
        return Words(message, cause, fix, code(self.snippet, self.edit))


# -- an optimizer handed an iterator used up already ---------------------------------------------------------
def _exhausted(crash: exhausted.ExhaustedIterator) -> Finding:
    snippet = f"{crash.name} = list({crash.value})" if crash.value is not None else None
    at = crash.at
    edit = edit_at("replace", at, f"{at.indent}{snippet}\n") if snippet is not None and at is not None \
        and fixes.is_code(snippet) else None
    return make(ExhaustedIterator(place=crash.place, optimizer=crash.optimizer, iterator=crash.kind,
                                  made_at=short(crash.made_at), used_at=short(crash.used_at), used=crash.used,
                                  snippet=snippet if edit else None, edit=edit), crash.name, "error")


class ExhaustedIterator(Reason, kind="not_in_optimizer", name="exhausted_iterator"):
    """``optimizer got an empty parameter list``: the one-shot iterator (of the class ``iterator``, made at
    ``made_at``) handed to ``optimizer`` at ``place`` was used up by ``used`` (at ``used_at``) before; the fix
    makes it a list where it is made (``snippet``, ``edit``)."""

    place: str
    optimizer: str
    iterator: str
    made_at: str | None = None
    used_at: str | None = None
    used: str | None = None
    snippet: str | None = None
    edit: Edit | None = None

    def words(self, m: Members) -> Words:
        made = f" (made at {self.made_at})" if self.made_at else ""
        used = (f"`{self.used}` at {self.used_at}" if self.used and "\n" not in self.used else
                f"the statement at {self.used_at}" if self.used_at else "an earlier statement")
        message = (f"{m.who}{made} is a one-shot `{self.iterator}` iterator, used up by {used} before "
                   f"`{self.optimizer}` at {short(self.place)} got it: the optimizer got no parameter, and nothing "
                   "would train.")
        cause = (f"a `{self.iterator}` (like a generator, or `model.parameters()`) yields its items once: the first "
                 f"pass over {m.who} took them all, so nothing was left for the optimizer.")
        if self.snippet:
            return Words(message, cause, f"make it a list where it is made: `{self.snippet}`", code(self.snippet, self.edit))
        return Words(message, cause, f"make {m.who} a list where it is made (`list(...)`), so that it can be read "
                                     "twice", ADVICE)


class BackwardOfNoGraph(Reason, kind="missing_grad", name="backward_of_no_graph", fixes="never"):
    """``element 0 of tensors does not require grad``: the loss was made without a graph; where it was lost,
    only where it was seen (an inference tensor, modules the hooks saw run with grad off, cuts)."""

    place: str
    loss: str | None = None
    inference: bool = False
    models: tuple[Model, ...] = ()
    grad_off: tuple[str, ...] = ()
    cuts: tuple[Seen, ...] = ()

    def _cause(self) -> tuple[str, str]:
        """What was observed of where the graph was lost, and the fix that goes with it."""
        keep = ("compute the loss from the model's outputs with grad mode on, keeping them tensors all the way (no "
                "`.item()`, `.tolist()`, NumPy or `torch.tensor(...)` between the model and the loss); to log a "
                "number, call `loss.item()` after `loss.backward()`")
        if self.inference:
            return (f"{_loss(self.loss)} is an inference tensor: it was computed under `torch.inference_mode()`, which "
                    "records no graph.", "run the forward and the loss outside `torch.inference_mode()`")
        if self.grad_off:
            modules = ", ".join(f"`{name}`" for name in self.grad_off)
            return (f"leafwatch's hooks saw {modules} run with grad mode off only since the last check (under "
                    "`torch.no_grad()`, `torch.inference_mode()` or `torch.set_grad_enabled(False)`), so its outputs "
                    "carry no graph.", f"run the forward of {modules} with grad mode on: out of the `torch.no_grad()` block")
        if self.cuts:
            seen = "; ".join(f"{c.op} at {c.place.within if c.place else '?'}"
                             + (f", called from {c.called_from.within}" if c.called_from else "") for c in self.cuts)
            return (f"leafwatch saw the last forward leave autograd at {seen}: what comes out of there carries no "
                    "graph.", keep)
        return ("leafwatch did not see where the graph was lost: a loss has none when it is computed under "
                "`torch.no_grad()` or `torch.inference_mode()`, from numbers (`.item()`, `.tolist()`, NumPy, "
                "`torch.tensor(...)` of values) or from `.detach()`ed tensors; a `leafwatch.Monitor` created before "
                "the forward sees where.", keep)

    def words(self, m: Members) -> Words:
        trainable = self.models
        having = (f" while {_listed(trainable)} {'has' if len(trainable) == 1 else 'have'} parameters that require "
                  "grad: it was not computed from them through autograd") if trainable else ""
        message = (f"{_loss(self.loss)} has no autograd graph (no `grad_fn`, `requires_grad=False`), so the "
                   f"backward() at {short(self.place)} fails{having}.")
        cause, fix = self._cause()
        return Words(message, cause, fix, ADVICE)

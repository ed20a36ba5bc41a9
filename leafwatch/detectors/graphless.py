"""``element 0 of tensors does not require grad`` where the script shows how the graph was lost, and the reasons
(the observation: :mod:`leafwatch.observe.graphless`):

- ``missing_grad`` / ``grad_off_function`` (:class:`GradOffFunction`): the loss computed through a function
  decorated with ``@torch.no_grad()`` (an evaluation helper used in the training step): the function and its
  decorator's line, never "a ``no_grad`` block"; the fix takes the decorator away;
- ``missing_grad`` / ``detached_loss`` (:class:`DetachedLoss`): a LightningModule's ``training_step`` that returns
  its loss ``.detach()``-ed: the ``.detach()`` and its line; the fix returns the loss itself.

Every parameter frozen stays ``all_frozen`` (``detectors/crashes.py``), which names the part the script meant to
train. The edits are worked out here, when the finding is decided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..observe import graphless
from ..report.findings import Finding
from ..report.reasons import Reason
from ..report.words import Edit, Members, Words, code
from . import fixes
from .constructors import make


@dataclasses.dataclass(frozen=True)
class Model:
    """A model of the user's frames as a crash names it: its code (``code``: a path the user can type) or its
    class in words, how many parameter tensors it has and how many of them require grad."""

    name: str
    code: bool
    parameters: int
    trainable: int


def _trainable(models: Sequence[Model]) -> str:
    names = [f"`{m.name}`" if m.code else str(m.name) for m in models]
    if not names:
        return ""
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
    return f" while {listed} {'has' if len(names) == 1 else 'have'} parameters that require grad"


def grad_off(place: str, loss: str | None, models: Sequence[Model], f: graphless.GradOffFunction) -> Finding:
    at = f.span
    return make(GradOffFunction(place=place, loss=loss, models=tuple(models), function=f.function,
                                decorator=f.decorator, at=fixes.short_place(f.at), called_at=fixes.short_place(f.called_at),
                                definition=f.definition, edit=Edit(at.path, at.start, at.end, "replace", f.kept)),
                loss or f"the tensor backward() was called on at {fixes.short_place(place)}", "error",
                **({} if loss else {"described": True}))


class GradOffFunction(Reason, kind="missing_grad", name="grad_off_function", fixes="always"):
    """The loss (``loss``, backward at ``place``) computed through ``function`` (called at ``called_at``), which
    ``decorator`` (at ``at``) runs with grad mode off; the fix: the definition (``definition``) without it."""

    place: str
    function: str
    decorator: str
    at: str
    called_at: str
    definition: str
    edit: Edit
    loss: str | None = None
    models: tuple[Model, ...] = ()

    def words(self, m: Members) -> Words:
        loss = f"`{self.loss}`" if self.loss else "the tensor backward() was called on"
        message = (f"{loss} has no autograd graph (no `grad_fn`, `requires_grad=False`), so the backward() at "
                   f"{fixes.short_place(self.place)} fails{_trainable(self.models)}: it was computed through `{self.function}` "
                   f"(called at {self.called_at}), which `{self.decorator}` at {self.at} runs with grad mode off.")
        cause = (f"`{self.decorator}` turns autograd off for every call of `{self.function}`: what it returns has no "
                 "graph, and neither has anything computed from it, so no parameter gets a gradient.")
        fix = (f"remove `{self.decorator}` from `{self.function}` (at {self.at}): it runs in the training step too; "
               f"where you call it to evaluate, call it under `with torch.no_grad():`")
        return Words(message, cause, fix, code(self.definition, self.edit))


def detached(place: str, loss: str | None, models: Sequence[Model], d: graphless.DetachedReturn) -> Finding:
    at = d.span
    return make(DetachedLoss(place=place, models=tuple(models), cls=d.cls, method=d.method, at=fixes.short_place(d.at),
                             call=d.call, fixed=d.fixed.strip(),
                             edit=Edit(at.path, at.start, at.end, "replace", d.fixed)),
                loss or f"the loss `{d.cls}.{d.method}` returns", "error", **({} if loss else {"described": True}))


class DetachedLoss(Reason, kind="missing_grad", name="detached_loss", fixes="always"):
    """``cls.method`` returns its loss as ``call`` (``.detach()``-ed) at ``at``: the tensor Lightning calls backward()
    on (in the run started at ``place``) has no graph; the fix: the statement as ``fixed``."""

    place: str
    cls: str
    method: str
    at: str
    call: str
    fixed: str
    edit: Edit
    models: tuple[Model, ...] = ()

    def words(self, m: Members) -> Words:
        message = (f"`{self.cls}.{self.method}` returns its loss as `{self.call}` at {self.at}: the tensor Lightning "
                   f"calls backward() on (in the run started at {fixes.short_place(self.place)}) has no autograd graph, so that "
                   f"backward() fails{_trainable(self.models)}.")
        cause = (f"`.detach()` gives a tensor cut from the graph, and Lightning runs backward() on the loss "
                 f"`{self.method}` returns: nothing trains. To log the loss, detach only the copy you log.")
        shown = f": `{self.fixed}`" if "\n" not in self.fixed else ""
        fix = f"return the loss itself, not `{self.call}`{shown}"
        return Words(message, cause, fix, code(self.fixed, self.edit))

"""The silenced error: ``missing_grad`` / ``silenced_loss``, a loss whose graph was cut and whose
``requires_grad`` was then set by hand.

A loss made without a graph makes ``backward()`` raise ``element 0 of tensors does not require grad``;
``loss.requires_grad = True`` (``loss.requires_grad_()``, ``torch.tensor(loss.item(), requires_grad=True)``)
silences that error: backward stops at the loss, a leaf, and no parameter gets a gradient. The gradient
check asks :func:`explain` once a parameter misses its gradient (never on a healthy step): the loss is
the one given (``audit(loss=)``, the Lightning callback's ``on_before_backward``) or, without it, a
hand-set leaf of the user's frames that backward reached whose hand setting the user's code shows.
Every tensor it leaves without a gradient is one mistake, named at the hand-setting line, with the cut
before it where seen: in the statement that made the loss, or by the forward hooks (the module-level
cause found before is kept as the cut).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Container

import torch

from ..observe import frames, silenced
from ..report.reasons import Place
from ..report.words import ADVICE, Members, Words
from .causes import Detached, Explanation, Miss
from .constructors import missing_words

#: The module-level causes a hand-set loss explains better (backward stopped at the loss): kept as the cut
#: where they name one, replaced otherwise. ``never_ran`` and the rest are mistakes of their own.
EXPLAINS = frozenset({None, "pending", "unknown", "unknown_hooks_off", "unknown_not_a_parameter", "traced_nothing",
                      "unused_output", "unused", "unreachable", "not_backpropagated", "detached", "rewrapped",
                      "grad_disabled"})
#: The group of the finding: every tensor the hand-set loss leaves without a gradient is one mistake.
GROUP = "the hand-set loss"


def finder(loss: torch.Tensor | None, exclude: Callable[[], Container[int]],
           every_missed: Callable[[], bool], handed: Callable[[], torch.Tensor | None]) -> Callable[[], silenced.Silenced | None]:
    """A memoised look for the hand-set loss of this check: ``loss`` when given (None when it has a
    graph); else, only where no checked tensor got a gradient (``every_missed``: backward stopped at the
    hand-set leaf, so none did), the loss a framework handed over at its backward (``handed``) or a
    hand-set leaf of the user's frames whose hand setting the code shows (reading a frame's locals keeps
    them alive on Python < 3.13 until the next read, so they are read only for the error itself)."""
    return functools.cache(lambda: _look(loss, exclude, every_missed, handed))


def _look(loss: torch.Tensor | None, exclude: Callable[[], Container[int]],
          every_missed: Callable[[], bool], handed: Callable[[], torch.Tensor | None]) -> silenced.Silenced | None:
    if loss is None:
        if not every_missed():
            return None
        loss = handed()
    if loss is not None:
        leaf = silenced.hand_set_leaf(loss)
        if leaf is None or id(leaf) in exclude():
            return None  # a loss with its graph, or a leaf an optimizer holds (trained on purpose)
        frame = frames.user_frame()
        return silenced.read(leaf, frame, silenced.named_in(leaf, frame))
    seen = silenced.in_frames(exclude())
    if seen is None:
        return None
    tensor, name, frame = seen
    found = silenced.read(tensor, frame, name)
    return found if found.hand is not None else None  # a leaf of the frames is the loss only where the code says so


@dataclasses.dataclass(frozen=True)
class Statement:
    """A statement of the user's code: what it does (``op``), where, and its text."""

    op: str
    place: Place
    statement: str


@dataclasses.dataclass(frozen=True)
class Traced:
    """The cut the forward hooks saw before the hand setting: an op at a line, or a module run without grad."""

    op: str
    place: Place | None = None
    module: str = ""


def _statement(site: silenced.Site | None) -> Statement | None:
    return None if site is None else Statement(site.op, Place(site.file, site.line, site.function), site.statement)


def explain(found: silenced.Silenced, before: Explanation | None) -> Explanation:
    """The explanation of a tensor the hand-set loss leaves without a gradient; ``before``: what the
    forward hooks said, kept as the cut where it names one (an op at a line, a module run without grad)."""
    traced, earlier = None, before.reason if before is not None else None
    if isinstance(earlier, Detached) and earlier.place is not None:
        traced = Traced(earlier.op or "", earlier.called_from or earlier.place)
    elif earlier is not None and earlier.name == "grad_disabled":
        traced = Traced("grad mode off", module=earlier.module or "")
    reason = SilencedLoss(loss=found.loss, hand=_statement(found.hand), cut=_statement(found.cut), traced=traced)
    loss = f"`{found.loss}`" if found.loss else "the loss"
    return Explanation(reason, GROUP, f"behind {loss}, set to require grad by hand" + (
        f" at {reason.hand.place.short}" if reason.hand is not None else ""))


class SilencedLoss(Miss, name="silenced_loss"):
    """A loss whose graph was cut and whose ``requires_grad`` was then set by hand (``hand``: that statement;
    ``cut``: the statement that made the loss, where it shows the cut; ``traced``: the cut the hooks saw)."""

    loss: str | None = None
    hand: Statement | None = None
    cut: Statement | None = None
    traced: Traced | None = None

    def _loss(self) -> str:
        return f"`{self.loss}`" if self.loss else "the loss"

    def _cut(self) -> tuple[str, str]:
        """What was observed of the cut before the hand setting, and what to change there."""
        cut, traced, hand = self.cut, self.traced, self.hand
        keep = ("compute the loss from the model's outputs through differentiable torch ops (no comparison or "
                "threshold, `.item()`, `.detach()`, NumPy or `torch.tensor(...)` between the model and the loss; to "
                "log a number, call `loss.item()` after `loss.backward()`)")
        if traced is not None and traced.place is not None:
            return (f"the graph was cut before: leafwatch saw {traced.op} at {traced.place.within} in the forward "
                    "pass.", f"remove {traced.op} at {traced.place.short} and " + keep)
        if traced is not None:
            return (f"the graph was cut before: leafwatch's hooks saw `{traced.module}` run with grad mode off "
                    "(`torch.no_grad()`), so its outputs carry no graph.", "run the forward with grad mode on and " + keep)
        if cut is not None and hand is not None and cut.place.line == hand.place.line:
            return (f"the value was taken out of autograd by {cut.op} in that same statement, so the new tensor is "
                    "made of a number, not of the model's outputs.", keep)
        if cut is not None:
            return (f"the graph was cut before: {self._loss()} was made by `{cut.statement}` at {cut.place.within}, "
                    f"where {cut.op} has no gradient.", f"change `{cut.statement}` at {cut.place.short}: " + keep)
        return ("where the graph was cut before is not known: leafwatch saw no `.item()`, comparison, `.detach()`, "
                "NumPy or `torch.no_grad()` on the way to it.", keep)

    def words(self, m: Members) -> Words:
        hand, loss = self.hand, self._loss()
        if hand is not None:
            setting = (f"`{hand.statement}` at {hand.place.within} set the `requires_grad` of {loss} by hand, after "
                       "its graph was cut")
            remove = (f"do not rewrap the loss at {hand.place.short} (`{hand.statement}` makes a new leaf of a number): "
                      "keep the tensor itself" if hand.op == "rewrap" else
                      f"remove `{hand.statement}` at {hand.place.short}")
        else:
            setting = (f"{loss} is a leaf that requires grad but was made of no parameter (no `grad_fn`): its "
                       "`requires_grad` was set by hand after its graph was cut (the line that set it is not known)")
            remove = f"remove the line that sets {loss}'s `requires_grad` by hand (`requires_grad = True`, " \
                     "`requires_grad_()`, `torch.tensor(..., requires_grad=True)`)"
        before, keep = self._cut()
        cause = (f"{setting}: backward() stops at {loss} and reaches no parameter. That setting silences torch's "
                 f"`element 0 of tensors does not require grad` and nothing trains; {before}")
        return missing_words(m, cause, f"{remove}, and {keep}", ADVICE)

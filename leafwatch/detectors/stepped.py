"""An optimizer's ``step()`` between a loss's forward and its ``backward()``: torch's "modified by an inplace
operation" when the step changed, in place, parameters the loss's graph saved (a GAN calling ``opt_D.step()``
before ``G_loss.backward()``, pytorch/pytorch#39141), and its reason (the observation:
:mod:`leafwatch.observe.stepped`).

The finding is the loss's (``missing_grad`` / ``stepped_before_backward``, :class:`SteppedBeforeBackward`: its
backward cannot run, so nothing it would train gets a gradient); its code fix computes the loss again, with a new
forward, right before its backward(). Nothing is said of the optimizer that never got to step: the run is left
undecided on it.
"""

from __future__ import annotations

import textwrap

from ..observe import stepped
from ..report.findings import Finding
from ..report.reasons import Reason
from ..report.words import ADVICE, Edit, Members, Words, code
from .fixes import short_place
from .constructors import make


def judge(crash: stepped.SteppedBeforeBackward) -> Finding:
    """The finding of a loss whose graph an optimizer step changed before its backward()."""
    edit = None
    if crash.before is not None and crash.recompute:
        at = crash.before
        edit = Edit(at.path, at.start - 1, at.start - 1, "insert_after", crash.recompute)
    return make(SteppedBeforeBackward(place=crash.place, loss_at=short_place(crash.loss_at), optimizer=crash.optimizer,
                                      cls=crash.cls, step_at=short_place(crash.step_at), module=crash.module,
                                      snippet=textwrap.dedent(crash.recompute).strip("\n"),
                                      recompute_at=tuple(short_place(r) for r in crash.recompute_at), edit=edit),
                crash.loss, "error")


class SteppedBeforeBackward(Reason, kind="missing_grad", name="stepped_before_backward"):
    """``optimizer.step()`` (a ``cls``, at ``step_at``) changed in place parameters (of ``module``) that the graph of
    the loss (computed at ``loss_at``) saved, before its backward at ``place``; the fix repeats the statements at
    ``recompute_at`` (``snippet``) right before that backward (``edit``)."""

    place: str
    loss_at: str
    optimizer: str
    cls: str
    step_at: str
    module: str | None = None
    snippet: str = ""
    recompute_at: tuple[str, ...] = ()
    edit: Edit | None = None

    def words(self, m: Members) -> Words:
        owner = f"the parameters of `{self.module}`" if self.module else f"parameters `{self.optimizer}` holds"
        message = (f"`{self.optimizer}.step()` at {self.step_at} changed in place {owner} that the graph of {m.who} "
                   f"(computed at {self.loss_at}) saved, before the backward() of {m.who} at {short_place(self.place)}: "
                   "that graph is out of date, and torch refuses to go through it.")
        cause = (f"an optimizer's step() updates its parameters in place; {m.who} was computed from them before "
                 f"`{self.optimizer}.step()` (a `{self.cls}`), so its backward() needs values the step overwrote. "
                 f"Nothing {m.who} would train gets a gradient.")
        lines = " and ".join(self.recompute_at)
        if self.edit is not None:
            fix = (f"compute {m.who} again after the step, with a new forward: repeat the statements at {lines} right "
                   f"before its backward() at {short_place(self.place)}; or call its backward() before "
                   f"`{self.optimizer}.step()`")
            return Words(message, cause, fix, code(self.snippet, self.edit))
        fix = (f"compute {m.who} again after `{self.optimizer}.step()`, with a new forward of what it was computed "
               "from, or call its backward() before that step")
        return Words(message, cause, fix, ADVICE)

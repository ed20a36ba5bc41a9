"""An optimizer's ``step()`` between a loss's forward and its ``backward()``: torch's "modified by an inplace
operation" when the step changed, in place, parameters the loss's graph saved (a GAN calling ``opt_D.step()``
before ``G_loss.backward()``, pytorch/pytorch#39141), and its words (the observation:
:mod:`leafwatch.observe.stepped`).

The finding is the loss's (``missing_grad`` / ``stepped_before_backward``: its backward cannot run, so nothing it
would train gets a gradient); its code fix computes the loss again, with a new forward, right before its
backward(). Nothing is said of the optimizer that never got to step: the run is left undecided on it.
"""

from __future__ import annotations

import textwrap

from ..observe import stepped
from ..report.findings import Finding
from ..report.words import ADVICE, Edit, Members, Words, code, renders
from . import fixes
from .constructors import make


def _short(location: str) -> str:
    return fixes.short_place(location)


def judge(crash: stepped.SteppedBeforeBackward) -> Finding:
    """The finding of a loss whose graph an optimizer step changed before its backward()."""
    edit = None
    if crash.before is not None and crash.recompute:
        at = crash.before
        edit = Edit(at.path, at.start - 1, at.start - 1, "insert_after", crash.recompute).to_dict()
    args = {"place": crash.place, "loss_at": _short(crash.loss_at), "optimizer": crash.optimizer, "cls": crash.cls,
            "step_at": _short(crash.step_at), "module": crash.module, "snippet": textwrap.dedent(crash.recompute).strip("\n"),
            "recompute_at": [_short(r) for r in crash.recompute_at], "edit": edit}
    return make("missing_grad", crash.loss, "error", "stepped_before_backward", args)


@renders("missing_grad", "stepped_before_backward")
def _stepped_before_backward(m: Members) -> Words:
    a = m.first
    owner = f"the parameters of `{a['module']}`" if a["module"] else f"parameters `{a['optimizer']}` holds"
    message = (f"`{a['optimizer']}.step()` at {a['step_at']} changed in place {owner} that the graph of {m.who} "
               f"(computed at {a['loss_at']}) saved, before the backward() of {m.who} at {_short(a['place'])}: that "
               "graph is out of date, and torch refuses to go through it.")
    cause = (f"an optimizer's step() updates its parameters in place; {m.who} was computed from them before "
             f"`{a['optimizer']}.step()` (a `{a['cls']}`), so its backward() needs values the step overwrote. Nothing "
             f"{m.who} would train gets a gradient.")
    lines = " and ".join(a["recompute_at"])
    if a["edit"] is not None:
        fix = (f"compute {m.who} again after the step, with a new forward: repeat the statements at {lines} right "
               f"before its backward() at {_short(a['place'])}; or call its backward() before `{a['optimizer']}.step()`")
        return Words(message, cause, fix, code(a["snippet"], Edit.from_dict(a["edit"])))
    fix = (f"compute {m.who} again after `{a['optimizer']}.step()`, with a new forward of what it was computed from, "
           "or call its backward() before that step")
    return Words(message, cause, fix, ADVICE)

"""Dead gradients: a gradient that exists but carries nothing, value check after value check.

A trainable tensor whose ``.grad`` is exactly zero at several value checks in a row (a path
multiplied by zero, a custom ``autograd.Function`` that returns zeros, DDP filling an unused
parameter's gradient with zeros) is ``dead_grad``: a warning, never an error. The zero test rides
on the batched NaN/Inf value check (the same reductions, no extra host read). Zero-initialised
gates (LoRA's B = 0, adaLN-zero, ReZero) are zero at the first check only: their partners get
gradients once the gate moves, which breaks the streak. A gradient that is None at a check
(routing, sparse use) also breaks it; sparse gradients and ``padding_idx`` rows are never zero
as a whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..report.history import FindingsView
from ..report.verdicts import Verdict, Verdicts
from ..report.findings import Finding
from .constructors import make
from ..report.reasons import Reason
from ..report.words import Members, Words

#: Value checks in a row with an exactly-zero gradient before ``dead_grad`` is reported.
DEAD_AFTER = 3


@dataclasses.dataclass(eq=False, slots=True)
class DeadGradState:
    """Per name, how many value checks in a row saw an exactly-zero gradient."""

    streak: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Names with an open dead_grad finding (the resolve pass runs only while there are some).
    open_names: set[str] = dataclasses.field(default_factory=set)


def record(state: DeadGradState, view: FindingsView, results: Iterable[tuple[int, list[str], set[str]]]) -> Verdicts:
    """Apply completed value checks: ``(step, names with a gradient, names exactly zero)`` (``view``: the findings so far)."""
    out: Verdicts = []
    opened: set[str] | None = None  # open after this call's verdicts, read once when first needed
    before = state.streak
    for step, checked, zero in results:
        # A name not zero at this check (or without a gradient) starts over.
        get = before.get
        streak = {name: get(name, 0) + 1 for name in zero}
        due = {name for name, count in streak.items() if count >= DEAD_AFTER}
        if due or state.open_names:
            if opened is None:
                opened = view.open_names("dead_grad")
            # Written once when the streak crosses the threshold (not at every value check after:
            # a deep chain whose gradients underflow has hundreds of them).
            for name in sorted(due - opened):
                out.append(Verdict.open(dead_grad(name, streak[name], step)))
            opened |= due
            if state.open_names:
                for name in sorted(opened - zero):
                    opened.discard(name)
                    out.append(Verdict.resolve(("dead_grad", name), step))
        state.streak = before = streak
        state.open_names = due
    return out


# -- its words ---------------------------------------------------------------------------------
def dead_grad(name: str, checks: int, step: int) -> Finding:
    """A gradient that exists but was exactly zero at ``checks`` value checks in a row."""
    return make(ZeroStreak(checks=checks), name, "warning", step=step, zero_checks=checks)


class ZeroStreak(Reason, kind="dead_grad", name="zero_streak", fixes="never"):
    """A gradient exactly zero at ``checks`` value checks in a row."""

    checks: int

    def words(self, m: Members) -> Words:
        checks = m.shared("checks") or f"{min(m.each('checks'))} or more"
        return Words(
            f"{m.who} gets a gradient, but it was exactly zero at {checks} value checks in a row: it does not train.",
            "every path from the loss to it is multiplied by zero (a gate or a scale stuck at 0, a mask "
            "that removes all of it, or gradients that underflow through a deep chain), a custom "
            "`autograd.Function` returns zeros for it, or DDP fills the gradient of a parameter unused on "
            "this rank with zeros.",
            f"find what zeroes the gradient of {m.who} (`torch.autograd.grad` of one step's loss with respect "
            "to the intermediate outputs); if it is unused on purpose, freeze it with `requires_grad_(False)`")

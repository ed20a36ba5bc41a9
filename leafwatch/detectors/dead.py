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

from collections.abc import Iterable

from ..history import FindingsView
from ..verdicts import Verdict, Verdicts
from .constructors import dead_grad

#: Value checks in a row with an exactly-zero gradient before ``dead_grad`` is reported.
DEAD_AFTER = 3


class DeadGradTracker:
    """Per name, how many value checks in a row saw an exactly-zero gradient.

    Args:
        view: The findings so far (read-only).
    """

    def __init__(self, view: FindingsView) -> None:
        self.view = view
        self.streak: dict[str, int] = {}
        #: Names with an open dead_grad finding (the resolve pass runs only while there are some).
        self.open_names: set[str] = set()

    def record(self, results: Iterable[tuple[int, list[str], set[str]]]) -> Verdicts:
        """Apply completed value checks: ``(step, names with a gradient, names exactly zero)``."""
        out: Verdicts = []
        opened: set[str] | None = None  # open after this call's verdicts, read when first needed

        def open_now() -> set[str]:
            nonlocal opened
            if opened is None:
                opened = self.view.open_names("dead_grad")
            return opened

        before = self.streak
        for step, checked, zero in results:
            streak: dict[str, int] = {}
            for name in zero:
                count = streak[name] = before.get(name, 0) + 1
                # Written once when the streak crosses the threshold (not at every value check after:
                # a deep chain whose gradients underflow has hundreds of them).
                if count >= DEAD_AFTER and name not in open_now():
                    open_now().add(name)
                    out.append(Verdict.open(dead_grad(name, count, step)))
            self.streak = before = streak  # a name not zero at this check (or without a gradient) starts over
            if self.open_names:
                for name in sorted(open_now() - zero):
                    open_now().discard(name)
                    out.append(Verdict.resolve(("dead_grad", name), step))
            self.open_names = {n for n, c in streak.items() if c >= DEAD_AFTER}
        return out

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

from .checks import dead_grad
from .history import FindingHistory

#: Value checks in a row with an exactly-zero gradient before ``dead_grad`` is reported.
DEAD_AFTER = 3


class DeadGradTracker:
    """Per name, how many value checks in a row saw an exactly-zero gradient.

    Args:
        history: Where ``dead_grad`` findings go.
    """

    def __init__(self, history: FindingHistory) -> None:
        self.history = history
        self.streak: dict[str, int] = {}
        #: Names with an open dead_grad finding (the resolve pass runs only while there are some).
        self.open_names: set[str] = set()

    def record(self, results: Iterable[tuple[int, list[str], set[str]]]) -> None:
        """Apply completed value checks: ``(step, names with a gradient, names exactly zero)``."""
        before, is_open = self.streak, self.history.is_open
        for step, checked, zero in results:
            streak: dict[str, int] = {}
            for name in zero:
                count = streak[name] = before.get(name, 0) + 1
                # Written once when the streak crosses the threshold (not at every value check after:
                # a deep chain whose gradients underflow has hundreds of them).
                if count >= DEAD_AFTER and not is_open(("dead_grad", name)):
                    self.history.upsert(dead_grad(name, count, step))
            self.streak = before = streak  # a name not zero at this check (or without a gradient) starts over
            if self.open_names:
                self.history.resolve_where(lambda f: f.kind == "dead_grad" and f.name not in zero, step)
            self.open_names = {n for n, c in streak.items() if c >= DEAD_AFTER}

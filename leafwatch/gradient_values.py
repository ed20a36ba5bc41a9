"""The values of the gradients: NaN/Inf (``nonfinite_grad``) and exactly-zero streaks (``dead_grad``).

One batched check per value check, never one host read per tensor (:mod:`leafwatch.values`), at
a cadence: every ``check_values_every_n_steps`` checks, the first check, a check a loop watch
asks for (a step about to be skipped), and every check up to ``every_check_values_until`` (so
``leafwatch run`` names a NaN at the step it appears). The exactly-zero streaks count only the
checks of the cadence, so their timing does not depend on the extra checks.
"""

from __future__ import annotations

import torch

from . import checks, distributed, inventory, structure
from .dead import DeadGradTracker
from .findings import Kind, Status
from .history import FindingHistory
from .values import NamedValueCheck, nonfinite


class GradientValues:
    """Checks gradient values at its cadence and writes ``nonfinite_grad`` / ``dead_grad``.

    Args:
        structure_: The structure cache (the check lists; how gradients are read when sharded).
        history: Where the findings are written.
        every: The cadence in checks (0: off).
    """

    def __init__(self, structure_: structure.StructureCache, history: FindingHistory, every: int) -> None:
        self.structure = structure_
        self.history = history
        self.every = every
        #: Check at every check up to this step too, besides the cadence.
        self.every_check_values_until = 0
        self._values = NamedValueCheck(track_zeros=True)
        self._dead = DeadGradTracker(history)
        self._last_step = -1
        self._off_cadence_steps: set[int] = set()

    def judge(self, step: int, lists: list[structure.CheckList], forced: bool) -> None:
        """At a check: the value check when it is due."""
        every = self.every
        on_cadence = bool(every) and (step == 1 or step % every == 0 or forced)
        if on_cadence or (every and step <= self.every_check_values_until):
            if not on_cadence:
                self._off_cadence_steps.add(step)
            self._check(step, lists)

    def finish(self, step: int) -> None:
        """At the end of a run: the checks still in flight, the gradients not checked since the last
        value check, and the parameters themselves (a short run may end between value checks, and
        gradients are often cleared by then: a NaN gradient that was applied left NaN in the parameter)."""
        self._record(step, *self._values.flush())
        if not self.every or step <= 0:
            return
        lists = list(self.structure.lists.values())
        if self._last_step != step:
            self._check(step, lists)
            self._record(step, *self._values.flush())
        named = [(p, n) for c in lists for p, n in zip(c.params, c.names) if inventory.has_values(p)]
        params, names = [p for p, _ in named], [n for _, n in named]
        flagged = {f.name for f in self.history if f.kind == Kind.NONFINITE_GRAD and f.status == Status.OPEN}
        for _, i in nonfinite(params, step):
            if names[i] not in flagged:
                self.history.upsert(checks.nonfinite_param(names[i], params[i], step))

    def stats(self) -> dict[str, int]:
        return {"value_checks_in_flight": len(self._values.checker.pending_steps()),
                "value_names_kept": self._values.launched()}

    def _check(self, step: int, lists: list[structure.CheckList]) -> None:
        self._last_step = step
        if len(lists) == 1:  # one optimizer: its list as it is (a new list at each structure reading)
            params, names = lists[0].params, lists[0].names
        else:
            params = [p for c in lists for p in c.params]
            names = tuple(n for c in lists for n in c.names)
        grads = [p.grad for p in params]
        if self.structure.grad_view.local_grads:
            grads = [distributed.local_tensor(g) for g in grads]
        self._record(step, *self._values.check(names, params, grads, step))

    def _record(self, step: int, completed: list[int], bad: list[tuple[int, str, torch.Tensor]]) -> None:
        flagged = set()
        for bad_step, name, param in bad:
            flagged.add(name)
            self.history.upsert(checks.nonfinite_grad(name, param, bad_step))
        if completed:
            latest = max(completed)
            self.history.resolve_where(
                lambda f: f.kind == Kind.NONFINITE_GRAD and f.name not in flagged and (f.last_step or 0) < latest,
                latest)
        zeros = self._values.take_zeros()
        if self._off_cadence_steps:
            zeros = [z for z in zeros if z[0] not in self._off_cadence_steps]
            self._off_cadence_steps = {s for s in self._off_cadence_steps if s >= step - 2}  # (CUDA: a step late)
        self._dead.record(zeros)

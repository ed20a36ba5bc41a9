"""A gradient that is exactly zero because it flows only through ops whose gradient is zero.

``round``, ``floor``, ``ceil``, ``trunc``, ``sign`` and ``sgn`` have a gradient of zero wherever it
is defined: a tensor whose every path to the loss passes through one gets a gradient that exists
and is exactly zero, step after step (a quantizer or a hard threshold without a straight-through
estimator). ``argmax``, comparisons and ``.long()`` are another matter: they leave no autograd graph
at all, and the cut recorder names them as cuts of a missing gradient.

The cut recorder notes where such an op ran on a tensor that requires grad, and the leaves
upstream of it (``Tracer.zero_ops``). When the value checks find a gradient exactly zero check
after check (``dead_grad``, :mod:`leafwatch.detectors.dead`), this detector names the op and the
user's line as its cause. A straight-through estimator (``x + (q - x).detach()``) gives ``x`` a
gradient through its identity path: it is never exactly zero, so it is never a finding.
"""

from __future__ import annotations

from typing import Any

from ..observe.evidence import INVENTORY, SEEN, Evidence
from ..report.findings import Status
from ..report.history import FindingsView
from ..report.reasons import Place, Transition
from ..report.verdicts import Verdict, Verdicts
from ..report.words import Members, Words
from .causes import place_of
from .constructors import transition
from .values import ValuesState


def judge(evidence: Evidence, state: None, view: FindingsView, values: ValuesState) -> Verdicts:
    """While a ``dead_grad`` finding is open: each one whose tensor lies upstream of an op of zero
    gradient the recorder saw is explained by that op and its line."""
    sites, inv = evidence[SEEN].tracer.zero_ops, evidence[INVENTORY]
    if not sites or inv is None:
        return []
    ids = {name: pid for pid, name in inv.known_names().items()}
    out: Verdicts = []
    for f in view:
        if f.kind != "dead_grad" or f.status != Status.OPEN or f.reason.name != "zero_streak" or f.name not in ids:
            continue
        pid = ids[f.name]
        site = min((s for s in sites.values() if pid in s.leaves), key=lambda s: s.order, default=None)
        if site is not None:
            op, place, called_from = site.site.op, site.site.place, site.site.called_from
            at = called_from or place
            out.append(Verdict.set(transition(  # every tensor behind one op is one mistake, said where it is
                f, ZeroGradientOp, {"group": f"{op.strip('`')} at {at}", "location": f"through {op} at {at}"},
                op=op, place=place_of(place), called_from=place_of(called_from))))
    return out


class ZeroGradientOp(Transition, kind="dead_grad", name="zero_gradient_op", fixes="never"):
    """The gradient is exactly zero because every path to the loss passes through an op of zero gradient
    (the op and its line, as the cut recorder saw it run)."""

    op: str
    place: Place
    called_from: Place | None = None

    def words(self, m: Members) -> Words:
        before, place, called_from = self.before(m), self.place, self.called_from
        at = place.within + (f", called from {called_from.within}" if called_from is not None else "")
        return Words(
            before.message,
            f"every path from the loss to {m.who} passes through {self.op} at {at}, whose gradient is zero wherever it "
            "is defined, so the gradient that reaches it is exactly zero (leafwatch saw the op run on it).",
            f"to train through {self.op} at {(called_from or place).short}, pass the gradient straight through: "
            "`x + (q - x).detach()` (with `q` the op's result) keeps the forward's values and gives `x` the gradient "
            "of an identity; or use a smooth surrogate (`torch.sigmoid(k * x)` for a step)")


def waits_on(state: Any, seen: Any, values: ValuesState) -> tuple[tuple[object, str], ...]:
    """It has work only while a ``dead_grad`` finding is open."""
    return ((values.dead, "open_names"),)

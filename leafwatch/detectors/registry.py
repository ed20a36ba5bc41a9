"""The one list of the check's detectors: what runs, in which order, at which stage.

Each entry is a :class:`Detector`: its name in the user's words (an ``incomplete`` finding names
it), ``run(checker, evidence)`` returning its verdicts (the check's
:class:`~leafwatch.observe.evidence.Evidence`), the stage it runs at, what it waits on,
and the state it keeps across checks (built once per :class:`~leafwatch.detectors.checker.Checker`,
kept in ``checker.states[name]``). The Checker builds its pipeline from this list and no other,
so adding a detector is its module, one line here, and its tests. The words of each
``(kind, reason)`` a detector decides are written by one builder in its module, listed in
:mod:`~leafwatch.detectors.voices`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from . import gradients, membership, outside, structure, values, watched
from ..observe.evidence import Evidence
from ..report.verdicts import Verdicts

#: Before any gradient exists (the structure scan at the first sight of a model).
SCAN = "scan"
#: At each check, in order.
CHECK = "check"
#: At the end of the run, in order.
CLOSE = "close"
#: After them, at the end of a run of one look without the loss (``audit()``).
ONE_LOOK = "one look"


@dataclasses.dataclass(frozen=True)
class Detector:
    """One detector as the pipeline runs it.

    ``when`` gives, for a Checker, the ``(owner, attribute)`` pairs the detector waits on (see
    :class:`~leafwatch.detectors.pipeline.Part`); ``state`` builds what it keeps across checks.
    """

    name: str
    run: Callable[[Any, Evidence | None], Verdicts | None]
    stage: str = CHECK
    when: Callable[[Any], tuple[tuple[object, str], ...]] | None = None
    state: Callable[[Any], Any] | None = None


DETECTORS: tuple[Detector, ...] = (
    Detector("the structure scan", structure.scan, SCAN),
    Detector("the structure check", structure.judge, when=lambda c: ((None, "rebuilt"),)),
    Detector("the gradient check", gradients.read),
    Detector("the check of watched tensors", watched.judge, when=watched.waits_on),
    Detector("the loss-graph check", outside.judge_loss, when=lambda c: ((None, "loss"),)),
    Detector("the optimizer-membership check", membership.judge, when=lambda c: ((c.membership, "waiting"),)),
    Detector("the NaN/Inf gradient check", values.judge),
    Detector("the last NaN/Inf gradient check", values.finish, CLOSE),
    Detector("the end-of-run decisions", membership.decide_pending, CLOSE),
    Detector("the loss-graph check", outside.undecided, CLOSE),
    Detector("the no-gradient-at-all check", gradients.no_gradient_at_all, ONE_LOOK),
)

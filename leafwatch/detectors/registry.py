"""The one list of the check's detectors: what runs, in which order, at which stage.

Each entry is a :class:`Detector`: its name in the user's words (an ``incomplete`` finding names
it, so names are unique), ``judge(evidence, state, view, *needed)`` returning its verdicts from the
check's :class:`~leafwatch.observe.evidence.Evidence`, the state it keeps across checks (built once
per :class:`~leafwatch.detectors.checker.Checker` by ``state(config)``), the findings so far
(read-only) and the states of the earlier detectors it names in ``needs`` (the pipeline orders by
them), the stage it runs at and what it waits on. The Checker builds its pipeline from this list
and no other, so adding a detector is its module, one entry here, and its tests.

One voice per finding: an entry also lists the reason classes its detector decides (``decides``);
each class (:class:`~leafwatch.report.reasons.Reason`, in the detector's module) is the one writer of
its words and declares its ``(kind, reason)``. ``tests/core/test_voices.py`` fails on a reason with
two classes or decided by two entries, on a class missing here, and on words edited after rendering.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from . import (causes, crashes, dead, freed, gradients, graphless, held, leaves, loop, membership, outside, pipeline,
               plain_flag, ranks, silenced, stepped, structure, unchecked, values, watched, zeroed)
from ..observe.evidence import LOSS, REBUILT
from ..report.reasons import Reason
from ..report.verdicts import Verdicts

#: Before any gradient exists (the structure scan at the first sight of a model).
SCAN = "scan"
#: At each check, in order.
CHECK = "check"
#: At the end of the run, in order.
CLOSE = "close"
#: After them, at the end of a run of one look without the loss (``audit()``).
ONE_LOOK = "one look"
#: After each check when distributed, on the findings of every rank (run by the Monitor's
#: :class:`~leafwatch.detectors.gatherer.Gatherer` on the merged history, with its own state).
RANKS = "ranks"
#: When torch raised because of a leaf mistake: run by the crash door (the excepthook, ``leafwatch run``,
#: the Lightning callback) on what the exception's traceback shows, once per exception; no check runs it.
CRASH = "crash"


@dataclasses.dataclass(frozen=True)
class Config:
    """What the Monitor was told, from which the detectors' states are built."""

    patience: int = 1
    diagnose: bool = True
    check_values_every_n_steps: int = 20


@dataclasses.dataclass(frozen=True)
class Detector:
    """One detector as the pipeline runs it.

    ``judge(evidence, state, view, *needed)``: its verdicts; ``state(config)`` builds what it keeps
    across checks (None: nothing); ``needs``: the names of the earlier detectors whose states it
    reads, handed to it in that order; ``when(state, seen, *needed)`` (``seen``: the check's
    :class:`~leafwatch.observe.evidence.Observation`) gives the ``(owner, attribute)`` pairs
    it waits on (see :class:`~leafwatch.detectors.pipeline.Part`); ``decides``: the reason classes it
    decides (each in the module that decides it, with its words; their ``(kind, reason)`` pairs are
    derived from them, never listed again).
    """

    name: str
    judge: Callable[..., Verdicts | None]
    stage: str = CHECK
    state: Callable[[Config], Any] | None = None
    needs: tuple[str, ...] = ()
    when: Callable[..., tuple[tuple[object, str | int], ...]] | None = None
    decides: tuple[type[Reason], ...] = ()


def ordered(detectors: Sequence[Detector]) -> list[Detector]:
    """The detectors in the order they are listed, each after those it ``needs`` (a stable
    topological order).

    Raises:
        ValueError: two detectors of one name, a need no detector of the list meets, or a cycle.
    """
    names = [d.name for d in detectors]
    if len(set(names)) != len(names):
        raise ValueError(f"detector names must be unique (a failing part is known by its name), got {names}")
    missing = {n for d in detectors for n in d.needs} - set(names)
    if missing:
        raise ValueError(f"`needs` names no detector of the list: {sorted(missing)}")
    done: list[Detector] = []
    waiting = list(detectors)
    while waiting:
        ready = next((d for d in waiting if set(d.needs) <= {x.name for x in done}), None)
        if ready is None:
            raise ValueError(f"`needs` make a cycle among {[d.name for d in waiting]}")
        done.append(ready)
        waiting.remove(ready)
    return done


GRADIENTS = "the gradient check"
#: The end-of-run look for a run that trained with no check (a front-end tells it the optimizers it met).
UNCHECKED = "the check that the run's steps were seen"


DETECTORS: tuple[Detector, ...] = (
    Detector("the structure scan", structure.scan, SCAN),
    Detector("the structure check", structure.judge, when=lambda state, *needed: ((None, REBUILT),), decides=(
        membership.LeftOut, membership.BufferRequiresGrad, structure.UnfrozenAfter, membership.CreatedAfterOptimizer,
        membership.LibraryOptimizers, membership.BufferSwitchedOn, membership.ListedTwice, structure.PlainTensor,
        structure.Frozen, structure.Buffer, structure.ReplacedTensor, structure.ModuleReplaced, structure.OldTensors,
        structure.Leftovers, structure.ModuleInContainer, structure.TensorInContainer, structure.NonLeafAttribute,
        structure.PlainAttribute, structure.Device, ranks.ShardedGradients)),
    Detector("the check of a module's plain requires_grad", plain_flag.judge,
             when=lambda state, *needed: ((None, REBUILT),), decides=(plain_flag.PlainRequiresGrad,)),
    Detector(GRADIENTS, gradients.read, state=lambda c: gradients.GradientState(c.patience, c.diagnose), decides=(
        # what the hooks and the cut recorder saw (causes.py), or why nothing can be said, and the transitions
        causes.NeverRan, causes.NoForwardOfItsOwn, causes.GradDisabled, causes.Checkpoint, causes.InsideFunction,
        causes.CopiedWeights, causes.IntegerCut, causes.Detached, causes.Rewrapped, causes.UnusedOutput,
        causes.DataAccess, causes.Unused, causes.CalledDirectly, causes.SubstitutedWeights, gradients.LossWithoutGraph,
        gradients.Unreachable, silenced.SilencedLoss, gradients.NotBackpropagated, gradients.UnknownNotAParameter,
        gradients.UnknownHooksOff, gradients.Unknown, gradients.Pending, gradients.TracedNothing, gradients.CameBack,
        gradients.Intermittent, gradients.Stalled, held.NotATarget, held.TargetUndecided, held.NotLayerdrop,
        held.LayerdropUndecided, held.Untraced,
        # the loop watch
        loop.Cleared, loop.ClearedOnPurpose, loop.ClearingEnded, loop.ZeroLr, loop.SkippedSteps)),
    Detector("the check of watched tensors", watched.judge, state=lambda c: watched.WatchedState(),
             when=watched.waits_on, decides=(leaves.NotALeaf, outside.OutsideModel, watched.RequiresGradFalse,
                                             watched.WatchedUnused)),
    Detector("the loss-graph check", outside.judge_loss, state=lambda c: outside.LossLeavesState(), needs=(GRADIENTS,),
             when=lambda state, *needed: ((None, LOSS),)),
    Detector("the optimizer-membership check", membership.judge, state=lambda c: membership.MembershipState(),
             when=lambda state, *needed: ((state, "waiting"), (None, REBUILT)), decides=(
                 membership.NeverStepped, membership.NoOptimizerStepped, membership.RootOutside,
                 membership.ChosenOutside, membership.Undecided)),
    Detector("the NaN/Inf gradient check", values.judge, state=lambda c: values.ValuesState(c.check_values_every_n_steps),
             needs=(GRADIENTS,), when=lambda state, *needed: ((state, "every"),), decides=(
                 values.NanOrInf, values.NanOrInfValue, dead.ZeroStreak)),
    Detector("the zero-gradient-op check", zeroed.judge, needs=("the NaN/Inf gradient check",), when=zeroed.waits_on,
             decides=(zeroed.ZeroGradientOp,)),
    Detector("the last NaN/Inf gradient check", values.judge_last, CLOSE, needs=("the NaN/Inf gradient check",)),
    Detector("the end-of-run decisions of missing gradients", gradients.decide_held, CLOSE, needs=(GRADIENTS,)),
    Detector("the end-of-run decisions of watched tensors", watched.decide_pending, CLOSE,
             needs=("the check of watched tensors",)),
    Detector("the end-of-run decisions of optimizer membership", membership.decide_pending, CLOSE,
             needs=("the optimizer-membership check",)),
    Detector("the end-of-run decision on the loss's leaves", outside.judge_undecided, CLOSE,
             needs=("the loss-graph check",), decides=(outside.LossLeaf,)),
    Detector(UNCHECKED, unchecked.judge, CLOSE, state=lambda c: unchecked.UncheckedState(),
             decides=(unchecked.UncheckedOptimizer,)),
    Detector("the no-gradient-at-all check", gradients.no_gradient_at_all, ONE_LOOK, needs=(GRADIENTS,),
             decides=(gradients.NoGradAtAll,)),
    Detector("the merge of the ranks' findings", ranks.judge, RANKS, decides=(
        ranks.UnusedOnRank, ranks.NoGradOnAnyRank, ranks.RankBranchingHangs, ranks.RankBranching)),
    Detector("the crash explanation", crashes.judge, CRASH, decides=(
        crashes.OptimizedNonLeaf, crashes.PersistentNonLeaf, crashes.InPlaceOnLeaf, freed.CarriedState,
        freed.ComputedOnce, freed.FreedByEarlier, crashes.AllFrozen, crashes.BackwardOfNoGraph,
        graphless.GradOffFunction, graphless.DetachedLoss, stepped.SteppedBeforeBackward, crashes.ExhaustedIterator)),
)

#: What no detector decides: a part that failed (the pipeline's own finding).
BEYOND_THE_CHECK: tuple[type[Reason], ...] = (pipeline.PartFailed,)

#: ``(kind, reason)`` -> the name of the registry's entry that decides it (the pipeline for ``incomplete``).
DECIDED_BY: dict[tuple[str, str], str] = {
    (cls.kind, cls.name): name
    for name, decides in (*((d.name, d.decides) for d in DETECTORS), ("the pipeline", BEYOND_THE_CHECK))
    for cls in decides}

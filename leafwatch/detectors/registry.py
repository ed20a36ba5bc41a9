"""The one list of the check's detectors: what runs, in which order, at which stage.

Each entry is a :class:`Detector`: its name in the user's words (an ``incomplete`` finding names
it, so names are unique), ``judge(evidence, state, view, *needed)`` returning its verdicts from the
check's :class:`~leafwatch.observe.evidence.Evidence`, the state it keeps across checks (built once
per :class:`~leafwatch.detectors.checker.Checker` by ``state(config)``), the findings so far
(read-only) and the states of the earlier detectors it names in ``needs`` (the pipeline orders by
them), the stage it runs at and what it waits on. The Checker builds its pipeline from this list
and no other, so adding a detector is its module, one entry here, and its tests.

One voice per finding: an entry also names, for each ``(kind, reason)`` its detector decides, the
one renderer of its words (registered with :func:`leafwatch.report.words.renders` in the
detector's module), as ``{"module.function": (kind, reason, ...)}`` under ``leafwatch.detectors``;
``tests/core/test_voices.py`` fails on a reason rendered twice, on a reason missing here, and on
words edited after rendering.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import gradients, membership, outside, ranks, structure, values, watched, zeroed
from . import pipeline  # noqa: F401 (the renderer of the incomplete finding a failing part leaves)
from ..observe.evidence import LOSS, REBUILT
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
    reads, handed to it in that order; ``when(state, *needed)`` gives the ``(owner, attribute)`` pairs
    it waits on (see :class:`~leafwatch.detectors.pipeline.Part`); ``voices``: the renderer of each
    ``(kind, reason)`` it decides.
    """

    name: str
    judge: Callable[..., Verdicts | None]
    stage: str = CHECK
    state: Callable[[Config], Any] | None = None
    needs: tuple[str, ...] = ()
    when: Callable[..., tuple[tuple[object, str | int], ...]] | None = None
    voices: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


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


DETECTORS: tuple[Detector, ...] = (
    Detector("the structure scan", structure.scan, SCAN),
    Detector(gradients.FIRST_STEPS, gradients.first_step_misses, SCAN, state=lambda c: gradients.FirstSteps(),
             when=lambda state, *needed: ((state, "misses"),)),
    Detector("the structure check", structure.judge, when=lambda state, *needed: ((None, REBUILT),), voices={
        "membership._left_out": ("not_in_optimizer", "left_out"),
        "membership._buffer_requires_grad": ("not_in_optimizer", "buffer_requires_grad"),
        "structure._unfrozen_after": ("not_in_optimizer", "unfrozen_after"),
        "membership._created_after": ("not_in_optimizer", "created_after_optimizer"),
        "structure._plain_tensor": ("frozen_in_optimizer", "plain_tensor"),
        "structure._frozen": ("frozen_in_optimizer", "frozen"),
        "structure._buffer": ("frozen_in_optimizer", "buffer"),
        "structure._replaced": ("stale_param", "replaced"),
        "structure._module_replaced_words": ("stale_param", "module_replaced"),
        "structure._old_tensors": ("stale_param", "old_tensors"),
        "structure._leftovers": ("stale_param", "leftovers"),
        "structure._module_in_container": ("orphan_tensor", "module_in_container"),
        "structure._tensor_in_container": ("orphan_tensor", "tensor_in_container"),
        "structure._non_leaf_attribute": ("orphan_tensor", "non_leaf_attribute"),
        "structure._plain_attribute": ("orphan_tensor", "plain_attribute"),
        "structure._device": ("device_mismatch", "device"),
        "ranks._sharded_gradients": ("missing_grad", "sharded_gradients")}),
    Detector(GRADIENTS, gradients.read, state=lambda c: gradients.GradientState(c.patience, c.diagnose), voices={
        # what the hooks and the cut recorder saw (causes.py) ...
        "causes._never_ran": ("missing_grad", "never_ran"),
        "causes._no_forward_of_its_own": ("missing_grad", "no_forward_of_its_own"),
        "causes._grad_disabled": ("missing_grad", "grad_disabled"),
        "causes._checkpoint": ("missing_grad", "checkpoint"),
        "causes._detached": ("missing_grad", "detached", "rewrapped"),
        "causes._unused_output": ("missing_grad", "unused_output"),
        "causes._data_access": ("missing_grad", "data_access"),
        "causes._unused": ("missing_grad", "unused"),
        "causes._called_directly": ("missing_grad", "called_directly"),
        "causes._substituted": ("missing_grad", "substituted_weights"),
        "causes._never_ran_at_the_only_step": ("missing_grad", "never_ran_at_the_only_step"),
        "causes._unknown_at_the_only_step": ("missing_grad", "unknown_at_the_only_step"),
        # ... or, without them, what the loss given says, or why nothing can be said
        "gradients._loss_without_graph": ("missing_grad", "loss_without_graph"),
        "gradients._unreachable": ("missing_grad", "unreachable"),
        "gradients._not_backpropagated": ("missing_grad", "not_backpropagated"),
        "gradients._unknown_not_a_parameter": ("missing_grad", "unknown_not_a_parameter"),
        "gradients._unknown_hooks_off": ("missing_grad", "unknown_hooks_off"),
        "gradients._unknown": ("missing_grad", "unknown"),
        "gradients._pending": ("missing_grad", "pending"),
        "gradients._traced_nothing": ("missing_grad", "traced_nothing"),
        "gradients._came_back_words": ("missing_grad", "came_back"),
        "gradients._intermittent": ("missing_grad", "intermittent"),
        "gradients._stalled_words": ("missing_grad", "stalled"),
        "held._not_a_target": ("missing_grad", "not_a_target"),
        "held._target_undecided": ("missing_grad", "target_undecided"),
        "held._not_layerdrop": ("missing_grad", "not_layerdrop"),
        "held._layerdrop_undecided": ("missing_grad", "layerdrop_undecided"),
        # the loop watch
        "loop._cleared": ("grad_cleared", "cleared"),
        "loop._cleared_on_purpose": ("grad_cleared", "cleared_on_purpose"),
        "loop._clearing_ended": ("grad_cleared", "clearing_ended"),
        "loop._zero_lr": ("no_update", "zero_lr"),
        "loop._skipped_steps": ("no_update", "skipped_steps")}),
    Detector("the check of watched tensors", watched.judge, state=lambda c: watched.WatchedState(),
             when=watched.waits_on, voices={
                 "leaves._not_a_leaf": ("non_leaf", "not_a_leaf"),
                 "watched._requires_grad_false": ("missing_grad", "requires_grad_false"),
                 "watched._watched_unused": ("missing_grad", "watched_unused"),
                 "outside._outside_model": ("not_in_optimizer", "outside_model")}),
    Detector("the loss-graph check", outside.judge_loss, state=lambda c: outside.LossLeavesState(), needs=(GRADIENTS,),
             when=lambda state, *needed: ((None, LOSS),)),
    Detector("the optimizer-membership check", membership.judge, state=lambda c: membership.MembershipState(),
             when=lambda state, *needed: ((state, "waiting"), (None, REBUILT)), voices={
                 "membership._never_stepped_words": ("not_in_optimizer", "never_stepped"),
                 "membership._no_optimizer_stepped": ("not_in_optimizer", "no_optimizer_stepped"),
                 "membership._root_outside": ("not_in_optimizer", "root_outside"),
                 "membership._chosen_outside": ("not_in_optimizer", "chosen_outside")}),
    Detector("the NaN/Inf gradient check", values.judge, state=lambda c: values.ValuesState(c.check_values_every_n_steps),
             needs=(GRADIENTS,), when=lambda state, *needed: ((state, "every"),), voices={
                 "values._nan_or_inf": ("nonfinite_grad", "nan_or_inf"),
                 "values._nan_or_inf_value": ("nonfinite_grad", "nan_or_inf_value"),
                 "dead._zero_streak": ("dead_grad", "zero_streak")}),
    Detector("the zero-gradient-op check", zeroed.judge, needs=("the NaN/Inf gradient check",), when=zeroed.waits_on,
             voices={"zeroed._zero_gradient_op": ("dead_grad", "zero_gradient_op")}),
    Detector("the last NaN/Inf gradient check", values.judge_last, CLOSE, needs=("the NaN/Inf gradient check",)),
    Detector("the end-of-run decisions of missing gradients", gradients.decide_held, CLOSE, needs=(GRADIENTS,)),
    Detector("the end-of-run decisions of watched tensors", watched.decide_pending, CLOSE,
             needs=("the check of watched tensors",)),
    Detector("the end-of-run decisions of optimizer membership", membership.decide_pending, CLOSE,
             needs=("the optimizer-membership check",)),
    Detector("the end-of-run decision on the loss's leaves", outside.judge_undecided, CLOSE,
             needs=("the loss-graph check",), voices={"outside._loss_leaf": ("not_in_optimizer", "loss_leaf")}),
    Detector("the no-gradient-at-all check", gradients.no_gradient_at_all, ONE_LOOK, needs=(GRADIENTS,), voices={
        "gradients._no_grad_at_all": ("missing_grad", "no_grad_at_all")}),
    Detector("the merge of the ranks' findings", ranks.judge, RANKS, voices={
        "ranks._unused_on_rank": ("missing_grad", "unused_on_rank"),
        "ranks._no_grad_on_any_rank": ("missing_grad", "no_grad_on_any_rank"),
        "ranks._rank_branching_hangs": ("missing_grad", "rank_branching_hangs"),
        "ranks._rank_branching": ("missing_grad", "rank_branching")}),
)

#: The voice of what no detector decides: a part that failed (the pipeline's own finding).
BEYOND_THE_CHECK: Mapping[str, tuple[str, ...]] = {"pipeline._part_failed": ("incomplete", "part_failed")}

#: ``(kind, reason)`` -> its one builder (``module.function`` under ``leafwatch.detectors``).
VOICES: dict[tuple[str, str], str] = {
    (kind, reason): builder for voices in (*(d.voices for d in DETECTORS), BEYOND_THE_CHECK)
    for builder, (kind, *reasons) in voices.items() for reason in reasons}

"""The one list of the check's detectors: what runs, in which order, at which stage.

Each entry is a :class:`Detector`: its name in the user's words (an ``incomplete`` finding names
it, so names are unique), ``judge(evidence, state, view, *needed)`` returning its verdicts from the
check's :class:`~leafwatch.observe.evidence.Evidence`, the state it keeps across checks (built once
per :class:`~leafwatch.detectors.checker.Checker` by ``state(config)``), the findings so far
(read-only) and the states of the earlier detectors it names in ``needs`` (the pipeline orders by
them), the stage it runs at and what it waits on. The Checker builds its pipeline from this list
and no other, so adding a detector is its module, one entry here, and its tests.

One voice per finding: an entry also names the ``(kind, reason)`` pairs its detector decides
(``decides``); each has one renderer of its words, registered with
:func:`leafwatch.report.words.renders` in the detector's module. ``tests/core/test_voices.py``
fails on a reason rendered twice or decided by two entries, on a reason made without a renderer
or missing here, and on words edited after rendering.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import crashes, gradients, membership, outside, ranks, structure, unchecked, values, watched, zeroed
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
    it waits on (see :class:`~leafwatch.detectors.pipeline.Part`); ``decides``: the reasons it
    decides, by kind (each rendered by the one renderer its module registers).
    """

    name: str
    judge: Callable[..., Verdicts | None]
    stage: str = CHECK
    state: Callable[[Config], Any] | None = None
    needs: tuple[str, ...] = ()
    when: Callable[..., tuple[tuple[object, str | int], ...]] | None = None
    decides: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


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
    Detector("the structure check", structure.judge, when=lambda state, *needed: ((None, REBUILT),), decides={
        "not_in_optimizer": ("left_out", "buffer_requires_grad", "unfrozen_after", "created_after_optimizer",
                             "library_optimizers", "buffer_switched_on"),
        "frozen_in_optimizer": ("plain_tensor", "frozen", "buffer"),
        "stale_param": ("replaced", "module_replaced", "old_tensors", "leftovers"),
        "orphan_tensor": ("module_in_container", "tensor_in_container", "non_leaf_attribute", "plain_attribute"),
        "device_mismatch": ("device",), "missing_grad": ("sharded_gradients",)}),
    Detector(GRADIENTS, gradients.read, state=lambda c: gradients.GradientState(c.patience, c.diagnose), decides={
        # what the hooks and the cut recorder saw (causes.py), or why nothing can be said, and the transitions
        "missing_grad": ("never_ran", "no_forward_of_its_own", "grad_disabled", "checkpoint", "inside_function", "copied_weights", "integer_cut", "detached", "rewrapped",
                         "unused_output", "data_access", "unused", "called_directly", "substituted_weights",
                         "loss_without_graph", "unreachable", "silenced_loss",
                         "not_backpropagated", "unknown_not_a_parameter", "unknown_hooks_off", "unknown", "pending",
                         "traced_nothing", "came_back", "intermittent", "stalled", "not_a_target", "target_undecided",
                         "not_layerdrop", "layerdrop_undecided", "untraced"),
        # the loop watch
        "grad_cleared": ("cleared", "cleared_on_purpose", "clearing_ended"), "no_update": ("zero_lr", "skipped_steps")}),
    Detector("the check of watched tensors", watched.judge, state=lambda c: watched.WatchedState(),
             when=watched.waits_on, decides={"non_leaf": ("not_a_leaf",), "not_in_optimizer": ("outside_model",),
                                             "missing_grad": ("requires_grad_false", "watched_unused")}),
    Detector("the loss-graph check", outside.judge_loss, state=lambda c: outside.LossLeavesState(), needs=(GRADIENTS,),
             when=lambda state, *needed: ((None, LOSS),)),
    Detector("the optimizer-membership check", membership.judge, state=lambda c: membership.MembershipState(),
             when=lambda state, *needed: ((state, "waiting"), (None, REBUILT)), decides={
                 "not_in_optimizer": ("never_stepped", "no_optimizer_stepped", "root_outside", "chosen_outside",
                                      "undecided")}),
    Detector("the NaN/Inf gradient check", values.judge, state=lambda c: values.ValuesState(c.check_values_every_n_steps),
             needs=(GRADIENTS,), when=lambda state, *needed: ((state, "every"),), decides={
                 "nonfinite_grad": ("nan_or_inf", "nan_or_inf_value"), "dead_grad": ("zero_streak",)}),
    Detector("the zero-gradient-op check", zeroed.judge, needs=("the NaN/Inf gradient check",), when=zeroed.waits_on,
             decides={"dead_grad": ("zero_gradient_op",)}),
    Detector("the last NaN/Inf gradient check", values.judge_last, CLOSE, needs=("the NaN/Inf gradient check",)),
    Detector("the end-of-run decisions of missing gradients", gradients.decide_held, CLOSE, needs=(GRADIENTS,)),
    Detector("the end-of-run decisions of watched tensors", watched.decide_pending, CLOSE,
             needs=("the check of watched tensors",)),
    Detector("the end-of-run decisions of optimizer membership", membership.decide_pending, CLOSE,
             needs=("the optimizer-membership check",)),
    Detector("the end-of-run decision on the loss's leaves", outside.judge_undecided, CLOSE,
             needs=("the loss-graph check",), decides={"not_in_optimizer": ("loss_leaf",)}),
    Detector(UNCHECKED, unchecked.judge, CLOSE, state=lambda c: unchecked.UncheckedState(),
             decides={"incomplete": ("unchecked_optimizer",)}),
    Detector("the no-gradient-at-all check", gradients.no_gradient_at_all, ONE_LOOK, needs=(GRADIENTS,),
             decides={"missing_grad": ("no_grad_at_all",)}),
    Detector("the merge of the ranks' findings", ranks.judge, RANKS, decides={
        "missing_grad": ("unused_on_rank", "no_grad_on_any_rank", "rank_branching_hangs", "rank_branching")}),
    Detector("the crash explanation", crashes.judge, CRASH, decides={
        "non_leaf": ("optimized_non_leaf", "persistent_non_leaf", "in_place_on_leaf", "carried_state", "computed_once",
                     "freed_by_earlier_backward"),
        "missing_grad": ("all_frozen", "backward_of_no_graph", "grad_off_function", "detached_loss",
                         "stepped_before_backward"),
        "not_in_optimizer": ("exhausted_iterator",)}),
)

#: What no detector decides: a part that failed (the pipeline's own finding).
BEYOND_THE_CHECK: Mapping[str, tuple[str, ...]] = {"incomplete": ("part_failed",)}

#: ``(kind, reason)`` -> the name of the registry's entry that decides it (the pipeline for ``incomplete``).
DECIDED_BY: dict[tuple[str, str], str] = {
    (kind, reason): name for name, decides in (*((d.name, d.decides) for d in DETECTORS), ("the pipeline", BEYOND_THE_CHECK))
    for kind, reasons in decides.items() for reason in reasons}

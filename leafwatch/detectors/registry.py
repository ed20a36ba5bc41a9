"""The one list of the check's detectors: what runs, in which order, at which stage.

Each entry is a :class:`Detector`: its name in the user's words (an ``incomplete`` finding names
it), ``run(checker, evidence)`` returning its verdicts (the check's
:class:`~leafwatch.observe.evidence.Evidence`), the stage it runs at, what it waits on,
and the state it keeps across checks (built once per :class:`~leafwatch.detectors.checker.Checker`,
kept in ``checker.states[name]``). The Checker builds its pipeline from this list and no other,
so adding a detector is its module, one entry here, and its tests.

One voice per finding: an entry also names, for each ``(kind, reason)`` its detector decides, the
one function that writes its words (message, cause and fix, or the cause and fix a generic message
goes with), as ``{"module.function": (kind, reason, ...)}`` under ``leafwatch.detectors``. A finding
always carries its reason (``details["reason"]``), so a reader, a test or a sink can tell which
builder spoke; ``tests/core/test_voices.py`` fails on a reason written in two functions, on a
reason missing here, and on a builder that edits the words another one wrote.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

from . import gradients, membership, outside, ranks, structure, values, watched
from . import pipeline  # noqa: F401 (the renderer of the incomplete finding a failing part leaves)
from ..observe.evidence import LOSS, REBUILT, Evidence
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
#: :class:`~leafwatch.detectors.gatherer.Gatherer`, bound to it, on the merged history).
RANKS = "ranks"


@dataclasses.dataclass(frozen=True)
class Detector:
    """One detector as the pipeline runs it.

    ``when`` gives, for a Checker, the ``(owner, attribute)`` pairs the detector waits on (see
    :class:`~leafwatch.detectors.pipeline.Part`); ``state`` builds what it keeps across checks;
    ``voices``: the builder of each ``(kind, reason)`` it decides.
    """

    name: str
    run: Callable[[Any, Evidence | None], Verdicts | None]
    stage: str = CHECK
    when: Callable[[Any], tuple[tuple[object, str | int], ...]] | None = None
    state: Callable[[Any], Any] | None = None
    voices: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


DETECTORS: tuple[Detector, ...] = (
    Detector("the structure scan", structure.scan, SCAN),
    Detector(gradients.FIRST_STEPS, gradients.first_step_misses, SCAN, when=lambda c: (
        (c.states[gradients.FIRST_STEPS], "misses"),), state=lambda c: types.SimpleNamespace(misses=[], seen=set())),
    Detector("the structure check", structure.judge, when=lambda c: ((None, REBUILT),), voices={
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
    Detector("the gradient check", gradients.read, voices={
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
    Detector("the check of watched tensors", watched.judge, when=watched.waits_on, voices={
        "leaves._not_a_leaf": ("non_leaf", "not_a_leaf"),
        "watched._requires_grad_false": ("missing_grad", "requires_grad_false"),
        "watched._watched_unused": ("missing_grad", "watched_unused"),
        "outside._outside_model": ("not_in_optimizer", "outside_model")}),
    Detector("the loss-graph check", outside.judge_loss, when=lambda c: ((None, LOSS),), voices={
        "outside._loss_leaf": ("not_in_optimizer", "loss_leaf")}),
    Detector("the optimizer-membership check", membership.judge, when=lambda c: ((c.membership, "waiting"),), voices={
        "membership._never_stepped_words": ("not_in_optimizer", "never_stepped"),
        "membership._no_optimizer_stepped": ("not_in_optimizer", "no_optimizer_stepped"),
        "membership._root_outside": ("not_in_optimizer", "root_outside"),
        "membership._chosen_outside": ("not_in_optimizer", "chosen_outside")}),
    Detector("the NaN/Inf gradient check", values.judge, when=lambda c: ((c.values, "every"),), voices={
        "values._nan_or_inf": ("nonfinite_grad", "nan_or_inf"),
        "values._nan_or_inf_value": ("nonfinite_grad", "nan_or_inf_value"),
        "dead._zero_streak": ("dead_grad", "zero_streak")}),
    Detector("the last NaN/Inf gradient check", values.judge_last, CLOSE),
    Detector("the end-of-run decisions", membership.decide_pending, CLOSE),
    Detector("the loss-graph check", outside.judge_undecided, CLOSE),
    Detector("the no-gradient-at-all check", gradients.no_gradient_at_all, ONE_LOOK, voices={
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

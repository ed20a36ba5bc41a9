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
        "membership.not_in_optimizer": ("not_in_optimizer", "left_out", "buffer_requires_grad"),
        "structure._optimizer_membership": ("not_in_optimizer", "unfrozen_after"),
        "membership._created_after": ("not_in_optimizer", "created_after_optimizer"),
        "structure._frozen_in_optimizer": ("frozen_in_optimizer", "plain_tensor", "frozen", "buffer"),
        "structure.stale_param": ("stale_param", "replaced"),
        "structure._module_replaced": ("stale_param", "module_replaced"),
        "structure.stale_group": ("stale_param", "old_tensors"),
        "structure._stale_leftovers": ("stale_param", "leftovers"),
        "structure._orphan_finding": ("orphan_tensor", "module_in_container", "tensor_in_container",
                                      "non_leaf_attribute", "plain_attribute"),
        "structure._devices": ("device_mismatch", "device"),
        "ranks.sharded_finding": ("missing_grad", "sharded_gradients")}),
    Detector("the gradient check", gradients.read, voices={
        # what the hooks and the cut recorder saw (causes.py) ...
        "causes._did_not_run": ("missing_grad", "never_ran", "no_forward_of_its_own"),
        "causes._ran_without_autograd": ("missing_grad", "grad_disabled", "checkpoint"),
        "causes._not_reached": ("missing_grad", "detached", "unused_output"),
        "causes.explain_missing": ("missing_grad", "data_access", "unused"),
        "causes.called_directly": ("missing_grad", "called_directly"),
        "causes.substituted": ("missing_grad", "substituted_weights"),
        "causes.at_the_only_step": ("missing_grad", "never_ran_at_the_only_step", "unknown_at_the_only_step"),
        # ... or, without them, what the loss given says, or why nothing can be said
        "gradients._without_hooks": ("missing_grad", "loss_without_graph", "unreachable", "not_backpropagated",
                                        "unknown_not_a_parameter", "unknown_hooks_off", "unknown"),
        "gradients._unexplained": ("missing_grad", "pending", "traced_nothing"),
        "gradients._recovered": ("missing_grad", "came_back"),
        "gradients.intermittent": ("missing_grad", "intermittent"),
        "gradients._stalled": ("missing_grad", "stalled"),
        "held._judged": ("missing_grad", "not_a_target", "target_undecided", "not_layerdrop", "layerdrop_undecided"),
        # the loop watch
        "loop.grad_cleared_all": ("grad_cleared", "cleared"),
        "loop.grad_cleared": ("grad_cleared", "cleared_on_purpose"),
        "loop._resumed": ("grad_cleared", "clearing_ended"),
        "loop.zero_lr": ("no_update", "zero_lr"),
        "loop.steps_skipped": ("no_update", "skipped_steps")}),
    Detector("the check of watched tensors", watched.judge, when=watched.waits_on, voices={
        "watched.non_leaf": ("non_leaf", "not_a_leaf"),
        "watched.not_requiring_grad": ("missing_grad", "requires_grad_false"),
        "watched.watched_findings": ("missing_grad", "watched_unused"),
        "outside.outside_optimizer": ("not_in_optimizer", "outside_model")}),
    Detector("the loss-graph check", outside.judge_loss, when=lambda c: ((None, LOSS),), voices={
        "outside.undecided": ("not_in_optimizer", "loss_leaf")}),
    Detector("the optimizer-membership check", membership.judge, when=lambda c: ((c.membership, "waiting"),), voices={
        "membership._never_stepped": ("not_in_optimizer", "never_stepped"),
        "membership._late": ("not_in_optimizer", "no_optimizer_stepped"),
        "membership._outside_root_finding": ("not_in_optimizer", "root_outside", "chosen_outside")}),
    Detector("the NaN/Inf gradient check", values.judge, when=lambda c: ((c.values, "every"),), voices={
        "values.nonfinite_grad": ("nonfinite_grad", "nan_or_inf"),
        "values.nonfinite_param": ("nonfinite_grad", "nan_or_inf_value"),
        "dead.dead_grad": ("dead_grad", "zero_streak")}),
    Detector("the last NaN/Inf gradient check", values.judge_last, CLOSE),
    Detector("the end-of-run decisions", membership.decide_pending, CLOSE),
    Detector("the loss-graph check", outside.judge_undecided, CLOSE),
    Detector("the no-gradient-at-all check", gradients.no_gradient_at_all, ONE_LOOK, voices={
        "gradients.no_grad_at_all": ("missing_grad", "no_grad_at_all")}),
    Detector("the merge of the ranks' findings", ranks.judge, RANKS, voices={
        "ranks.unused_on_rank": ("missing_grad", "unused_on_rank"),
        "ranks._merged_missing": ("missing_grad", "no_grad_on_any_rank", "rank_branching_hangs", "rank_branching")}),
)

#: The voice of what no detector decides: a part that failed (the pipeline's own finding).
BEYOND_THE_CHECK: Mapping[str, tuple[str, ...]] = {"pipeline.incomplete": ("incomplete", "part_failed")}

#: ``(kind, reason)`` -> its one builder (``module.function`` under ``leafwatch.detectors``).
VOICES: dict[tuple[str, str], str] = {
    (kind, reason): builder for voices in (*(d.voices for d in DETECTORS), BEYOND_THE_CHECK)
    for builder, (kind, *reasons) in voices.items() for reason in reasons}

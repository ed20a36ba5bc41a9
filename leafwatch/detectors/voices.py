"""One voice per finding: each ``(kind, reason)`` a finding can carry, and the one function that
writes its words (message, cause and fix, or the cause and fix a generic message goes with).

A finding always carries its reason (``details["reason"]``: :func:`~leafwatch.detectors.constructors.make`
requires it), so a reader, a test or a sink can tell which builder spoke. A new reason is a new
entry here and a builder in the detector that decides it; ``tests/core/test_voices.py`` fails on
a reason written in two functions, on a reason missing here, and on an entry whose builder does
not write it.
"""

from __future__ import annotations

#: ``(kind, reason)`` -> the builder, as ``module.function`` under ``leafwatch.detectors``.
VOICES: dict[tuple[str, str], str] = {
    ("non_leaf", "not_a_leaf"): "constructors.non_leaf",
    # missing_grad: what the hooks and the cut recorder saw (causes.py) ...
    ("missing_grad", "never_ran"): "causes._did_not_run",
    ("missing_grad", "no_forward_of_its_own"): "causes._did_not_run",
    ("missing_grad", "grad_disabled"): "causes._ran_without_autograd",
    ("missing_grad", "checkpoint"): "causes._ran_without_autograd",
    ("missing_grad", "detached"): "causes._not_reached",
    ("missing_grad", "unused_output"): "causes._not_reached",
    ("missing_grad", "data_access"): "causes.explain_missing",
    ("missing_grad", "unused"): "causes.explain_missing",
    ("missing_grad", "called_directly"): "causes.called_directly",
    ("missing_grad", "substituted_weights"): "causes.substituted",
    ("missing_grad", "never_ran_at_the_only_step"): "causes.at_the_only_step",
    ("missing_grad", "unknown_at_the_only_step"): "causes.at_the_only_step",
    # ... or, without them, what the loss given says, or why nothing can be said
    ("missing_grad", "loss_without_graph"): "constructors._without_hooks",
    ("missing_grad", "unreachable"): "constructors._without_hooks",
    ("missing_grad", "not_backpropagated"): "constructors._without_hooks",
    ("missing_grad", "unknown_not_a_parameter"): "constructors._without_hooks",
    ("missing_grad", "unknown_hooks_off"): "constructors._without_hooks",
    ("missing_grad", "unknown"): "constructors._without_hooks",
    ("missing_grad", "pending"): "gradients.GradientTracker._unexplained",
    ("missing_grad", "traced_nothing"): "gradients.GradientTracker._unexplained",
    ("missing_grad", "came_back"): "gradients.GradientTracker._recovered",
    ("missing_grad", "intermittent"): "constructors.intermittent",
    ("missing_grad", "stalled"): "gradients._stalled",
    ("missing_grad", "not_a_target"): "held._judged",
    ("missing_grad", "target_undecided"): "held._judged",
    ("missing_grad", "not_layerdrop"): "held._judged",
    ("missing_grad", "layerdrop_undecided"): "held._judged",
    ("missing_grad", "no_grad_at_all"): "constructors.no_grad_at_all",
    ("missing_grad", "requires_grad_false"): "constructors.not_requiring_grad",
    ("missing_grad", "watched_unused"): "constructors.watched_findings",
    ("missing_grad", "sharded_gradients"): "ranks.sharded_finding",
    ("missing_grad", "unused_on_rank"): "ranks.Gatherer._locally_unused",
    ("missing_grad", "no_grad_on_any_rank"): "ranks._merged_missing",
    ("missing_grad", "rank_branching_hangs"): "ranks._merged_missing",
    ("missing_grad", "rank_branching"): "ranks._merged_missing",
    ("grad_cleared", "cleared"): "constructors.grad_cleared_all",
    ("grad_cleared", "cleared_on_purpose"): "constructors.grad_cleared",
    ("grad_cleared", "clearing_ended"): "loop.ClearedGradients._resumed",
    ("not_in_optimizer", "left_out"): "structure.not_in_optimizer",
    ("not_in_optimizer", "buffer_requires_grad"): "structure.not_in_optimizer",
    ("not_in_optimizer", "unfrozen_after"): "structure._optimizer_membership",
    ("not_in_optimizer", "created_after_optimizer"): "structure._created_after",
    ("not_in_optimizer", "never_stepped"): "membership._never_stepped",
    ("not_in_optimizer", "no_optimizer_stepped"): "membership.MembershipJudge._late",
    ("not_in_optimizer", "root_outside"): "membership._outside_root_finding",
    ("not_in_optimizer", "chosen_outside"): "membership._outside_root_finding",
    ("not_in_optimizer", "outside_model"): "constructors.outside_optimizer",
    ("not_in_optimizer", "loss_leaf"): "outside.LossLeaves.undecided",
    ("frozen_in_optimizer", "plain_tensor"): "structure._frozen_in_optimizer",
    ("frozen_in_optimizer", "frozen"): "structure._frozen_in_optimizer",
    ("frozen_in_optimizer", "buffer"): "structure._frozen_in_optimizer",
    ("stale_param", "replaced"): "structure.stale_param",
    ("stale_param", "module_replaced"): "structure._module_replaced",
    ("stale_param", "old_tensors"): "structure.stale_group",
    ("stale_param", "leftovers"): "structure._stale_leftovers",
    ("orphan_tensor", "module_in_container"): "structure._orphan_finding",
    ("orphan_tensor", "tensor_in_container"): "structure._orphan_finding",
    ("orphan_tensor", "non_leaf_attribute"): "structure._orphan_finding",
    ("orphan_tensor", "plain_attribute"): "structure._orphan_finding",
    ("nonfinite_grad", "nan_or_inf"): "constructors.nonfinite_grad",
    ("nonfinite_grad", "nan_or_inf_value"): "constructors.nonfinite_param",
    ("dead_grad", "zero_streak"): "constructors.dead_grad",
    ("no_update", "zero_lr"): "constructors.zero_lr",
    ("no_update", "skipped_steps"): "constructors.steps_skipped",
    ("device_mismatch", "device"): "structure._devices",
    ("incomplete", "part_failed"): "pipeline.incomplete",
}


def builder_of(kind: str, reason: str) -> str | None:
    """The builder of ``(kind, reason)`` (``module.function`` under ``leafwatch.detectors``)."""
    return VOICES.get((kind, reason))

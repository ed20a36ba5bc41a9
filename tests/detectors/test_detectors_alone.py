"""Each detector alone: evidence handed to it, verdicts out, the history never touched.

No Monitor and no hooks here: a detector reads a read-only view of the findings and the facts
a test gives it, and returns verdicts; the tests apply them to a history themselves where the
outcome matters.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from leafwatch.detectors import dead, loop, structure, watched
from leafwatch.detectors.causes import Explanation, GradDisabled
from leafwatch.report.findings import Finding
from leafwatch.detectors.dead import dead_grad
from leafwatch.detectors import gradients, held
from leafwatch.report.findings import Kind, Status, Waiting
from leafwatch.observe.changes import HandUpdates
from leafwatch.report.history import FindingHistory, FindingsView
from leafwatch.report.reasons import Written
from leafwatch.observe.inventory import Inventory, ParamInfo
from leafwatch.options import WarnOnce
from leafwatch.detectors.pipeline import Part, Pipeline
from leafwatch.observe.structure import CheckList
from leafwatch.observe.tracing import Tracer
from leafwatch.report.verdicts import Action, Verdict
from leafwatch.watching import WatchSet, add_watch


def make(kind: str, name: str, severity: str, message: str, cause: str, fix: str, *, step: int | None = None,
         reason: str = "", **details) -> Finding:
    """A finding made by hand (its words written as they are, under the word ``reason``): these tests are about
    verdicts, not words."""
    return Finding(kind, name, severity, Written(message=message, cause=cause, fix=fix, name=reason), step=step,
                   first_step=step, last_step=step, details=details)


def _ran_under_no_grad(name: str):
    """How the gradient detector makes the miss of a module run under no_grad (its words rendered)."""
    return lambda: gradients.missing_grad(name, torch.ones(1), step=1, explanation=Explanation(GradDisabled()))


def _actions(verdicts: list[Verdict]) -> list[tuple[str, str, str]]:
    return [(str(v.action), v.key[0], v.key[1]) for v in verdicts]


# -- dead gradients -----------------------------------------------------------------------------
def test_dead_grad_opens_at_the_third_zero_value_check_and_resolves_when_the_gradient_moves() -> None:
    history = FindingHistory()
    state = dead.DeadGradState()
    zero = [(s, ["gate", "w"], {"gate"}) for s in (10, 20)]
    assert dead.record(state, history.view, zero) == []  # two zero checks: not yet
    opened = dead.record(state, history.view, [(30, ["gate", "w"], {"gate"})])
    assert _actions(opened) == [("open", "dead_grad", "gate")]
    assert opened[0].finding is not None and opened[0].finding.details["zero_checks"] == dead.DEAD_AFTER
    assert len(history) == 0  # the detector wrote nothing
    history.apply(opened)
    assert history.is_open(("dead_grad", "gate"))
    assert dead.record(state, history.view, [(40, ["gate", "w"], {"gate"})]) == []  # already open: said once
    assert _actions(dead.record(state, history.view, [(50, ["gate", "w"], set())])) == [("resolve", "dead_grad", "gate")]


def test_dead_grad_sees_its_own_verdicts_across_value_checks_that_complete_together() -> None:
    # Value checks read late (CUDA) complete together: opened at the third, resolved at the fourth.
    verdicts = dead.record(dead.DeadGradState(), FindingsView({}), [(s, ["g"], {"g"}) for s in (1, 2, 3)] + [(4, ["g"], set())])
    assert _actions(verdicts) == [("open", "dead_grad", "g"), ("resolve", "dead_grad", "g")]


# -- the structure ------------------------------------------------------------------------------
def test_a_structural_finding_the_new_reading_lacks_is_resolved_and_the_new_ones_open_or_wait() -> None:
    old = make("not_in_optimizer", "head.weight", "error", "m", "c", "f", step=1, reason="left_out")
    outside = make("not_in_optimizer", "temperature", "error", "m", "c", "f", step=1, reason="outside_model", outside=True)
    new = make("orphan_tensor", "blocks.0.weight", "error", "m", "c", "f", step=2, reason="module_in_container")
    held = make("stale_param", "fc.weight", "error", "m", "c", "f", step=2, reason="replaced", pending=Waiting.STRUCTURE)
    view = FindingsView({f.key: f for f in (old, outside)})
    verdicts = structure.verdicts(view, [new], 2, [held])
    # A tensor outside the model is judged at checks, never resolved by a reading of the structure.
    assert _actions(verdicts) == [("resolve", "not_in_optimizer", "head.weight"),
                                  ("open", "orphan_tensor", "blocks.0.weight"),
                                  ("hold", "stale_param", "fc.weight")]


def test_the_structure_detector_reads_a_model_and_its_optimizer_alone() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    found = structure.structural(Inventory(model, [opt]), step=0)
    assert sorted((f.kind, f.name) for f in found) == [("not_in_optimizer", "1.bias"), ("not_in_optimizer", "1.weight")]


# -- missing gradients --------------------------------------------------------------------------
def _checklist(model: nn.Module) -> CheckList:
    named = list(model.named_parameters())
    return CheckList(params=[p for _, p in named], names=tuple(n for n, _ in named),
                     infos=[ParamInfo(n, n.rpartition(".")[0], n.rpartition(".")[2]) for n, _ in named],
                     ids=frozenset(id(p) for _, p in named))


def test_the_gradient_detector_opens_missing_grad_after_patience_and_makes_it_intermittent_on_recovery() -> None:
    model = nn.ModuleDict({"body": nn.Linear(2, 2), "head": nn.Linear(2, 1)})
    clist = _checklist(model)
    history = FindingHistory()
    state = gradients.GradientState(patience=2, diagnose=False)
    missing = [i for i, n in enumerate(clist.names) if n.startswith("head")]
    clist.checks = 1
    assert gradients.update(state, history.view, clist, missing, 1, tracer=Tracer(), reachable=None, skip=set()) == []  # patience 2
    clist.checks = 2
    opened = gradients.update(state, history.view, clist, missing, 2, tracer=Tracer(), reachable=None, skip=set())
    assert _actions(opened) == [("open", "missing_grad", "head.weight"), ("open", "missing_grad", "head.bias")]
    assert len(history) == 0
    history.apply(opened)
    clist.checks = 3
    recovered = gradients.update(state, history.view, clist, [], 3, tracer=Tracer(), reachable=None, skip=set())
    assert _actions(recovered) == [("set", "missing_grad", "head.weight"), ("set", "missing_grad", "head.bias")]
    history.apply(recovered)
    assert {f.status for f in history} == {Status.INTERMITTENT}


def test_a_replaced_tensor_with_an_open_stale_param_gets_no_missing_grad() -> None:
    stale = make("stale_param", "old", "error", "m", "c", "f", step=1, reason="replaced")
    state = gradients.GradientState(patience=1, diagnose=False)
    p = nn.Parameter(torch.ones(1))
    clist = CheckList(params=[p], names=("old",), infos=[None], ids=frozenset([id(p)]), checks=1)
    assert gradients.update(state, FindingsView({stale.key: stale}), clist, [0], 1, tracer=Tracer(), reachable=None,
                            skip=set()) == []


# -- watched tensors ----------------------------------------------------------------------------
def test_a_watched_non_leaf_is_one_open_verdict_and_is_resolved_once_it_is_gone() -> None:
    watches = WatchSet()
    leaf = torch.ones(2, requires_grad=True)
    scale = leaf * 2  # a non-leaf: its .grad stays None
    with pytest.warns(Warning, match="scale"):
        add_watch(watches, scale, "scale")
    history = FindingHistory()
    state, hand = watched.WatchedState(), HandUpdates()
    verdicts = watched.update(state, hand, history.view, watches.entries(), 1, None)
    assert ("open", "non_leaf", "scale") in _actions(verdicts)
    history.apply(verdicts)
    del scale
    assert ("resolve", "non_leaf", "scale") in _actions(watched.update(state, hand, history.view, watches.entries(), 2, None))


# -- the training loop --------------------------------------------------------------------------
def test_every_gradient_cleared_before_the_step_is_one_error_and_a_missing_grad_suspicion_is_withdrawn() -> None:
    model = nn.Linear(2, 1)
    clist = _checklist(model)
    suspicion = make("missing_grad", "weight", "error", "m", "c", "f", step=1, reason="unknown")
    left, ids, verdicts = loop.judge_cleared(loop.ClearedGradients(), FindingsView({suspicion.key: suspicion}), clist,
                                             [0, 1], {id(p) for p in clist.params}, "optimizers[0]", 2)
    assert left == [] and sorted(ids) == sorted(id(p) for p in clist.params)
    assert _actions(verdicts) == [("resolve", "missing_grad", "weight"), ("open", "grad_cleared", "optimizers[0]")]


def test_a_learning_rate_stuck_at_zero_is_a_no_update_verdict_after_its_checks() -> None:
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lrs = loop.LearningRates()
    model(torch.ones(1, 2)).sum().backward()
    assert loop.read_lrs(lrs, opt, "optimizers[0]", 1, 1, lambda t: None) == []  # lr 0.1 when first seen
    opt.param_groups[0]["lr"] = 0.0
    verdicts = []
    for checks in range(2, 2 + loop.LR_ZERO_AFTER + 1):
        verdicts += loop.read_lrs(lrs, opt, "optimizers[0]", checks, checks, lambda t: None)
    assert _actions(verdicts) == [("open", "no_update", "optimizers[0].param_groups[0]")]
    opt.param_groups[0]["lr"] = 0.1
    assert _actions(loop.read_lrs(lrs, opt, "optimizers[0]", 20, 20, lambda t: None)) == [
        ("resolve", "no_update", "optimizers[0].param_groups[0]")]


# -- the pipeline: a failing detector costs only its own verdicts -------------------------------
def test_a_part_that_raises_applies_none_of_its_verdicts_and_leaves_an_incomplete_finding() -> None:
    history = FindingHistory()

    def healthy(evidence: object, state: object, view: FindingsView) -> list[Verdict]:
        return [Verdict.open(dead_grad("a", 3, 1))]

    def failing(evidence: object, state: object, view: FindingsView) -> list[Verdict]:
        made = [Verdict.open(dead_grad("b", 3, 1))]  # decided, then the detector fails
        raise RuntimeError(f"boom after {len(made)} verdict")

    pipeline = Pipeline((Part("healthy", healthy), Part("the failing part", failing)), history, WarnOnce())
    with pytest.warns(Warning, match="the failing part"):
        pipeline.run(None, 1)
    assert {(f.kind, f.name) for f in history} == {("dead_grad", "a"), (Kind.INCOMPLETE, "the failing part")}
    incomplete = history.get((Kind.INCOMPLETE, "the failing part"))
    assert incomplete is not None and "RuntimeError: boom after 1 verdict" in incomplete.cause


def test_a_part_runs_when_what_it_waits_on_is_there_and_while_it_is_failing() -> None:
    class Owner:
        waiting = False
        busy: list[int] = []

    history, owner, ran = FindingHistory(), Owner(), []

    def part(evidence: object, state: object, view: FindingsView) -> list[Verdict]:
        ran.append(len(ran))
        if len(ran) == 2:
            raise RuntimeError("once")
        return []

    pipeline = Pipeline((Part("the gated part", part, when=((owner, "waiting"), (owner, "busy"))),), history, WarnOnce())
    pipeline.run(None, 1)
    assert ran == []  # nothing it waits on: not called
    owner.busy = [1]
    pipeline.run(None, 2)
    owner.busy, owner.waiting = [], True
    with pytest.warns(Warning, match="the gated part"):
        pipeline.run(None, 3)  # called (either attribute), and fails
    owner.waiting = False
    pipeline.run(None, 4)  # nothing to wait on, but failing: runs, and its incomplete finding clears
    assert ran == [0, 1, 2]
    assert history.get((Kind.INCOMPLETE, "the gated part")).status == Status.RESOLVED
    pipeline.run(None, 5)
    assert ran == [0, 1, 2]


def test_a_part_gets_its_state_the_findings_so_far_and_the_states_it_needs() -> None:
    history, got = FindingHistory(), []
    history.apply([Verdict.open(dead_grad("a", 3, 1))])
    mine, earlier = object(), object()

    def part(evidence: object, state: object, view: FindingsView, needed: object) -> None:
        got.append((evidence, state, [f.name for f in view], needed))

    Pipeline((Part("judge", part, mine, (earlier,)),), history, WarnOnce()).run("the evidence", 2)
    assert got == [("the evidence", mine, ["a"], earlier)]


def test_parts_of_one_name_are_refused_the_failing_one_would_be_taken_for_the_other() -> None:
    with pytest.raises(ValueError, match="unique names"):
        Pipeline((Part("the loss-graph check", lambda *a: None), Part("the loss-graph check", lambda *a: None)),
                 FindingHistory(), WarnOnce())


def test_every_action_has_its_effect_on_the_history() -> None:
    history = FindingHistory()
    f = dead_grad("g", 3, 1)
    history.apply([Verdict.hold(f)])
    assert history.get(f.key).status == Status.PENDING and history.report(1).findings == []
    decided = dead_grad("g", 5, 4)  # a confirmation shows the finding its decision made, first seen when held
    history.apply([Verdict.confirm(f.key, decided)])
    shown = history.get(f.key)
    assert (shown.status, shown.message, shown.first_step) == (Status.OPEN, decided.message, f.first_step)
    version = history.version
    history.apply([Verdict.count(decided.replace(step=5))])
    assert history.version == version and history.get(f.key).step == 5  # counts only: no new version
    history.apply([Verdict.resolve(f.key, 6)])
    assert history.get(f.key).status == Status.RESOLVED and history.get(f.key).last_step == 6
    history.apply([Verdict.hold(f), Verdict.drop(f.key)])  # a hold never takes back a shown finding
    assert history.get(f.key).status == Status.RESOLVED
    history.apply([Verdict.set(f.replace(status=Status.INTERMITTENT))])
    assert history.get(f.key).status == Status.INTERMITTENT
    g = dead_grad("h", 3, 1)
    history.apply([Verdict.open(g)])
    history.apply([Verdict.merge(f.key), Verdict.merge(g.key)])  # one finding speaks for open ones
    assert history.get(g.key) is None and history.get(f.key).status == Status.INTERMITTENT  # only open ones go
    assert {a.value for a in Action} == {"open", "hold", "confirm", "drop", "merge", "resolve", "set", "count"}


# -- suspicions held until the evidence decides --------------------------------------------------
def test_a_no_grad_miss_is_held_then_dropped_as_a_target_when_its_value_changes() -> None:
    state = held.HeldState()
    ema = nn.Parameter(torch.ones(3))
    made = _ran_under_no_grad("ema.weight")
    assert held.judges(state, id(ema), "grad_disabled") and not held.judges(state, id(ema), "never_ran")
    first = held.target(state, ema, "ema.weight", None, None, 1, made)
    assert _actions(first) == [("hold", "missing_grad", "ema.weight")]
    assert first[0].finding.details["pending"] == Waiting.TARGET
    with torch.no_grad():
        ema.mul_(0.9).add_(0.1)  # the EMA update between checks
    assert held.target(state, ema, "ema.weight", None, None, 2, made) is None  # a target: no finding
    assert id(ema) in state.targets and held.take_new_targets(state) == {id(ema)}


def test_a_no_grad_miss_that_never_changes_is_confirmed_saying_so() -> None:
    state = held.HeldState()
    frozen = nn.Parameter(torch.ones(3))
    made = _ran_under_no_grad("enc.weight")
    held.target(state, frozen, "enc.weight", None, None, 1, made)
    verdicts = held.target(state, frozen, "enc.weight", None, None, 2, made)
    assert _actions(verdicts) == [("hold", "missing_grad", "enc.weight"), ("confirm", "missing_grad", "enc.weight")]
    assert verdicts[1].finding.reason.name == "not_a_target" and "ran with gradients disabled" in verdicts[1].finding.cause
    assert "did not change between checks" in verdicts[1].finding.cause


def test_open_after_reads_what_verdicts_will_leave_open_in_their_order() -> None:
    from leafwatch.report.verdicts import open_after

    a, b, c = (dead_grad(n, 3, 1) for n in ("a", "b", "c"))
    verdicts = [Verdict.open(a), Verdict.resolve(a.key, 2), Verdict.hold(b), Verdict.confirm(b.key),
                Verdict.open(c.replace(status=Status.INTERMITTENT)), Verdict.drop(("dead_grad", "d")),
                Verdict.open(make("missing_grad", "a", "error", "m", "c", "f", step=1, reason="unknown"))]
    assert open_after(verdicts, "dead_grad") == {"a": False, "b": True, "c": False}
    assert open_after(verdicts, "missing_grad") == {"a": True}


def test_the_tracer_puts_its_recorder_hooks_on_the_top_armed_modules_only() -> None:
    """Armed on every module, the cut recorder's enter/leave hooks fire for the root alone; armed on
    two sibling blocks and a child of one, for the two blocks (torch's global forward hooks, while armed)."""
    from leafwatch.observe import hooks

    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Linear(2, 1))
    subscribers = len(hooks.MODULE_FORWARD_PRE), len(hooks.MODULE_FORWARD)
    tracer = Tracer()
    tracer.arm(dict(model.named_modules()))
    assert tracer.tops == {""}
    assert (len(hooks.MODULE_FORWARD_PRE), len(hooks.MODULE_FORWARD)) == (subscribers[0] + 1, subscribers[1] + 1)
    tracer.disarm()
    assert (len(hooks.MODULE_FORWARD_PRE), len(hooks.MODULE_FORWARD)) == subscribers
    tracer.arm({"0": model[0], "0.0": model[0][0], "1": model[1]})
    assert tracer.tops == {"0", "1"}
    tracer.reset()
    tracer.disarm()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())

"""Property-based tests: on random models, leafwatch's findings equal the truth from autograd.

Each example builds a random tree of tiny ``nn.Linear`` blocks in nested containers
(``nn.Sequential``, ``nn.ModuleList``, ``nn.ModuleDict``), then draws at random: frozen
parameters, blocks the forward never calls, blocks whose output is detached before the loss,
tied weights, and an optimizer that holds only some of the parameters. The truth is worked out
independently of leafwatch:

- a missing gradient: ``torch.autograd.grad(loss, trainable, allow_unused=True)`` returns None;
  with optimizers, leafwatch checks the parameters the optimizers hold, without them every
  trainable parameter;
- ``not_in_optimizer`` (the gradient rule): a trainable parameter outside the optimizer's
  parameter set that received a gradient and does not change (computed and never applied); one
  that received none is an EMA copy, a teacher or an unused part, and no finding. A Monitor's
  check that first sees the gradient holds it (the value may still change by hand before the
  next check): the next check, or the end of the run, decides;
- ``frozen_in_optimizer``: a parameter in the optimizer that does not require grad;
- ``device_mismatch``: a lone half-precision parameter (``gain``) in a float32 model.

Each example also draws the wrappers and tensors users meet: the model inside ``DataParallel``
and the optimizer inside a wrapper that exposes it as ``.optimizer`` (both unwrapped by
leafwatch: names are the user's), lazy blocks (``nn.LazyLinear``; one that never runs stays
uninitialized), blocks on the meta device (never run: a meta tensor cannot take part in a CPU
forward; placed there whole, they are a placement, not a mismatch), a sparse embedding and a
complex parameter (each used or not), the whole model in bfloat16, and an empty parameter group.
None of these changes the truth above: a parameter still misses its gradient exactly when
autograd says so.

Names are compared as tensors (every qualified name, aliases included, maps to its tensor), so a
tied weight reported under either of its names is the same finding: no miss, no false alarm.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from torch import nn

import leafwatch

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
WIDTH = 2


@dataclasses.dataclass
class Block:
    """One Linear of the tree and what the forward does with it."""

    linear: nn.Module
    used: bool
    detach: bool
    #: "plain", "lazy" (``nn.LazyLinear``) or "meta" (on the meta device, never run).
    kind: str = "plain"


_leaf = st.fixed_dictionaries({
    "detach": st.integers(0, 4).map(lambda i: i == 0),
    "frozen_weight": st.integers(0, 3).map(lambda i: i == 0),
    "frozen_bias": st.integers(0, 3).map(lambda i: i == 0),
    "unused": st.integers(0, 3).map(lambda i: i == 0),
    "kind": st.sampled_from(["plain"] * 6 + ["lazy", "meta"]),
})
_tree = st.recursive(
    _leaf,
    lambda children: st.tuples(st.sampled_from(["seq", "list", "dict"]),
                               st.lists(children, min_size=1, max_size=3)),
    max_leaves=6,
)


def _build(tree, blocks: list[Block]) -> nn.Module:
    if isinstance(tree, dict):
        kind = tree["kind"]
        if kind == "lazy":  # an uninitialized parameter cannot be frozen: only its module's use is drawn
            linear: nn.Module = nn.LazyLinear(WIDTH)
        else:
            linear = nn.Linear(WIDTH, WIDTH, device="meta" if kind == "meta" else None)
            linear.weight.requires_grad_(not tree["frozen_weight"])
            linear.bias.requires_grad_(not tree["frozen_bias"])
        blocks.append(Block(linear, used=kind != "meta" and not tree["unused"], detach=tree["detach"], kind=kind))
        return linear
    kind, children = tree
    built = [_build(child, blocks) for child in children]
    if kind == "seq":
        return nn.Sequential(*built)
    if kind == "list":
        return nn.ModuleList(built)
    return nn.ModuleDict({f"k{i}": m for i, m in enumerate(built)})


class RandomNet(nn.Module):
    """Runs the used blocks one after the other (containers never run a forward of their own)."""

    def __init__(self, tree, ties: list[tuple[int, int]], extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        blocks: list[Block] = []
        self.body = _build(tree, blocks)
        # The anchor keeps the loss differentiable whatever else is frozen, unused or cut.
        self.anchor = nn.Parameter(torch.zeros(()))
        self.blocks = blocks  # a plain list of modules already registered in body: not orphans
        for source, target in ties:
            if source < len(blocks) and target < len(blocks) and source != target \
                    and blocks[source].kind == blocks[target].kind == "plain":
                blocks[target].linear.weight = blocks[source].linear.weight
        self.sparse_used = extras.get("sparse")  # None: no sparse embedding
        if self.sparse_used is not None:
            self.table = nn.Embedding(3, WIDTH, sparse=True)
        self.complex_used = extras.get("complex")  # None: no complex parameter
        if self.complex_used is not None:
            self.phase = nn.Parameter(torch.randn(WIDTH, dtype=torch.complex64))
        if extras.get("lone_half"):
            # A lone half-precision tensor in a float32 model: its small updates are lost (a true finding).
            self.gain = nn.Parameter(torch.ones((), dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sparse_used:
            x = x + self.table(torch.arange(x.shape[0]))
        if self.complex_used:
            x = x + (x * self.phase).real
        if hasattr(self, "gain"):
            x = x * self.gain.to(x.dtype)
        for block in self.blocks:
            if not block.used:
                continue
            x = block.linear(x)
            if block.detach:
                x = x.detach()
        return x.sum() + self.anchor


class WrappedOptimizer:
    """An optimizer wrapper as libraries write them: the real one as ``.optimizer``."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(group)


@dataclasses.dataclass
class Case:
    model: RandomNet
    optimizer: torch.optim.Optimizer | WrappedOptimizer | None
    x: torch.Tensor
    #: What leafwatch is given: the model itself or ``DataParallel`` around it.
    given: nn.Module
    half: bool = False

    @property
    def real_optimizer(self) -> torch.optim.Optimizer | None:
        return getattr(self.optimizer, "optimizer", self.optimizer)


_optional_use = st.sampled_from([None, None, True, False])


@st.composite
def cases(draw) -> Case:
    tree = draw(_tree)
    ties = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=2))
    half = draw(st.integers(0, 5)) == 0
    extras = {} if half else {  # bfloat16 is drawn alone: no sparse, complex or lone half tensor with it
        "sparse": draw(_optional_use), "complex": draw(_optional_use),
        "lone_half": draw(st.integers(0, 5)) == 0}
    model = RandomNet(tree, ties, extras)
    if half:
        model.to(torch.bfloat16)
    trainable_floats = [p for p in model.parameters() if p.requires_grad and p.is_floating_point()]
    meta = sum(1 for p in trainable_floats if p.is_meta)
    assume(len(trainable_floats) - meta > meta)  # the meta blocks are a minority: the model lives on the CPU
    params = list(model.parameters())
    use_optimizer = draw(st.integers(0, 4)) != 0
    optimizer: torch.optim.Optimizer | WrappedOptimizer | None = None
    if use_optimizer:
        keep = draw(st.lists(st.integers(0, 3).map(lambda i: i != 0), min_size=len(params), max_size=len(params)))
        chosen = [p for p, k in zip(params, keep) if k and p is not model.anchor]
        optimizer = torch.optim.SGD([model.anchor, *chosen], lr=0.1)
        if draw(st.integers(0, 3)) == 0:
            optimizer.add_param_group({"params": []})
        if draw(st.booleans()):
            optimizer = WrappedOptimizer(optimizer)
    given = nn.DataParallel(model) if draw(st.integers(0, 3)) == 0 else model
    x = torch.randn(3, WIDTH, dtype=torch.bfloat16 if half else torch.float32)
    return Case(model, optimizer, x, given, half)


def _tensor_of_name(model: nn.Module) -> dict[str, int]:
    return {name: id(p) for name, p in model.named_parameters(remove_duplicate=False)}


def _owner_block(model: RandomNet, p: torch.Tensor) -> Block | None:
    """The block whose qualified name comes first for ``p`` (the name leafwatch reports)."""
    first = next(name for name, q in model.named_parameters(remove_duplicate=False) if q is p)
    module = model.get_submodule(first.rsplit(".", 1)[0])
    return next((b for b in model.blocks if b.linear is module), None)


@dataclasses.dataclass
class Truth:
    missing: set[int]
    not_in_optimizer: set[int]
    frozen_in_optimizer: set[int]
    params: dict[int, torch.Tensor]
    device_mismatch: set[int] = dataclasses.field(default_factory=set)


def _forward_backward(case: Case) -> tuple[torch.Tensor, Truth]:
    """One training step's forward and backward, and the truth worked out from autograd."""
    model = case.model
    params = {id(p): p for p in model.parameters()}
    trainable = [p for p in params.values() if p.requires_grad]
    loss = model(case.x)
    # A lazy block that never ran is still uninitialized and a meta block never runs: autograd
    # cannot be asked about them, and no gradient can reach them.
    askable = [p for p in trainable if not nn.parameter.is_lazy(p) and not p.is_meta]
    grads = torch.autograd.grad(loss, askable, allow_unused=True, retain_graph=True)
    no_grad = {id(p) for p, g in zip(askable, grads) if g is None}
    no_grad |= {id(p) for p in trainable if nn.parameter.is_lazy(p) or p.is_meta}
    loss.backward()
    optimizer = case.real_optimizer
    if optimizer is None:
        in_optimizer = None
        missing = no_grad
    else:
        in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
        missing = no_grad & in_optimizer
    truth = Truth(
        missing=missing,
        not_in_optimizer=set() if in_optimizer is None else {id(p) for p in trainable} - in_optimizer - no_grad,
        frozen_in_optimizer=set() if in_optimizer is None else {
            k for k in in_optimizer if not params[k].requires_grad},
        params=params,
        device_mismatch={id(model.gain)} if hasattr(model, "gain") else set(),
    )
    return loss, truth


def _ids(report: leafwatch.Report, kind: str, model: nn.Module) -> set[int]:
    names = _tensor_of_name(model)
    found = report.names(kind, status=None)
    unknown = found - set(names)
    assert not unknown, f"{kind} names that are no parameter of the model: {unknown}"
    return {names[n] for n in found}


def _assert_matches_truth(report: leafwatch.Report, truth: Truth, model: nn.Module, *, held: bool = False) -> None:
    """``held``: the report of the check that first saw the gradients (membership not decided yet)."""
    assert _ids(report, "missing_grad", model) == truth.missing, str(report)
    assert _ids(report, "not_in_optimizer", model) == (set() if held else truth.not_in_optimizer), str(report)
    assert _ids(report, "frozen_in_optimizer", model) == truth.frozen_in_optimizer, str(report)
    assert _ids(report, "device_mismatch", model) == truth.device_mismatch, str(report)
    other = {f.kind for f in report} - {"missing_grad", "not_in_optimizer", "frozen_in_optimizer", "device_mismatch"}
    assert not other, f"false alarms of other kinds: {other}\n{report}"


@SETTINGS
@given(case=cases())
def test_monitor_names_exactly_the_tensors_autograd_and_the_optimizer_leave_out(case: Case) -> None:
    with warnings.catch_warnings():
        # A warning raised inside leafwatch's own code (torch's, about what leafwatch did) fails too.
        warnings.filterwarnings("error", module=r"leafwatch\.")
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
        monitor = leafwatch.Monitor(case.given, case.optimizer)
        try:
            _, truth = _forward_backward(case)
            report = monitor.check()
        finally:
            final = monitor.close()  # the end of the run decides what the first check held
    _assert_matches_truth(report, truth, case.model, held=True)
    _assert_matches_truth(final, truth, case.model)
    event(f"missing_grad: {min(len(truth.missing), 3)}+, not_in_optimizer: {min(len(truth.not_in_optimizer), 2)}+")
    event(f"tied weights: {len(truth.params) < len(_tensor_of_name(case.model))}")
    # Every missing gradient's finding is open and an error: a random model's first step.
    assert all(f.status == "open" and f.severity == "error" for f in report.by_kind("missing_grad"))


@SETTINGS
@given(case=cases())
def test_monitor_created_before_the_first_forward_names_the_right_cause(case: Case) -> None:
    with warnings.catch_warnings():
        # A warning raised inside leafwatch's own code (torch's, about what leafwatch did) fails too.
        warnings.filterwarnings("error", module=r"leafwatch\.")
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
        monitor = leafwatch.Monitor(case.given, case.optimizer)
        try:
            _, truth = _forward_backward(case)
            report = monitor.check()
        finally:
            monitor.close()
    names = _tensor_of_name(case.model)
    for finding in report.tensors("missing_grad"):
        p = truth.params[names[finding.name]]
        if finding.cause.startswith("cut by `.detach()` at test_property.py:"):
            # The recorder saw the detach in RandomNet.forward: only a block that runs and detaches
            # can cut, and only what runs before it (a block never called is never upstream).
            assert finding.reason.name == "detached", finding.cause
            assert any(b.used and b.detach for b in case.model.blocks), finding.cause
            if finding.name not in ("table.weight", "phase", "gain"):
                # A tied weight is named by its first owner, but runs wherever it is held.
                holders = [b for b in case.model.blocks if any(q is p for q in b.linear.parameters())]
                assert any(b.used for b in holders), finding.cause
            event("reason ['detached'] (cut seen)")
            continue
        if finding.name == "table.weight":
            # The sparse embedding: not called, or its output cut by a later block's detach (outside
            # any module that leafwatch sees run after it: a cut or an ignored output).
            expected = {"detached", "unused_output"} if case.model.sparse_used else {"never_ran"}
        elif finding.name in ("phase", "gain"):
            # Parameters of the root, whose output backward reaches (the anchor): a cut inside its own
            # forward, or no use at all, is what leafwatch can see of them.
            expected = {"unused"}
        else:
            block = _owner_block(case.model, p)
            assert block is not None, finding.name  # only the blocks' parameters can miss a gradient
            # A block never called is "never_ran"; a called block whose output backward never
            # reached (its own detach or a later one) is "detached".
            expected = {"detached"} if block.used else {"never_ran"}
        event(f"reason {sorted(expected)}")
        observed = finding.reason.observed  # a layer no LayerDrop explains: not_layerdrop
        assert observed in expected, f"{finding.name}: {finding.cause}"
        assert finding.reason.name in {observed, "not_layerdrop" if observed == "never_ran" else observed}
        assert ("never ran" in finding.cause) == (expected == {"never_ran"}), finding.cause
        assert ("backward never reached" in finding.cause) == ("detached" in expected), finding.cause
        assert (f"does not use `{finding.name}` itself" in finding.cause) == (expected == {"unused"}), finding.cause


@SETTINGS
@given(case=cases(), with_loss=st.booleans())
def test_audit_names_exactly_the_tensors_autograd_and_the_optimizer_leave_out(case: Case, with_loss: bool) -> None:
    loss, truth = _forward_backward(case)
    with warnings.catch_warnings():
        # A warning raised inside leafwatch's own code (torch's, about what leafwatch did) fails too.
        warnings.filterwarnings("error", module=r"leafwatch\.")
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
        report = leafwatch.audit(case.given, case.optimizer, loss=loss if with_loss else None)
    _assert_matches_truth(report, truth, case.model)
    expected_reason = "unreachable" if with_loss else "unknown"
    assert {f.reason.name for f in report.by_kind("missing_grad")} <= {expected_reason}, str(report)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
def test_monitor_over_several_steps_stays_exact_and_resolves_what_was_fixed(case: Case) -> None:
    model, optimizer = case.model, case.optimizer
    with warnings.catch_warnings():
        # A warning raised inside leafwatch's own code (torch's, about what leafwatch did) fails too.
        warnings.filterwarnings("error", module=r"leafwatch\.")
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
        monitor = leafwatch.Monitor(case.given, optimizer)
        if optimizer is not None:
            monitor.attach()
        try:
            for step in range(1, 4):
                _, truth = _forward_backward(case)
                if optimizer is None:
                    monitor.check()
                else:
                    optimizer.step()  # the attached pre-hook checks
                    optimizer.zero_grad(set_to_none=True)
                report = monitor.report
                assert monitor.step == step
                _assert_matches_truth(report, truth, model, held=step == 1)
                for f in report.by_kind("missing_grad"):
                    assert (f.status, f.first_step, f.steps_seen) == ("open", 1, step), f
            if optimizer is None or not truth.not_in_optimizer:
                return
            # The fix the finding gives: hand the left-out parameters to the optimizer.
            event("left-out parameters handed to the optimizer")
            left_out = [truth.params[k] for k in truth.not_in_optimizer]
            optimizer.add_param_group({"params": left_out})
            _, truth = _forward_backward(case)
            optimizer.step()
            report = monitor.report
        finally:
            monitor.close()
    assert report.names("not_in_optimizer") == set(), str(report)
    assert _ids(report, "missing_grad", model) == truth.missing, str(report)
    resolved = {f.name for f in monitor.history.values() if f.kind == "not_in_optimizer"}
    assert {monitor.history[("not_in_optimizer", n)].status for n in resolved} == {"resolved"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases(), use_monitor=st.booleans())
def test_watched_activations_miss_a_gradient_exactly_when_autograd_says_so(case: Case, use_monitor: bool) -> None:
    model = case.model
    with warnings.catch_warnings():
        # A warning raised inside leafwatch's own code (torch's, about what leafwatch did) fails too.
        warnings.filterwarnings("error", module=r"leafwatch\.")
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
        monitor = leafwatch.Monitor(case.given, case.optimizer) if use_monitor else None
        try:
            x, outputs = case.x, {}
            for i, block in enumerate(model.blocks):
                if block.used:
                    x = outputs[f"out{i}"] = leafwatch.watch(block.linear(x), name=f"out{i}", expect_leaf=False)
                    if block.detach:
                        x = x.detach()
            loss = x.sum() + model.anchor
            flowing = [t for t in outputs.values() if t.requires_grad]
            grads = torch.autograd.grad(loss, flowing, allow_unused=True, retain_graph=True) if flowing else ()
            expected = {n for n, t in outputs.items() if not t.requires_grad}
            expected |= {n for (n, t) in outputs.items() for f, g in zip(flowing, grads) if f is t and g is None}
            loss.backward()
            report = monitor.check() if monitor is not None else leafwatch.audit(case.given, case.optimizer)
        finally:
            if monitor is not None:
                monitor.close()
    watched_missing = {f.name for f in report.by_kind("missing_grad") if f.name.startswith("out")}
    assert watched_missing == expected, str(report)
    assert report.names("non_leaf") == set()  # expect_leaf=False: an activation is not a leaf by design

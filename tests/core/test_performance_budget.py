"""What keeps leafwatch cheap enough to leave on, as structural properties (no timings here:
those live in ``benchmarks/bench.py``).

- the default per-step check reads each ``p.grad`` once and runs no tensor op;
- the NaN/Inf check reads the host once per device whatever the number of tensors, runs every
  ``DEFAULT_VALUE_CHECK_EVERY`` checks, and on CUDA never synchronizes with the device;
- the structure is not re-read while the parameter sets stay the same;
- 10,000 checks leave memory and every internal structure the size they were.
"""

from __future__ import annotations

import collections
import gc
import tracemalloc
import warnings
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import leafwatch
from leafwatch import monitor as monitor_module
from leafwatch.observe.values import SMALL_NUMEL, ValueChecker

#: Tensor methods that read a value on the host (on CUDA: a host-device sync).
HOST_READS = frozenset({"item", "__bool__", "tolist", "__int__", "__float__", "__index__", "numpy", "cpu"})


class _TorchCalls(TorchFunctionMode):
    """Counts every torch function and tensor method called while active, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.calls[getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))] += 1
        return func(*args, **(kwargs or {}))

    @property
    def host_reads(self) -> int:
        return sum(n for name, n in self.calls.items() if name.rsplit(".", 1)[-1] in HOST_READS)

    @property
    def ops(self) -> collections.Counter[str]:
        """Everything but attribute reads (``p.grad``, ``t.is_sparse``) and size queries."""
        return collections.Counter({name: n for name, n in self.calls.items()
                                    if not name.endswith(("__get__", "numel", "is_complex"))})


class _Chain(nn.Module):
    """``layers`` tiny linear layers: ``2 * layers`` parameter tensors."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(2, 2) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _trained_once(layers: int, **monitor_kwargs: Any) -> tuple[_Chain, torch.optim.Optimizer, leafwatch.Monitor]:
    """A model whose gradients are set once, and a Monitor that has done its first check."""
    model = _Chain(layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt, **monitor_kwargs)
    model(torch.ones(4, 2)).sum().backward()
    monitor.check()
    return model, opt, monitor


def test_no_event_is_built_for_sinks_that_read_only_a_new_report_while_the_history_stays_the_same(monkeypatch):
    from leafwatch.detectors.checker import Checker
    from leafwatch.sinks.console import NewFindingWarnings

    every: list[int] = []
    model = _Chain(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    console = leafwatch.Monitor(model, opt, sinks=[NewFindingWarnings(lambda line: None)], check_values_every_n_steps=0)
    both = leafwatch.Monitor(model, opt, sinks=[NewFindingWarnings(), lambda e: every.append(e.step)],
                             check_values_every_n_steps=0)
    built = {"console": 0, "both": 0}
    keys = {id(console._checker): "console", id(both._checker): "both"}
    make = Checker.event  # (the Checker has slots: counted on its class, per instance)

    def counted(checker: Checker, *args: Any, **kwargs: Any) -> Any:
        built[keys[id(checker)]] += 1
        return make(checker, *args, **kwargs)

    monkeypatch.setattr(Checker, "event", counted)
    for step in range(1, 6):
        model(torch.ones(4, 2)).sum().backward()
        if step == 4:
            model.layers[1].weight.grad = None  # the history changes: a new report, an event, a line
        console.check(opt)
        both.check(opt)
        opt.zero_grad()
    # Built at the first check, at step 4 (missing_grad opens) and at step 5 (the gradient is back:
    # it changes again); never at steps 2 and 3, when nothing changed.
    assert built["console"] == 3 and ("missing_grad", "layers.1.weight") in console.history
    assert built["both"] == 5 and every == [1, 2, 3, 4, 5]  # a sink without changes_only gets every check
    console.close()
    both.close()


@pytest.mark.parametrize("layers", [5, 200])
def test_default_check_reads_each_grad_once_and_runs_no_tensor_op(layers):
    model, _, monitor = _trained_once(layers, check_values_every_n_steps=0)
    with _TorchCalls() as seen:
        for _ in range(3):
            report = monitor.check()
    assert report.findings == []
    assert seen.calls == {"getset_descriptor.__get__": 3 * 2 * layers}  # one `p.grad` per tensor per check
    assert seen.host_reads == 0
    monitor.close()


def test_value_check_reads_the_host_once_whatever_the_number_of_tensors():
    from leafwatch.observe import values

    counts = {}
    for layers in (5, 20, 150, 300):  # 10 and 40 tensors: few; 300 and 600: many
        _, _, monitor = _trained_once(layers, check_values_every_n_steps=1)
        with _TorchCalls() as seen:
            report = monitor.check()
        assert report.findings == []
        counts[layers] = (seen.host_reads, seen.ops)
        monitor.close()
    assert 2 * 20 <= values.FEW_TENSORS < 2 * 150
    assert all(reads == 1 for reads, _ in counts.values())
    # The same few batched ops for 10 and 40 tensors (one fused L2 norm, one host read), and for
    # 300 and 600 (per shape one concatenation and one max-abs per row: NaN/Inf and the dead_grad
    # zero test at once).
    assert counts[5][1] == counts[20][1] and sum(counts[5][1].values()) <= 4
    assert counts[150][1] == counts[300][1] and sum(counts[300][1].values()) <= 8


def test_default_value_checks_run_every_n_checks_and_on_the_first():
    every = monitor_module.DEFAULT_VALUE_CHECK_EVERY
    assert every >= 10
    _, _, monitor = _trained_once(3)  # check 1: the first value check
    reads = []
    for _ in range(3 * every):
        with _TorchCalls() as seen:
            monitor.check()
        reads.append(seen.host_reads)
    checked_at = [step for step, n in enumerate(reads, start=2) if n]
    assert checked_at == [every, 2 * every, 3 * every]
    assert all(n == 1 for n in reads if n)
    monitor.close()


def test_nan_found_by_the_default_cadence_names_the_tensor():
    model, opt, monitor = _trained_once(3)
    model.layers[1].weight.grad[0, 1] = float("nan")
    for _ in range(monitor_module.DEFAULT_VALUE_CHECK_EVERY - 1):
        report = monitor.check()
    assert report.names("nonfinite_grad") == {"layers.1.weight"}
    assert "NaN or Inf" in report.by_kind("nonfinite_grad")[0].message
    monitor.close()


def test_batched_value_check_names_every_non_finite_gradient_and_nothing_else():
    grads: list[torch.Tensor | None] = [torch.randn(3, 3) for _ in range(50)]
    grads += [
        torch.randn(SMALL_NUMEL + 1),  # large: checked in place, not flattened
        None,  # no gradient: skipped
        torch.full((SMALL_NUMEL + 10,), 60000.0, dtype=torch.float16),  # huge but finite fp16
        torch.full((7,), 60000.0, dtype=torch.float16),
        torch.empty(0, 4),  # no elements
        torch.randn(5, dtype=torch.complex64),
        torch.sparse_coo_tensor([[0, 3]], [1.0, 2.0], (6,), check_invariants=True),
        torch.arange(4),  # not floating: not checked
    ]
    checker = ValueChecker()
    assert checker.check(grads, step=1) == ([1], [])
    grads[7][1, 2] = float("nan")
    grads[50][SMALL_NUMEL] = float("inf")
    grads[53][3] = float("-inf")
    grads[55][2] = complex(0.0, float("inf"))
    grads[56] = torch.sparse_coo_tensor([[0, 3]], [1.0, float("nan")], (6,), check_invariants=True)
    completed, bad = checker.check(grads, step=2)
    assert completed == [2]
    assert sorted(bad) == [(2, 7), (2, 50), (2, 53), (2, 55), (2, 56)]


@pytest.mark.parametrize(("sizes", "chunk"), [
    ([9] * 14, 40),  # 4 tensors per flat buffer
    ([7, 8, 9, 10, 11] * 3, 40),
    ([300, 301, 302, 303] * 4, 1000),  # not tiny: three per copy
    ([9] * 12 + [300] * 4 + [5] * 8, 1 << 22),  # one buffer
    ([9, 5] * 8, 1 << 22),
])
def test_batched_value_check_names_the_zero_and_non_finite_gradients_of_every_chunk(monkeypatch, sizes, chunk):
    from leafwatch.observe import values

    monkeypatch.setattr(values, "CHUNK_NUMEL", chunk)
    grads = [torch.randn(n) + 3.0 for n in sizes]
    for i in (0, 3, 4, 13):
        grads[i].zero_()
    grads[5][0], grads[12][-1], grads[7][1] = float("nan"), float("inf"), float("-inf")
    grads[6][2] = 0.0  # one zero element is not a zero gradient
    checker = ValueChecker(track_zeros=True)
    assert checker.check(grads, step=1) == ([1], [(1, 5), (1, 7), (1, 12)])
    assert checker.zeros == {1: {0, 3, 4, 13}}


def test_small_gradients_grouped_by_shape_are_judged_exactly_and_left_as_they_were():
    """Many small gradients are concatenated by shape (0-dim ones stacked) and reduced per row: each
    tensor's flags are its own, a group of one works, and no gradient is written to."""
    from leafwatch.observe import values

    grads = [torch.randn(3, 4) + 5.0 for _ in range(40)] + [torch.randn(12) + 5.0 for _ in range(30)]
    grads += [torch.tensor(2.0), torch.tensor(0.0), torch.tensor(float("nan")), torch.randn(2, 5) + 5.0]
    grads[3].zero_()
    grads[41].zero_()
    grads[7][2, 1] = float("nan")
    grads[50][0] = float("-inf")
    grads[73][1, 4] = float("inf")  # the only (2, 5) tensor: a group of one
    grads[9][0, 0] = 1e-44  # subnormal, nonzero: not zero
    grads[10][1, 1] = 3e38  # huge, finite
    before = [g.clone() for g in grads]
    checker = ValueChecker(track_zeros=True)
    assert len(grads) > values.FEW_TENSORS  # the grouped path
    assert checker.check(grads, step=1) == ([1], [(1, 7), (1, 50), (1, 72), (1, 73)])
    assert checker.zeros == {1: {3, 41, 71}}
    assert all(torch.allclose(g, b, rtol=0, atol=0, equal_nan=True) for g, b in zip(grads, before))
    assert len(checker._plans) == 1  # worked out once for these sizes


def test_a_gradient_reshaped_to_the_same_size_is_grouped_again():
    """The grouping is kept per set of sizes; a tensor whose shape changes but not its size makes the
    concatenation fail, and the check groups again rather than misreading a row."""
    from leafwatch.observe import values

    grads = [torch.randn(4, 4) + 5.0 for _ in range(values.FEW_TENSORS)] + [torch.randn(16) + 5.0]
    checker = ValueChecker(track_zeros=True)
    assert checker.check(grads, step=1) == ([1], [])
    grads[5] = torch.zeros(16)  # was (4, 4): same size, another shape
    grads[64] = torch.full((4, 4), float("nan"))  # was (16,)
    assert checker.check(grads, step=2) == ([2], [(2, 64)])
    assert checker.zeros[2] == {5}
    assert len(checker._plans) == 1  # the same sizes: the plan replaced, not added


_SHAPES = [(), (1,), (3,), (4, 3), (2, 6), (12,), (2, 2, 3), (0, 4), (5,)]
_SPECIALS = [None, None, None, "zero", "nan", "inf", "-inf", "tiny", "huge"]


@settings(max_examples=40, deadline=None)
@given(picks=st.lists(st.tuples(st.sampled_from(_SHAPES), st.sampled_from(_SPECIALS)), min_size=65, max_size=160),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       reshaped=st.lists(st.integers(0, 159), max_size=4))
def test_the_value_check_of_many_small_gradients_agrees_with_each_tensor_looked_at_alone(picks, dtype, reshaped):
    """Against the truth worked out per tensor: non-finite anywhere, or every element exactly zero
    (an empty tensor is neither), at two checks with the same checker, some tensors reshaped to
    the same size in between."""
    info = torch.finfo(dtype)

    def make(shape: tuple[int, ...], special: str | None) -> torch.Tensor:
        t = (torch.rand(shape) + 0.5).to(dtype)
        if t.numel() and special is not None:
            flat = t.view(-1)
            if special == "zero":
                t.zero_()
            else:
                flat[-1] = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"),
                            "tiny": info.tiny, "huge": info.max}[special]
        return t

    grads = [make(shape, special) for shape, special in picks]
    checker = ValueChecker(track_zeros=True)
    for step in (1, 2):
        bad = [(step, i) for i, g in enumerate(grads) if not torch.isfinite(g).all()]
        zero = {i for i, g in enumerate(grads) if g.numel() and not g.any()}
        assert checker.check(grads, step=step) == ([step], bad)
        assert checker.zeros.pop(step, set()) == zero
        for i in reshaped:
            if i < len(grads) and grads[i].dim() == 2:
                grads[i] = grads[i].reshape(-1)  # the same size, another shape


def test_the_shape_plans_a_checker_keeps_are_bounded():
    from leafwatch.observe import values

    checker = ValueChecker(track_zeros=True)
    for extra in range(3 * values.PLANS_KEPT):
        grads = [torch.randn(3) + 5.0 for _ in range(values.FEW_TENSORS)] + [torch.randn(2 + extra) + 5.0]
        assert checker.check(grads, step=extra + 1) == ([extra + 1], [])
    assert 1 <= len(checker._plans) <= values.PLANS_KEPT


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]

@pytest.mark.parametrize("few", [64, 0])  # every tensor its own norm; only the large ones
def test_the_l2_norms_of_gradients_flag_nothing_that_is_finite_and_nonzero(monkeypatch, few):
    """An L2 norm overflows for huge finite values and underflows for tiny nonzero ones, and is 0
    for an empty tensor: none of them is reported; a real NaN, -Inf or all-zero gradient is."""
    from leafwatch.observe import values

    monkeypatch.setattr(values, "FEW_TENSORS", few)
    n = values.NORM_NUMEL
    grads = [
        torch.full((n,), 1e30),  # L2 overflows in float32: finite
        torch.full((n,), 1e-30),  # L2 underflows to 0: not zero
        torch.full((2 * n,), 60000.0, dtype=torch.float16),  # finite fp16 whose L2 is above the fp16 range
        torch.full((n,), 1e-30, dtype=torch.bfloat16),
        torch.randn(n), torch.randn(n), torch.randn(n), torch.zeros(n),
        torch.randn(3),
        torch.zeros(5),
        torch.empty(0),  # no elements: neither
        torch.full((3,), 1e-30),
    ]
    grads[4][7] = float("-inf")
    grads[5][0] = float("nan")
    grads[8][1] = float("inf")
    checker = ValueChecker(track_zeros=True)
    assert checker.check(grads, step=1) == ([1], [(1, 4), (1, 5), (1, 8)])
    assert checker.zeros == {1: {7, 9}}
    large = [torch.randn(n), torch.randn(3), torch.randn(n + 1)]
    assert values._cpu_norms(large)[2] == (3 if few else 2)  # only the large ones, or all of them, get an L2 norm


def test_fingerprint_read_each_check_does_not_grow_with_the_parameters():
    fingerprints = []
    for layers in (5, 500):
        _, _, monitor = _trained_once(layers, check_values_every_n_steps=0)
        fingerprints.append(_leaves(monitor.structure.fingerprint()))
        monitor.close()
    small, large = fingerprints
    assert len(small) == len(large)
    assert not any(isinstance(leaf, torch.Tensor) for leaf in large)


def test_the_objects_a_check_reads_keep_their_attributes_where_cpython_reads_them_fast():
    # An instance of more than 30 attributes (CPython's shared-key limit) gets a dict of its own:
    # every attribute read and method call on it then misses the interpreter's specialized paths.
    # The Checker once crossed it (32), which cost ~1% more instructions on every check.
    _, _, monitor = _trained_once(3, check_values_every_n_steps=0)
    checker = monitor._checker
    hot = [monitor, checker, monitor.structure, monitor.history_store, checker.pipeline, checker.diagnostics,
           checker.diagnostics.tracer, checker.grads, checker.loop, checker.seen, checker.seen.arrivals,
           checker.seen.sentinels, monitor.observer, *checker.states.values()]
    too_big = {type(obj).__name__: len(vars(obj)) for obj in hot if hasattr(obj, "__dict__") and len(vars(obj)) > 30}
    assert not too_big
    assert not hasattr(checker, "__dict__")  # slots: the runner of every detector
    monitor.close()


class _WithHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = _Chain(20)
        self.head = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_structure_is_reread_only_when_the_parameter_sets_change():
    model = _WithHead()
    opt = torch.optim.SGD(model.body.parameters(), lr=0.1)  # the head is left out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
        monitor = leafwatch.Monitor(model, opt, check_values_every_n_steps=0)
        model(torch.ones(4, 2)).sum().backward()
        assert monitor.check().findings == []  # held: the check that first sees the gradient (the gradient rule)
        report = monitor.check()
        assert report.names("not_in_optimizer") == {"head.weight", "head.bias"}
        rebuilds = monitor.structure.rebuilds
        for _ in range(100):
            monitor.check()
        assert monitor.structure.rebuilds == rebuilds
        opt.add_param_group({"params": list(model.head.parameters())})
        report = monitor.check()
    assert monitor.structure.rebuilds == rebuilds + 1
    assert report.names("not_in_optimizer") == set()
    assert report.names("not_in_optimizer", status="resolved") == {"head.weight", "head.bias"}
    monitor.close()


def _sizes(monitor: leafwatch.Monitor) -> dict[str, int]:
    return monitor.stats()


class _OneUnused(nn.Module):
    """A used layer and one that never gets a gradient: a finding updated at every check."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(2, 2)
        self.unused = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


@pytest.mark.parametrize("model_class", [_Chain, _OneUnused])
def test_ten_thousand_checks_keep_memory_bounded(model_class):
    model = model_class(3) if model_class is _Chain else model_class()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt)  # the default: value checks every few checks
    model(torch.ones(4, 2)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
        for _ in range(100):
            monitor.check()
        sizes = _sizes(monitor)
        gc.collect()
        objects = len(gc.get_objects())
        for _ in range(9_000):
            monitor.check()
        # The last 1,000 checks under tracemalloc (it slows every allocation down a lot).
        gc.collect()
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            for _ in range(1_000):
                report = monitor.check()
            gc.collect()
            after, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert monitor.step == 10_100
    assert _sizes(monitor) == sizes
    assert len(gc.get_objects()) - objects < 100
    assert after - before < 16 * 1024  # a leak of 16 bytes per check would show
    expected = {"unused.weight", "unused.bias"} if model_class is _OneUnused else set()
    assert report.names("missing_grad") == expected
    assert all(f.steps_seen == 10_100 for f in report.findings)
    monitor.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_monitor_never_synchronizes_with_the_device_on_cuda():
    model = _OneUnused().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(4, 2, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
        monitors = [leafwatch.Monitor(model, opt), leafwatch.Monitor(model, opt, check_values_every_n_steps=1)]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for step in range(12):
                opt.zero_grad(set_to_none=True)
                model(x).sum().backward()
                if step == 5:
                    model.used.weight.grad[0, 0] = float("nan")
                for monitor in monitors:
                    monitor.check()
                opt.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        reports = [monitor.close() for monitor in monitors]
    for report in reports:
        assert report.names("missing_grad") == {"unused.weight", "unused.bias"}
    # The NaN of step 6 is read a check or more later, or at close, never by a sync.
    assert reports[1].names("nonfinite_grad", status=None) == {"used.weight"}
    assert reports[0].names("nonfinite_grad", status=None) == set()  # step 6 is not one of its value checks


class _HalfUsed(nn.Module):
    """A chain and a copy of it that is called only when ``use_copy`` is set."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.used = _Chain(layers)
        self.spare = _Chain(layers)
        self.use_copy = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.used(x)
        return out + self.spare(x) if self.use_copy else out


def test_many_steady_misses_are_counted_exactly_and_recover():
    # 100 tensors that miss at every check (more than the steady findings refreshed one by one):
    # counted in one pass per check, yet every count is exact and a gradient still ends the streak.
    model = _HalfUsed(50)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)
        monitor = leafwatch.Monitor(model, opt, check_values_every_n_steps=0)
        for _ in range(120):
            opt.zero_grad(set_to_none=True)
            model(torch.ones(4, 2)).sum().backward()
            monitor.check()
        assert monitor.state_dict()["misses"]["spare.layers.7.weight"] == 120
        report = monitor.check()  # the same gradients again: the 121st miss
        found = report.names("missing_grad")
        assert found == {f"spare.layers.{i}.{p}" for i in range(50) for p in ("weight", "bias")}
        assert [f.name for f in report.open] == ["spare"]  # one unused copy: one mistake
        assert monitor.state_dict()["misses"]["spare.layers.7.weight"] == 121  # brings the findings up to date
        assert monitor.history[("missing_grad", "spare.layers.7.weight")].details["steps_without_grad"] == 121
        model.use_copy = True
        opt.zero_grad(set_to_none=True)
        model(torch.ones(4, 2)).sum().backward()
        report = monitor.check()
    assert report.names("missing_grad") == set()
    assert report.names("missing_grad", status="intermittent") == set(found)
    monitor.close()

"""leafwatch never breaks a training run, never keeps what the user owns, and cleans up after itself.

Fault injection uses real failing components (a sink that raises, a writer whose disk is full,
a log directory that cannot be written, tensor subclasses that refuse what leafwatch asks of
them); memory is checked with weak references and by counting objects, never with timings.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import warnings
import weakref
from typing import Any

import _warm
import pytest
import torch
import torch.optim.optimizer as _optimizers
from torch import nn

import leafwatch
from leafwatch.observe import inventory
from leafwatch.integrations.tensorboard import TensorBoardSink


# -- models -----------------------------------------------------------------------------------
class TwoLayer(nn.Module):
    """``layer`` then ``head``; ``spare`` is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.head = nn.Linear(2, 1)
        self.spare = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x))


class Healthy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.head = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.layer(x)))


#: A change of requires_grad mid-run must be noticed within this many checks.
FEW_CHECKS = 20


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, monitor: leafwatch.Monitor | None = None,
                **check: Any) -> leafwatch.Report | None:
    model(torch.ones(3, 2)).sum().backward()
    report = monitor.check(**check) if monitor is not None else None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return report


def _use_in_loss(model: nn.Module, attribute: str) -> None:
    """Add ``model.<attribute>(x)`` to the model's output: its parameters get gradients."""
    def hook(module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
        return out + getattr(module, attribute)(args[0]).sum(dim=-1, keepdim=True)

    model.register_forward_hook(hook)


def _leafwatch_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    """The messages of leafwatch's warnings; each internal failure must be a LeafwatchInternalWarning."""
    messages = [str(w.message) for w in record if issubclass(w.category, leafwatch.LeafwatchWarning)]
    internal = [str(w.message) for w in record if issubclass(w.category, leafwatch.LeafwatchInternalWarning)]
    assert internal == [m for m in messages if "internal failure" in m], messages
    return messages


# -- fault injection: a failure inside leafwatch warns once and training goes on -----------------
def test_a_sink_that_raises_warns_once_and_training_goes_on() -> None:
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []

    def broken_sink(event: leafwatch.CheckEvent) -> None:
        calls.append(event.step)
        raise RuntimeError("dashboard unreachable")

    before = model.head.weight.detach().clone()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        monitor = leafwatch.Monitor(model, optimizer, sinks=[broken_sink])
        for _ in range(5):
            report = _train_step(model, optimizer, monitor)
        monitor.close()
    messages = _leafwatch_warnings(record)
    assert len(messages) == 1, messages
    assert "internal failure in the function sink" in messages[0]
    assert "RuntimeError: dashboard unreachable" in messages[0]
    assert "training goes on" in messages[0]
    assert calls == [1, 2, 3, 4, 5]  # the sink keeps being offered every check
    assert not torch.equal(model.head.weight, before)  # the optimizer stepped
    # The findings are still right: the never-called layer misses its gradients.
    assert report.names("missing_grad") == {"spare.weight", "spare.bias"}


def test_strict_mode_raises_for_findings_only_never_for_internal_failures() -> None:
    model = Healthy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def broken_sink(event: leafwatch.CheckEvent) -> None:
        raise OSError(28, "No space left on device")

    with pytest.warns(leafwatch.LeafwatchInternalWarning, match=r"No space left on device"):
        monitor = leafwatch.Monitor(model, optimizer, strict=True, sinks=[broken_sink])
        for _ in range(3):
            assert _train_step(model, optimizer, monitor).findings == []
    # A real finding in strict mode raises, with the report attached: a layer added mid-run and used
    # in the loss, whose gradients no optimizer applies (the gradient rule). The check that first
    # sees its gradient holds it; the next one sees that its value did not change, and raises.
    model.extra = nn.Linear(2, 2)
    _use_in_loss(model, "extra")
    assert _train_step(model, optimizer, monitor).findings == []
    with pytest.raises(leafwatch.LeafwatchError, match=r"not_in_optimizer\s+extra \(since step \d+[^)]*\)\n.*`extra\.\{bias,weight\}`") as raised:
        _train_step(model, optimizer, monitor)
    assert raised.value.report.names("not_in_optimizer") == {"extra.weight", "extra.bias"}
    monitor.close()


class _FailingWriter:
    """A writer object whose methods all raise, as a writer on a full disk does."""

    log_dir = None

    def __init__(self) -> None:
        self.attempts = 0

    def _fail(self, *args: Any, **kwargs: Any) -> None:
        self.attempts += 1
        raise OSError(28, "No space left on device")

    add_scalar = add_text = flush = _fail


def test_a_writer_whose_methods_raise_warns_once_per_place_and_training_goes_on() -> None:
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = _FailingWriter()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        monitor = leafwatch.Monitor(model, optimizer, writer=writer, strict=False)
        for _ in range(20):
            _train_step(model, optimizer, monitor)
        final = monitor.close()
    messages = _leafwatch_warnings(record)
    assert len(messages) == 2, messages
    assert "internal failure in the TensorBoardSink sink (OSError: [Errno 28] No space left on device)" in messages[0]
    assert "internal failure in closing TensorBoardSink" in messages[1]
    assert writer.attempts >= 20  # every check still tried to log
    assert monitor.step == 20
    assert final.names("missing_grad") == {"spare.weight", "spare.bias"}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_summary_writer_on_a_full_disk_warns_once_and_training_goes_on(tmp_path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    # A real file object that fails the way a full disk does: every write raises ENOSPC.
    full_disk = open("/dev/full", "wb", buffering=0)  # noqa: SIM115
    writer._get_file_writer().event_writer._async_writer._writer._writer = full_disk
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            monitor = leafwatch.Monitor(model, optimizer, writer=writer)
            for _ in range(60):
                _train_step(model, optimizer, monitor)
            report = monitor.close()
    finally:
        try:
            writer.close()
        except OSError:
            pass  # the user's own writer fails on the full disk too
        full_disk.close()
    messages = _leafwatch_warnings(record)
    sink_failures = [m for m in messages if "the TensorBoardSink sink" in m]
    assert len(sink_failures) == 1, messages
    assert "No space left on device" in sink_failures[0]
    assert monitor.step == 60
    assert report.names("missing_grad") == {"spare.weight", "spare.bias"}


def test_a_log_dir_leafwatch_cannot_write_warns_and_the_scalars_still_arrive(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from leafwatch.integrations.tensorboard import LAYOUT_RUN

    # The layout's sub-run directory cannot be created: a plain file is in its way.
    (tmp_path / LAYOUT_RUN).write_text("not a directory")
    writer = SummaryWriter(str(tmp_path))
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        monitor = leafwatch.Monitor(model, optimizer, writer=writer)
        for _ in range(100):
            _train_step(model, optimizer, monitor)
        monitor.close()
    writer.close()
    messages = _leafwatch_warnings(record)
    assert len(messages) == 1, messages
    assert "internal failure in the TensorBoardSink sink" in messages[0]
    assert LAYOUT_RUN in messages[0]
    accumulator = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    values = {e.step: e.value for e in accumulator.Scalars("leafwatch/open/missing_grad")}
    assert values[50] == 1 and values[100] == 1  # one mistake (the unused module) of two tensors


class _NormlessTensor(torch.Tensor):
    """A tensor subclass that supports training but refuses the norms of the NaN/Inf check."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("_foreach_norm", "vector_norm", "linalg_vector_norm", "norm", "isfinite"):
            raise RuntimeError(f"{func.__name__} is not implemented for _NormlessTensor")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_an_unexpected_gradient_subclass_warns_once_and_the_other_checks_still_run() -> None:
    model = TwoLayer()
    optimizer = torch.optim.SGD([*model.layer.parameters(), *model.spare.parameters()], lr=0.1)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        monitor = leafwatch.Monitor(model, optimizer, check_values_every_n_steps=1)
        for _ in range(3):
            model(torch.ones(3, 2)).sum().backward()
            model.layer.weight.grad = model.layer.weight.grad.as_subclass(_NormlessTensor)
            report = monitor.check()
            audited = leafwatch.audit(model, optimizer)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        monitor.close()
    messages = _leafwatch_warnings(record)
    monitor_failures = [m for m in messages if "Monitor" not in m and "audit()" not in m]
    assert len(monitor_failures) == 1, messages
    assert "internal failure in the NaN/Inf gradient check" in monitor_failures[0]
    assert "not implemented for _NormlessTensor" in monitor_failures[0]
    assert sum("audit() reports everything else" in m for m in messages) == 3  # one per audit() call
    for r in (report, audited):
        assert r.names("not_in_optimizer") == {"head.weight", "head.bias"}
        assert r.names("missing_grad") == {"spare.weight", "spare.bias"}
        # The part that failed is named in the report itself: "no NaN" is not claimed.
        (incomplete,) = r.by_kind("incomplete")
        assert (incomplete.name, incomplete.severity, incomplete.status) == ("the NaN/Inf gradient check", "warning", "open")
        assert "not implemented for _NormlessTensor" in incomplete.cause
    assert monitor.step == 3


def test_a_part_that_fails_is_an_incomplete_finding_everywhere_and_clears_when_it_runs_again(tmp_path) -> None:
    """An internal failure never reads as "no findings": the console line, the TensorBoard scalar
    and the tab's record all carry it, and it resolves at the next check where the part runs."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from leafwatch.report import records
    model = Healthy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = SummaryWriter(str(tmp_path))
    reports = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        monitor = leafwatch.Monitor(model, optimizer, writer=writer, check_values_every_n_steps=1).attach()
        for step in range(1, 4):
            model(torch.ones(3, 2)).sum().backward()
            if step == 1:  # only the first step's gradient is one the NaN/Inf check cannot read
                model.layer.weight.grad = model.layer.weight.grad.as_subclass(_NormlessTensor)
            optimizer.step()
            reports.append(monitor.report)
            optimizer.zero_grad(set_to_none=True)
        final = monitor.close()
    writer.close()
    messages = _leafwatch_warnings(record)
    (failure,) = [m for m in messages if "internal failure" in m]
    assert "the NaN/Inf gradient check" in failure
    (line,) = [m for m in messages if "incomplete" in m]
    assert "WARNING incomplete `the NaN/Inf gradient check`" in line
    (incomplete,) = reports[0].by_kind("incomplete")
    assert incomplete.is_open and bool(reports[0]), "a check that did not run whole is never a clean report"
    assert incomplete.details["error"].startswith("RuntimeError: ") and "_NormlessTensor" in incomplete.cause
    assert [f.status for f in reports[1].by_kind("incomplete")] == ["resolved"]
    assert not final and [f.status for f in final.by_kind("incomplete")] == ["resolved"]
    accumulator = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    values = {e.step: e.value for e in accumulator.Scalars(records.open_tag("incomplete"))}
    assert values[1] == 1 and values[2] == 0
    # `leafwatch report` (and the tab, which reads the same records) shows it, resolved at the end.
    from leafwatch.report.reader import read_reports

    (run,) = read_reports(str(tmp_path))
    assert [(f.kind, f.name, f.status) for f in run.report.by_kind("incomplete")] == [
        ("incomplete", "the NaN/Inf gradient check", "resolved")]


class _HooklessTensor(torch.Tensor):
    """A tensor subclass that refuses tensor hooks."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("register_hook", "register_post_accumulate_grad_hook"):
            raise TypeError("_HooklessTensor does not support hooks")
        return super().__torch_function__(func, types, args, kwargs or {})


class HooklessOutput(nn.Module):
    """Its layers return a tensor subclass that refuses hooks; ``unused`` is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.unused = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).as_subclass(_HooklessTensor)


def test_a_diagnostic_hook_that_fails_inside_forward_warns_once_and_training_goes_on() -> None:
    model = HooklessOutput()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        monitor = leafwatch.Monitor(model, optimizer)
        for _ in range(3):
            report = _train_step(model, optimizer, monitor)
        monitor.close()
    messages = _leafwatch_warnings(record)
    assert len(messages) == 1, messages
    assert "internal failure in a diagnostic forward hook" in messages[0]
    assert "does not support hooks" in messages[0]
    assert monitor.step == 3
    assert report.names("missing_grad") == {"unused.weight", "unused.bias"}
    # The root's hook failed, so nothing is guessed from it: the module that did run is not blamed.
    assert all("layer" not in f.cause for f in report.by_kind("missing_grad"))


def test_watch_of_a_tensor_that_refuses_hooks_warns_and_still_watches_it() -> None:
    scale = torch.zeros(2).as_subclass(_HooklessTensor).requires_grad_()
    with pytest.warns(leafwatch.LeafwatchInternalWarning,
                      match=r"internal failure in watch\('scale'\): cannot hook _HooklessTensor.*checks only whether its \.grad is set"):
        assert leafwatch.watch(scale, name="scale") is scale
    assert leafwatch.watched()["scale"] is scale
    # The watch still reports: a step that leaves it out names it, a step that uses it does not.
    (torch.ones(2) * 3).sum()
    (finding,) = leafwatch.audit().findings
    assert (finding.kind, finding.name, finding.reason.name) == ("missing_grad", "scale", "watched_unused")
    (scale * 2).sum().backward()
    assert leafwatch.audit().findings == []


def test_watch_of_a_non_leaf_that_refuses_hooks_is_never_blamed_for_its_gradient() -> None:
    base = torch.zeros(2, requires_grad=True)
    hookless = base.as_subclass(_HooklessTensor)
    with pytest.warns(leafwatch.LeafwatchInternalWarning,
                      match=r"internal failure in watch\('scale'\).*cannot tell whether gradients flow through it"):
        assert leafwatch.watch(hookless, name="scale", expect_leaf=False) is hookless
    assert leafwatch.watched()["scale"] is hookless
    assert leafwatch.audit().findings == []  # not yet used: no hook, so no guess
    (hookless * 2).sum().backward()
    assert leafwatch.audit().findings == []


# -- never keep what the user owns -------------------------------------------------------------
def test_a_freed_watched_leaf_is_gone() -> None:
    t = leafwatch.watch(torch.zeros(3, requires_grad=True), name="scale")
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is None
    assert leafwatch.watched() == {}


def test_a_freed_watched_non_leaf_and_its_graph_are_gone() -> None:
    leaf = torch.zeros(3, requires_grad=True)
    saved = torch.ones(3)  # saved by the multiplication for backward: alive while the graph is
    saved_ref = weakref.ref(saved)
    with pytest.warns(leafwatch.LeafwatchWarning, match=r"`scaled` is not a leaf"):
        scaled = leafwatch.watch(leaf * saved, name="scaled")
    del saved
    gc.collect()
    assert saved_ref() is not None  # the graph holds it while `scaled` lives
    scaled_ref = weakref.ref(scaled)
    del scaled
    gc.collect()
    assert scaled_ref() is None
    assert saved_ref() is None
    assert leafwatch.watched() == {}


def test_monitor_watched_tensors_and_their_graphs_are_freed_while_it_runs() -> None:
    model = Healthy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    refs = []
    for _ in range(3):
        saved = torch.ones(2)
        refs.append(weakref.ref(saved))
        hidden = leafwatch.watch(model.layer(torch.ones(1, 2)) * saved, name="hidden", expect_leaf=False)
        del saved
        model.head(hidden).sum().backward()
        assert monitor.check().findings == []  # each step's `hidden` got its gradient
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del hidden
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    monitor.close()


def test_monitor_and_audit_keep_no_loss_graph_or_gradient_alive() -> None:
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer, check_values_every_n_steps=1)
    x = torch.ones(3, 2)
    hidden = model.layer(x)
    loss = model.head(hidden.detach()).sum() + model.head(hidden).sum()
    loss.backward()
    refs = {
        "loss": weakref.ref(loss),
        "hidden": weakref.ref(hidden),  # an activation the graph saved
        "input": weakref.ref(x),
        "grad": weakref.ref(model.layer.weight.grad),
    }
    report = monitor.check(loss=loss)
    audited = leafwatch.audit(model, optimizer, loss=loss)
    assert report.names("missing_grad") == audited.names("missing_grad") == {"spare.weight", "spare.bias"}
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del loss, hidden, x
    gc.collect()
    assert {k: r() is None for k, r in refs.items()} == dict.fromkeys(refs, True)
    monitor.close()


def test_a_missing_gradient_under_diagnosis_keeps_no_graph_alive() -> None:
    class Detaching(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.early = nn.Linear(2, 2)
            self.late = nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.late(self.early(x).detach())

    model = Detaching()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    refs = []
    for _ in range(3):
        x = torch.ones(2, 2)
        refs.append(weakref.ref(x))
        report = _train_step(model, optimizer, monitor)
        del x
    gc.collect()
    assert report.names("missing_grad") == {"early.weight", "early.bias"}
    assert report.by_kind("missing_grad")[0].reason.name == "detached"
    assert [r() for r in refs] == [None, None, None]
    monitor.close()


def _hook_snapshot(model: nn.Module, optimizers: list[torch.optim.Optimizer],
                   tensors: list[torch.Tensor]) -> dict[str, Any]:
    modules = dict(model.named_modules())
    return {
        "module_forward": {n: len(m._forward_hooks) for n, m in modules.items()},
        "module_forward_pre": {n: len(m._forward_pre_hooks) for n, m in modules.items()},
        "module_backward": {n: len(m._backward_hooks) for n, m in modules.items()},
        "optimizer_step_pre": [len(o._optimizer_step_pre_hooks) for o in optimizers],
        "optimizer_step_post": [len(o._optimizer_step_post_hooks) for o in optimizers],
        "tensor_post_accumulate": [len(t._post_accumulate_grad_hooks or {}) for t in tensors],
        "tensor_backward": [len(t._backward_hooks or {}) for t in tensors],
        "global_forward": len(torch.nn.modules.module._global_forward_hooks),
        "global_registration": (len(torch.nn.modules.module._global_parameter_registration_hooks),
                                len(torch.nn.modules.module._global_module_registration_hooks)),
        "global_optimizer": (len(_optimizers._global_optimizer_pre_hooks),
                             len(_optimizers._global_optimizer_post_hooks)),
    }


def test_close_removes_every_hook_leafwatch_installed() -> None:
    model = TwoLayer()
    scale = nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([*model.parameters(), scale], lr=0.1)
    tensors = [*model.parameters(), scale]
    before = _hook_snapshot(model, [optimizer], tensors)
    monitor = leafwatch.Monitor(model, optimizer, tensors={"scale": scale}).attach()
    during = _hook_snapshot(model, [optimizer], tensors)
    # The diagnostic forward hooks are torch's global ones while a module is armed: nothing on the modules
    assert during["module_forward"] == before["module_forward"]
    assert during["module_forward_pre"] == before["module_forward_pre"]
    assert during["global_forward"] > before["global_forward"]
    # attach() subscribes to leafwatch's global step dispatchers: torch iterates an optimizer's own hook
    # dict during its step, where a check that closes the Monitor must not change it
    assert during["optimizer_step_pre"] == before["optimizer_step_pre"]
    from leafwatch.observe import hooks

    assert hooks.OPTIMIZER_STEP_PRE in _optimizers._global_optimizer_pre_hooks.values()
    assert hooks.OPTIMIZER_STEP_POST in _optimizers._global_optimizer_post_hooks.values()
    # The watch's hook, and one arrival hook per trainable parameter until the first check.
    assert sum(during["tensor_post_accumulate"]) == sum(before["tensor_post_accumulate"]) + 1 + len(list(model.parameters()))
    for _ in range(3):
        (model(torch.ones(3, 2)).sum() * scale).sum().backward()
        optimizer.step()  # the attached pre-hook checks
        optimizer.zero_grad(set_to_none=True)
    assert monitor.step == 3
    assert monitor.report.names("missing_grad") == {"spare.weight", "spare.bias"}
    monitor.close()
    assert _hook_snapshot(model, [optimizer], tensors) == before
    assert leafwatch.watched() == {}
    # A closed Monitor stays closed: stepping no longer checks.
    _train_step(model, optimizer)
    assert monitor.step == 3


def test_a_monitor_dropped_without_close_leaves_no_global_hook_behind() -> None:
    """A Monitor the user never closes (its attach() raised, or it was simply dropped) keeps no subscriber
    on leafwatch's global dispatchers once it is gone: a forward pre-hook left by it would keep running
    in every later forward of the process."""
    from leafwatch.observe import hooks

    def subscribers() -> dict[str, int]:
        gc.collect()
        return {dispatcher.name: len(dispatcher) for dispatcher in hooks.DISPATCHERS}

    before = subscribers()
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model)
    assert subscribers()["module forward pre-hook"] > before["module forward pre-hook"]
    with pytest.raises(ValueError, match="`optimizers` must be given to attach"):
        monitor.attach()
    del monitor
    assert subscribers() == before
    leafwatch.Monitor(model, optimizer)  # never closed, never kept
    assert subscribers() == before
    # An attached Monitor whose reference the user dropped still checks: its step hooks hold it.
    attached = weakref.ref(leafwatch.Monitor(model, optimizer).attach())
    gc.collect()
    _train_step(model, optimizer)
    monitor = attached()
    assert monitor is not None and monitor.step == 1
    monitor.close()
    del monitor
    assert subscribers() == before


def test_closing_twice_and_using_as_a_context_manager_is_safe() -> None:
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _hook_snapshot(model, [optimizer], list(model.parameters()))
    with leafwatch.Monitor(model, optimizer).attach() as monitor:
        _train_step(model, optimizer)
    assert monitor.close() is monitor.report
    assert monitor.report.names("missing_grad") == {"spare.weight", "spare.bias"}
    assert _hook_snapshot(model, [optimizer], list(model.parameters())) == before


# -- bounded memory over a long run -------------------------------------------------------------
class Routed(nn.Module):
    """``odd`` runs on odd steps only; ``spare`` never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.odd = nn.Linear(2, 2)
        self.spare = nn.Linear(2, 2)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.step += 1
        x = self.layer(x)
        return self.odd(x) if self.step % 2 else x


def _monitor_sizes(monitor: leafwatch.Monitor, sink: TensorBoardSink) -> dict[str, int]:
    return {
        **monitor.stats(),
        "history": len(monitor.history),
        "report": len(monitor.report),
        "sink_groups": sink.stats()["coverage_groups"],
        "watched": len(leafwatch.watched()),
    }


def test_ten_thousand_checks_keep_memory_bounded(tmp_path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    model = Routed()
    scale = torch.ones(2, requires_grad=True)
    # `scale` is trained too: a watched tensor in no optimizer would be a not_in_optimizer finding.
    optimizer = torch.optim.SGD([*model.parameters(), scale], lr=0.01)
    writer = SummaryWriter(str(tmp_path))
    sink = TensorBoardSink(writer)
    monitor = leafwatch.Monitor(model, optimizer, sinks=[sink], tensors={"scale": scale})
    x = torch.ones(1, 2)
    sizes: dict[int, dict[str, int]] = {}
    objects: dict[int, int] = {}
    for step in range(1, 10_001):
        (model(x).sum() * scale).sum().backward()
        monitor.check()
        optimizer.zero_grad(set_to_none=True)  # no step: the checks are what this test is about
        scale.grad = None
        if step in (2_000, 10_000):
            gc.collect()
            sizes[step] = _monitor_sizes(monitor, sink)
            objects[step] = len(gc.get_objects())
    report = monitor.close()
    writer.close()
    event_bytes = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
    assert event_bytes < 2_000_000, event_bytes  # the findings table is rewritten only when it changes
    assert monitor.step == 10_000
    assert sizes[10_000] == sizes[2_000]
    assert sizes[10_000]["findings"] == 4  # odd.* intermittent, spare.* missing
    assert objects[10_000] - objects[2_000] < 500, objects
    assert report.names("missing_grad") == {"spare.weight", "spare.bias"}
    assert report.names("missing_grad", status="intermittent") == {"odd.weight", "odd.bias"}
    odd = next(f for f in report.tensors() if f.name == "odd.weight")
    assert [(f.name, f.status) for f in report.by_kind("missing_grad")] == [("spare", "open"), ("odd", "intermittent")]
    assert odd.details["checks"] == 10_000 and odd.details["steps_without_grad"] == 5_000
    # The sink's per-chunk coverage state is reset at every chunk: bounded by chunk_steps.
    stats = sink.stats()
    assert stats["coverage_groups"] >= 1 and stats["max_steps_in_a_group"] <= 1


# -- two monitors, re-entrancy, changing models -------------------------------------------------
def test_two_monitors_on_one_model_both_work_and_both_clean_up() -> None:
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _hook_snapshot(model, [optimizer], list(model.parameters()))
    first = leafwatch.Monitor(model, optimizer)
    second = leafwatch.Monitor(model, optimizer, patience=2)
    model(torch.ones(3, 2)).sum().backward()
    report_first, report_second = first.check(), second.check()
    assert report_first.names("missing_grad") == {"spare.weight", "spare.bias"}
    assert report_first.by_kind("missing_grad")[0].reason.name == "never_ran"
    assert report_second.names("missing_grad") == set()  # patience 2: not yet
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    first.close()
    report_second = _train_step(model, optimizer, second)
    assert report_second.names("missing_grad") == {"spare.weight", "spare.bias"}
    assert report_second.by_kind("missing_grad")[0].reason.name == "never_ran"
    second.close()
    assert _hook_snapshot(model, [optimizer], list(model.parameters())) == before


def test_a_sink_that_calls_check_again_gets_the_current_report_without_recursion() -> None:
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    nested: list[leafwatch.Report] = []
    monitor = leafwatch.Monitor(model, optimizer, sinks=[lambda event: nested.append(monitor.check())])
    with warnings.catch_warnings():
        warnings.simplefilter("error", leafwatch.LeafwatchWarning)
        for _ in range(3):
            report = _train_step(model, optimizer, monitor)
    assert monitor.step == 3
    assert len(nested) == 3
    assert nested[-1] is report
    monitor.close()


def test_attached_and_manual_checks_in_one_step_do_not_interfere() -> None:
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer).attach()
    model(torch.ones(3, 2)).sum().backward()
    manual = monitor.check(step=1)
    optimizer.step()  # the attached hook checks again
    optimizer.zero_grad(set_to_none=True)
    assert monitor.step == 2
    assert manual.names("missing_grad") == monitor.report.names("missing_grad") == {"spare.weight", "spare.bias"}
    monitor.close()


def test_layers_added_mid_run_are_named_not_in_optimizer() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    assert _train_step(model, optimizer, monitor).findings == []
    model.append(nn.Linear(2, 2)); line = sys._getframe().f_lineno  # noqa: E702
    # The check that first sees its gradients holds it (it may be updated by hand); the next one decides.
    assert _train_step(model, optimizer, monitor).findings == []
    report = _train_step(model, optimizer, monitor)
    assert report.names() == {"2.weight", "2.bias"}
    assert report.names("not_in_optimizer") == {"2.weight", "2.bias"}
    (f,) = report.by_kind("not_in_optimizer")
    # Observed by the registration hooks, not guessed: when and where the layer appeared.
    assert f.reason.name == "created_after_optimizer"
    assert f.cause == (f"`2` was created at test_reliability.py:{line} in "
                       "`test_layers_added_mid_run_are_named_not_in_optimizer`, after the optimizer was built: "
                       "the optimizer's parameter list was made before it existed.")
    code = 'optimizer.add_param_group({"params": model[2].parameters()})'
    assert f.fix.startswith("create `2` before the optimizer is built; or add it to `optimizer`") and f"`{code}`" in f.fix
    exec(code)  # pasted here, where the script holds `optimizer` and `model`
    assert [f.status for f in _train_step(model, optimizer, monitor).findings] == ["resolved"]
    monitor.close()


def test_a_layer_replaced_mid_run_is_named_stale_param_once() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    assert _train_step(model, optimizer, monitor).findings == []
    model[1] = nn.Linear(2, 2)
    for _ in range(3):
        report = _train_step(model, optimizer, monitor)
    assert report.names("stale_param") == {"1.weight", "1.bias"}
    assert "was replaced" in report.by_kind("stale_param")[0].cause
    # The replaced tensor is not also reported as an anonymous missing gradient.
    assert report.names() == {"1.weight", "1.bias"}
    assert {f.kind for f in report} == {"stale_param"}
    monitor.close()


def test_a_parameter_frozen_mid_run_is_no_missing_gradient() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    _train_step(model, optimizer, monitor)
    model[0].requires_grad_(False)
    for _ in range(FEW_CHECKS):
        report = _train_step(model, optimizer, monitor)
        assert report.names("missing_grad") == set()
        assert report.at_least("warning") == []
    # Named as frozen while still in the optimizer, an info finding: intended freezing is legitimate.
    assert report.names("frozen_in_optimizer") == {"0.weight", "0.bias"}
    assert {f.severity for f in report} == {"info"}
    monitor.close()


def test_a_parameter_unfrozen_mid_run_but_not_in_the_optimizer_is_named() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    assert _train_step(model, optimizer, monitor).findings == []
    model[0].requires_grad_(True)  # gradual unfreezing, without adding the layer to the optimizer
    for _ in range(FEW_CHECKS):
        report = _train_step(model, optimizer, monitor)
    assert report.names("not_in_optimizer") == {"0.weight", "0.bias"}
    assert report.names("missing_grad") == set()
    monitor.close()


def test_a_branch_that_stops_running_mid_run_gets_its_cause_at_the_next_check() -> None:
    class Switchable(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 2)
            self.branch = nn.Linear(2, 2)
            self.use_branch = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.layer(x)
            return self.branch(x) if self.use_branch else x

    model = Switchable()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    reports = []
    for step in range(1, 5):
        model.use_branch = step < 3
        reports.append(_train_step(model, optimizer, monitor))
    assert reports[1].findings == []
    # Step 3 arms the hooks on `branch`; from step 4 on the cause is known, not "being traced".
    late = reports[3].tensors("missing_grad")
    assert {f.name for f in late} == {"branch.weight", "branch.bias"}
    assert [f.name for f in reports[3].by_kind("missing_grad")] == ["branch"]
    assert {(f.reason.name, f.reason.observed) for f in late} == {("intermittent", "never_ran")}
    assert "module `branch` never ran in this step's forward" in late[0].cause
    monitor.close()


def test_no_grad_evaluation_between_steps_raises_no_finding() -> None:
    model = Healthy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    with torch.no_grad():  # an evaluation before the first training step, in train mode
        model(torch.ones(3, 2))
    for step in range(1, 7):
        report = _train_step(model, optimizer, monitor)
        assert report.findings == [], str(report)
        model.train(step % 2 == 0)  # evaluate in eval mode on odd steps, in train mode on even ones
        with torch.no_grad():
            model(torch.ones(3, 2))
        with torch.inference_mode():
            model(torch.ones(3, 2))
        model.train()
    assert monitor.close().findings == []


def test_a_parameter_subclass_is_checked_like_a_parameter() -> None:
    class ScaledParameter(nn.Parameter):
        pass

    class WithSubclass(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = ScaledParameter(torch.ones(2))
            self.left_out_gain = ScaledParameter(torch.ones(2))  # used, in no optimizer
            self.unused_gain = ScaledParameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.gain * self.left_out_gain

    model = WithSubclass()
    optimizer = torch.optim.SGD([model.gain], lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    model(torch.ones(3, 2)).sum().backward()
    assert leafwatch.audit(model, optimizer).names() == {"left_out_gain"}  # one look: decided at once
    assert monitor.check().findings == []  # held: its value may still change by hand before the next check
    model(torch.ones(3, 2)).sum().backward()
    report = monitor.check()
    assert isinstance(model.gain.grad, torch.Tensor)
    assert report.names("not_in_optimizer") == {"left_out_gain"}
    assert report.names("missing_grad") == set()
    assert leafwatch.audit(model, optimizer).names() == {"left_out_gain"}
    assert leafwatch.audit(model).names("missing_grad") == {"unused_gain"}
    monitor.close()


def test_lazy_modules_created_before_the_first_forward_work() -> None:
    model = nn.Sequential(nn.LazyLinear(3), nn.Linear(3, 1), nn.LazyLinear(2))
    monitor = leafwatch.Monitor(model)
    model[:2](torch.ones(2, 4)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", leafwatch.LeafwatchWarning)
        report = monitor.check()
    # The lazy layer that never ran stays uninitialized: it is named, without a shape.
    assert report.names("missing_grad") == {"2.weight", "2.bias"}
    assert {f.reason.name for f in report} == {"never_ran"}
    assert {f.shape for f in report} == {None}
    monitor.close()


def test_dtensor_parameters_in_a_single_process_group(tmp_path) -> None:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    tensor_api = pytest.importorskip("torch.distributed.tensor")
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = TwoLayer()
        tensor_api.distribute_module(model, mesh)
        assert isinstance(model.layer.weight, tensor_api.DTensor)
        optimizer = torch.optim.SGD([*model.layer.parameters(), *model.spare.parameters()], lr=0.1)
        x = tensor_api.distribute_tensor(torch.ones(3, 2), mesh, [tensor_api.Replicate()])
        with warnings.catch_warnings():
            warnings.simplefilter("error", leafwatch.LeafwatchWarning)
            monitor = leafwatch.Monitor(model, optimizer, check_values_every_n_steps=1)
            for _ in range(2):  # the second check decides the gradient rule (the value did not change)
                model(x).sum().backward()
                report = monitor.check()
            assert report.names("not_in_optimizer") == {"head.weight", "head.bias"}
            assert report.names("missing_grad") == {"spare.weight", "spare.bias"}
            model.layer.weight.grad = model.layer.weight.grad * float("nan")
            audited = leafwatch.audit(model, optimizer)
            assert audited.names("nonfinite_grad") == {"layer.weight"}
            monitor.close()
    finally:
        dist.destroy_process_group()


# -- state ------------------------------------------------------------------------------------
def test_state_dict_round_trip_and_pickling_keep_the_history() -> None:
    model = Routed()
    optimizer = torch.optim.SGD([*model.layer.parameters(), *model.odd.parameters(), *model.spare.parameters()], lr=0.1)
    model.extra = nn.Linear(2, 2)  # used in the loss, left out of the optimizer
    _use_in_loss(model, "extra")
    monitor = leafwatch.Monitor(model, optimizer)
    for _ in range(4):
        _train_step(model, optimizer, monitor)
    state = monitor.state_dict()
    monitor.close()
    restored_state = pickle.loads(pickle.dumps(state))
    assert restored_state == state
    history = {k: f.to_dict() for k, f in monitor.history.items()}
    assert set(history) == {("missing_grad", "odd.weight"), ("missing_grad", "odd.bias"),
                            ("missing_grad", "spare.weight"), ("missing_grad", "spare.bias"),
                            ("not_in_optimizer", "extra.weight"), ("not_in_optimizer", "extra.bias")}

    resumed = leafwatch.Monitor(model, optimizer)
    resumed.load_state_dict(restored_state)
    assert resumed.step == 4
    assert {k: f.to_dict() for k, f in resumed.history.items()} == history
    report = _train_step(model, optimizer, resumed)
    assert resumed.step == 5
    spare = next(f for f in report.tensors() if f.name == "spare.weight")
    assert spare.first_step == 1 and spare.steps_seen == 5 and spare.status == "open"
    assert spare.details["steps_without_grad"] == 5
    extra = next(f for f in report.tensors() if f.name == "extra.weight")
    assert extra.first_step == 1 and extra.status == "open"
    resumed.close()


_CYCLE_SCRIPT = """
import faulthandler, gc, torch, leafwatch
faulthandler.dump_traceback_later(30, exit=True)  # a deadlock fails instead of hanging

class Holder:
    pass

for i in range(500):
    holder = Holder()
    holder.self = holder  # a cycle: freed by the collector, whenever it runs (inside leafwatch too)
    holder.scale = leafwatch.watch(torch.zeros(2, requires_grad=True), name=f"scale{i}")
    del holder
gc.collect()
print("watched after collection:", len(leafwatch.watched()))
"""


def test_watched_tensors_freed_by_the_garbage_collector_never_deadlock(tmp_path) -> None:
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    script = tmp_path / "cycles.py"
    script.write_text(_CYCLE_SCRIPT)
    done = _warm.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "watched after collection: 0" in done.stdout


def test_watch_without_a_name_in_a_training_loop_replaces_the_previous_step() -> None:
    class Watching(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 2)
            self.head = nn.Linear(2, 1)
            self.cut = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            hidden = leafwatch.watch(self.layer(x), expect_leaf=False)  # named by this line
            return self.head(hidden.detach() if self.cut else hidden), hidden

    model = Watching()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []  # the activations are kept for logging: every step's stays alive
    monitor = leafwatch.Monitor(model, optimizer)
    for step in range(1, 5):
        model.cut = step == 4
        out, hidden = model(torch.ones(3, 2))
        kept.append(hidden)
        out.sum().backward()
        report = monitor.check()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        assert list(leafwatch.watched().values()) == [hidden]
        assert report.open == [] or step == 4
    monitor.close()
    # The cut at step 4 is named by the watch point's line, with the cause.
    cut = [f for f in report.by_kind("missing_grad") if f.name.startswith("tensor@")]
    assert len(cut) == 1 and cut[0].name.endswith(f"test_reliability.py:{Watching.forward.__code__.co_firstlineno + 1}")
    assert "no gradient flowed through it" in cut[0].message
    assert report.names("missing_grad") == {cut[0].name}
    # The layer trained for three steps, so its first miss is intermittent.
    assert report.names("missing_grad", status="intermittent") == {"layer.weight", "layer.bias"}


def test_a_watched_leaf_that_stops_being_used_is_named_by_audit_and_monitor() -> None:
    model = Healthy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    temperature = leafwatch.watch(torch.ones(1, requires_grad=True), name="temperature")
    monitor = leafwatch.Monitor(model, optimizer)
    for step in range(1, 4):
        out = model(torch.ones(3, 2))
        (out * temperature if step == 1 else out).sum().backward()
        audited, report = leafwatch.audit(model, optimizer), monitor.check()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        temperature.grad = None
        expected = set() if step == 1 else {"temperature"}
        assert audited.names("missing_grad") == expected
        assert report.names("missing_grad", status=None) == expected
    monitor.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_deferred_cuda_value_checks_stay_bounded_and_keep_no_gradient_alive() -> None:
    model = Healthy().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = leafwatch.Monitor(model, optimizer, check_values_every_n_steps=1)
    x = torch.ones(3, 2, device="cuda")
    refs = []
    for step in range(1, 201):
        model(x).sum().backward()
        refs.append(weakref.ref(model.layer.weight.grad))
        if step == 200:
            model.head.weight.grad.fill_(float("nan"))
        monitor.check()
        # Results still on their way, and their names, are bounded by how far the GPU lags.
        stats = monitor.stats()
        assert stats["value_checks_in_flight"] <= 50 and stats["value_names_kept"] <= 50
        if step < 200:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    report = monitor.close()  # waits for the last step's result
    assert report.names("nonfinite_grad") == {"head.weight"}
    assert monitor.stats()["value_checks_in_flight"] == 0


def test_checking_only_one_of_two_optimizers_keeps_the_diagnostic_records_bounded() -> None:
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.generator = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
            self.critic = nn.Linear(2, 1)

    model = Pair()
    gen_opt = torch.optim.SGD(model.generator.parameters(), lr=0.1)
    critic_opt = torch.optim.SGD(model.critic.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, [gen_opt, critic_opt])
    for step in range(1, 101):
        # generator.0 is always cut off, so its hooks stay armed; a new batch size every step.
        hidden = model.generator[0](torch.randn(step % 7 + 1, 2)).detach()
        model.critic(model.generator[1](hidden)).sum().backward()
        report = monitor.check(gen_opt)  # the critic's optimizer is never checked
        gen_opt.step()
        gen_opt.zero_grad(set_to_none=True)
        stats = monitor.stats()
        assert stats["diagnostic_records"] <= 3, step
        assert stats["diagnostic_inputs_kept"] <= 2 * 7 and stats["diagnostic_max_calls"] <= 2, step
    assert report.names("missing_grad") == {"generator.0.weight", "generator.0.bias"}
    assert {f.reason.name for f in report.by_kind("missing_grad")} == {"detached"}
    monitor.close()


def test_a_failure_reading_the_modules_beyond_the_model_warns_once_and_training_goes_on() -> None:
    from leafwatch.observe.discovery import Discovery

    def broken_owners() -> dict:
        raise RuntimeError("an owner that cannot be read")

    model, head = nn.Linear(2, 2), nn.Linear(2, 1)
    modules = Discovery(model, broken_owners)
    modules.arm()
    head(model(torch.ones(1, 2))).sum().backward()  # `head` runs beyond the model: its path is asked
    with pytest.warns(leafwatch.LeafwatchInternalWarning, match="an owner that cannot be read"):
        assert modules.update() is None
    assert not modules.armed  # the hook is gone: nothing more is asked of it
    head(model(torch.ones(1, 2))).sum().backward()
    assert modules.update() is None

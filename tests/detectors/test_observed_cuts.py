"""Causes observed, located in the user's code: a parameter cut from the loss by an op inside the
model's forward is explained by that op and its line (seen by the cut recorder on an instrumented
forward), every tensor cut there shares one ``details["group"]``, and where no cut was seen the
cause says the exact point is unknown instead of guessing."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

import leafwatch
from leafwatch.observe import cuts
from tests._requirements import require_module

_HERE = os.path.basename(__file__)


def _at(marker: str) -> str:
    """``test_observed_cuts.py:N``: the line of this file that ends with ``# cut: <marker>``."""
    with open(__file__, encoding="utf-8") as source:
        lines = [n for n, line in enumerate(source, 1) if line.rstrip().endswith(f"# cut: {marker}")]
    assert len(lines) == 1, marker
    return f"{_HERE}:{lines[0]}"


def _one_step(model: nn.Module, steps: int = 1) -> leafwatch.Report:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            model(torch.randn(4, 3)).sum().backward()
            report = monitor.check()
            opt.step()
    assert torch._C._len_torch_function_stack() == 0, "the recorder is never left on the stack"
    return report


class Cutting(nn.Module):
    """``a`` feeds ``middle``, whose cut keeps ``a`` from the loss; ``b`` trains."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.middle(self.a(x)))

    def middle(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Detach(Cutting):
    def middle(self, h):
        return h.detach()  # cut: detach


class DetachInPlace(Cutting):
    def middle(self, h):
        h = h * 1
        return h.detach_()  # cut: detach_


class Data(Cutting):
    def middle(self, h):
        return h.data  # cut: data


class NumpyForced(Cutting):
    def middle(self, h):
        return torch.from_numpy(h.numpy(force=True))  # cut: numpy


class ListRewrap(Cutting):
    def middle(self, h):
        return torch.tensor(h.tolist())  # cut: tolist


class Item(Cutting):
    def middle(self, h):
        return torch.full((4, 3), h.sum().item())  # cut: item


class Float(Cutting):
    def middle(self, h):
        return torch.ones(4, 3) * float(h.mean())  # cut: float


class Int(Cutting):
    def middle(self, h):
        return torch.ones(4, 3) * int(h.abs().sum())  # cut: int


class TensorOf(Cutting):
    def middle(self, h):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's advice to use .detach().clone()
            return torch.tensor(h)  # cut: tensor


class NoGrad(Cutting):
    def middle(self, h):
        with torch.no_grad():  # cut: no_grad
            return h * 2


class GradSwitchedOff(Cutting):
    def middle(self, h):
        torch.set_grad_enabled(False)  # cut: set_grad_enabled
        try:
            return h * 2
        finally:
            torch.set_grad_enabled(True)


class InferenceMode(Cutting):
    def middle(self, h):
        with torch.inference_mode():
            out = h * 2  # cut: inference_mode
        return out.clone()


@pytest.mark.parametrize(
    ("model_cls", "op", "marker", "reason", "fix"),
    [
        (Detach, "`.detach()`", "detach", "detached", "remove the `.detach()` at {at}"),
        (DetachInPlace, "`.detach_()`", "detach_", "detached", "remove the `.detach_()` at {at}"),
        (Data, "`.data`", "data", "data_access", "not `.data`, at {at}"),
        (NumpyForced, "`.numpy()`", "numpy", "rewrapped", "keep the values a tensor at {at}"),
        (ListRewrap, "`.tolist()`", "tolist", "rewrapped", "keep the values a tensor at {at}"),
        (Item, "`.item()`", "item", "rewrapped", "keep the values a tensor at {at}"),
        (Float, "`float(...)`", "float", "rewrapped", "keep the values a tensor at {at}"),
        (Int, "`int(...)`", "int", "rewrapped", "keep the values a tensor at {at}"),
        (TensorOf, "`torch.tensor(...)`", "tensor", "rewrapped", "keep the values a tensor at {at}"),
        (NoGrad, "`torch.no_grad()`", "no_grad", "detached", "out of the `torch.no_grad()` block at {at}"),
        (GradSwitchedOff, "`torch.set_grad_enabled(False)`", "set_grad_enabled", "detached",
         "do not switch it off at {at}"),
        (InferenceMode, "`torch.inference_mode()`", "inference_mode", "detached",
         "out of the `torch.inference_mode()` block at {at}"),
    ],
)
def test_a_cut_seen_in_the_forward_is_named_at_its_line(model_cls, op, marker, reason, fix) -> None:
    report = _one_step(model_cls())
    at = _at(marker)
    missing = report.tensors("missing_grad")
    assert {f.name for f in missing} == {"a.weight", "a.bias"}
    # One cut, one mistake, named by the module that holds its two tensors, the cut said as its location.
    assert [(f.name, f.details["location"], f.names) for f in report] == [("a", f"cut by {op} at {at}",
                                                                          ("a.bias", "a.weight"))]
    for f in missing:
        assert f.cause.startswith(f"cut by {op} at {at} (in `{model_cls.__name__}.middle`)"), f.cause
        assert f.reason.name == reason
        assert f.details["group"] == f"{op.strip('`')} at {at}"
        assert fix.format(at=at) in f.fix, f.fix


def test_a_warning_the_cutting_op_raises_points_at_the_line_that_wrote_it() -> None:
    """torch warns from C++ at the Python frame that called the op: under the cut recorder that frame
    is leafwatch's, so the warning is put back on the user's line."""
    always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # (torch warns it once per process otherwise)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _one_step(Float())
    finally:
        torch.set_warn_always(always)
    scalar = [w for w in caught if "to a scalar" in str(w.message)]
    assert scalar and {f"{os.path.basename(w.filename)}:{w.lineno}" for w in scalar} == {_at("float")}


class AsTensor(Cutting):
    def middle(self, h):
        return torch.as_tensor(h)  # the same tensor back: its graph is kept


def test_as_tensor_that_keeps_the_graph_is_no_cut() -> None:
    assert not _one_step(AsTensor()).findings


class ScaledByItsData(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(x * self.scale.data)  # cut: param_data


def test_a_parameter_cut_itself_gets_the_fix_on_its_attribute() -> None:
    (finding,) = _one_step(ScaledByItsData()).tensors("missing_grad")
    at = _at("param_data")
    assert (finding.name, finding.reason.name) == ("scale", "data_access")
    assert finding.cause.startswith(f"cut by `.data` at {at} (in `ScaledByItsData.forward`)")
    assert f"use `scale` itself, not `scale.data`, at {at}" in finding.fix


# -- no cut observed: what is known, and that the exact point is unknown -----------------------------
def test_a_cut_outside_the_model_forward_is_said_to_be_unknown() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            # The layers are called one by one in the loop: the model's own forward never runs, so no
            # forward is instrumented; the values go through NumPy into a tensor of new storage.
            hidden = torch.from_numpy(model[0](torch.randn(4, 3)).detach().numpy().copy())
            model[1](hidden).sum().backward()
            report = monitor.check()
    missing = report.tensors("missing_grad")
    assert {f.name for f in missing} == {"0.weight", "0.bias"}
    for f in missing:
        assert "Where exactly is unknown" in f.cause, f.cause
        assert "cut by" not in f.cause and "Most likely" not in f.cause
        assert "group" not in f.details


def test_a_compiled_model_is_not_instrumented_and_its_cause_stays_at_module_level(monkeypatch) -> None:
    entered = []
    monkeypatch.setattr(cuts.CutRecorder, "__enter__", lambda self: entered.append(self))
    model = Detach()
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's recompile notes about leafwatch's module hooks
        with leafwatch.Monitor(compiled, opt) as monitor:
            for _ in range(2):
                opt.zero_grad(set_to_none=True)
                compiled(torch.randn(4, 3)).sum().backward()
                report = monitor.check()
    assert entered == [], "a torch-function mode around a compiled model would force a recompile"
    missing = report.tensors("missing_grad")
    assert {f.name for f in missing} == {"a.weight", "a.bias"}
    for f in missing:
        assert "cut by" not in f.cause and "group" not in f.details
        assert "unknown" in f.cause, f.cause


def _count_recorders(monkeypatch) -> list[cuts.CutRecorder]:
    entered: list[cuts.CutRecorder] = []
    enter = cuts.CutRecorder.__enter__

    def counting(self):
        entered.append(self)
        return enter(self)

    monkeypatch.setattr(cuts.CutRecorder, "__enter__", counting)
    return entered


def test_the_recorder_runs_on_instrumented_forwards_only(monkeypatch) -> None:
    entered = _count_recorders(monkeypatch)
    healthy = _one_step(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)), steps=5)
    assert not healthy.findings
    assert len(entered) == 1, "a healthy run: the first forward only"
    entered.clear()
    report = _one_step(Detach(), steps=5)
    # The first forward, and the one after the new miss; the cause stays known afterwards.
    assert len(entered) == 2
    at = _at("detach")
    assert {f.details["group"] for f in report.tensors("missing_grad")} == {f".detach() at {at}"}


class RaisesOnce(Detach):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def middle(self, h):
        self.calls += 1
        if self.calls == 1:
            raise ValueError("a bad batch")
        return super().middle(h)


def test_a_forward_that_raises_leaves_no_mode_on_the_stack() -> None:
    model = RaisesOnce()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        with pytest.raises(ValueError, match="a bad batch"):
            model(torch.randn(4, 3))
        assert torch._C._len_torch_function_stack() == 0
        model(torch.randn(4, 3)).sum().backward()
        report = monitor.check()
    assert torch._C._len_torch_function_stack() == 0
    assert {f.details.get("group") for f in report.tensors("missing_grad")} == {f".detach() at {_at('detach')}"}


# -- one cut, one mistake ------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 16)

    def forward(self, h):
        return h + self.fc2(torch.relu(self.fc1(h)))


class Deep(nn.Module):
    """Twelve residual blocks; the forward detaches after block 3."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(12))
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        h = self.embed(x)
        for i, block in enumerate(self.blocks):
            h = block(h)
            if i == 3:
                h = h.detach()  # cut: deep
        return self.head(h)


def test_every_tensor_cut_by_one_detach_is_one_mistake() -> None:
    report = _one_step(Deep(), steps=4)  # later forwards are not instrumented: the cut stays known
    at = _at("deep")
    missing = report.tensors("missing_grad")
    cut_off = {"embed.weight", "embed.bias"} | {f"blocks.{i}.{layer}.{kind}" for i in range(4)
                                                  for layer in ("fc1", "fc2") for kind in ("weight", "bias")}
    assert {f.name for f in missing} == cut_off
    assert {f.details["group"] for f in missing} == {f".detach() at {at}"}
    for f in missing:
        assert f.cause.startswith(f"cut by `.detach()` at {at} (in `Deep.forward`)"), f.cause
        assert f"remove the `.detach()` at {at}" in f.fix


class DetachedLMHead(nn.Module):
    """A GPT-2 whose hidden states are detached before the language-model head."""

    def __init__(self, transformers) -> None:
        super().__init__()
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
        self.gpt = transformers.GPT2LMHeadModel(config)
        self.head = nn.Linear(32, 64)

    def forward(self, ids):
        hidden = self.gpt.transformer(input_ids=ids).last_hidden_state
        return self.head(hidden.detach())  # cut: gpt2


def test_a_detach_between_a_gpt2_and_its_head_is_one_mistake_at_the_users_line() -> None:
    transformers = require_module("transformers")
    torch.manual_seed(0)
    model = DetachedLMHead(transformers)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 64, (2, 8))
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            logits = model(ids)
            nn.functional.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1)).backward()
            report = monitor.check()
            opt.step()
    at = _at("gpt2")
    missing = report.tensors("missing_grad")
    transformer = {n for n, p in model.gpt.transformer.named_parameters()}
    # Every tensor of the transformer (the tied lm_head too, reported under one of its names).
    assert {f.name.removeprefix("gpt.transformer.") for f in missing} >= transformer - {"wte.weight"}
    assert all(f.name.startswith("gpt.") for f in missing)
    assert {f.details["group"] for f in missing} == {f".detach() at {at}"}
    for f in missing:
        assert f.cause.startswith(f"cut by `.detach()` at {at} (in `DetachedLMHead.forward`)"), f.cause
    # One mistake, one finding, at the user's line; its fix names that line.
    (mistake,) = report.open
    assert (mistake.kind, mistake.details["location"], len(mistake.members)) == (
        "missing_grad", f"cut by `.detach()` at {at}", len(missing))
    assert mistake.name == "gpt.transformer"  # the module that holds them all: a path, never the place of the cut
    assert f"`.detach()` at {at}" in mistake.fix


def test_a_failing_recorder_warns_once_and_training_goes_on(monkeypatch) -> None:
    def broken(self, *args):
        raise RuntimeError("recorder bug")

    monkeypatch.setattr(cuts.CutRecorder, "_cut", broken)
    model = Detach()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(leafwatch.LeafwatchInternalWarning, match="cut recorder") as caught:
        with leafwatch.Monitor(model, opt) as monitor:
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                model(torch.randn(4, 3)).sum().backward()
                report = monitor.check()
                opt.step()
    assert len([w for w in caught if "cut recorder" in str(w.message)]) == 1
    assert torch._C._len_torch_function_stack() == 0
    missing = report.tensors("missing_grad")
    assert {f.name for f in missing} == {"a.weight", "a.bias"}
    assert all("cut by" not in f.cause and "group" not in f.details for f in missing)


def test_a_cut_inside_a_library_names_its_line_and_the_users_call(tmp_path, monkeypatch) -> None:
    import importlib.util

    from leafwatch.observe import frames

    library = tmp_path / "fakelib"
    library.mkdir()
    (library / "layers.py").write_text("def squash(h):\n    return h.detach()\n")
    spec = importlib.util.spec_from_file_location("fakelib_layers", library / "layers.py")
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    # The folder is one of the frameworks whose frames are not the user's (as transformers' is).
    monkeypatch.setattr(frames, "framework_dirs", lambda: (str(library) + os.sep,))

    class CallsTheLibrary(Cutting):
        def middle(self, h):
            return layers.squash(h)  # cut: library_call

    missing = _one_step(CallsTheLibrary()).tensors("missing_grad")
    at = _at("library_call")
    assert {f.name for f in missing} == {"a.weight", "a.bias"}
    for f in missing:
        assert f.cause.startswith(f"cut by `.detach()` at layers.py:2 (in `squash`), called from {at} "
                                  "(in `test_a_cut_inside_a_library_names_its_line_and_the_users_call."
                                  "<locals>.CallsTheLibrary.middle`)"), f.cause
        assert f.details["group"] == f".detach() at {at}"
        assert f"reached from your call at {at}" in f.fix


class IntegerIndices(nn.Module):
    """``offset`` only picks rows of ``table`` through rounded integer indices; ``shift`` is rewrapped as
    a float tensor (a new leaf: torch ops on the tensor itself would keep it)."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = nn.Parameter(torch.tensor(1.3))
        self.shift = nn.Parameter(torch.zeros(3))
        self.table = nn.Parameter(torch.randn(16, 3))
        self.head = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = torch.arange(x.shape[0])
        idx = (ids + self.offset * 4).round().long().clamp(0, 15)  # cut: long
        x = x + torch.tensor(self.shift.tolist())  # cut: float rewrap
        return self.head(x + self.table[idx])


def test_integer_indices_are_a_cut_that_says_no_op_carries_a_gradient_through_integers() -> None:
    report = _one_step(IntegerIndices())
    by_name = {f.name: f for f in report.findings}
    assert set(by_name) == {"offset", "shift"}
    offset, shift = by_name["offset"], by_name["shift"]
    assert (offset.kind, offset.reason.name) == ("missing_grad", "integer_cut")
    assert offset.cause == (
        f"cut by `.long()` at {_at('long')} (in `IntegerIndices.forward`): the values computed from it (rounded on "
        "the way: `round()`, whose gradient is zero) become integers (`torch.int64`) there, such as pixel indices or "
        "crop sizes, and integer indexing cuts the gradient: an integer tensor carries no gradient in any form, so "
        "backward never reaches it (leafwatch saw the op run).")
    assert offset.fix.startswith("no torch op carries a gradient through integers: to learn `offset`, let it act "
                                 "through float values, by a differentiable resampling")
    # a float rewrap keeps its words: torch ops on the tensor itself would keep the graph
    assert (shift.kind, shift.reason.name) == ("missing_grad", "rewrapped")
    assert shift.cause.startswith(f"cut by `.tolist()` at {_at('float rewrap')}")
    assert "use torch ops on the tensor itself" in shift.fix


def test_a_conversion_to_integers_of_values_that_need_no_gradient_is_no_finding() -> None:
    class Bins(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(3, 3)
            self.head = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.proj(x)
            bins = h.detach().argmax(-1).long()  # integer labels of a detached copy, for a lookup
            return self.head(h * (bins.float().unsqueeze(-1) + 1)) + h.long().sum() * 0

    assert _one_step(Bins(), steps=2).findings == []

"""Intent told from accident on public training code: EMA / target networks, teachers, LayerDrop,
closure optimizers, deliberate mixed dtypes and devices, late optimizers, decisions at the end.

Each pattern is built the way the public code writes it and checked at every step (step 1
included), in strict mode, through every front-end where it applies (``Monitor``,
``attach()``, the Lightning callback, ``leafwatch run``); each has its bug twin, still caught,
with the kind, the qualified name and the cause asserted.
"""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path

import _warm
import pytest
import torch
from torch import nn
from _requirements import optional_import, require_module
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import leafwatch
from leafwatch.detectors.structure import device_on_purpose, dtype_changes_training
from leafwatch.observe.changes import ChangeEvidence, LAYERDROP_FALSE_ALARM

# The file collects without Lightning; the tests that use it skip (locally) or fail (in CI).
pl = optional_import("pytorch_lightning")
LeafWatch = optional_import("leafwatch", needs="pytorch_lightning").LeafWatch

REPO = Path(__file__).resolve().parents[2]


# -- helpers ----------------------------------------------------------------------------------
def _no_leafwatch_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, leafwatch.LeafwatchWarning)]


def _trainer(tmp_path: Path, callback: LeafWatch, max_steps: int = 4) -> pl.Trainer:
    return pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, callbacks=[callback],
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      limit_val_batches=0)


def _loader(n: int = 16, batch_size: int = 4, width: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, width, generator=g), torch.randn(n, 1, generator=g)),
                      batch_size=batch_size)


def _leafwatch_run(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return _warm.run([sys.executable, "-m", "leafwatch", "run", *args, str(script)], capture_output=True,
                     text=True, env=env, cwd=tmp_path, timeout=240)


# -- BYOL as lightning-bolts writes it --------------------------------------------------------
class MLP(nn.Module):
    """bolts' projector / predictor: Linear (no bias), BatchNorm1d, ReLU, Linear."""

    def __init__(self, input_dim: int = 8, hidden_dim: int = 16, output_dim: int = 4) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(input_dim, hidden_dim, bias=False), nn.BatchNorm1d(hidden_dim),
                                   nn.ReLU(inplace=True), nn.Linear(hidden_dim, output_dim, bias=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class SiameseArm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.projector = MLP(8, 16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.encoder(x)
        return y, self.projector(y)


class BYOLMAWeightUpdate:
    """bolts' update rule: ``target_p.data = tau * target_p.data + (1 - tau) * online_p.data``."""

    def __init__(self, initial_tau: float = 0.996) -> None:
        self.initial_tau = self.current_tau = initial_tau

    def update_tau(self, global_step: int, max_steps: int) -> None:
        self.current_tau = 1 - (1 - self.initial_tau) * (math.cos(math.pi * global_step / max_steps) + 1) / 2

    def update_weights(self, online_net: nn.Module, target_net: nn.Module) -> None:
        for online_p, target_p in zip(online_net.parameters(), target_net.parameters()):
            target_p.data = self.current_tau * target_p.data + (1.0 - self.current_tau) * online_p.data


class _ByolLoss:
    """bolts' ``calculate_loss``: the target network runs under ``torch.no_grad()``."""

    online_network: SiameseArm
    target_network: SiameseArm
    predictor: MLP

    def calculate_loss(self, v_online: torch.Tensor, v_target: torch.Tensor) -> torch.Tensor:
        _, z1 = self.online_network(v_online)
        h1 = self.predictor(z1)
        with torch.no_grad():
            _, z2 = self.target_network(v_target)
        return -2 * F.cosine_similarity(h1, z2).mean()

    def loss(self, img1: torch.Tensor, img2: torch.Tensor) -> torch.Tensor:
        return self.calculate_loss(img1, img2) + self.calculate_loss(img2, img1)


class BYOLNets(_ByolLoss, nn.Module):
    """The online arm, its deep copy as the target (not frozen) and the predictor."""

    def __init__(self) -> None:
        super().__init__()
        self.online_network = SiameseArm()
        self.target_network = copy.deepcopy(self.online_network)
        self.predictor = MLP(4, 16, 4)


class BYOL(_ByolLoss, pl.LightningModule):
    def __init__(self, max_steps: int = 4) -> None:
        super().__init__()
        self.online_network = SiameseArm()
        self.target_network = copy.deepcopy(self.online_network)
        self.predictor = MLP(4, 16, 4)
        self.weight_callback = BYOLMAWeightUpdate()
        self.max_steps = max_steps

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.weight_callback.update_weights(self.online_network, self.target_network)
        self.weight_callback.update_tau(self.global_step, self.max_steps)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        img1, img2 = x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)
        return self.loss(img1, img2)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.2, weight_decay=1.5e-6)


def test_byol_target_network_in_the_optimizer_is_no_finding_with_the_lightning_callback(tmp_path):
    callback = LeafWatch(strict=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _trainer(tmp_path, callback, max_steps=4).fit(BYOL(), _loader())
    assert _no_leafwatch_warnings(record) == []
    assert callback.report.findings == []
    assert callback.report.step == 4


UPDATES: dict[str, Callable[[nn.Parameter, nn.Parameter, float], None]] = {
    # bolts BYOL / MoCo: a new tensor behind `.data` (data_ptr moves)
    "data_assignment": lambda t, o, tau: setattr(t, "data", tau * t.data + (1 - tau) * o.data),
    # DINO-style in place through `.data` (neither the version nor the storage moves: the fingerprint)
    "data_in_place": lambda t, o, tau: t.data.mul_(tau).add_(o.detach().data, alpha=1 - tau),
    # mean teacher / timm ModelEmaV2: in place under no_grad (the version moves)
    "no_grad_in_place": lambda t, o, tau: t.mul_(tau).add_(o.detach(), alpha=1 - tau),
    "foreach_lerp": lambda t, o, tau: torch._foreach_lerp_([t], [o.detach()], 1 - tau),
}


@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("attach", [False, True])
def test_ema_target_in_the_optimizer_is_no_finding_at_any_step(update, attach):
    torch.manual_seed(0)
    nets = BYOLNets()
    opt = torch.optim.Adam(nets.parameters(), lr=0.2, weight_decay=1.5e-6)  # bolts: every parameter
    monitor = leafwatch.Monitor(nets, opt, strict=True)
    if attach:
        monitor.attach()
    with monitor:
        for _ in range(5):
            opt.zero_grad()
            x = torch.randn(8, 8)
            nets.loss(x + 0.1 * torch.randn_like(x), x).backward()
            report = monitor.report if attach else monitor.check()
            opt.step()
            with torch.no_grad():
                for t, o in zip(nets.target_network.parameters(), nets.online_network.parameters()):
                    UPDATES[update](t, o, 0.99)
            assert (monitor.report if attach else report).findings == []
        assert monitor.stats()["streaks"] == 0  # a known target costs one set lookup per tensor
    assert monitor.report.findings == []


class MeanTeacher(nn.Module):
    """A student and its deep copy as the teacher (not frozen), outside the optimizer."""

    def __init__(self, fixed_teacher_in_eval: bool = False) -> None:
        super().__init__()
        self.student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.teacher = copy.deepcopy(self.student)
        self.fixed = fixed_teacher_in_eval
        if fixed_teacher_in_eval:
            self.teacher.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.teacher(x)
        return F.mse_loss(self.student(x), target)

    @torch.no_grad()
    def update_teacher(self, alpha: float = 0.99) -> None:
        if self.fixed:
            return
        for t, s in zip(self.teacher.parameters(), self.student.parameters()):
            t.mul_(alpha).add_(s, alpha=1 - alpha)


@pytest.mark.parametrize("fixed", [False, True], ids=["ema_teacher", "fixed_teacher_in_eval"])
def test_teacher_outside_the_optimizer_is_no_finding_at_any_step(fixed):
    model = MeanTeacher(fixed_teacher_in_eval=fixed)
    opt = torch.optim.SGD(model.student.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, strict=True) as monitor:
        assert monitor.scan().findings == []  # nothing at the start either: membership waits for a check
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8)).backward()
            assert monitor.check().findings == []
            opt.step()
            model.update_teacher()
    assert monitor.report.findings == []


class TeacherModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = MeanTeacher()

    def training_step(self, batch, batch_idx):
        return self.model(batch[0])

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.model.update_teacher()

    def configure_optimizers(self):
        return torch.optim.SGD(self.model.student.parameters(), lr=0.1)


def test_teacher_outside_the_optimizer_is_no_finding_with_the_lightning_callback(tmp_path):
    callback = LeafWatch(strict=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _trainer(tmp_path, callback).fit(TeacherModule(), _loader())
    assert _no_leafwatch_warnings(record) == []
    assert callback.report.findings == []


BYOL_SCRIPT = """
    import copy, torch
    from torch import nn
    from torch.nn import functional as F

    online = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    target = copy.deepcopy(online)
    predictor = nn.Linear(4, 4)
    nets = nn.ModuleDict({"online": online, "target": target, "predictor": predictor})
    opt = torch.optim.Adam(nets.parameters(), lr=0.2)
    for step in range(6):
        x = torch.randn(8, 8)
        with torch.no_grad():
            z2 = target(x)
        loss = -2 * F.cosine_similarity(predictor(online(x + 0.1)), z2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        for o, t in zip(online.parameters(), target.parameters()):
            t.data = 0.99 * t.data + 0.01 * o.data
    print("done")
"""


def test_byol_target_network_is_no_finding_under_leafwatch_run(tmp_path):
    result = _leafwatch_run(tmp_path, BYOL_SCRIPT, "--strict")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert "missing_grad" not in result.stderr and "not_in_optimizer" not in result.stderr, result.stderr


# -- the bug twin: an encoder run under no_grad by mistake, never updated ----------------------
class AccidentalNoGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # left over from an evaluation helper
            h = self.encoder(x)
        return self.head(h).pow(2).mean()


def _assert_accidental_no_grad(report: leafwatch.Report) -> None:
    assert report.names("missing_grad") == {"encoder.weight", "encoder.bias"}
    for f in report.by_kind("missing_grad"):
        assert (f.severity, f.status) == ("error", "open")
        assert "ran with gradients disabled" in f.cause
        assert "did not change between checks either" in f.cause
        line = AccidentalNoGrad.forward.__code__.co_firstlineno + 1  # the block, moved out of (#54 item 1)
        assert f.fix == ("move the computation that feeds the loss out of the `torch.no_grad()` block at "
                         f"test_false_alarm_patterns.py:{line}: `h = self.encoder(x)`")
        assert (f.remedy.applicability, f.remedy.code) == ("code", "h = self.encoder(x)")
        assert (f.remedy.edit.start, f.remedy.edit.end, f.remedy.edit.action) == (line, line + 1, "replace")


def test_encoder_run_under_no_grad_by_mistake_is_an_error_at_the_second_check():
    model = AccidentalNoGrad()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, strict=True) as monitor:
        model(torch.randn(4, 8)).backward()
        assert monitor.check().findings == []  # the first check cannot tell it from a target network
        opt.step()
        opt.zero_grad()
        model(torch.randn(4, 8)).backward()
        with pytest.raises(leafwatch.LeafwatchError, match=r"missing_grad\s+encoder \(since step \d+\)\n.*`encoder\.\{bias,weight\}`") as raised:
            monitor.check()
    _assert_accidental_no_grad(raised.value.report)


def test_encoder_run_under_no_grad_by_mistake_is_decided_when_a_one_step_run_ends():
    model = AccidentalNoGrad()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        model(torch.randn(4, 8)).backward()
        assert monitor.check().findings == []
        opt.step()
    _assert_accidental_no_grad(monitor.close())


class AccidentalNoGradModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = AccidentalNoGrad()

    def training_step(self, batch, batch_idx):
        return self.model(batch[0])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.1)


@pytest.mark.parametrize("max_steps", [1, 3])
def test_encoder_run_under_no_grad_by_mistake_is_caught_by_the_lightning_callback(tmp_path, max_steps):
    callback = LeafWatch(strict=max_steps > 1)
    module = AccidentalNoGradModule()
    if max_steps > 1:
        with pytest.raises(leafwatch.LeafwatchError, match=r"missing_grad\s+model\.encoder"):
            _trainer(tmp_path, callback, max_steps=max_steps).fit(module, _loader())
        assert module.global_step == 1  # raised at the second check
    else:
        with pytest.warns(leafwatch.LeafwatchWarning):
            _trainer(tmp_path, callback, max_steps=1).fit(module, _loader())
    report = callback.report
    assert report.names("missing_grad") == {"model.encoder.weight", "model.encoder.bias"}
    assert all("did not change between checks either" in f.cause for f in report.by_kind("missing_grad"))


def test_encoder_run_under_no_grad_by_mistake_is_caught_by_leafwatch_run(tmp_path):
    script = """
        import torch
        from torch import nn
        encoder, head = nn.Linear(8, 8), nn.Linear(8, 1)
        model = nn.Sequential(encoder, head)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        for step in range(5):
            with torch.no_grad():
                h = encoder(torch.randn(4, 8))
            opt.zero_grad()
            head(h).pow(2).mean().backward()
            opt.step()
    """
    result = _leafwatch_run(tmp_path, script, "--strict")
    assert result.returncode == 1, result.stderr
    assert re.search(r"ERROR missing_grad `0` \(2 tensors: 0\.\{bias,weight\}\)", result.stderr), result.stderr
    assert "did not change between checks either" in result.stderr


def test_a_tensor_in_no_optimizer_that_no_gradient_reached_is_no_finding():
    """The gradient rule: in no optimizer and no gradient is a part neither trained nor used (or an
    EMA copy, a teacher): nothing was computed and left unapplied, so nothing is reported."""
    model = nn.ModuleDict({"used": nn.Linear(3, 1), "unused": nn.Linear(3, 1)})
    opt = torch.optim.SGD(model["used"].parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(3):
            model["used"](torch.randn(2, 3)).sum().backward()
            report = monitor.check()
            assert leafwatch.audit(model, opt).findings == []
            opt.step()
            opt.zero_grad()
    assert report.findings == [] and monitor.report.findings == []


def test_change_evidence_reads_version_pointer_and_values():
    evidence = ChangeEvidence()
    still, bumped, moved, through_data = (torch.zeros(4) for _ in range(4))
    for t in (still, bumped, moved, through_data):
        assert evidence.verdict(t) == "unknown"
    bumped.add_(1.0)
    moved.data = moved.data + 1.0
    through_data.data.mul_(2.0).add_(1.0)
    assert through_data._version == 0  # `.data` in place: only the values tell
    assert [evidence.verdict(t) for t in (still, bumped, moved, through_data)] == ["unchanged", "changed",
                                                                                  "changed", "changed"]


# -- LayerDrop -------------------------------------------------------------------------------
def _wav2vec2():
    transformers = require_module("transformers")
    config = transformers.Wav2Vec2Config(
        hidden_size=16, num_hidden_layers=6, num_attention_heads=2, intermediate_size=32,
        conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, mask_time_prob=0.0, vocab_size=12,
        hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
    )
    assert config.layerdrop == 0.1  # the library's default
    torch.manual_seed(0)
    return transformers.Wav2Vec2Model(config).train()


def _layers_run(model, audio: torch.Tensor) -> set[int]:
    ran: set[int] = set()
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: ran.add(i))
               for i, layer in enumerate(model.encoder.layers)]
    try:
        loss = model(audio).last_hidden_state.pow(2).mean()
    finally:
        for h in handles:
            h.remove()
    loss.backward()
    return ran


@pytest.mark.parametrize("attach", [False, True])
def test_wav2vec2_layerdrop_is_no_error_at_any_step(attach):
    model = _wav2vec2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    monitor = leafwatch.Monitor(model, opt, strict=True)
    if attach:
        monitor.attach()
    torch.manual_seed(2)  # drops layer 2 at step 1
    skipped_at: dict[int, set[int]] = {}
    with monitor:
        for step in range(1, 26):
            opt.zero_grad()
            ran = _layers_run(model, torch.randn(2, 400))
            skipped_at[step] = set(range(6)) - ran
            report = monitor.report if attach else monitor.check()
            opt.step()
            report = monitor.report
            assert report.open == [], (step, str(report))
    assert skipped_at[1] == {2}, "the seed must drop a layer at step 1"
    shown = {f.name for f in monitor.report if f.kind == "missing_grad"}
    assert shown and all(n.startswith("encoder.layers.") for n in shown)
    assert {f.status for f in monitor.report} == {"intermittent"}
    assert all("LayerDrop" in f.message for f in monitor.report)


class Wav2Vec2Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.wav2vec2 = _wav2vec2()

    def training_step(self, batch, batch_idx):
        return self.wav2vec2(batch[0]).last_hidden_state.pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def test_wav2vec2_layerdrop_is_no_error_with_the_lightning_callback(tmp_path):
    callback = LeafWatch(strict=True)
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(24, 400, generator=g)), batch_size=2)
    torch.manual_seed(3)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _trainer(tmp_path, callback, max_steps=12).fit(Wav2Vec2Module(), data)
    assert _no_leafwatch_warnings(record) == []
    assert callback.report.open == []


def test_wav2vec2_layerdrop_is_no_error_under_leafwatch_run(tmp_path):
    require_module("transformers")  # the script below imports it
    script = """
        import torch, transformers
        config = transformers.Wav2Vec2Config(
            hidden_size=16, num_hidden_layers=6, num_attention_heads=2, intermediate_size=32,
            conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2, mask_time_prob=0.0)
        torch.manual_seed(0)
        model = transformers.Wav2Vec2Model(config).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for step in range(12):
            opt.zero_grad()
            model(torch.randn(2, 400)).last_hidden_state.pow(2).mean().backward()
            opt.step()
        print("done")
    """
    result = _leafwatch_run(tmp_path, script, "--strict")
    assert result.returncode == 0, result.stderr
    assert "ERROR" not in result.stderr and "WARNING" not in result.stderr, result.stderr


class OffByOne(nn.Module):
    """A stack whose loop leaves out the last layer (``range(len(self.layers) - 1)``)."""

    def __init__(self, layerdrop: float = 0.0) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(6))
        self.layerdrop = layerdrop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(len(self.layers) - 1):
            if self.training and torch.rand([]) < self.layerdrop:
                continue
            x = torch.relu(self.layers[i](x))
        return x.pow(2).mean()


@pytest.mark.parametrize(("layerdrop", "named_by"), [(0.0, 1), (0.1, 10)])
def test_a_layer_never_called_is_named_within_a_few_steps(layerdrop, named_by):
    torch.manual_seed(1)
    model = OffByOne(layerdrop)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    named_at = None
    with leafwatch.Monitor(model, opt) as monitor:
        for step in range(1, 13):
            opt.zero_grad()
            model(torch.randn(4, 8)).backward()
            report = monitor.check()
            opt.step()
            found = [f for f in report.open if f.kind == "missing_grad"]
            if found and named_at is None:
                named_at = step
                assert [f.name for f in found] == ["layers.5"]  # one layer never called: one mistake
                assert set(found[0].names) == {"layers.5.weight", "layers.5.bias"}
                named = found
    assert named_at is not None and named_at <= named_by, named_at
    found = named
    for f in found:
        assert (f.severity, f.status) == ("error", "open")
        assert "`layers.5` never ran" in f.cause
        assert "siblings in `layers` ran" in f.cause


def test_layerdrop_false_alarm_chance_is_tiny():
    # 12 layers, LayerDrop 0.1: a layer is named only once p**k < 1e-9, that is after 9 skips
    # in a row from the start; one run's false alarm chance is at most 12 * 0.1**9.
    k = math.ceil(math.log(LAYERDROP_FALSE_ALARM) / math.log(0.1))
    assert k == 9 and 12 * 0.1 ** k == pytest.approx(1.2e-8)


# -- closure optimizers with attach() ---------------------------------------------------------
class Sequence(nn.Module):
    """pytorch/examples time_sequence_prediction, smaller."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 12)
        self.lstm2 = nn.LSTMCell(12, 12)
        self.linear = nn.Linear(12, 1)

    def forward(self, input: torch.Tensor, future: int = 0) -> torch.Tensor:
        outputs = []
        h_t = torch.zeros(input.size(0), 12, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 12, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 12, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 12, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            outputs += [self.linear(h_t2)]
        return torch.cat(outputs, dim=1)


def _sine_data() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(21, dtype=torch.double)[None, :] + torch.arange(4, dtype=torch.double)[:, None]
    data = torch.sin(x / 4.0)
    return data[:, :-1], data[:, 1:]


def test_lbfgs_with_a_closure_and_attach_is_no_finding_at_any_step():
    torch.manual_seed(0)
    seq = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
    input, target = _sine_data()
    monitor = leafwatch.Monitor(seq, optimizer, strict=True).attach()
    with monitor:
        for _ in range(3):
            def closure():
                optimizer.zero_grad()
                loss = criterion(seq(input), target)
                loss.backward()
                return loss

            optimizer.step(closure)
            assert monitor.report.findings == []
            assert monitor.report.step >= 1
    assert monitor.report.findings == []


def test_non_closure_optimizer_missing_gradients_is_still_caught_with_attach():
    seq = Sequence().double()
    seq.unused_head = nn.Linear(12, 1).double()
    optimizer = torch.optim.SGD(seq.parameters(), lr=0.1)
    input, target = _sine_data()
    with leafwatch.Monitor(seq, optimizer).attach() as monitor:
        optimizer.zero_grad()
        nn.MSELoss()(seq(input), target).backward()
        optimizer.step()
        report = monitor.report
    assert report.names("missing_grad") == {"unused_head.weight", "unused_head.bias"}
    assert all("`unused_head` never ran" in f.cause and f.severity == "error" for f in report.by_kind("missing_grad"))


def test_lbfgs_with_a_closure_is_no_finding_under_leafwatch_run(tmp_path):
    script = """
        import torch
        from torch import nn
        seq = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
        optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
        x, y = torch.randn(16, 4, dtype=torch.double), torch.randn(16, 1, dtype=torch.double)
        for step in range(4):
            def closure():
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(seq(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
    """
    result = _leafwatch_run(tmp_path, script, "--strict")
    assert result.returncode == 0, result.stderr
    assert "missing_grad" not in result.stderr, result.stderr


# -- deliberate mixed dtypes and devices ------------------------------------------------------
def _keep_in_fp32_like_from_pretrained(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """What ``from_pretrained(..., dtype=torch.float16)`` does: every weight in ``dtype`` except
    those matching ``_keep_in_fp32_modules`` (``PreTrainedModel._get_dtype_plan``), which a regex
    search over the parameter names keeps in float32."""
    keep = list(model._keep_in_fp32_modules or []) if dtype == torch.float16 else []
    pattern = re.compile("|".join(k.replace("*", ".*") for k in keep)) if keep else None
    model.to(dtype)
    for name, p in model.named_parameters():
        if pattern is not None and pattern.search(name):
            p.data = p.data.float()
    return model


def test_t5_keep_in_fp32_modules_is_no_device_mismatch():
    transformers = require_module("transformers")
    config = transformers.T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2,
                                   decoder_start_token_id=0)
    model = _keep_in_fp32_like_from_pretrained(transformers.T5ForConditionalGeneration(config), torch.float16)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert dtypes["encoder.block.0.layer.1.DenseReluDense.wo.weight"] == torch.float32
    assert dtypes["encoder.block.0.layer.1.DenseReluDense.wi.weight"] == torch.float16
    opt = torch.optim.Adam(model.parameters())
    with leafwatch.Monitor(model, opt, strict=True) as monitor:
        assert monitor.scan().findings == []  # the structure, before any gradient


def _openai_clip_convert_weights(model: nn.Module) -> None:
    """openai/CLIP's ``convert_weights``: Conv/Linear/MultiheadAttention weights and the
    ``text_projection``/``proj`` parameters to fp16; embeddings, norms and ``logit_scale`` stay fp32."""

    def _convert_weights_to_fp16(layer: nn.Module) -> None:
        if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Linear)):
            layer.weight.data = layer.weight.data.half()
            if layer.bias is not None:
                layer.bias.data = layer.bias.data.half()
        if isinstance(layer, nn.MultiheadAttention):
            for attr in [*[f"{s}_proj_weight" for s in ["in", "q", "k", "v"]], "in_proj_bias", "bias_k", "bias_v"]:
                tensor = getattr(layer, attr)
                if tensor is not None:
                    tensor.data = tensor.data.half()
        for name in ["text_projection", "proj"]:
            if hasattr(layer, name):
                attr = getattr(layer, name)
                if isinstance(attr, torch.Tensor):
                    attr.data = attr.data.half()

    model.apply(_convert_weights_to_fp16)


class TinyCLIP(nn.Module):
    """The parts of OpenAI's CLIP that its fp16 conversion treats differently."""

    def __init__(self) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(32, 16)
        self.positional_embedding = nn.Parameter(torch.randn(6, 16))
        self.transformer = nn.ModuleList(nn.MultiheadAttention(16, 2) for _ in range(2))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(2))
        self.ln_final = nn.LayerNorm(16)
        self.text_projection = nn.Parameter(torch.randn(16, 8))
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))


def test_openai_clip_fp16_conversion_is_no_device_mismatch():
    model = TinyCLIP()
    _openai_clip_convert_weights(model)
    assert model.logit_scale.dtype == torch.float32 and model.text_projection.dtype == torch.float16
    with leafwatch.Monitor(model, torch.optim.Adam(model.parameters())) as monitor:
        assert monitor.scan().findings == []


class RouterMoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4, bias=False)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 32, bias=False)


def test_float32_router_gate_norm_and_lm_head_in_a_bfloat16_model_are_no_finding():
    model = RouterMoE().to(torch.bfloat16)
    for kept in (model.gate, model.norm, model.lm_head):
        kept.float()
    with leafwatch.Monitor(model, torch.optim.AdamW(model.parameters())) as monitor:
        assert monitor.scan().findings == []


def test_float16_layer_in_a_float32_model_is_still_a_mismatch():
    model = RouterMoE()
    model.experts[2].half()  # converted on its own by mistake: its small updates are rounded away
    (finding,) = leafwatch.audit(model, torch.optim.AdamW(model.parameters()),
                                 check_values=False).by_kind("device_mismatch")
    assert finding.name == "experts.2" and finding.severity == "warning"
    assert {m.name for m in finding.members} == {"experts.2.weight", "experts.2.bias"}
    assert "float16 while the other trainable parameters are float32" in finding.message
    assert "rounded to float16" in finding.cause


class Staged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.stage0 = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.stage1 = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))


def test_whole_modules_placed_on_another_device_are_no_finding():
    # "meta" is the second device this CPU machine can build: the stage and the embeddings are
    # placed as whole modules, the way pipeline stages and CPU-offloaded embeddings are.
    model = Staged()
    model.stage1.to("meta")
    with leafwatch.Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1)) as monitor:
        assert monitor.scan().findings == []


def test_a_model_with_a_device_map_is_no_finding():
    model = Staged()
    model.stage1[2].bias = nn.Parameter(torch.zeros(8, device="meta"))
    model.hf_device_map = {"embed": "cpu", "stage0": "cpu", "stage1": "meta"}  # as device_map="auto" sets
    with leafwatch.Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1)) as monitor:
        assert monitor.scan().findings == []


def test_a_lone_parameter_on_another_device_is_still_a_mismatch():
    model = Staged()
    model.scale = nn.Parameter(torch.ones([], device="meta"))  # registered after the model was moved
    (finding,) = leafwatch.audit(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 check_values=False).by_kind("device_mismatch")
    assert (finding.name, finding.severity, finding.device) == ("scale", "warning", "meta")
    assert "on meta while the other trainable parameters are on cpu" in finding.message


@pytest.mark.parametrize(
    ("module", "device", "below", "spread", "expected"),
    [
        ("stage1", "cuda:1", {"": {"cuda:0", "cuda:1"}, "stage1": {"cuda:1"}}, False, True),   # pipeline stage
        ("embed", "cpu", {"": {"cuda:0", "cpu"}, "embed": {"cpu"}}, False, True),             # offloaded embeddings
        ("", "cpu", {"": {"cuda:0", "cpu"}}, False, False),                                   # a root parameter left behind
        ("head", "cpu", {"": {"cuda:0", "cpu"}, "head": {"cuda:0", "cpu"}}, False, False),    # a bias left behind
        ("head", "cpu", {"": {"cuda:0", "cpu"}, "head": {"cuda:0", "cpu"}}, True, True),      # device_map says so
    ],
)
def test_device_placement_decision(module, device, below, spread, expected):
    assert device_on_purpose(module, device, below, spread) is expected


@pytest.mark.parametrize(
    ("dtype", "main", "expected"),
    [
        (torch.float32, torch.float16, False), (torch.float32, torch.bfloat16, False),
        (torch.float16, torch.float32, True), (torch.bfloat16, torch.float32, True),
        (torch.float64, torch.float32, True), (torch.bfloat16, torch.float16, True),
    ],
)
def test_dtype_decision(dtype, main, expected):
    assert dtype_changes_training(dtype, main) is expected


# -- strict at fit start; info; ignore= in the text -------------------------------------------
class WithPlainTensorInOptimizer(pl.LightningModule):
    def __init__(self, bug: str) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.bug = bug
        self.steps_run = 0
        if bug == "not_in_optimizer":
            self.loss_weight = nn.Parameter(torch.ones(1))
        if bug == "frozen_parameter":
            self.frozen = nn.Parameter(torch.ones(1), requires_grad=False)

    def training_step(self, batch, batch_idx):
        self.steps_run += 1
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        return loss * self.loss_weight if self.bug == "not_in_optimizer" else loss

    def configure_optimizers(self):
        if self.bug == "plain_tensor":
            return torch.optim.SGD([*self.layer.parameters(), torch.zeros(3)], lr=0.1)
        if self.bug == "frozen_parameter":
            return torch.optim.SGD([*self.layer.parameters(), self.frozen], lr=0.1)
        return torch.optim.SGD(self.layer.parameters(), lr=0.1)


def test_strict_raises_at_the_first_check_never_at_the_fit_start_scan(tmp_path):
    """One rule for every callback (Lightning, Hugging Face): the fit-start scan reports, strict
    mode raises from a check, after a real step."""
    module = WithPlainTensorInOptimizer("plain_tensor")
    with pytest.raises(leafwatch.LeafwatchError, match="frozen_in_optimizer"):
        _trainer(tmp_path, LeafWatch(strict=True)).fit(module, _loader())
    assert module.steps_run == 1
    module = WithPlainTensorInOptimizer("not_in_optimizer")
    with pytest.raises(leafwatch.LeafwatchError, match=r"not_in_optimizer\s+loss_weight"):
        _trainer(tmp_path, LeafWatch(strict=True)).fit(module, _loader())
    # It waited for the first check, where the gradient is seen, and for the next one, where the
    # value is seen not to change (the gradient rule: a tensor updated by hand would have changed).
    assert module.steps_run == 2


def test_a_frozen_parameter_in_the_optimizer_is_quiet_info(tmp_path):
    callback = LeafWatch(strict=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _trainer(tmp_path, callback, max_steps=2).fit(WithPlainTensorInOptimizer("frozen_parameter"), _loader())
    assert _no_leafwatch_warnings(record) == []
    (finding,) = callback.report.findings
    assert (finding.kind, finding.name, finding.severity, finding.is_open) == ("frozen_in_optimizer", "frozen", "info", False)
    assert "will not train" not in finding.message


def test_bert_pooler_with_the_mlm_loss_only_gives_the_ignore_pattern():
    transformers = require_module("transformers")
    config = transformers.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(config)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 32, (2, 8))

    def step(monitor: leafwatch.Monitor) -> leafwatch.Report:
        opt.zero_grad()
        out = model(input_ids=ids)
        F.cross_entropy(out.prediction_logits.reshape(-1, 32), ids.reshape(-1)).backward()  # MLM only
        return monitor.check()

    with leafwatch.Monitor(model, opt) as monitor:
        report = step(monitor)
    pooler = [f for f in report.tensors("missing_grad") if f.name.startswith("bert.pooler.")]
    assert {f.name for f in pooler} == {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    assert all('`ignore=["bert.pooler.dense.*"]`' in f.fix for f in pooler)
    ignore = sorted({re.search(r'ignore=\["([^"]+)"\]', f.fix).group(1) for f in report.by_kind("missing_grad")})
    with leafwatch.Monitor(model, opt, ignore=ignore) as monitor:
        assert step(monitor).open == []


# -- an optimizer that steps for the first time late (leafwatch run) --------------------------
GAN_SCRIPT = """
    import torch
    from torch import nn

    class WGAN(nn.Module):
        def __init__(self):
            super().__init__()
            self.generator = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            self.critic = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))

    model = WGAN()
    opt_d = torch.optim.Adam(model.critic.parameters(), lr=1e-4)
    opt_g = torch.optim.Adam(model.generator.parameters(), lr=1e-4)
    n_critic, G_STEPS = 5, {g_steps}
    for i in range(30):
        real, z = torch.randn(16, 2), torch.randn(16, 4)
        fake = model.generator(z).detach()
        d_loss = -model.critic(real).mean() + model.critic(fake).mean()
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        if i % n_critic == n_critic - 1 and G_STEPS:
            g_loss = -model.critic(model.generator(z)).mean()
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
    print("done")
"""


def test_an_optimizer_that_steps_late_is_no_false_alarm_under_leafwatch_run(tmp_path):
    result = _leafwatch_run(tmp_path, GAN_SCRIPT.format(g_steps=True), "--strict")
    assert result.returncode == 0, result.stderr
    assert "not_in_optimizer" not in result.stderr, result.stderr


def test_a_generator_whose_optimizer_never_steps_is_a_warning_then_an_error_at_the_end(tmp_path):
    result = _leafwatch_run(tmp_path, GAN_SCRIPT.format(g_steps=False))
    assert result.returncode == 0, result.stderr
    before, summary = result.stderr.split("leafwatch: summary")
    # Held while the optimizer may still step (the grace period of `run`), decided as a warning.
    # One generator, one mistake: its tensors listed.
    assert re.search(r"WARNING not_in_optimizer `generator` \(4 tensors: generator\.\{0,2\}\.\{bias,weight\}\) "
                     r"seen at step \d+, decided at step \d+", before), result.stderr
    assert re.search(r"ERROR\s+not_in_optimizer\s+generator \(since", summary), summary
    assert "each of `generator.{0,2}.{bias,weight}` is held only by an optimizer that never stepped in" in summary
    assert "cause: `opt_g` (an `Adam`) was created with it, but its `step()` is never called" in summary
    assert "fix (code): call `opt_g.step()` after the backward pass" in summary and "opt_d" not in summary


# -- CUDA (skipped without a GPU) ---------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
def test_change_evidence_on_cuda_reads_the_fingerprint_one_look_later():
    evidence = ChangeEvidence()
    t = torch.zeros(1024, device="cuda")
    assert evidence.verdict(t) == "unknown"
    t.data.mul_(2.0).add_(1.0)  # neither the version nor the storage moves
    torch.cuda.synchronize()
    first = evidence.verdict(t)  # the second fingerprint is launched here, read at the next look
    assert first in ("unknown", "changed")
    torch.cuda.synchronize()
    assert evidence.verdict(t) == "changed"


@needs_cuda
def test_embeddings_offloaded_to_the_cpu_are_no_device_mismatch_on_cuda():
    model = Staged().cuda()
    model.embed.cpu()  # CPU-offloaded embeddings
    with leafwatch.Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1)) as monitor:
        assert monitor.scan().findings == []

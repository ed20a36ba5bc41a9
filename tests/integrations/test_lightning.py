"""The Lightning callback with real Trainers: findings, loggers, strict mode, resume, namespaces."""

from __future__ import annotations

import csv
import importlib
import json
import os
import pickle
import shlex
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
from _requirements import require_module
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import leafwatch

# Every test here runs a real Trainer: without Lightning the file skips (locally) or fails (in CI).
pl = require_module("pytorch_lightning")
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger  # noqa: E402

from leafwatch import LeafWatch, LeafwatchError  # noqa: E402
from leafwatch.integrations.lightning import callback_class  # noqa: E402


def loader(n: int = 16, batch_size: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)),
                      batch_size=batch_size)


def trainer(tmp_path: Path, callback: LeafWatch, *, logger=None, max_steps: int = 3, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=TensorBoardLogger(tmp_path) if logger is None else logger,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        **kwargs,
    )


class Boring(pl.LightningModule):
    """One linear layer, MSE loss, SGD over every parameter: nothing to find."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Buggy(Boring):
    """Three seeded bugs: an unused head, a loss weight left out of the optimizer, a moved temperature."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 1)  # never used
        self.loss_weight = nn.Parameter(torch.ones(1))  # not in the optimizer
        self.temperature = torch.ones(1, requires_grad=True).to(torch.float64)  # a non-leaf copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) / self.temperature.to(x.dtype)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss_weight * nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD([p for n, p in self.named_parameters() if n != "loss_weight"], lr=0.01)


class UnusedHead(Boring):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 1)


def assert_seeded_bugs(report: leafwatch.Report) -> None:
    assert report.names("missing_grad") == {"head.weight", "head.bias"}
    assert report.names("not_in_optimizer") == {"loss_weight"}
    assert report.names("orphan_tensor") == {"temperature"}
    by_key = {(f.kind, f.name): f for f in report}  # one finding per mistake: the unused head is one
    assert by_key[("missing_grad", "head")].names == ("head.bias", "head.weight")
    assert "never ran" in by_key[("missing_grad", "head")].cause
    assert "left out" in by_key[("not_in_optimizer", "loss_weight")].cause
    temperature = by_key[("orphan_tensor", "temperature")]
    assert "ToCopyBackward" in temperature.cause and "not a leaf" in temperature.cause
    # fixes in the user's terms: the right-hand side the class wrote, and Lightning's own place for
    # the optimizer (never a plain-loop `add_param_group` or a made-up `AdamW(model.parameters())`)
    assert "`self.temperature = nn.Parameter(torch.ones(1).to(torch.float64))`" in temperature.fix
    left_out = by_key[("not_in_optimizer", "loss_weight")]
    # configure_optimizers' own statement, its params argument given the left-out tensor too (#47)
    given = ('return torch.optim.SGD([*[p for n, p in self.named_parameters() if n != "loss_weight"], '
             'self.loss_weight], lr=0.01)')
    assert f"in `configure_optimizers`, give `self.loss_weight` to your `SGD` with the rest: `{given}`" in left_out.fix
    assert "add_param_group" not in left_out.fix and "AdamW" not in left_out.fix
    edit = left_out.remedy.edit
    statement = Buggy.configure_optimizers.__code__.co_firstlineno + 1
    assert (edit.path, edit.start, edit.end, edit.action, edit.text) == (
        __file__, statement, statement, "replace", f"        {given}\n")
    # Each fix says what it is: the line to paste, or advice.
    assert {f.name: f.remedy.applicability for f in report} == {
        "head": "words", "loss_weight": "code", "temperature": "code"}
    assert all(f.remedy.applicability in ("code", "words") for f in report.tensors() if f.fix)


def assert_no_hooks(model: nn.Module) -> None:
    assert all(not m._forward_hooks for m in model.modules())


def event_accumulator(log_dir: str) -> EventAccumulator:
    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_seeded_bugs_are_named_and_written_to_tensorboard(tmp_path):
    model, callback = Buggy(), LeafWatch(log_every_n_steps=1)
    t = trainer(tmp_path, callback)
    with pytest.warns(leafwatch.LeafwatchWarning, match=r"missing_grad `head` \(2 tensors: head\.\{bias,weight\}\)"):
        t.fit(model, loader())
    report = callback.report
    assert_seeded_bugs(report)
    assert report.step == 3
    by_key = {(f.kind, f.name): f for f in report}
    assert by_key[("missing_grad", "head")].first_step == 1
    assert by_key[("not_in_optimizer", "loss_weight")].first_step == 0  # found at fit start
    # Its gradient is first seen at step 1; step 2 sees its value unchanged and decides (the gradient rule).
    assert by_key[("not_in_optimizer", "loss_weight")].details["decided_step"] == 2
    assert callback.monitor is None
    assert_no_hooks(model)

    acc = event_accumulator(t.logger.log_dir)
    missing = acc.Scalars("leafwatch/open/missing_grad")
    assert [e.step for e in missing] == [1, 2, 3] and missing[-1].value == 1  # one mistake: the unused head
    assert acc.Scalars("leafwatch/open/not_in_optimizer")[-1].value == 1
    coverage = acc.Scalars("leafwatch/grad_coverage")
    assert coverage[-1].value == pytest.approx(0.5)  # head.weight and head.bias of the 4 tensors miss
    text = acc.Tensors("leafwatch/findings/text_summary")[-1].tensor_proto.string_val[0].decode()
    for name in ("`head` (2 tensors: head.{bias,weight})", "loss_weight", "temperature"):
        assert name in text
    assert "| (code) register it where it is assigned: `self.temperature = " in text
    record = json.loads(acc.Tensors("leafwatch/report")[-1].tensor_proto.string_val[0])
    assert record["counts"]["missing_grad"] == 1 and record["version"] == 3
    # The tab's record carries the mark with the fix.
    assert {f["name"]: f["remedy"]["applicability"] for f in record["findings"]} == {
        "head": "words", "loss_weight": "code", "temperature": "code"}
    # ... and what the patch needs: the folder, each edited file's hash, each code fix's hunk (#47).
    assert record["patch"]["root"] == os.getcwd() and list(record["patch"]["files"]) == [__file__]
    hunks = {h["name"]: h["diff"] for h in record["patch"]["hunks"]}
    assert set(hunks) == {"loss_weight", "temperature"}
    assert "+        return torch.optim.SGD([*[p for n, p in self.named_parameters()" in hunks["loss_weight"]


def test_clean_model_with_validation_test_and_clipping_has_no_findings(tmp_path):
    model, callback = Boring(), LeafWatch(log_every_n_steps=1)
    t = pl.Trainer(
        max_steps=4, accelerator="cpu", devices=1, logger=TensorBoardLogger(tmp_path), callbacks=[callback],
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        limit_val_batches=1, val_check_interval=1, gradient_clip_val=0.5,
    )
    t.fit(model, loader(), loader())
    assert callback.report.findings == []
    assert callback.report.step == 4
    t.test(model, loader())
    assert callback.monitor is None and callback.report.findings == []
    acc = event_accumulator(t.logger.log_dir)
    assert all(e.value == 0 for e in acc.Scalars("leafwatch/open/missing_grad"))
    assert [e.value for e in acc.Scalars("leafwatch/grad_coverage")] == [1.0] * 4


def test_a_module_the_loss_uses_that_the_lightning_module_does_not_own_is_named_by_the_callback(tmp_path):
    """A learned loss weighting kept outside the LightningModule (a script-level object its
    training_step uses): it gets gradients and no optimizer holds it; named by the user's name."""
    weighting = nn.Linear(1, 1)

    class WeightedLoss(Boring):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return weighting(nn.functional.mse_loss(self(x), y).reshape(1, 1)).sum()

    model, callback = WeightedLoss(), LeafWatch(verbose=False)
    trainer(tmp_path, callback).fit(model, loader())
    (f,) = callback.report.open
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "weighting", "warning")  # a whole module: both fixes
    assert callback.report.names("not_in_optimizer") == {"weighting.weight", "weighting.bias"}
    assert f.cause.startswith("no optimizer holds `weighting` (none of its tensors): its optimizer was forgotten")
    assert "in `configure_optimizers`, give `weighting.parameters()` to your `SGD`" in f.fix
    assert "`weighting.requires_grad_(False)`" in f.fix
    assert not any(m._forward_pre_hooks for m in (model, weighting))


def test_once_the_modules_a_step_runs_are_stable_the_callback_stops_asking_for_them(tmp_path, monkeypatch):
    """After STABLE_STEPS checks with the same extra modules, the global hook is gone and the callback
    drops the discovery: no call per step for it (the finding on the extra module stays)."""
    from leafwatch.observe import discovery

    updates: list[int] = []
    update = discovery.Discovery.update
    monkeypatch.setattr(discovery.Discovery, "update", lambda self: updates.append(1) or update(self))
    weighting = nn.Linear(1, 1)

    class WeightedLoss(Boring):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return weighting(nn.functional.mse_loss(self(x), y).reshape(1, 1)).sum()

    callback = LeafWatch(verbose=False)
    steps = discovery.STABLE_STEPS + 10
    trainer(tmp_path, callback, max_steps=steps).fit(WeightedLoss(), loader(n=4 * steps))
    assert len(updates) == discovery.STABLE_STEPS + 1  # the first reading, then the stable ones, then none
    assert callback.report.names("not_in_optimizer") == {"weighting.weight", "weighting.bias"}
    assert not torch.nn.modules.module._global_forward_pre_hooks


class LateLayer(Boring):
    """A layer created in the module's `on_fit_start`: Lightning has built the optimizer by then
    (the callbacks' `on_fit_start`, then the module's, run after `configure_optimizers`)."""

    def on_fit_start(self):
        self.proj = nn.Linear(1, 1)  # the line the cause names

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.proj(self(x)), y)


def test_a_layer_created_in_on_fit_start_says_when_and_where_and_the_fix_moves_it_before_the_optimizer(tmp_path):
    import inspect

    callback = LeafWatch(verbose=False)
    trainer(tmp_path, callback).fit(LateLayer(), loader())
    (f,) = callback.report.open
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "proj", "error")
    assert f.reason.name == "created_after_optimizer"
    line = inspect.getsourcelines(LateLayer.on_fit_start)[1] + 1
    assert f.cause.startswith(f"`proj` was created at test_lightning.py:{line} in `LateLayer.on_fit_start`, "
                              "after the optimizer was built")
    # Not "give self.proj.parameters() to configure_optimizers": the layer does not exist there yet.
    assert f.fix.startswith("create `proj` in `__init__` (or `setup`), before Lightning calls `configure_optimizers`")
    assert "configure_optimizers`, give" not in f.fix


def test_a_frozen_teacher_outside_the_lightning_module_is_quiet(tmp_path):
    teacher = nn.Linear(8, 1)  # requires grad, run under no_grad: no gradient, never judged

    class Distilled(Boring):
        def training_step(self, batch, batch_idx):
            x, _ = batch
            with torch.no_grad():
                target = teacher(x)
            return nn.functional.mse_loss(self(x), target)

    callback = LeafWatch(verbose=False)
    trainer(tmp_path, callback).fit(Distilled(), loader())
    assert callback.report.step == 3 and callback.report.findings == []


class GAN(pl.LightningModule):
    """Manual optimization with two optimizers and ``toggle_optimizer``."""

    def __init__(self, rebuild_while_toggled: bool = True) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Linear(4, 8)
        self.discriminator = nn.Linear(8, 1)
        self.rebuild_while_toggled = rebuild_while_toggled

    def training_step(self, batch, batch_idx):
        real, _ = batch
        g_opt, d_opt = self.optimizers()
        z = torch.randn(real.shape[0], 4)

        self.toggle_optimizer(g_opt)
        if self.rebuild_while_toggled:
            # Registering any parameter makes leafwatch re-read the structure at the next check,
            # which happens while the discriminator's parameters are toggled off.
            nn.Linear(1, 1)
        g_loss = -self.discriminator(self.generator(z)).mean()
        self.manual_backward(g_loss)
        g_opt.step()
        g_opt.zero_grad()
        self.untoggle_optimizer(g_opt)

        self.toggle_optimizer(d_opt)
        fake = self.generator(z).detach()
        d_loss = self.discriminator(fake).mean() - self.discriminator(real).mean()
        self.manual_backward(d_loss)
        d_opt.step()
        d_opt.zero_grad()
        self.untoggle_optimizer(d_opt)

    def configure_optimizers(self):
        return (torch.optim.SGD(self.generator.parameters(), lr=0.01),
                torch.optim.SGD(self.discriminator.parameters(), lr=0.01))


def test_manual_optimization_with_toggled_optimizers_has_no_false_alarm(tmp_path):
    model, callback = GAN(), LeafWatch()
    t = trainer(tmp_path, callback, max_steps=4)
    t.fit(model, DataLoader(TensorDataset(torch.randn(16, 8), torch.zeros(16)), batch_size=4))
    assert callback.report.findings == []
    assert callback.report.step == 4  # one check per optimizer step, two per batch
    assert all(p.requires_grad for p in model.parameters())


def test_accumulate_grad_batches_checks_only_at_optimizer_steps(tmp_path):
    model, callback = Boring(), LeafWatch(log_every_n_steps=1)
    t = trainer(tmp_path, callback, max_steps=3, accumulate_grad_batches=2)
    t.fit(model, loader(n=32))
    assert callback.report.findings == []
    acc = event_accumulator(t.logger.log_dir)
    assert [e.step for e in acc.Scalars("leafwatch/grad_coverage")] == [1, 2, 3]  # 6 batches, 3 steps


class StepProbe(pl.Callback):
    """After the LeafWatch callback: the step it checked at, next to ``trainer.global_step + 1``."""

    def __init__(self, watched: LeafWatch, swap_at: int | None = None) -> None:
        self.watched, self.swap_at, self.seen = watched, swap_at, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.swap_at:  # a counter that stops agreeing (another Lightning layout)
            from pytorch_lightning.loops.progress import _ReadyCompletedTracker

            self.watched._counter = _ReadyCompletedTracker()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.seen.append((self.watched.monitor.step, trainer.global_step + 1))


@pytest.mark.parametrize("module", ["automatic", "manual, two optimizers", "accumulating"])
def test_checks_are_numbered_by_global_step_read_through_its_counter(tmp_path, module):
    callback = LeafWatch(verbose=False)
    probe = StepProbe(callback)
    model = {"automatic": Boring, "manual, two optimizers": GAN, "accumulating": Boring}[module]()
    t = trainer(tmp_path, callback, logger=False, max_steps=6,
                accumulate_grad_batches=2 if module == "accumulating" else 1)
    t.callbacks.append(probe)
    t.fit(model, loader(n=48))
    assert len(probe.seen) == 6 and all(checked == expected for checked, expected in probe.seen)
    assert callback._counter is None  # released with the Monitor


def test_a_counter_that_stops_agreeing_with_global_step_is_dropped_at_its_next_comparison(tmp_path, monkeypatch):
    from leafwatch.integrations import lightning as module

    monkeypatch.setattr(module, "VERIFY_STEP_EVERY", 3)
    callback = LeafWatch(verbose=False)
    probe = StepProbe(callback, swap_at=3)  # swapped before the 4th read; compared at the 6th
    t = trainer(tmp_path, callback, logger=False, max_steps=8)
    t.callbacks.append(probe)
    counters = []
    t.callbacks.append(type("Spy", (pl.Callback,), {"on_before_optimizer_step": lambda s, *a: counters.append(
        callback._counter)})())
    t.fit(Boring(), loader(n=48))
    assert [c is not None for c in counters] == [True] * 5 + [False] * 3
    assert all(checked == expected for checked, expected in probe.seen[:3] + probe.seen[5:])
    assert [checked for checked, _ in probe.seen[3:5]] == [1, 1]  # the swapped-in count, until compared


def test_bf16_mixed_precision_on_cpu(tmp_path):
    model, callback = UnusedHead(), LeafWatch(verbose=False)
    t = trainer(tmp_path, callback, precision="bf16-mixed")
    t.fit(model, loader())
    report = callback.report
    assert report.names() == {"head.weight", "head.bias"}
    assert all(f.kind == "missing_grad" and "never ran" in f.cause for f in report)


class NaNLoss(Boring):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * float("nan")


def test_nonfinite_gradients_are_found_at_the_step(tmp_path):
    callback = LeafWatch(verbose=False, check_values_every_n_steps=1)
    trainer(tmp_path, callback, logger=False, max_steps=2).fit(NaNLoss(), loader())
    report = callback.report
    assert report.names("nonfinite_grad") == {"layer.weight", "layer.bias"}
    finding = report.by_kind("nonfinite_grad")[0]
    assert finding.first_step == 1 and "NaN or Inf" in finding.message


def test_csv_logger_gets_the_leafwatch_columns(tmp_path):
    model, callback = UnusedHead(), LeafWatch(verbose=False, log_every_n_steps=1)
    logger = CSVLogger(tmp_path)
    t = trainer(tmp_path, callback, logger=logger)
    t.fit(model, loader())
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    rows = [r for r in rows if r.get("leafwatch/open/missing_grad")]
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert float(rows[-1]["leafwatch/open/missing_grad"]) == 1  # open mistakes: the unused head
    assert float(rows[-1]["leafwatch/grad_coverage"]) == pytest.approx(1 / 2)  # head.* of the 4 tensors miss


def test_without_a_logger_it_reports_on_the_console(tmp_path, capsys):
    model, callback = UnusedHead(), LeafWatch()
    t = trainer(tmp_path, callback, logger=False)
    with pytest.warns(leafwatch.LeafwatchWarning, match=r"`head` \(2 tensors: head\.\{bias,weight\}\)"):
        t.fit(model, loader())
    assert callback.report.names("missing_grad") == {"head.weight", "head.bias"}
    out = capsys.readouterr().out
    assert "missing_grad" in out and "head.{bias,weight}" in out  # the table at fit end


class NoParameters(pl.LightningModule):
    """A LightningModule without a parameter and without an optimizer: it logs a loss and trains nothing."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.log("loss", nn.functional.mse_loss(x.sum(dim=1, keepdim=True), y))  # returns None: no backward

    def configure_optimizers(self):
        return None


def test_a_module_without_parameters_is_nothing_to_check_not_no_findings(tmp_path, capsys):
    from leafwatch.report.reader import read_reports

    callback = LeafWatch()
    t = trainer(tmp_path, callback, max_steps=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(NoParameters(), loader())
    said = [w for w in caught if issubclass(w.category, leafwatch.LeafwatchWarning)]
    assert [str(w.message) for w in said] == [
        "leafwatch: nothing to check: no tensor requires grad and nothing is watched (a model without "
        "parameters, or every parameter frozen), so no finding can appear."]  # once, at fit start
    assert said[0].filename == __file__  # the fit line
    report = callback.report
    assert report.nothing_to_check and report.findings == []
    out = capsys.readouterr().out
    assert "leafwatch: nothing to check" in out and "no findings" not in out
    assert str(report).startswith("leafwatch: nothing to check")
    assert str(report).endswith(": no tensor requires grad and nothing is watched")
    (written,) = read_reports(str(tmp_path))  # the record says so too
    assert written.data["nothing_to_check"] is True and written.report.nothing_to_check


def test_finding_warnings_are_short_and_point_at_the_fit_line(tmp_path):
    model, callback = UnusedHead(), LeafWatch()
    t = trainer(tmp_path, callback, logger=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_line = sys._getframe().f_lineno + 1
        t.fit(model, loader())
    ours = [w for w in caught if issubclass(w.category, leafwatch.LeafwatchWarning)]
    assert sorted(str(w.message) for w in ours) == [  # one mistake, one line listing its tensors
        "leafwatch: ERROR missing_grad `head` (2 tensors: head.{bias,weight}) at step 1. Fix (advice): call `head` in "
        "forward(), or remove it (or freeze it with requires_grad_(False) if that is intended); if that is "
        'intended, silence it: `ignore=["head.*"]`',
    ]
    for w in ours:
        assert (w.filename, w.lineno) == (__file__, fit_line)  # the user's line, not leafwatch's or Lightning's
        assert "cause" not in str(w.message).lower()  # the cause waits for the table


class ManualUnusedHead(UnusedHead):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        self.step_line = sys._getframe().f_lineno + 1
        optimizer.step()


def test_with_manual_optimization_the_warning_points_at_the_users_step_call(tmp_path):
    model, callback = ManualUnusedHead(), LeafWatch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, callback, logger=False).fit(model, loader())
    ours = [w for w in caught if issubclass(w.category, leafwatch.LeafwatchWarning)]
    assert [str(w.message).split("`")[1] for w in ours] == ["head"]  # one mistake: the unused head
    assert {(w.filename, w.lineno) for w in ours} == {(__file__, model.step_line)}


def test_an_unmatched_ignore_pattern_warns_at_the_fit_line_not_inside_lightning(tmp_path):
    callback = LeafWatch(ignore={"haed.*": "typo"}, verbose=False)
    t = trainer(tmp_path, callback, logger=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_line = sys._getframe().f_lineno + 1
        t.fit(Boring(), loader())
    (w,) = [w for w in caught if "matches no parameter" in str(w.message)]
    assert issubclass(w.category, leafwatch.LeafwatchWarning)
    assert "'haed.*'" in str(w.message)
    assert (w.filename, w.lineno) == (__file__, fit_line)


def test_findings_of_the_fit_start_scan_say_at_start(tmp_path):
    model, callback = Buggy(), LeafWatch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, callback, logger=False, max_steps=1).fit(model, loader())
    lines = {str(w.message).split("`")[1]: str(w.message) for w in caught
             if issubclass(w.category, leafwatch.LeafwatchWarning)}
    # Seen at the fit-start scan, its gradient seen at the first (and only) check: the end of the
    # run decides it (no later check can show its value changing).
    assert lines["loss_weight"].startswith(
        "leafwatch: ERROR not_in_optimizer `loss_weight` seen at start, decided at step 1. Fix (code): in `configure_optimizers`")
    assert lines["head"].startswith("leafwatch: ERROR missing_grad `head` (2 tensors: head.{bias,weight}) at step 1. Fix (advice): ")
    table = str(callback.report)
    assert "loss_weight (since start, decided at step 1)" in table and "head (since step 1)" in table


def test_strict_raises_naming_the_bugs_and_removes_the_hooks(tmp_path):
    model, callback = Buggy(), LeafWatch(strict=True, verbose=False)
    t = trainer(tmp_path, callback, logger=False)
    with pytest.raises(LeafwatchError, match=r"missing_grad\s+head \(since") as raised:
        t.fit(model, loader())
    message = str(raised.value)
    for name in ("head.{bias,weight}", "temperature"):
        assert name in message
    # loss_weight's gradient is first seen at this check: it is held until the next one shows its
    # value unchanged (the gradient rule), and strict mode stops at this one.
    assert "loss_weight" not in message
    assert raised.value.report.step == 1
    assert callback.monitor is None
    assert_no_hooks(model)


def plain_tensor_in_optimizer(namespace: str) -> pl.LightningModule:
    """A LightningModule of ``namespace`` whose SGD also holds a plain tensor created without
    ``requires_grad``: an error the fit-start scan already sees (``frozen_in_optimizer``)."""
    L = importlib.import_module(namespace)

    class PlainTensorInOptimizer(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 1)
            self.scale = torch.ones(1)  # requires_grad=False: SGD will never update it
            self.training_steps = 0

        def training_step(self, batch, batch_idx):
            self.training_steps += 1
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD([*self.parameters(), self.scale], lr=0.01)

    return PlainTensorInOptimizer()


@pytest.mark.parametrize("namespace", ["pytorch_lightning", "lightning.pytorch"])
def test_strict_reports_at_fit_start_and_raises_at_the_first_check(tmp_path, namespace):
    L = importlib.import_module(namespace)
    model, callback = plain_tensor_in_optimizer(namespace), LeafWatch(strict=True)
    t = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, callbacks=[callback],
                  enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(LeafwatchError, match="frozen_in_optimizer") as raised:
            t.fit(model, loader())
    at_start = [str(w.message) for w in caught if issubclass(w.category, leafwatch.LeafwatchWarning)]
    assert any("frozen_in_optimizer" in line and "at start" in line for line in at_start)
    # Not raised by the fit-start scan: after one real step, from the first check.
    assert model.training_steps == 1
    assert raised.value.report.step == 1
    assert raised.value.report.by_kind("frozen_in_optimizer")[0].first_step == 0
    assert callback.monitor is None
    assert_no_hooks(model)


def test_resume_from_a_checkpoint_keeps_the_history(tmp_path):
    checkpoints = tmp_path / "ckpt"
    first = LeafWatch(verbose=False, ignore={"temperature": "a known demo bug"})
    t = pl.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, callbacks=[first,
                   ModelCheckpoint(dirpath=checkpoints, save_last=True)],
                   enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    t.fit(UnusedHead(), loader())
    assert {f.first_step for f in first.report.by_kind("missing_grad")} == {1}
    checkpoint = torch.load(checkpoints / "last.ckpt", weights_only=False)
    assert first.state_key in checkpoint["callbacks"]

    second = LeafWatch(verbose=False, ignore={"temperature": "a known demo bug"})
    t = trainer(tmp_path, second, logger=False, max_steps=4)
    t.fit(UnusedHead(), loader(), ckpt_path=checkpoints / "last.ckpt")
    report = second.report
    assert report.step == 4
    weight = next(f for f in report.tensors() if f.key == ("missing_grad", "head.weight"))
    assert weight.first_step == 1 and weight.last_step == 4
    assert weight.steps_seen == 4  # steps 1-2 before the resume, 3-4 after


class HeadUsed(UnusedHead):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) + self.head(x)


def test_resume_after_the_bug_is_fixed_closes_the_finding(tmp_path):
    first = LeafWatch(verbose=False)
    path = tmp_path / "unused.ckpt"
    checkpoint_trainer = trainer(tmp_path, first, logger=False, max_steps=2)
    checkpoint_trainer.fit(UnusedHead(), loader())
    checkpoint_trainer.save_checkpoint(path)
    assert first.report.names("missing_grad") == {"head.weight", "head.bias"}

    second = LeafWatch(verbose=False)
    trainer(tmp_path, second, logger=False, max_steps=4).fit(HeadUsed(), loader(), ckpt_path=path)
    report = second.report
    assert not report  # nothing open once the head gets gradients
    assert {f.status for f in report.by_kind("missing_grad")} == {"intermittent"}
    assert "2 of 3 checked steps" in report.by_kind("missing_grad")[0].message


def test_lightning_pytorch_namespace_trainer(tmp_path):
    import lightning.pytorch as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 1)
            self.head = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = LeafWatch(verbose=False)
    assert isinstance(callback, L.Callback) and isinstance(callback, pl.Callback)
    t = L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=L.loggers.TensorBoardLogger(tmp_path),
                  callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
                  enable_checkpointing=False)
    t.fit(Module(), loader())
    assert callback.report.names("missing_grad") == {"head.weight", "head.bias"}
    acc = event_accumulator(t.logger.log_dir)
    assert acc.Scalars("leafwatch/open/missing_grad")[-1].value == 1  # one mistake: the unused head


def test_callback_class_builds_on_one_namespace():
    import lightning.pytorch as L

    only_lightning = callback_class(L.Callback, "LightningLeafWatch")
    callback = only_lightning(patience=2)
    assert isinstance(callback, L.Callback) and not isinstance(callback, pl.Callback)
    assert callback.state_key.startswith("LightningLeafWatch")


def test_state_is_plain_and_picklable(tmp_path):
    model, callback = UnusedHead(), LeafWatch(verbose=False)
    trainer(tmp_path, callback, logger=False, max_steps=2).fit(model, loader())
    state = callback.state_dict()
    json.dumps(state)  # plain data only
    restored = pickle.loads(pickle.dumps(callback))
    assert restored.monitor is None
    assert restored.report.names("missing_grad") == {"head.weight", "head.bias"}
    assert restored.state_dict() == state


def test_two_instances_have_distinct_state_keys():
    assert LeafWatch(patience=1).state_key != LeafWatch(patience=3).state_key


def test_the_state_key_read_at_every_hook_is_made_once_and_follows_the_options():
    callback = LeafWatch(patience=1, ignore=["aux.*"])
    key = callback.state_key
    assert callback.state_key is key  # the Trainer reads it around every hook: not made again
    callback.patience = 3
    callback.ignore["head.*"] = "unused on purpose"
    assert callback.state_key == LeafWatch(patience=3, ignore={"aux.*": "", "head.*": "x"}).state_key != key


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"strict": "yes"}, TypeError, r"`strict` must be a bool, got str"),
        ({"verbose": 1}, TypeError, r"`verbose` must be a bool, got int"),
        ({"patience": 0}, ValueError, r"`patience` must be >= 1, got 0"),
        ({"patience": 1.5}, TypeError, r"`patience` must be an int, got float"),
        ({"log_every_n_steps": 0}, ValueError, r"`log_every_n_steps` must be >= 1, got 0"),
        ({"check_values_every_n_steps": -1}, ValueError, r"`check_values_every_n_steps` must be >= 0, got -1"),
        ({"ignore": "head.*"}, TypeError, r"`ignore` must be a mapping"),
        ({"ignore": {"": "why"}}, ValueError, r"`ignore` patterns must be non-empty str"),
    ],
)
def test_bad_options_are_rejected_with_the_argument_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        LeafWatch(**kwargs)


@pytest.mark.parametrize(("args", "kwargs", "match"), [
    (("x",), {}, r"^LeafWatch\.__init__\(\) takes 1 positional argument but 2 were given$"),
    ((), {"stric": True}, r"^LeafWatch\.__init__\(\) got an unexpected keyword argument 'stric'"),
])
def test_a_wrong_argument_names_leafwatch_not_the_base_class(args, kwargs, match):
    with pytest.raises(TypeError, match=match):
        LeafWatch(*args, **kwargs)
    built = callback_class(pl.Callback, "LeafWatch")  # a class callback_class builds: its own name too
    with pytest.raises(TypeError, match=match):
        built(*args, **kwargs)


def test_without_lightning_the_callback_says_how_to_install_it():
    code = (
        "import sys\n"
        "sys.modules['pytorch_lightning'] = None\n"
        "sys.modules['lightning'] = None\n"
        "import leafwatch\n"
        "try:\n"
        "    leafwatch.LeafWatch\n"
        "except ImportError as error:\n"
        "    print('ImportError:', error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    # Run from this checkout, the command that works is the checkout form with this interpreter's
    # pip (the README's venv is not activated): `.venv/bin/python -m pip install -e ".[lightning]"`.
    prefix = "ImportError: the leafwatch Lightning callback needs PyTorch Lightning: "
    (line,) = [line for line in out.stdout.splitlines() if line.startswith(prefix)]
    command = shlex.split(line[len(prefix):])
    assert command[1:5] == ["-m", "pip", "install", "-e"] and command[5] == ".[lightning]"
    root = Path(__file__).resolve().parents[2]
    assert os.path.samefile(root / command[0], sys.executable)
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "leafwatch" and "lightning" in pyproject["project"]["optional-dependencies"]
    assert subprocess.run([*command[:3], "--version"], capture_output=True, cwd=root).returncode == 0


def test_with_only_the_lightning_package_it_is_a_lightning_pytorch_callback(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['pytorch_lightning'] = None\n"
        "import lightning.pytorch as L\n"
        "from leafwatch import LeafWatch\n"
        "print(isinstance(LeafWatch(), L.Callback), [b.__module__ for b in LeafWatch.__mro__[1:-1] if not b.__module__.startswith('leafwatch')])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True ['lightning.pytorch.callbacks.callback']"


def test_the_loss_kept_between_backward_and_the_optimizer_step_is_not_kept_alive() -> None:
    """The callback keeps the loss of the last backward for the check that follows (the silenced
    error), weakly: a loss whose graph the user keeps (`retain_graph=True`) dies with the user's last
    reference, not with the next step."""
    import gc
    import weakref

    callback = LeafWatch()
    w = torch.ones(3, requires_grad=True)
    loss = (w * 2).sum()
    loss.backward(retain_graph=True)
    callback.on_before_backward(None, None, loss)  # type: ignore[arg-type]
    gone = weakref.ref(loss)
    del loss
    gc.collect()
    assert gone() is None

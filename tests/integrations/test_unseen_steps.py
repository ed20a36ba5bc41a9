"""An optimizer whose steps leafwatch cannot see never ends a run with a silent "no findings".

torch hooks a class's ``step`` inside ``Optimizer.__init__``: a wrapper that never runs it (as Opacus's
``DPOptimizer`` is written) and updates the parameters itself is stepped where no hook fires. When the
model's forward and backward ran and no check did, every door says so with an ``incomplete`` warning
naming the optimizer and how to attach to it: ``Monitor.attach()`` and ``leafwatch run``. The Lightning
callback checks from Lightning's own ``on_before_optimizer_step``, so it meets no such run: it checks such
an optimizer at every step.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import _warm
import pytest
import torch
from _requirements import require_lightning_callback
from torch import nn

import leafwatch
from leafwatch.observe.inventory import unwrap_optimizer

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "unseen_steps" / "wrapper_optimizer.py"


def _wrapper_class() -> type:
    """The script's wrapper class (its training loop runs only as ``__main__``)."""
    return runpy.run_path(str(SCRIPT), run_name="wrapper_optimizer")["SkipInitWrapper"]


SkipInitWrapper = _wrapper_class()


def _train(monitor: leafwatch.Monitor, model: nn.Module, opt: torch.optim.Optimizer, steps: int = 3) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()


def test_an_attached_monitor_whose_optimizer_is_never_hooked_says_no_check_ran() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = SkipInitWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    monitor = leafwatch.Monitor(model, opt).attach()
    _train(monitor, model, opt)
    with pytest.warns(leafwatch.LeafwatchWarning, match=r"WARNING incomplete `opt`"):
        report = monitor.close()
    assert monitor.step == 0  # no check ran: torch never hooked SkipInitWrapper.step
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))  # and it trained
    (f,) = report.findings
    assert (f.kind, f.name, f.severity, f.reason.name) == ("incomplete", "opt", "warning", "unchecked_optimizer")
    assert f.message == "No check ran: `opt` (a `SkipInitWrapper`) trained the model where leafwatch could not see its steps."
    assert f.cause.startswith("the model's forward and backward ran, its tensors got gradients and were updated, but "
                              "no check ran: "
                              "torch's optimizer step hooks, where leafwatch checks before each step, never fire for "
                              "`opt` (a `SkipInitWrapper`): its class never ran `Optimizer.__init__`, which hooks `step`.")
    assert f.fix.startswith("call `monitor.check()` yourself after `loss.backward()` and before `opt.step()`, with "
                            "`monitor = leafwatch.Monitor(model, opt)`")
    assert "no findings" not in str(report)


def test_a_wrapper_that_steps_a_torch_optimizer_it_holds_names_that_optimizer_to_attach_to() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = SkipInitWrapper(torch.optim.SGD(model.parameters(), lr=0.1), inner=True)
    monitor = leafwatch.Monitor(model, opt, verbose=False).attach()
    _train(monitor, model, opt)
    (f,) = monitor.close().findings
    assert (f.kind, f.name, f.reason.name) == ("incomplete", "opt", "unchecked_optimizer")
    assert f.fix == ("attach the Monitor to `opt.base`, the torch optimizer that `opt.step()` steps, which torch's "
                     "hooks see: `leafwatch.Monitor(model, opt.base).attach()`")
    assert f.remedy.applicability == "code"
    # The fix, applied: every step is checked, and nothing is wrong.
    applied = leafwatch.Monitor(model, opt.base, verbose=False).attach()
    _train(applied, model, opt)
    assert applied.step == 3
    assert applied.close().findings == []


def test_an_attached_monitor_of_a_model_that_never_trained_reports_nothing() -> None:
    """No backward ran: there was nothing to check, and nothing is said (no incomplete warning)."""
    model = nn.Linear(4, 1)
    opt = SkipInitWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    monitor = leafwatch.Monitor(model, opt, verbose=False).attach()
    with torch.no_grad():
        model(torch.randn(2, 4))
    assert monitor.close().findings == []


def test_a_run_that_ends_before_its_first_step_has_no_incomplete_finding() -> None:
    """A backward ran and nothing stepped the model (a script that raised before its first step): no step went
    unseen, so nothing is said of one (whatever the optimizer, hooked by torch or not)."""
    for inner in (torch.optim.SGD, lambda params, lr: SkipInitWrapper(torch.optim.SGD(params, lr=lr))):
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = inner(model.parameters(), lr=0.1)
        monitor = leafwatch.Monitor(model, opt, verbose=False).attach()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        assert all(p.grad is not None for p in model.parameters())
        assert monitor.close().findings == []


def test_a_monitor_checked_by_hand_beside_the_wrapper_has_no_incomplete_finding() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = SkipInitWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            monitor.check()
            opt.step()
        assert monitor.step == 3
        assert monitor.close().findings == []


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = _warm.run([sys.executable, "-m", "leafwatch", "run", *args], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=240)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr
    assert result.stdout == "done\n", result.stdout
    return result


def test_leafwatch_run_of_a_script_whose_optimizer_is_never_hooked_says_nothing_was_checked() -> None:
    result = _run(str(SCRIPT))
    assert result.returncode == 0, result.stderr
    assert "leafwatch: no optimizer step was seen, nothing was checked\n" in result.stderr, result.stderr
    assert "WARNING incomplete          opt (since start)" in result.stderr
    assert "No check ran: `opt` (a `SkipInitWrapper`) trained the model where leafwatch could not see its steps." \
        in result.stderr
    assert "its class never ran `Optimizer.__init__`, which hooks `step`" in result.stderr
    assert "no findings" not in result.stderr


def test_leafwatch_run_strict_exits_incomplete_when_no_step_was_seen() -> None:
    result = _run("--strict", str(SCRIPT))
    assert result.returncode == 70, result.stderr
    assert result.stderr.endswith("leafwatch: --strict: the check is incomplete (no step of `opt` was seen): exit 70.\n")


def test_leafwatch_run_checks_the_torch_optimizer_the_wrapper_steps() -> None:
    result = _run(str(SCRIPT), "--inner")
    assert result.returncode == 0, result.stderr
    assert "leafwatch: summary after 4 optimizer steps\nleafwatch: no findings at step 4" in result.stderr


def test_the_lightning_callback_checks_a_wrapper_that_torch_never_hooked_at_every_step() -> None:
    require_lightning_callback()
    import pytorch_lightning as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(3, 1)
            self.aux = nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).sum() + self.aux(batch[0]).sum()

        def configure_optimizers(self):
            return SkipInitWrapper(torch.optim.SGD(self.net.parameters(), lr=0.1))  # `aux` left out

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 3)), batch_size=4)
    callback = leafwatch.LeafWatch(verbose=False)
    trainer = pl.Trainer(max_steps=3, callbacks=[callback], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lightning's own advice (workers, log_every_n_steps)
        trainer.fit(Module(), data)
    assert isinstance(unwrap_optimizer(trainer.optimizers[0])[0], SkipInitWrapper)
    report = callback.report
    assert report.step == 3  # Lightning's on_before_optimizer_step: a check at every step
    (f,) = report.findings
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "aux", "error")
    assert all(g.kind != "incomplete" for g in report.findings)

"""``leafwatch run`` judges from the first step, as a Monitor attached before the first forward.

Each training script of ``tests/scripts/`` runs twice, unmodified: under ``leafwatch run``'s
session and with the Monitor a user would attach (``tests/_run_or_attach.py``); what stays open
(kind, tensor, severity, status) is the same. A periodic auxiliary loss, correct code, passes
``--strict`` through every door; a layer created after the optimizer is named as such at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import _warm
import pytest
import torch
from _requirements import require_module
from torch import nn

import leafwatch

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
SCRIPTS = TESTS / "scripts"

#: Scripts that are no training script of their own.
NOT_TRAINING = {"helper_module.py": "a module the other scripts import",
                "show_argv.py": "prints how it was run, trains nothing"}
#: Scripts where no user could attach one Monitor before the first forward, and why.
NO_ATTACH_POINT = {
    "forward_forward.py": "each layer builds its own optimizer and is called through `.forward()`: no frame of the "
                          "script holds every optimizer, and no forward hook runs",
    "pyro_regression.py": "Pyro builds its optimizers inside `pyro.optim` at the first step: no variable of the "
                          "script holds them",
    "resumed_head_replaced.py": "the first forward is the one step of the run it resumes, before `model` exists: a "
                                "Monitor attached there is given `previous`, never the model that trains",
    "fold_copies.py": "the first forward is the first fold's, after `model = copy.deepcopy(base)` replaced the model "
                      "the optimizer holds: a Monitor attached there is given that copy as its own root, in no "
                      "optimizer, where `run` saw the model replaced (test_fixes_train patches it)",
}
#: Scripts that raise before `run` could judge what a Monitor given the tensor is told, and why.
RAISES_FIRST = {
    "nonleaf_global_second_backward.py": "the second backward raises before `run`'s second scan of the script's "
                                         "globals, which tells a tensor kept across steps from a per-step "
                                         "activation; `run` names `margin` in the crash's note "
                                         "(test_fixes_run)",
    "crash_std_before_loop.py": "the same: `std`, computed once before the loop, is a module-level non-leaf the "
                                "second backward reaches before `run`'s second scan; `run` names it in the crash's "
                                "note (test_common_crashes)",
    "crash_scale_beside_a_detached_state.py": "the same, for `scale` (test_common_crashes)",
}
#: Arguments a script needs ("{tmp}": a fresh folder).
ARGUMENTS = {"hf_peft_after_optimizer.py": ["{tmp}"]}
COMPARED = sorted(p.name for p in SCRIPTS.glob("*.py") if p.name not in {**NOT_TRAINING, **NO_ATTACH_POINT, **RAISES_FIRST})


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), str(TESTS), env.get("PYTHONPATH", "")) if p)
    env["PYTHONHASHSEED"] = "0"
    return env


def _open_findings(mode: str, script: str, tmp_path: Path) -> list[list[str]]:
    args = [a.format(tmp=tmp_path / mode) for a in ARGUMENTS.get(script, [])]
    result = _warm.run([sys.executable, str(TESTS / "_run_or_attach.py"), mode, str(SCRIPTS / script), *args],
                       capture_output=True, text=True, env=_env(), cwd=REPO, timeout=300)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("OPEN ")]
    assert len(lines) == 1, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(lines[0][len("OPEN "):])


def test_every_script_is_compared_or_excluded_with_a_reason() -> None:
    assert len(COMPARED) >= 25
    for excluded in {**NOT_TRAINING, **NO_ATTACH_POINT, **RAISES_FIRST}:
        assert (SCRIPTS / excluded).exists(), excluded


@pytest.mark.parametrize("script", COMPARED)
def test_run_and_an_attached_monitor_leave_the_same_findings_open(script: str, tmp_path: Path) -> None:
    if script.startswith(("hf_", "lora_")):
        require_module("transformers")
    if script == "hf_peft_after_optimizer.py":
        require_module("peft")
    assert _open_findings("run", script, tmp_path) == _open_findings("attach", script, tmp_path)


def test_the_comparison_sees_the_findings_of_a_buggy_script(tmp_path: Path) -> None:
    # (what the comparison compares is not empty: both name the planted mistakes, and both from step 1)
    found = _open_findings("attach", "buggy.py", tmp_path)
    assert {(kind, name) for kind, name, _, _ in found} >= {("missing_grad", "aux_head.weight"),
                                                            ("orphan_tensor", "scale")}
    gan = _open_findings("run", "gan_separate.py", tmp_path)
    assert ["dead_grad", "critic.2.bias", "warning", "open"] in gan  # a streak that runs from step 1


def test_an_attached_monitor_names_the_tensors_of_an_optimizer_that_never_stepped() -> None:
    generator, critic = nn.Linear(4, 2), nn.Linear(2, 1)
    opt_g = torch.optim.Adam(generator.parameters())
    opt_d = torch.optim.Adam(critic.parameters())
    monitor = leafwatch.Monitor(roots={"generator": generator, "critic": critic}, optimizers=[opt_g, opt_d]).attach()
    for _ in range(3):
        d_loss = critic(generator(torch.randn(8, 4)).detach()).mean()
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
    assert not monitor.report  # it may still step: nothing is said before the end
    report = monitor.close()
    (f,) = report.open
    assert (f.kind, f.reason.name, f.severity) == ("not_in_optimizer", "never_stepped", "error")
    assert {m.name for m in f.tensors} == {"generator.weight", "generator.bias"}
    assert f.cause == "`opt_g` (an `Adam`) was created with it, but its `step()` is never called, so its gradients are never applied."
    assert f.fix.startswith("call `opt_g.step()` after the backward pass")


def test_an_optimizer_that_steps_late_in_the_run_is_no_finding() -> None:
    generator, critic = nn.Linear(4, 2), nn.Linear(2, 1)
    opt_g, opt_d = torch.optim.Adam(generator.parameters()), torch.optim.Adam(critic.parameters())
    monitor = leafwatch.Monitor(roots={"generator": generator, "critic": critic}, optimizers=[opt_g, opt_d]).attach()
    for step in range(6):  # the critic trains alone for five steps (WGAN's n_critic), then the generator once
        fake = generator(torch.randn(8, 4))
        d_loss = critic(fake.detach()).mean()
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        if step == 5:
            opt_g.zero_grad()
            (-critic(fake).mean()).backward()
            opt_g.step()
    assert monitor.close().findings == []


# -- a periodic auxiliary loss: correct code, through every door with strict -----------------------------


def test_run_strict_passes_a_periodic_auxiliary_loss() -> None:
    result = _warm.run([sys.executable, "-m", "leafwatch", "run", "--strict", str(SCRIPTS / "periodic_aux_loss.py")],
                       capture_output=True, text=True, env=_env(), cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "aux done" in result.stdout
    assert "ERROR" not in result.stderr
    assert "INFO    missing_grad        aux [intermittent] (since step 2)" in result.stderr


def test_a_strict_attached_monitor_passes_a_periodic_auxiliary_loss() -> None:
    result = _warm.run([sys.executable, str(SCRIPTS / "periodic_aux_loss.py"), "--attach"],
                       capture_output=True, text=True, env=_env(), cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "ERROR" not in result.stdout + result.stderr
    assert "INFO    missing_grad        aux [intermittent] (since step 2)" in result.stdout


class AuxNet(nn.Module):
    """A body, a head and an auxiliary head whose loss is added every 4th call."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head, self.aux = nn.Linear(8, 16), nn.Linear(16, 1), nn.Linear(16, 1)
        self.calls = 0

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.body(x).relu()
        loss = nn.functional.mse_loss(self.head(h), y)
        if self.calls % 4 == 0:
            loss = loss + 0.1 * nn.functional.mse_loss(self.aux(h), y)
        self.calls += 1
        return loss


def _assert_intermittent_aux(report: leafwatch.Report, prefix: str = "") -> None:
    assert not report.at_least("error")
    assert {f.name for f in report.tensors("missing_grad")} == {f"{prefix}aux.weight", f"{prefix}aux.bias"}
    assert {f.status for f in report.tensors("missing_grad")} == {"intermittent"}


def test_the_strict_lightning_callback_passes_a_periodic_auxiliary_loss(tmp_path: Path) -> None:
    pl = require_module("pytorch_lightning")
    from leafwatch import LeafWatch

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = AuxNet()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net.loss(*batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 8, generator=g), torch.randn(48, 1, generator=g))
    callback = LeafWatch(strict=True, verbose=False)
    trainer = pl.Trainer(max_steps=12, accelerator="cpu", devices=1, logger=False, callbacks=[callback],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         limit_val_batches=0, default_root_dir=tmp_path)
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=4))
    assert trainer.global_step == 12
    _assert_intermittent_aux(callback.report, "net.")


def test_the_strict_hugging_face_callback_passes_a_periodic_auxiliary_loss(tmp_path: Path) -> None:
    transformers = require_module("transformers")
    from leafwatch.transformers import LeafWatchCallback

    class Model(AuxNet):
        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": self.loss(x, labels)}

    class Pairs(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 48

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            g = torch.Generator().manual_seed(i)
            return {"x": torch.randn(8, generator=g), "labels": torch.randn(1, generator=g)}

    callback = LeafWatchCallback(strict=True, verbose=False)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no",
                                          max_steps=12, per_device_train_batch_size=4, logging_strategy="no",
                                          disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=Model(), args=args, train_dataset=Pairs(), callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 12
    _assert_intermittent_aux(callback.report)


# -- a layer created after the optimizer, named as such at once ---------------------------------------------


def test_run_names_a_layer_created_after_the_optimizer_by_both_lines_at_the_next_check() -> None:
    result = _warm.run([sys.executable, "-m", "leafwatch", "run", str(SCRIPTS / "module_after_optimizer.py")],
                       capture_output=True, text=True, env=_env(), cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "ERROR   not_in_optimizer    extra (since step 1, decided at step 2)" in result.stderr
    assert ("cause: `extra` was created at module_after_optimizer.py:30, after `opt` was built at "
            "module_after_optimizer.py:29: the optimizer's parameter list was made before it existed.") in result.stderr
    assert ("fix (code): build `opt` after the last change to the model, so that it holds the new parameters and none "
            "of the old ones: move its statement right below the change at module_after_optimizer.py:30: `opt = "
            "torch.optim.Adam(model.parameters(), lr=1e-3)`") in result.stderr  # #54 item 3: no add_param_group
    assert "left out when" not in result.stderr and "add_param_group" not in result.stderr


def test_a_monitor_built_before_the_optimizer_names_the_line_that_built_it() -> None:
    result = _warm.run([sys.executable, str(SCRIPTS / "module_after_optimizer.py"), "--attach"],
                       capture_output=True, text=True, env=_env(), cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "ERROR   not_in_optimizer    model.extra (since step 1, decided at step 2)" in result.stdout
    assert ("cause: `model.extra` was created at module_after_optimizer.py:30, after `opt` was built at "
            "module_after_optimizer.py:29") in result.stdout

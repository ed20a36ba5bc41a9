"""No warning of an object leafwatch reads reaches the user; the user's own warnings do, unchanged.

leafwatch reads the user's variables to name things (the user's path to a module or an optimizer,
the optimizers a script holds): a script whose module-level variables hold ``torch.distributed``
(torchtune's recipes, Pyro, mmengine) used to get torch's ``FutureWarning`` about
``torch.distributed.reduce_op`` on its stderr, from leafwatch's own reads, and a script run with
``-W error::FutureWarning`` lost leafwatch's reading of its variables. These tests run
``tests/scripts/deprecated_reads.py`` (``torch.distributed`` at module level, a settings object
with a deprecated property that holds ``reduce_op``, the optimizer kept by a recipe object and
leaving out a tensor) under ``leafwatch run`` and with a Monitor it attaches itself, and the same
objects in-process under ``warnings.simplefilter("error")``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import _warm
import pytest
import torch
import torch.distributed as dist
from torch import nn

import leafwatch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "deprecated_reads.py"
MODES = ("run", "attach")
#: The script's own warning, at the line of the script that reads the deprecated property.
USERS_WARNING = "FutureWarning: `Settings.num_steps` is deprecated, use `Settings.steps`"


def _run(mode: str, *python_flags: str, user_warns: bool = False) -> subprocess.CompletedProcess:
    script = [str(SCRIPT), *(["--user-warns"] if user_warns else [])]
    args = ["-m", "leafwatch", "run", *script] if mode == "run" else [*script, "--attach"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return _warm.run([sys.executable, *python_flags, *args], capture_output=True, text=True, env=env,
                     cwd=REPO, timeout=240)


def _warnings(stderr: str) -> list[str]:
    """The lines of ``stderr`` that show a warning, leafwatch's findings (``LeafwatchWarning``) left out."""
    return [line for line in stderr.splitlines() if "Warning: " in line and "LeafwatchWarning: " not in line]


def _user_line() -> int:
    return next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "settings.num_steps" in text)


@pytest.mark.parametrize("mode", MODES)
def test_leafwatch_reads_the_scripts_variables_without_their_warnings_and_the_users_own_warning_shows(
        mode: str) -> None:
    result = _run(mode, user_warns=True)
    assert result.returncode == 0, result.stderr
    assert "reduce_op" not in result.stderr
    # The script's own deprecation warning, once, at its own line, as Python shows it without leafwatch.
    assert _warnings(result.stderr) == [f"{SCRIPT}:{_user_line()}: {USERS_WARNING}"]
    # The optimizer is named by the user's path to it, which the walk through the variables found.
    assert "add it to `recipe.optimizer`" in result.stderr
    if mode == "attach":
        assert "[('not_in_optimizer', 'recipe.loss_head'), ('not_in_optimizer', 'scale')]" in result.stdout


@pytest.mark.parametrize("mode", MODES)
def test_deprecation_warnings_made_errors_neither_stop_nor_blind_leafwatch(mode: str) -> None:
    result = _run(mode, "-W", "error::FutureWarning", "-W", "error::DeprecationWarning")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "LeafwatchInternalWarning" not in result.stderr
    assert _warnings(result.stderr) == []
    assert "add it to `recipe.optimizer`" in result.stderr  # the walk was not cut short by an error
    if mode == "attach":
        assert "[('not_in_optimizer', 'recipe.loss_head'), ('not_in_optimizer', 'scale')]" in result.stdout


class _Settings:
    """A library's settings object with a deprecated property, holding torch's deprecated ``reduce_op``."""

    def __init__(self) -> None:
        self.steps = 4
        self.reduce_op = dist.reduce_op

    @property
    def num_steps(self) -> int:
        warnings.warn("`_Settings.num_steps` is deprecated", FutureWarning, stacklevel=2)
        return self.steps


class _Net(nn.Module):
    """Keeps torch's deprecated ``reduce_op`` in a plain dict (leafwatch reads those for tensors left unregistered)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(4, 8), nn.Linear(8, 1)
        self.collectives = {"reduce_op": dist.reduce_op}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).relu())


def test_an_attached_monitor_raises_no_warning_of_what_it_reads_under_simplefilter_error() -> None:
    distributed, reduce_op, settings = torch.distributed, dist.reduce_op, _Settings()  # the user's variables
    model, loss_head = _Net(), nn.Linear(1, 1)  # the loss runs `loss_head`, which no optimizer holds
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monitor = leafwatch.Monitor(model, opt, verbose=False).attach()
        for _ in range(settings.steps):
            loss = loss_head(model(torch.randn(16, 4))).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        report = monitor.close()
        with pytest.raises(FutureWarning, match=r"`_Settings.num_steps` is deprecated"):
            settings.num_steps  # the user's own warning is raised as the filter says
    assert distributed is dist and reduce_op is dist.reduce_op
    (finding,) = report.findings
    assert (finding.kind, finding.name) == ("not_in_optimizer", "loss_head")
    assert "`opt.add_param_group(" in finding.fix

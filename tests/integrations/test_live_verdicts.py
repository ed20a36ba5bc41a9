"""A live verdict agrees with the final report: no error is printed at a check (nor raised in strict mode)
that the end of the run resolves without any change to the script, and an error leafwatch prints is true.

Each pattern is a faithful plain-torch rebuild of a public project's code (the library and file are named in
each script's docstring), run under ``leafwatch run`` (plain and ``--strict``), beside the true bug it looks like,
which is still named, with its cause, at the first check where it can be known."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _run(script: str, *args: str, strict: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "leafwatch", "run", *(["--strict"] if strict else []), str(SCRIPTS / script), *args]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=240)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr
    return result


def _live(result: subprocess.CompletedProcess) -> list[str]:
    """The console lines printed at the checks (before the summary)."""
    before = result.stderr.split("leafwatch: summary after")[0]
    return [line for line in before.splitlines() if line.startswith("leafwatch: ")]


def _summary(result: subprocess.CompletedProcess) -> str:
    return result.stderr.split("leafwatch: summary after")[1]


# -- item: an optimizer that steps later in the same iteration ----------------------------------------
@pytest.mark.parametrize("script", ["loss_optimizer.py", "sac_per_group.py"])
@pytest.mark.parametrize("strict", [False, True])
def test_an_optimizer_built_before_the_check_and_stepped_later_in_the_iteration_holds_its_tensors(script, strict):
    """pytorch-metric-learning's ``loss_optimizer`` (stepped after the model's ``optimizer``) and torchrl's SAC
    with one optimizer per loss group: the tensors they hold were created after the first optimizer was built,
    and that one steps first. Each optimizer counts from the moment it is built: no live error, nothing at the end."""
    result = _run(script, strict=strict)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert _live(result) == [], result.stderr
    assert "leafwatch: no findings at step" in _summary(result)
    assert "created at" not in result.stderr


def test_a_loss_parameter_left_out_of_every_optimizer_is_still_named():
    """The bug beside pytorch-metric-learning's pattern: no ``loss_optimizer`` (its documentation: "This loss
    requires an optimizer"). ``loss_func.W`` gets gradients and never changes: named at the second check (the
    first shows its gradient, the second that its value did not change), a warning, as a whole module no
    optimizer holds is (a forgotten optimizer, or a fixed network)."""
    result = _run("loss_optimizer.py", "--forget-loss-optimizer")
    assert result.returncode == 0, result.stderr
    assert _live(result)[0].startswith(
        "leafwatch: WARNING not_in_optimizer `loss_func.W` seen at step 1, decided at step 2.")
    summary = _summary(result)
    assert "WARNING not_in_optimizer    loss_func.W (since step 1, decided at step 2)" in summary
    assert "no optimizer holds `loss_func` (none of its tensors)" in summary


def test_a_loss_parameter_no_optimizer_holds_is_still_named():
    """The bug beside torchrl's pattern: ``log_alpha`` has no optimizer. Built before the last optimizer, it may
    be stepped by one that steps late (``leafwatch run`` waits 25 checks for one): named, an error, at the end of
    this shorter run; the Q-value copies its optimizer holds are no finding at any point."""
    result = _run("sac_per_group.py", "--forget-alpha")
    assert result.returncode == 0, result.stderr
    assert [line.split(" at step")[0] for line in _live(result)] == [
        "leafwatch: ERROR not_in_optimizer `loss_module.log_alpha` seen"]
    summary = _summary(result)
    assert "ERROR   not_in_optimizer    loss_module.log_alpha (since step 1" in summary
    assert "qvalue_network_params" not in result.stderr

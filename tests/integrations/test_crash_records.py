"""A crash finding goes through the one flow (#52 item 4): where torch raises for a leaf mistake, the finding that
explains it reaches the Monitor's history, so the TensorBoard record holds it (``leafwatch report DIR --json``
lists it, ``report --diff`` patches it, the tab shows it), besides the note on the exception. The doors: a
crashed ``leafwatch run --logdir``, a Monitor's excepthook (a script that crashes with a Monitor open and a
writer), the Lightning callback's ``on_exception`` and the Hugging Face callback's open Monitor (its Trainer has
no exception event: the exception that leaves ``trainer.train()`` reaches the excepthook). Every record is read
back from the real event files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from _requirements import require_module
from torch import nn

import leafwatch
from leafwatch.tensorboard_plugin.plugin import sorted_findings, with_hunks

REPO = Path(__file__).resolve().parents[2]

OPTIMIZE_NON_LEAF = """\
    import torch

    w = torch.randn(4, 4, requires_grad=True).to(torch.float64)
    optimizer = torch.optim.Adam([w], lr=1e-3)
    print("trained")
"""


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr
    return result


def _script(folder: Path, text: str, name: str = "train.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _report_json(logdir: Path, cwd: Path) -> dict:
    result = _run("-m", "leafwatch", "report", str(logdir), "--json", cwd=cwd)
    assert result.returncode == 1, result.stdout + result.stderr  # the crash finding is an open error
    (run,) = json.loads(result.stdout)["runs"]
    return run


def _crash_finding(run: dict, kind: str, reason: str) -> dict:
    (found,) = [f for f in run["findings"] if (f["kind"], f["reason"]) == (kind, reason)]
    assert found["status"] == "open" and found["severity"] == "error"
    assert found["message"] and found["cause"] and found["fix"]  # the words, next to the data
    assert found["details"]["crash"] is True and found["args"]
    return found


def test_a_crashed_leafwatch_run_writes_the_crash_finding_and_report_diff_patches_it(tmp_path: Path) -> None:
    _script(tmp_path, OPTIMIZE_NON_LEAF)
    run = _run("-m", "leafwatch", "run", "--logdir", "logs", "train.py", cwd=tmp_path)
    assert run.returncode == 1 and "ValueError: can't optimize a non-leaf Tensor" in run.stderr
    assert "leafwatch: `w` (assigned at train.py:3) is not a leaf tensor" in run.stderr  # the note, as before
    found = _crash_finding(_report_json(tmp_path / "logs", tmp_path), "non_leaf", "optimized_non_leaf")
    assert found["name"] == "w" and found["remedy"]["applicability"] == "code"
    assert found["remedy"]["edit"]["start"] == 3 and found["remedy"]["edit"]["action"] == "replace"
    diff = _run("-m", "leafwatch", "report", "logs", "--diff", cwd=tmp_path)
    assert diff.returncode == 0, diff.stderr
    assert "-w = torch.randn(4, 4, requires_grad=True).to(torch.float64)\n" in diff.stdout
    assert "+w = torch.randn(4, 4).to(torch.float64).requires_grad_()\n" in diff.stdout
    fixed = _run("-m", "leafwatch", "report", "logs", "--fix", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    after = _run("train.py", cwd=tmp_path)  # the patched script runs through
    assert after.returncode == 0 and after.stdout == "trained\n", after.stderr


#: Crash scripts of #53 (tests/scripts/): the finding their record holds (kind, name, reason, members) and the lines
#: `report --diff` takes out and puts in.
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
COMMON_CRASHES = {
    "crash_hidden_state.py": (("non_leaf", "h_state", "carried_state", []), [],
                              ["+    h_state = None if h_state is None else h_state.detach()\n"]),
    "crash_two_non_leaves.py": (("non_leaf", "{W1,W2}", "optimized_non_leaf", ["W1", "W2"]),
                                ["-W1 = torch.randn(784, 128, requires_grad=True) * 0.01\n"],
                                ["+W1 = (torch.randn(784, 128) * 0.01).requires_grad_()\n",
                                 "+W2 = (torch.randn(128, 10) * 0.01).requires_grad_()\n"]),
}


@pytest.mark.parametrize("script", sorted(COMMON_CRASHES))
def test_a_crashed_leafwatch_run_of_a_common_crash_writes_its_finding_and_report_diff_patches_it(
        tmp_path: Path, script: str) -> None:
    """#53's crashes take the one flow too: the record of a crashed ``leafwatch run --logdir`` lists the finding
    (one mistake for several non-leaves, its tensors its members) and ``report --diff`` shows its placed fix."""
    (kind, name, reason, members), removed, added = COMMON_CRASHES[script]
    (tmp_path / script).write_text((SCRIPTS / script).read_text())
    run = _run("-m", "leafwatch", "run", "--logdir", "logs", script, cwd=tmp_path)
    assert run.returncode == 1 and "Traceback (most recent call last):" in run.stderr
    found = _crash_finding(_report_json(tmp_path / "logs", tmp_path), kind, reason)
    assert found["name"] == name and [m["name"] for m in found["members"] if len(found["members"]) > 1] == members
    assert found["remedy"]["applicability"] == "code" and found["remedy"]["edit"] is not None
    assert f"leafwatch: {found['message']}" in run.stderr  # the note and the record: one render
    diff = _run("-m", "leafwatch", "report", "logs", "--diff", cwd=tmp_path)
    assert diff.returncode == 0, diff.stderr
    for line in removed + added:
        assert line in diff.stdout, (line, diff.stdout)


def test_a_monitor_with_a_writer_in_a_script_that_crashes_writes_the_record_through_the_excepthook(
        tmp_path: Path) -> None:
    _script(tmp_path, """\
        import torch
        from torch import nn
        from torch.utils.tensorboard import SummaryWriter

        import leafwatch

        model = nn.Linear(4, 4)
        monitor = leafwatch.Monitor(model, writer=SummaryWriter("logs"))
        w = nn.Parameter(torch.empty(4, 4))
        w.normal_()
        print("never reached")
    """)
    crashed = _run("train.py", cwd=tmp_path)
    assert crashed.returncode == 1 and crashed.stdout == ""
    assert "RuntimeError: a leaf Variable that requires grad is being used in an in-place operation." in crashed.stderr
    assert "leafwatch: `w` is an `nn.Parameter`, a leaf: torch refuses the in-place `.normal_()`" in crashed.stderr
    found = _crash_finding(_report_json(tmp_path / "logs", tmp_path), "non_leaf", "in_place_on_leaf")
    assert found["name"] == "w" and found["remedy"]["code"] == "nn.init.normal_(w)"
    diff = _run("-m", "leafwatch", "report", "logs", "--diff", cwd=tmp_path)
    assert diff.returncode == 0 and "-w.normal_()\n+nn.init.normal_(w)\n" in diff.stdout, diff.stdout + diff.stderr


def _record(logdir: Path) -> dict:
    """The latest ``leafwatch/report`` record under ``logdir``, read back from the event files."""
    from leafwatch.report.reader import read_reports

    (run,) = read_reports(str(logdir))
    return run.data


def _tab_rows(record: dict) -> list[dict]:
    """The rows the Leafwatch tab shows for a record (its findings route: with the hunks the run recorded)."""
    return sorted_findings(with_hunks(record.get("findings", []), record.get("patch")))


class _InitInTheStep(nn.Module):
    """A model whose forward initialises a parameter in place with grad mode on: torch raises mid-training."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.layer.weight.normal_()
        return self.layer(x)


def test_a_lightning_fit_that_crashes_writes_the_crash_finding_to_its_logger_and_the_tab_shows_it(
        tmp_path: Path) -> None:
    pl = require_module("pytorch_lightning")

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _InitInTheStep()

        def training_step(self, batch, batch_idx):
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = pl.Trainer(max_steps=2, accelerator="cpu", devices=1, callbacks=[leafwatch.LeafWatch(verbose=False)],
                         logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="lit"), enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad") as caught:
            trainer.fit(Lit(), torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4))
    (note,) = caught.value.__notes__
    assert "is an `nn.Parameter`, a leaf: torch refuses the in-place `.normal_()`" in note
    record = _record(tmp_path / "lit")
    (row,) = [f for f in _tab_rows(record) if f["kind"] == "non_leaf"]
    assert (row["name"], row["status"], row["details"]["crash"]) == ("self.layer.weight", "open", True)
    assert row["message"] == note.splitlines()[0].removeprefix("leafwatch: ")  # one render: the note's words
    assert "+        nn.init.normal_(self.layer.weight)\n" in row["hunk"]  # the tab's diff of the fix


def test_a_hugging_face_trainer_that_crashes_writes_the_crash_finding_when_the_exception_leaves_train(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_module("transformers")
    require_module("accelerate")
    from transformers import Trainer, TrainingArguments

    from leafwatch.integrations.transformers import LOG_SUBDIR
    from leafwatch.transformers import LeafWatchCallback

    class Regression(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _InitInTheStep()

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": (self.net(x).squeeze(-1) - labels).pow(2).mean()}

    class Points(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": torch.randn(4, generator=torch.Generator().manual_seed(i)), "labels": torch.tensor(float(i))}

    callback = LeafWatchCallback(verbose=False)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", max_steps=2,
                             per_device_train_batch_size=4, logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=Regression(), args=args, train_dataset=Points(), callbacks=[callback])
    try:
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad") as caught:
            trainer.train()
        assert callback.monitor is not None  # no exception event: the callback's Monitor is still open
        error = caught.value
        sys.excepthook(type(error), error, error.__traceback__)  # the exception leaves the script
    finally:
        callback._close(print_table=False)
    assert "RuntimeError: a leaf Variable" in capsys.readouterr().err
    (note,) = error.__notes__
    record = _record(tmp_path / LOG_SUBDIR)
    (row,) = [f for f in _tab_rows(record) if f["kind"] == "non_leaf"]
    assert (row["name"], row["details"]["crash"]) == ("self.layer.weight", True)
    assert row["message"] == note.splitlines()[0].removeprefix("leafwatch: ")

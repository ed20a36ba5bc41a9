"""``leafwatch report`` on what real runs leave behind: Lightning's runs of one experiment side by side
(``version_0``, ``version_1``, ...), of which only the newest is judged, and event files that a killed
run cut off or that were overwritten, named as unreadable while the other runs are still judged."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from _requirements import require_module
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from leafwatch import LeafWatch, cli
from leafwatch.report.reader import read_logdir, read_reports

pl = require_module("pytorch_lightning")
from pytorch_lightning.loggers import TensorBoardLogger  # noqa: E402

#: Every test here reads the runs of one module-scoped fixture: under pytest-xdist they share a worker.
pytestmark = pytest.mark.xdist_group("report_versions")


class Classifier(pl.LightningModule):
    """A layer and a loss; with ``buggy``, an ``aux_head`` that forward never calls (one open error)."""

    def __init__(self, buggy: bool) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        if buggy:
            self.aux_head = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(save_dir: Path, name: str, buggy: bool, version: int | None = None) -> str:
    """One real fit with a TensorBoardLogger and the LeafWatch callback; the run's log folder."""
    logger = TensorBoardLogger(save_dir, name=name, version=version)
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
    trainer = pl.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=logger, callbacks=[LeafWatch(verbose=False)],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         limit_val_batches=0, log_every_n_steps=1)
    trainer.fit(Classifier(buggy), data)
    return logger.log_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``fixed``: the bug of version_0 is fixed in version_1 (Lightning numbers them). ``regressed``:
    version_9 is clean and version_10, the newest (after version_9 in number, before it by name), is not."""
    root = tmp_path_factory.mktemp("runs")
    assert _fit(root, "fixed", buggy=True).endswith(os.path.join("fixed", "version_0"))
    assert _fit(root, "fixed", buggy=False).endswith(os.path.join("fixed", "version_1"))
    _fit(root, "regressed", buggy=False, version=9)
    _fit(root, "regressed", buggy=True, version=10)
    return root


def _report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _copy(runs: Path, tmp_path: Path, *experiments: str) -> Path:
    for name in experiments:
        shutil.copytree(runs / name, tmp_path / "logs" / name)
    return tmp_path / "logs"


def _event_file(folder: Path) -> Path:
    (path,) = folder.glob("events.out.tfevents.*")
    return path


# -- the newest version of each experiment -----------------------------------------------------------------------
def test_the_newest_version_is_judged_and_the_fixed_bug_of_an_older_one_does_not_fail_the_run(runs, capsys) -> None:
    code, out, err = _report(capsys, str(runs / "fixed"))
    assert code == 0, (out, err)
    assert out.startswith("run: version_1\nleafwatch: no findings") and "version_0" not in out
    assert err == ("leafwatch report: older versions, not judged (the newest version of each experiment is; --all "
                   "judges every run): version_0 (1 open error)\n")


def test_all_judges_every_version_as_report_did(runs, capsys) -> None:
    code, out, err = _report(capsys, str(runs / "fixed"), "--all")
    assert code == 1 and err == ""
    assert [line for line in out.splitlines() if line.startswith("run: ")] == ["run: version_0", "run: version_1"]
    assert "ERROR   missing_grad        aux_head (since step 1)" in out.split("run: version_1")[0]
    assert [r.run for r in read_reports(str(runs / "fixed"))] == ["version_0", "version_1"]


def test_the_newest_is_the_highest_number_and_each_experiment_is_judged(runs, capsys) -> None:
    reading = read_logdir(str(runs))
    assert [r.run for r in reading.judged] == ["fixed/version_1", "regressed/version_10"]
    assert [r.run for r in reading.older] == ["fixed/version_0", "regressed/version_9"]
    code, out, err = _report(capsys, str(runs))
    assert code == 1  # the regression, in the newest version of its experiment
    assert "run: regressed/version_10\nleafwatch: 1 open of 1 finding(s)" in out and "version_9" not in out
    assert err.splitlines() == ["leafwatch report: older versions, not judged (the newest version of each experiment "
                                "is; --all judges every run): fixed/version_0 (1 open error), regressed/version_9 "
                                "(no open error)"]


def test_json_lists_the_runs_judged_and_the_older_versions_apart(runs, capsys) -> None:
    code, out, _ = _report(capsys, str(runs), "--json")
    data = json.loads(out)
    assert code == 1
    assert [r["run"] for r in data["runs"]] == ["fixed/version_1", "regressed/version_10"]
    assert [(r["run"], r["open_errors"]) for r in data["not_judged"]] == [("fixed/version_0", 1),
                                                                          ("regressed/version_9", 0)]
    assert data["unreadable"] == []


def test_the_separate_runs_of_a_sweep_are_each_judged(runs, tmp_path, capsys) -> None:
    """Folders not named version_N are separate runs (a sweep's), as before: each is judged."""
    for name, source in (("lr_0.1", "fixed/version_0"), ("lr_0.01", "fixed/version_1")):
        shutil.copytree(runs / source, tmp_path / "sweep" / name)
    code, out, err = _report(capsys, str(tmp_path / "sweep"))
    assert code == 1 and err == ""
    assert [line for line in out.splitlines() if line.startswith("run: ")] == ["run: lr_0.01", "run: lr_0.1"]


# -- unreadable event files -----------------------------------------------------------------------------------------
def test_a_cut_off_event_file_is_named_unreadable_and_the_other_experiments_are_judged(runs, tmp_path, capsys) -> None:
    logs = _copy(runs, tmp_path, "fixed", "regressed")
    newest = _event_file(logs / "regressed" / "version_10")
    size = newest.stat().st_size
    os.truncate(newest, size - 7)  # a run killed while it wrote its last record
    code, out, err = _report(capsys, str(logs))
    assert code == 0  # the run judged is clean; the one that can't be read is said, not guessed at
    assert [line for line in out.splitlines() if line.startswith("run: ")] == ["run: fixed/version_1"]
    lines = err.splitlines()
    assert re.fullmatch(rf"leafwatch report: unreadable: {re.escape(str(newest))}: it cannot be read past byte "
                        rf"(\d+) of {size - 7}: cut off \(by a run still writing it, or one that was killed\) or "
                        r"overwritten; run regressed/version_10 is not judged", lines[0]), lines[0]
    assert 0 < int(lines[0].split("past byte ")[1].split()[0]) < size - 7  # the records before the cut were read
    assert len(lines) == 2 and "regressed/version_9 (no open error)" in lines[1]  # not put in its place


def test_an_event_file_overwritten_with_garbage_is_unreadable_and_exit_2_when_no_run_could_be_read(
        runs, tmp_path, capsys) -> None:
    logs = _copy(runs, tmp_path, "regressed")
    shutil.rmtree(logs / "regressed" / "version_9")
    newest = _event_file(logs / "regressed" / "version_10")
    newest.write_bytes(os.urandom(newest.stat().st_size))
    code, out, err = _report(capsys, str(logs))
    assert code == 2 and out == ""
    assert err == (f"leafwatch report: unreadable: {newest}: it cannot be read past byte 0 of "
                   f"{newest.stat().st_size}: cut off (by a run still writing it, or one that was killed) or "
                   "overwritten; run regressed/version_10 is not judged\n"
                   "leafwatch report: no run could be judged: the event files named above cannot be read\n")
    assert "no leafwatch data" not in err


def test_an_intact_event_file_is_never_called_unreadable(runs) -> None:
    reading = read_logdir(str(runs), every=True)
    assert reading.unreadable == [] and len(reading.judged) == 4

"""leafwatch/report/verify.py without a rerun: the scratch copy's rule (what is copied, linked, left out),
a linked file the rerun changes, the rerun's command line, and how the rerun's findings are matched to the
run's (torch-free; the real reruns are in tests/integrations/test_verify.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from leafwatch import Finding, Report
from leafwatch.report import verify
from leafwatch.report.patch import FilePatch, Patch
from leafwatch.report.reasons import Written

OLD = 1_000_000_000  # a modification time long before the run
BIG = verify.LINK_OVER + 1


def _write(path: Path, data: bytes | str, *, old: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    if old:
        os.utime(path, (OLD, OLD))
    return path


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    _write(root / "train.py", "# " + "x" * BIG + "\n")  # Python source: copied, whatever its size
    _write(root / "data.bin", b"d" * BIG)  # big, unchanged since before the run: linked
    _write(root / "written.bin", b"w" * BIG, old=False)  # big, changed since the run started: copied
    _write(root / "small.txt", "config\n")  # small: copied
    for i in range(3):
        _write(root / "dataset" / f"{i}.png", b"p" * (BIG // 2))  # no Python, big in all, unchanged: linked whole
    _write(root / "pkg" / "model.py", "x = 1\n")
    _write(root / "pkg" / "weights.bin", b"b" * BIG)  # a folder with Python source is copied, its big file linked
    _write(root / ".venv" / "pyvenv.cfg", "home = /usr\n", old=False)  # a virtual environment: linked whole
    _write(root / "__pycache__" / "train.cpython-311.pyc", b"c")  # left out: Python writes it again
    _write(root / "runs" / "events.out.tfevents.1", b"e")  # the log folder: left out
    os.utime(root / "dataset", (OLD, OLD))
    os.symlink(root / "small.txt", root / "absolute_link")  # points into the folder: into the copy
    os.symlink("small.txt", root / "relative_link")
    return root


def test_the_copy_links_what_the_run_only_read_and_copies_the_rest(source: Path, tmp_path: Path) -> None:
    copy = verify.copy_folder(str(source), str(tmp_path / "scratch" / "project"), skip=[str(source / "runs")],
                              started=time.time())
    there = Path(copy.root)
    linked = {p.relative_to(there).as_posix() for p in there.rglob("*") if p.is_symlink()}
    assert linked == {"data.bin", "dataset", "pkg/weights.bin", ".venv", "absolute_link", "relative_link"}
    assert sorted(copy.linked) == [".venv/", "data.bin", "dataset/", os.path.join("pkg", "weights.bin")]
    for name in ("data.bin", "dataset", "pkg/weights.bin", ".venv"):
        assert os.readlink(there / name) == str(source / name)
    assert os.readlink(there / "absolute_link") == str(there / "small.txt")
    assert os.readlink(there / "relative_link") == "small.txt"
    for name in ("train.py", "written.bin", "small.txt", "pkg/model.py"):
        assert not (there / name).is_symlink() and (there / name).read_bytes() == (source / name).read_bytes()
    assert os.stat(there / "small.txt").st_mtime == OLD  # copied with its times
    assert not (there / "__pycache__").exists() and not (there / "runs").exists()
    assert copy.changed() == []


def test_a_linked_file_the_rerun_changes_is_named(source: Path, tmp_path: Path) -> None:
    copy = verify.copy_folder(str(source), str(tmp_path / "copy"), skip=[], started=time.time())
    with open(Path(copy.root) / "data.bin", "ab") as through_the_link:
        through_the_link.write(b"!")
    _write(Path(copy.root) / "dataset" / "3.png", b"new")  # a new file in a linked folder
    assert copy.changed() == [str(source / "data.bin"), str(source / "dataset")]


def test_nothing_is_linked_for_a_run_that_gives_no_start(source: Path, tmp_path: Path) -> None:
    copy = verify.copy_folder(str(source), str(tmp_path / "copy"), skip=[], started=0.0)
    assert copy.linked == [".venv/"]  # (installed: linked whatever the times)


def test_the_patch_is_applied_to_the_copy_only_and_a_changed_file_is_refused(source: Path, tmp_path: Path) -> None:
    model = source / "pkg" / "model.py"
    patch = Patch((FilePatch(str(model), "pkg/model.py", "x = 1\n", "x = 2\n", 1),), ())
    copy = verify.copy_folder(str(source), str(tmp_path / "copy"), skip=[], started=time.time())
    verify.apply_to(patch, copy)
    assert (Path(copy.root) / "pkg" / "model.py").read_text() == "x = 2\n" and model.read_text() == "x = 1\n"
    with pytest.raises(verify.Refused, match=r"^pkg/model.py changed since the run"):
        verify.apply_to(patch, copy)  # (the copy now holds the patched text)


def test_the_rerun_command_is_the_recorded_one_under_max_steps(source: Path, tmp_path: Path) -> None:
    copy = verify.copy_folder(str(source), str(tmp_path / "copy"), skip=[], started=time.time())
    run = verify.command("train.py", None, ["--lr", "0.1"], cwd=str(source), logdir="runs", strict=True, patience=3,
                         ignore={"aux.*": "kept"}, max_steps=None)
    assert verify.rerun_command(run, copy, "/scratch/runs", 7) == [
        sys.executable, "-m", "leafwatch", "run", "--logdir", "/scratch/runs", "--max-steps", "7", "--strict",
        "--patience", "3", "--ignore", "aux.*=kept", "train.py", "--lr", "0.1"]
    absolute = {**run, "script": str(source / "train.py"), "options": {}}
    assert verify.rerun_command(absolute, copy, "L", 1)[-3:] == [str(Path(copy.root) / "train.py"), "--lr", "0.1"]
    module = {**run, "script": None, "module": "pkg.train", "options": {}}
    assert verify.rerun_command(module, copy, "L", 1)[-4:] == ["-m", "pkg.train", "--lr", "0.1"]
    python = _write(tmp_path / "env" / "bin" / "python3", "")  # the interpreter the run ran in, when it is there
    assert verify.rerun_command({**run, "python": str(python)}, copy, "L", 1)[0] == str(python)
    assert verify.rerun_command({**run, "python": str(tmp_path / "gone" / "python3")}, copy, "L", 1)[0] == sys.executable
    elsewhere = {**run, "script": str(tmp_path / "other.py")}
    with pytest.raises(verify.Refused, match="outside the folder the run was started in"):
        verify.rerun_command(elsewhere, copy, "L", 1)


def test_pythonpath_folders_of_the_run_point_into_the_copy(source: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    copy = verify.copy_folder(str(source), str(tmp_path / "copy"), skip=[], started=time.time())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(source / "pkg"), "/usr/lib/elsewhere", "relative"]))
    env = verify.rerun_environment(copy)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(Path(copy.root) / "pkg"), "/usr/lib/elsewhere", "relative"]
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def _mistake(kind: str, name: str, *members: str, severity: str = "error", reason: str = "r", first: int = 1,
             decided: int | None = None) -> Finding:
    details = {"decided_step": decided} if decided is not None else {}
    tensors = tuple(Finding(kind=kind, name=m, severity=severity, reason=Written(message="m", name=reason),  # type: ignore[arg-type]
                            first_step=first, details=details) for m in members)
    return Finding(kind=kind, name=name, severity=severity, reason=Written(message="m", name=reason),  # type: ignore[arg-type]
                   first_step=first, members=tensors, details=details)


def test_a_mistake_is_matched_by_its_tensors_when_its_name_changes_with_its_members() -> None:
    """`nonfinite_grad fc` in the run, `nonfinite_grad fc.{bias,weight}, scale` in the rerun (`scale` trains
    there too): the same finding, still open, never a new one."""
    run = Report([_mistake("nonfinite_grad", "fc", "fc.bias", "fc.weight"),
                  _mistake("not_in_optimizer", "scale", "scale", decided=26)], step=40)
    rerun = Report([_mistake("nonfinite_grad", "fc.{bias,weight}, scale", "fc.bias", "fc.weight", "scale")], step=40)
    fixes, others, new = verify.judge(run, {("not_in_optimizer", "scale")}, rerun, 40)
    assert [(o.name, o.outcome) for o in fixes] == [("scale", "fixed")]
    assert [(o.name, o.outcome) for o in others] == [("fc", "still_open")]
    assert new == []


@pytest.mark.parametrize(("rerun", "reached", "outcome"), [
    (Report([], step=10), 10, "undecided"),  # decided at step 26, the rerun made 10
    (Report([_mistake("not_in_optimizer", "scale", "scale", severity="info", reason="undecided")], step=30), 30,
     "undecided"),  # the rerun left it undecided (it ended before the checks that decide it)
    (Report([_mistake("not_in_optimizer", "scale", "scale", decided=26)], step=10), 10, "still_open"),
    (Report([], step=30), 30, "fixed"),
    (None, 0, "undecided"),  # no record of the rerun
])
def test_a_patched_findings_outcome(rerun: Report | None, reached: int, outcome: str) -> None:
    run = Report([_mistake("not_in_optimizer", "scale", "scale", decided=26)], step=40)
    (fix,), others, new = verify.judge(run, {("not_in_optimizer", "scale")}, rerun, reached)
    assert (fix.outcome, fix.decided_step, others, new) == (outcome, 26, [], [])

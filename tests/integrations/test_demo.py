"""The examples and ``leafwatch demo``, end to end."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import _warm
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from _demo_run import DEMO_GROUP
from _requirements import optional_import

from leafwatch import cli

# leafwatch.demo is a Lightning script: the file collects without Lightning, and the tests that
# run the demo skip (locally) or fail (in CI).
demo = optional_import("leafwatch.demo", needs="pytorch_lightning")

ROOT = Path(__file__).resolve().parents[2]


def event_dirs(logdir: Path) -> list[Path]:
    return sorted({p.parent for p in logdir.rglob("events.out.tfevents.*")})


def assert_demo_findings(report) -> None:
    assert report.names("missing_grad") == {"aux_head.weight", "aux_head.bias"}
    assert report.names("not_in_optimizer") == {"loss_weight"}
    assert report.names("orphan_tensor") == {"temperature"}
    by_key = {(f.kind, f.name): f for f in report}  # one finding per mistake: the unused head is one
    assert by_key[("missing_grad", "aux_head")].names == ("aux_head.bias", "aux_head.weight")
    assert "never ran" in by_key[("missing_grad", "aux_head")].cause
    assert "left out" in by_key[("not_in_optimizer", "loss_weight")].cause
    assert "ToCopyBackward" in by_key[("orphan_tensor", "temperature")].cause


@pytest.mark.xdist_group(DEMO_GROUP)  # the demo run is shared with the dashboard's tests
def test_demo_command_end_to_end(demo_run):
    # `python -m leafwatch demo --logdir <tmp_path>/runs --steps 6` from tmp_path (tests/conftest.py).
    tmp_path, logdir, env, done = demo_run.cwd, demo_run.logdir, demo_run.env, demo_run.done
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LeafwatchInternalWarning" not in done.stderr, done.stderr[-3000:]
    out = done.stdout
    for words in ("missing_grad", "aux_head.{bias,weight}", "not_in_optimizer", "loss_weight",
                  "orphan_tensor", "temperature", "never ran", "ToCopyBackward"):
        assert words in out
    assert f"tensorboard --logdir {logdir}" in out
    # The last line is a command that works here: this interpreter's TensorBoard (not on PATH when
    # the venv is not activated), with the Leafwatch tab.
    command = shlex.split(out.strip().splitlines()[-1])
    assert command[-2:] == ["--logdir", str(logdir)]
    assert command[:-2] == _expected_tensorboard(env["PATH"], tmp_path)
    runs = event_dirs(logdir)
    assert runs, "no event files were written"
    main_run = next(d for d in runs if d.name != "leafwatch-layout")
    acc = EventAccumulator(str(main_run), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert acc.Scalars("leafwatch/open/missing_grad")[-1].value == 1  # one mistake: the unused head
    assert "leafwatch/report" in acc.Tags()["tensors"]


def _expected_tensorboard(path: str, cwd: Path) -> list[str]:
    """How the TensorBoard of this interpreter, with the Leafwatch tab, is started from ``cwd``."""
    installed = any(ep.name == "leafwatch" for ep in importlib.metadata.entry_points(group="tensorboard_plugins"))
    beside = shutil.which("tensorboard", path=os.path.dirname(sys.executable))
    if not installed or beside is None:
        return [sys.executable, "-m", "leafwatch.tensorboard_plugin"]
    on_path = shutil.which("tensorboard", path=path)
    if on_path is not None and os.path.samefile(on_path, beside):
        return ["tensorboard"]
    return [os.path.relpath(beside, cwd) if beside.startswith(str(cwd)) else beside]


@pytest.mark.parametrize("on_path", [True, False])
def test_the_tensorboard_command_is_the_one_next_to_this_interpreter(on_path, tmp_path, monkeypatch):
    from leafwatch.integrations.environment import tensorboard_command

    folder = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", os.pathsep.join([folder, "/usr/bin", "/bin"] if on_path else ["/usr/bin", "/bin"]))
    monkeypatch.chdir(tmp_path)
    command = shlex.split(tensorboard_command("my runs"))
    assert command[-2:] == ["--logdir", "my runs"]
    assert command[:-2] == _expected_tensorboard(os.environ["PATH"], tmp_path)
    if command[0] != "tensorboard" and len(command) == 3:
        assert os.access(command[0], os.X_OK)  # the venv's bin/tensorboard, by its path
    if on_path and command[0] == "tensorboard":
        assert shutil.which("tensorboard")  # it runs as printed


def test_cli_without_a_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "demo" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "match"), [(["demo", "--steps", "0"], "must be an int >= 1, got 0"),
                                             (["demo", "--steps", "x"], "must be an int >= 1, got 'x'"),
                                             (["nope"], "invalid choice: 'nope'")])
def test_cli_rejects_bad_arguments(argv, match, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert match in capsys.readouterr().err


def test_demo_with_a_logdir_that_is_a_file_exits_2_before_training(tmp_path):
    (tmp_path / "afile.txt").write_text("not a folder")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    done = _warm.run([sys.executable, "-m", "leafwatch", "demo", "--logdir", "afile.txt"], capture_output=True,
                     text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""  # not even the "training ..." line
    assert done.stderr.splitlines() == ["leafwatch demo: `--logdir` 'afile.txt' is a file, not a folder"]
    assert (tmp_path / "afile.txt").read_text() == "not a folder"


def test_leafwatch_report_does_not_import_torch(tmp_path):
    # `leafwatch report` in CI only reads event files: the parser of `leafwatch run`, whose
    # package imports torch, is not built for it.
    code = (f"import sys\nfrom leafwatch import cli\ncode = cli.main(['report', {str(tmp_path)!r}])\n"
            "print(code, 'torch' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    done = _warm.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert "no leafwatch data" in done.stderr


def test_lightning_demo_train_finds_the_bugs_and_nothing_when_clean(tmp_path):
    assert_demo_findings(demo.train(tmp_path / "buggy", max_steps=3, verbose=False))
    assert demo.train(tmp_path / "clean", bugs=(), max_steps=3, verbose=False).findings == []


def _below_the_docstring(path: Path) -> str:
    source = path.read_text()
    return source[source.index('"""\n', 3) + 4:]


def test_the_packaged_demo_is_the_lightning_example_below_its_docstring():
    example = ROOT / "examples" / "lightning_tensorboard.py"
    packaged = Path(importlib.util.find_spec("leafwatch.demo").origin)  # found, not imported: no Lightning needed
    assert _below_the_docstring(packaged) == _below_the_docstring(example), (
        "leafwatch/demo.py and examples/lightning_tensorboard.py differ: copy one onto the other "
        "(keeping each docstring)")


def test_plain_loop_example_writes_the_findings_to_tensorboard(tmp_path):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import plain_loop
    finally:
        sys.path.remove(str(ROOT / "examples"))
    assert_demo_findings(plain_loop.train(tmp_path / "buggy", max_steps=3))
    acc = EventAccumulator(str(tmp_path / "buggy"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    missing = acc.Scalars("leafwatch/open/missing_grad")
    assert (missing[0].step, missing[0].value) == (1, 1)  # one mistake: the unused head
    assert acc.Scalars("leafwatch/open/orphan_tensor")[-1].value == 1
    assert plain_loop.train(tmp_path / "clean", bugs=(), max_steps=3).findings == []


@pytest.mark.parametrize(("direct_url", "target"), [
    (None, "leafwatch[lightning]"),  # from a package index
    ({"url": "file:///src/leafwatch", "dir_info": {}}, "/src/leafwatch[lightning]"),  # from a folder
])
def test_the_install_hint_follows_how_leafwatch_was_installed(direct_url, target, tmp_path):
    # An installed copy: the package and its dist-info in a site folder, no checkout around it.
    site = tmp_path / "site"
    shutil.copytree(ROOT / "leafwatch", site / "leafwatch", ignore=shutil.ignore_patterns("__pycache__"))
    info = site / "leafwatch-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: leafwatch\nVersion: 0.1.0\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    code = ("import leafwatch.integrations.environment as e, leafwatch; "
            "print(leafwatch.__file__); print(e.install_command('lightning'))")
    done = _warm.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                     env={**os.environ, "PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, check=True)
    where, command = done.stdout.splitlines()
    assert where.startswith(str(site))
    assert shlex.split(command) == [sys.executable, "-m", "pip", "install", target]

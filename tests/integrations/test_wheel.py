"""The wheel: built from a copy of the source, installed into a fresh venv, ``leafwatch demo`` run elsewhere.

The fresh venv gets leafwatch from the wheel only; torch, Lightning and TensorBoard come from the
environment running the tests, through a ``.pth`` line naming the directories they are installed
in (a path line adds the directory, it does not run that directory's own ``.pth`` files, so the
editable install of leafwatch there stays out). Nothing is downloaded: ``--no-index``,
``--no-build-isolation``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _requirements import require_module
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[2]
DEPENDENCIES = ("torch", "tensorboard", "typing_extensions", "pytorch_lightning", "lightning")


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def _dependency_dirs() -> list[str]:
    """The directories the dependencies are imported from (one site-packages, usually)."""
    dirs: list[str] = []
    for name in DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        directory = str(Path(spec.origin).resolve().parent.parent)
        if directory not in dirs:
            dirs.append(directory)
    return dirs


def _fresh_venv(path: Path) -> Path:
    """A venv without pip whose site-packages sees the test environment's dependencies."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    python = path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    dirs = _dependency_dirs()
    Path(purelib, "leafwatch_test_dependencies.pth").write_text("\n".join([*dirs, *_start_up_lines(dirs)]) + "\n")
    return python


def _start_up_lines(dirs: list[str]) -> list[str]:
    """The ``import`` lines of the ``.pth`` files in ``dirs`` that run at start-up there (the transparency
    suite's torchvision shim, once the ecosystem extra is installed: torchmetrics, and so Lightning, import
    torchvision), except the editable install of leafwatch, which the fresh venv must not see."""
    lines = []
    for directory in dirs:
        for pth in sorted(Path(directory).glob("*.pth")):
            if "leafwatch" in pth.name:
                continue
            lines += [line for line in pth.read_text().splitlines() if line.startswith("import ")]
    return lines


@pytest.mark.slow
def test_the_demo_runs_from_an_installed_wheel_outside_the_source_tree(tmp_path):
    require_module("setuptools")  # builds the wheel
    require_module("pytorch_lightning")  # `leafwatch demo` trains with Lightning
    # Build from a copy, so that the source tree gets no build/ or egg-info from this test.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "leafwatch", source / "leafwatch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-q", "-w", str(dist), str(source)])
    (wheel,) = dist.glob("leafwatch-*.whl")

    python = _fresh_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    # Without PYTHONPATH: a checkout on it with an editable install's leafwatch.egg-info (the
    # source tree's root) makes pip say "already installed" and install nothing.
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
         env=env)
    scripts = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('scripts'))"]).stdout.strip())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    # Where `leafwatch.demo` is imported from, found without running it (that would import
    # Lightning once more): the `leafwatch demo` below runs it.
    where = _run([str(python), "-c", "import importlib.util; print(importlib.util.find_spec('leafwatch.demo').origin)"],
                 cwd=elsewhere, env=env).stdout.strip()
    assert Path(where).resolve().is_relative_to((tmp_path / "venv").resolve()), where

    logdir = elsewhere / "runs"
    done = _run([str(scripts / "leafwatch"), "demo", "--logdir", "runs", "--steps", "3"], cwd=elsewhere, env=env)
    out = done.stdout
    for words in ("3 seeded bugs (temperature, unused_head, loss_weight)", "missing_grad", "aux_head.{bias,weight}",
                  "not_in_optimizer", "loss_weight", "orphan_tensor", "temperature",
                  "--logdir runs"):
        assert words in out, out
    runs = sorted({p.parent for p in logdir.rglob("events.out.tfevents.*")})
    main_run = next(d for d in runs if d.name != "leafwatch-layout")
    acc = EventAccumulator(str(main_run), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert acc.Scalars("leafwatch/open/missing_grad")[-1].value == 1  # one mistake: the unused head
    assert acc.Scalars("leafwatch/open/not_in_optimizer")[-1].value == 1
    assert "leafwatch/report" in acc.Tags()["tensors"]

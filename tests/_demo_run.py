"""``leafwatch demo`` run once for the tests that read what it printed and wrote.

Its own end-to-end test (tests/integrations/test_demo.py) and the dashboard's (a TensorBoard
server on its logdir, tests/dashboard/test_demo_dashboard.py) read the same run: the
session-scoped ``demo_run`` fixture (tests/conftest.py). Those tests are in the
:data:`DEMO_GROUP` xdist group, so that under ``--dist loadgroup`` one worker runs the demo.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import _warm

ROOT = Path(__file__).resolve().parents[1]

#: The xdist group of the tests that read the demo run.
DEMO_GROUP = "demo_dashboard"


@dataclasses.dataclass(frozen=True)
class DemoRun:
    """One ``python -m leafwatch demo --logdir <cwd>/runs --steps 6``, started in ``cwd``."""

    cwd: Path
    logdir: Path
    env: dict[str, str]
    done: subprocess.CompletedProcess


def run_demo(cwd: Path) -> DemoRun:
    """The demo, from ``cwd`` (a scratch folder), with this checkout first on ``PYTHONPATH``."""
    logdir = cwd / "runs"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = _warm.run([sys.executable, "-m", "leafwatch", "demo", "--logdir", str(logdir), "--steps", "6"],
                     capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    return DemoRun(cwd, logdir, env, done)

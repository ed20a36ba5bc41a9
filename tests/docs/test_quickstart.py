"""The README's quick start runs and finds what the README says it finds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import _warm

REPO = Path(__file__).resolve().parents[2]


def test_quickstart_names_each_seeded_bug_with_its_cause() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = _warm.run([sys.executable, str(REPO / "examples" / "quickstart.py")], capture_output=True,
                    text=True, env=env, timeout=240, check=True)
    text = out.stdout
    assert "3 open of 3 finding(s) at step 1" in text  # three mistakes, five tensors
    assert "ERROR   non_leaf            temperature" in text and "ToCopyBackward0" in text
    assert "ERROR   missing_grad        aux_head" in text and "`aux_head.{bias,weight}`" in text
    assert "module `aux_head` never ran in this step's forward" in text
    assert "ERROR   orphan_tensor       blocks" in text and "nn.ModuleList" in text
    # watch() warned at once, at the user's line.
    assert "quickstart.py:" in out.stderr and "LeafwatchWarning" in out.stderr

"""What leafwatch put into the text of a traceback: its own frames and its note's lines.

A frame is leafwatch's when the module it runs is a module of the leafwatch package, judged by the
package's own folder, never by the word "leafwatch" in a path: ``git clone`` names the checkout
``leafwatch``, and then every path of its tests and scripts holds that word.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import leafwatch

#: The folder of the leafwatch package these tests import (a clone's own under ``PYTHONPATH=.``).
PACKAGE = Path(leafwatch.__file__).resolve().parent
#: A frame line of a traceback, as ``traceback`` prints it: ``  File "PATH", line N, in NAME``.
_FRAME = re.compile(r'^  File "(.+)", line \d+, in ', re.MULTILINE)


def frame_files(text: str) -> list[str]:
    """The file of every frame of the tracebacks in ``text``, in order."""
    return _FRAME.findall(text)


def is_leafwatch_module(file: str, cwd: str | os.PathLike[str] = ".") -> bool:
    """Whether ``file`` (a frame's file, relative to ``cwd`` when not absolute) is a module of the
    leafwatch package; pseudo-files (``<frozen runpy>``, ``<string>``) never are."""
    if file.startswith("<") and file.endswith(">"):
        return False
    path = (Path(cwd) / file).resolve()
    return path.suffix == ".py" and PACKAGE in path.parents


def leafwatch_frames(text: str, cwd: str | os.PathLike[str] = ".") -> list[str]:
    """The files of the frames in ``text`` that run a module of the leafwatch package."""
    return [f for f in frame_files(text) if is_leafwatch_module(f, cwd)]


def leafwatch_lines(text: str, cwd: str | os.PathLike[str] = ".") -> list[str]:
    """What leafwatch wrote into ``text``: the files of its frames, and its lines (``leafwatch: ...``,
    a note or a summary); empty when the traceback is the interpreter's alone."""
    return leafwatch_frames(text, cwd) + [line for line in text.splitlines() if line.startswith("leafwatch:")]

"""Commands that work where leafwatch runs: how to add an extra, how to open the dashboard.

Torch-free. A message that tells the user to run something must give a command that works in
their environment: a virtual environment that is not activated has its ``pip`` and
``tensorboard`` next to its interpreter, not on ``PATH``, and a checkout installs its extras with
``pip install -e ".[lightning]"``, not from PyPI.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import shutil
import sys
import urllib.parse
import urllib.request
from pathlib import Path

#: The distribution name of leafwatch.
DISTRIBUTION = "leafwatch"
_CHECKOUT = Path(__file__).resolve().parent.parent.parent


def _display(path: str | os.PathLike[str]) -> str:
    absolute = os.path.abspath(path)
    try:
        relative = os.path.relpath(absolute)
    except ValueError:  # another drive (Windows)
        return absolute
    return absolute if relative.startswith(os.pardir) else relative


def shown(path: str | os.PathLike[str]) -> str:
    """A path as a command line shows it: relative to the working directory when it is below
    it (``.venv/bin/tensorboard``), else absolute; quoted for the shell when needed."""
    return shlex.quote(_display(path))


def _installed_from() -> tuple[Path | None, bool]:
    """Where the running leafwatch comes from: ``(checkout, True)`` when it runs from a source
    tree (installed editable or on ``PYTHONPATH``), ``(folder, False)`` when it was installed
    from a local folder, ``(None, False)`` from a package index."""
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / DISTRIBUTION).is_dir():
        return _CHECKOUT, True
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)  # the first on sys.path, as imported
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None, False
    if isinstance(direct, dict) and str(direct.get("url", "")).startswith("file:"):
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(direct["url"]).path)), False
    return None, False


def install_command(extra: str) -> str:
    """The command that adds leafwatch's ``extra`` (``"lightning"``) to the running environment.

    From a checkout: ``pip install -e ".[lightning]"`` with the checkout's path; installed from
    a folder: ``pip install "<folder>[lightning]"``; from a package index: ``pip install
    "leafwatch[lightning]"``. ``pip`` is the running interpreter's (``.venv/bin/python -m pip``)
    unless the ``pip`` on ``PATH`` is that one.
    """
    folder, editable = _installed_from()
    pip = "pip" if _on_path("pip") else f"{shown(sys.executable)} -m pip"
    if folder is None:
        return f'{pip} install "{DISTRIBUTION}[{extra}]"'
    # The README's form: pip install -e ".[lightning]".
    return f'{pip} install {"-e " if editable else ""}"{_display(folder)}[{extra}]"'


def _on_path(program: str) -> bool:
    """Whether the ``program`` on ``PATH`` is the one next to the running interpreter."""
    on_path = shutil.which(program)
    beside = shutil.which(program, path=str(Path(sys.executable).parent))
    try:
        return on_path is not None and beside is not None and os.path.samefile(on_path, beside)
    except OSError:
        return False


def tensorboard_command(logdir: str | os.PathLike[str]) -> str:
    """The command that opens TensorBoard, with the Leafwatch tab, on ``logdir``.

    ``tensorboard`` when the one on ``PATH`` is the one next to the running interpreter; that
    one by its path (``.venv/bin/tensorboard``) when it is not on ``PATH``; ``<python> -m
    leafwatch.tensorboard_plugin`` (TensorBoard with the tab added) when leafwatch's TensorBoard
    plugin is not installed.
    """
    log = shlex.quote(str(logdir))
    beside = shutil.which("tensorboard", path=str(Path(sys.executable).parent))
    if beside is not None and any(ep.name == DISTRIBUTION
                                  for ep in importlib.metadata.entry_points(group="tensorboard_plugins")):
        return f"{'tensorboard' if _on_path('tensorboard') else shown(beside)} --logdir {log}"
    return f"{shown(sys.executable)} -m leafwatch.tensorboard_plugin --logdir {log}"


__all__ = ["install_command", "shown", "tensorboard_command"]

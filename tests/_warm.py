"""``run``: ``subprocess.run`` for the tests' ``python -m leafwatch ...`` and ``python script.py`` runs,
forked from a warm interpreter (``tests/_zygote.py``) instead of started cold.

A cold start pays ``import torch`` and ``torch._dynamo`` (about 2.3 s of CPU) before the script's first
line; a fork of the warm interpreter starts at the script's first line, in the same state a cold
``python`` reaches after those imports. Each pytest process (each xdist worker) starts its own warm
interpreter at its first run, and it ends with the process. What cannot be forked faithfully goes to
``subprocess.run`` as it is: another Python, interpreter flags (``-X``, ``-c``), input on stdin, another
leafwatch on ``PYTHONPATH``, a run that must not have leafwatch or torch imported before its first line
(``cold=True``).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ZYGOTE = Path(__file__).resolve().parent / "_zygote.py"
_server: subprocess.Popen | None = None


def _zygote() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, bufsize=1)
        atexit.register(_stop, _server)
    return _server


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(timeout=30)


#: The folder the warm interpreter imports leafwatch from (this checkout's, as the tests' own process does).
_LEAFWATCH_FROM = Path(importlib.util.find_spec("leafwatch").origin).resolve().parent.parent  # type: ignore[arg-type, union-attr]


def _same_leafwatch(env: Mapping[str, str]) -> bool:
    """Whether a cold run with ``env`` would import the leafwatch the warm interpreter holds: no folder on its
    ``PYTHONPATH`` holds another one (a wheel installed elsewhere, a copy of the package)."""
    for folder in filter(None, env.get("PYTHONPATH", "").split(os.pathsep)):
        if (Path(folder) / "leafwatch" / "__init__.py").exists():
            return Path(folder).resolve() == _LEAFWATCH_FROM
    return True


def _request(command: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``(mode, target, args)`` of a command the warm interpreter can run, else None."""
    if len(command) < 2 or os.path.realpath(command[0]) != os.path.realpath(sys.executable):
        return None
    if command[1] == "-m" and len(command) > 2:
        return "module", command[2], list(command[3:])
    if command[1].endswith(".py") and not command[1].startswith("-"):
        return "script", command[1], list(command[2:])
    return None


def run(command: Sequence[str | os.PathLike], *, cwd: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None, timeout: float | None = None, cold: bool = False,
        input: str | None = None, check: bool = False, **kwargs: Any) -> subprocess.CompletedProcess:
    """As ``subprocess.run(command, capture_output=True, text=True, ...)``, forked from the warm interpreter
    where the command is ``[sys.executable, "-m", module, ...]`` or ``[sys.executable, "script.py", ...]``.

    Raises:
        subprocess.TimeoutExpired: it ran past ``timeout``.
        subprocess.CalledProcessError: ``check`` and a non-zero exit code.
    """
    command = [os.fspath(part) for part in command]
    kwargs.pop("capture_output", None)
    kwargs.pop("text", None)
    environment = dict(os.environ if env is None else env)
    found = None if cold or input is not None or kwargs or not _same_leafwatch(environment) else _request(command)
    if found is None:
        return subprocess.run(command, cwd=cwd, env=env, timeout=timeout, input=input, check=check,
                              capture_output=True, text=True, **kwargs)
    mode, target, args = found
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        request = {"mode": mode, "target": target, "args": args, "cwd": os.path.abspath(cwd or os.getcwd()),
                   "env": environment, "stdout": out, "stderr": err, "timeout": timeout}
        server = _zygote()
        server.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        server.stdin.flush()  # type: ignore[union-attr]
        line = server.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the warm interpreter {ZYGOTE} ended (exit code {server.wait()})")
        answer = json.loads(line)
        stdout = Path(out).read_text(errors="replace")
        stderr = Path(err).read_text(errors="replace")
    if answer.get("timeout"):
        raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)  # type: ignore[arg-type]
    result = subprocess.CompletedProcess(command, answer["returncode"], stdout, stderr)
    if check:
        result.check_returncode()
    return result

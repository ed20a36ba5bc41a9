"""A warm interpreter that the tests' subprocess runs are forked from (``tests/_warm.py`` starts it).

Each ``python -m leafwatch run script.py`` a test starts pays about 2.3 s of CPU before the script's
first line: ``import torch``, and ``torch._dynamo``, which torch imports when the first optimizer is
built (``Optimizer.add_param_group`` is wrapped by ``torch._disable_dynamo``). On 2 cores, with a few
hundred such runs, that was most of the suite's time. This process imports them once, and then, for
each request read from stdin (one JSON line), forks: the child is a fresh run of the command as
``python`` would start it (the working folder, the environment, ``sys.argv``, ``sys.path[0]``, stdin
from ``/dev/null``, stdout and stderr to the files named), and it ends as an interpreter does (an
uncaught exception printed by ``sys.excepthook``, exit code 1; ``SystemExit`` as Python exits with it;
non-daemon threads joined, then the ``atexit`` handlers, then stdout and stderr flushed, as
``Py_FinalizeEx`` does: only the teardown of the modules, which nothing of a run can see, is skipped). The parent answers with the exit code, or a
timeout. Nothing runs in this process but imports, so every child starts from the same state: no
thread, no tensor op, no hook.

Protocol (one line each way): ``{"mode": "module" | "script", "target": "leafwatch" | path, "args":
[...], "cwd": ..., "env": {...}, "stdout": path, "stderr": path, "timeout": seconds or null}`` ->
``{"returncode": int}`` or ``{"timeout": true}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn


def _warm() -> None:
    import torch
    import torch._dynamo  # noqa: F401  (torch imports it at the first optimizer: a second per run)

    import leafwatch.cli  # noqa: F401
    import leafwatch.integrations.runner.command  # noqa: F401

    del torch
    if threading.active_count() != 1:  # a fork copies one thread only: the imports must start none
        raise RuntimeError(f"the warm imports started threads: {threading.enumerate()}")


def _child(request: dict[str, Any]) -> NoReturn:
    """The forked run: as ``python -m TARGET ARGS`` or ``python TARGET ARGS`` would start it."""
    import builtins
    import importlib.machinery
    import runpy
    import types
    from pathlib import Path

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import tempfile

    tempfile.tempdir = None  # (the warm imports may have cached it: worked out again from this TMPDIR, as a cold start does)
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    target, args = request["target"], request["args"]
    main = sys.modules["__main__"] = types.ModuleType("__main__")  # (the script's module stays __main__ to the end)
    if request["mode"] == "module":
        sys.argv = ["-m", *args]  # (runpy sets argv[0] to the module's file)
        sys.path[:] = [os.getcwd(), *extra, *sys.path[1:]]
        runner: Any = lambda: runpy._run_module_as_main(target)  # what `python -m` calls
    else:
        target = os.path.abspath(target)
        sys.argv = [request["target"], *args]
        sys.path[:] = [os.path.dirname(target), *extra, *sys.path[1:]]
        main.__dict__.update(__file__=target, __builtins__=builtins, __cached__=None,
                             __loader__=importlib.machinery.SourceFileLoader("__main__", target))
        runner = lambda: exec(compile(Path(target).read_bytes(), target, "exec"), main.__dict__)
    try:
        runner()
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException as error:
        tb = error.__traceback__  # from the script's own frame on, as the interpreter prints it
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # (the frames of this file: `python -m` keeps runpy's own, as here)
        if tb is not None:
            error.__traceback__ = tb  # (the default hook prints the exception's own traceback)
        sys.excepthook(type(error), error, error.__traceback__)
        code = 1
    _finish(code)


def _exit_code(code: Any) -> int:
    """The exit code of ``SystemExit(code)`` as Python's own exit gives it (a message printed, then 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def _finish(code: int) -> NoReturn:
    """End the run as ``Py_FinalizeEx`` does, in its order: wait for the non-daemon threads, run the
    ``atexit`` handlers, flush stdout and stderr; then leave without tearing the modules down (with torch
    loaded that takes over a second, and a cold run of the same script would have done it unseen)."""
    import atexit

    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


def _serve() -> None:
    protocol = os.fdopen(os.dup(1), "w")  # the answers; fd 1 itself becomes each child's stdout
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # (nothing this process writes to stdout reaches the answers)
    os.close(quiet)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            protocol.close()
            sys.stdin.close()
            _child(request)
        answer = _wait(pid, request.get("timeout"))
        protocol.write(json.dumps(answer) + "\n")
        protocol.flush()


def _wait(pid: int, timeout: float | None) -> dict[str, Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status)}
        if time.monotonic() >= deadline:  # type: ignore[operator]
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"timeout": True}
        time.sleep(0.01)


if __name__ == "__main__":
    _warm()
    _serve()

"""Executes the code fixes leafwatch prints: the findings of one script of ``tests/scripts/`` (and the
crash it raised, explained), the :class:`~leafwatch.report.words.Edit` of each code fix applied to the
text of a copy of the script, and that copy run again under ``leafwatch run``.

``python _fix_runs.py SCRIPT OUT.json`` runs SCRIPT under ``leafwatch run``'s own function (a real
Session with a ``--logdir``, the real crash door) and writes to OUT.json the findings leafwatch decided:
the open findings of the run's record (as ``leafwatch report --json`` reads them) and the findings that
explained the script's exception, if it raised one. The crash doors are read by wrapping the real
``Checker.crash`` (a Monitor's, through its history) and ``leafwatch.detectors.crashes.explain`` (a watched
tensor's without a Monitor); their findings pass through unchanged.

``python _fix_runs.py --batch SPEC.json OUT.json`` does the same for several scripts in one process (one
interpreter start for all: :func:`runs_of`), each in its own folder, and also writes what each printed on
stderr and, for the expressions the spec names (``W1``, ``model.fc``: read in the script's variables once it
ended), whether each tensor trains: an optimizer that stepped held it, it had a gradient at a step, and its
value changed since the first step that held it (torch's global optimizer step hooks, as a user's would be).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from leafwatch.report.words import Edit

import _warm

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"


def apply_edits(text: str, edits: Iterable[Edit]) -> str:
    """``text`` with each edit applied (``insert_after`` line ``end``, or ``replace`` lines ``start`` to
    ``end``; lines count from 1), the lowest last so that each edit's lines still count from the text it
    was made for; an edit already in the text (two findings, one fix) is applied once.

    Raises:
        ValueError: edits that overlap, or an edit outside the text.
    """
    lines = text.splitlines(keepends=True)
    unique = sorted(set(edits), key=lambda e: (e.end, e.start, e.action == "replace", e.text), reverse=True)
    last_start = len(lines) + 2
    for edit in unique:
        if not 1 <= edit.start <= edit.end <= len(lines):
            raise ValueError(f"edit outside the text ({len(lines)} lines): {edit}")
        if edit.end >= last_start and not (edit.action == "insert_after" and edit.end == last_start - 1):
            raise ValueError(f"edits overlap at line {edit.end}: {edit}")
        new = edit.text.splitlines(keepends=True)
        if edit.action == "insert_after":
            lines[edit.end:edit.end] = new
            last_start = edit.end + 1
        else:
            lines[edit.start - 1:edit.end] = new
            last_start = edit.start
    return "".join(lines)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONHASHSEED"] = "0"
    return env


def findings_of(script: Path, out: Path, *args: str) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    """What ``leafwatch run`` decides on ``script`` (run in its own folder): ``{"open": [...], "crash":
    [...]}``, each a list of ``Finding.to_dict()``; and the finished process."""
    result = _warm.run([sys.executable, str(Path(__file__).resolve()), str(script), str(out), *args],
                       capture_output=True, text=True, env=_env(), cwd=script.parent, timeout=300)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr
    assert out.exists(), result.stderr
    return json.loads(out.read_text()), result


def code_edits(findings: Sequence[Mapping[str, Any]], script: Path) -> list[Edit]:
    """The edit of each code fix among ``findings`` that goes into ``script``."""
    edits = []
    for found in findings:
        remedy = found.get("remedy") or {}
        edit = remedy.get("edit")
        if remedy.get("applicability") == "code" and isinstance(edit, Mapping):
            if Path(edit["path"]).resolve() == script.resolve():
                edits.append(Edit.from_dict(edit))
    return edits


def fixed_copy(script: Path, edits: Iterable[Edit], folder: Path) -> Path:
    """A copy of ``script``'s folder in ``folder`` with ``edits`` applied to the copy of ``script``."""
    copy = folder / script.parent.name
    shutil.copytree(script.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / script.name
    target.write_text(apply_edits(script.read_text(), edits))
    return target


def runs_of(spec: Sequence[Mapping[str, Any]], out: Path) -> dict[str, Any]:
    """What ``leafwatch run`` decides on each script of ``spec`` (``{"script", "argv", "trains"}``), all run in one
    process: ``{key: {"code", "open", "crash", "stderr", "trains"}}``, keyed by the script's path and arguments."""
    listing = out.with_suffix(".spec.json")
    listing.write_text(json.dumps(list(spec)))
    result = _warm.run([sys.executable, str(Path(__file__).resolve()), "--batch", str(listing), str(out)],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert out.exists(), result.stderr
    found = json.loads(out.read_text())
    for run in found.values():
        assert "LeafwatchInternalWarning" not in run["stderr"], run["stderr"]
    return found


def key_of(script: Path | str, argv: Sequence[str] = ()) -> str:
    return " ".join([str(script), *argv])


class _Training:
    """What torch's global optimizer step hooks see: each tensor an optimizer stepped, whether it had a gradient
    after a step, and its value before the first step that held it."""

    def __init__(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.first: dict[int, tuple[Any, Any]] = {}
        self.grads: set[int] = set()
        self.handles = [register_optimizer_step_pre_hook(self._before), register_optimizer_step_post_hook(self._after)]

    def _before(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in self.first:
                    self.first[id(p)] = (p, p.detach().clone())

    def _after(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            self.grads.update(id(p) for p in group["params"] if p.grad is not None)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()

    def trains(self, value: Any) -> dict[str, bool]:
        """Whether every tensor of ``value`` (a tensor, a module's parameters) trained."""
        import torch

        tensors = list(value.parameters()) if isinstance(value, torch.nn.Module) else [value]
        held = [id(t) in self.first for t in tensors]
        return {"stepped": bool(tensors) and all(held), "grad": bool(tensors) and all(id(t) in self.grads for t in tensors),
                "changed": bool(tensors) and all(h and not torch.equal(self.first[id(t)][1], t.detach())
                                                 for h, t in zip(held, tensors))}


def _batch(listing: str, out: str) -> int:
    import contextlib
    import io

    results = {}
    for item in json.loads(Path(listing).read_text()):
        script = Path(item["script"])
        stderr, here = io.StringIO(), os.getcwd()
        training = _Training()
        os.chdir(script.parent)
        try:
            with contextlib.redirect_stderr(stderr):
                found, scope = _run(str(script), "", item.get("argv", []))
        finally:
            os.chdir(here)
            training.close()
        trains = {expr: training.trains(eval(expr, dict(scope))) if scope else None for expr in item.get("trains", [])}
        results[key_of(item["script"], item.get("argv", []))] = {**found, "stderr": stderr.getvalue(), "trains": trains}
    Path(out).write_text(json.dumps(results))
    return 0


@contextlib.contextmanager
def _crash_doors(explained: list[Any]) -> Iterator[None]:
    """Collect into ``explained`` the findings the crash doors decide: a Monitor's (``Checker.crash``, through its
    history) and a watched tensor's without a Monitor (``crashes.explain``); their findings pass through unchanged."""
    from leafwatch.detectors import crashes
    from leafwatch.detectors.checker import Checker

    real_explain, real_crash = crashes.explain, Checker.crash

    def explain(error: BaseException, contexts: Any = ()) -> list[Any]:
        found = real_explain(error, contexts)
        explained.extend(found)
        return found

    def crash(self: Any, error: BaseException, contexts: Any = ()) -> list[Any]:
        found = real_crash(self, error, contexts)
        explained.extend(found)
        return found

    crashes.explain, Checker.crash = explain, crash  # type: ignore[method-assign]
    try:
        yield
    finally:
        crashes.explain, Checker.crash = real_explain, real_crash  # type: ignore[method-assign]


def _run(script: str, out: str, argv: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The findings of ``leafwatch run`` on ``script`` and the script's variables when it ended (none when it
    raised)."""
    import tempfile

    from leafwatch.integrations.runner import command
    from leafwatch.report.reader import format_json, read_reports

    explained: list[Any] = []
    real_target = command.run_target
    scope: dict[str, Any] = {}

    def run_target(*args: Any, **kwargs: Any) -> int:
        code = real_target(*args, **kwargs)
        ended = args[4] if len(args) > 4 else kwargs.get("ended")
        scope.update(ended or {})
        return code

    command.run_target = run_target
    try:
        with tempfile.TemporaryDirectory() as logdir, _crash_doors(explained):
            code = command.run(script, argv, logdir=logdir)
            runs = json.loads(format_json(logdir, read_reports(logdir)))["runs"]
    finally:
        command.run_target = real_target
    opened = [f for run in runs for f in run["findings"] if f["status"] == "open"]
    return {"code": code, "open": opened, "crash": [f.to_dict() for f in explained]}, scope


def _main(script: str, out: str, argv: Sequence[str]) -> int:
    import tempfile

    from leafwatch.integrations.runner import command
    from leafwatch.report.reader import format_json, read_reports

    explained: list[Any] = []
    with tempfile.TemporaryDirectory() as logdir, _crash_doors(explained):
        code = command.run(script, argv, logdir=logdir)
        runs = json.loads(format_json(logdir, read_reports(logdir)))["runs"]
    opened = [f for run in runs for f in run["findings"] if f["status"] == "open"]
    Path(out).write_text(json.dumps({"code": code, "open": opened, "crash": [f.to_dict() for f in explained]}))
    return code


if __name__ == "__main__":
    if sys.argv[1] == "--batch":
        raise SystemExit(_batch(sys.argv[2], sys.argv[3]))
    raise SystemExit(_main(sys.argv[1], sys.argv[2], sys.argv[3:]))

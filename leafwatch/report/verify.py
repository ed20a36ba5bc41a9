"""``--verify``: a patch proven before it is applied (``leafwatch report DIR --diff --verify``,
``leafwatch run --diff FILE --verify``).

The record of a ``leafwatch run`` keeps what it ran (:func:`command`: the script or module, its
arguments, the options, the working folder, when it started, how it ended). :func:`verify` copies that
folder to a scratch folder (:func:`copy_folder`: the log folder left out, large files and folders the
run did not change linked rather than copied), applies the patch to the copy, runs the same command
there under ``leafwatch run --max-steps N`` (N: the optimizer steps the run made, at most
``--verify-steps``), its log folder in the copy too, and reads the rerun's record back. Each finding
the patch fixes is then *fixed* (not open in the rerun), *still open*, or *undecided* (the rerun
stopped before the step at which the run decided it); an open finding of the rerun that the run did
not have is *new* (:func:`judge`). The outcome is written as a ``leafwatch/verify`` record
(:data:`~leafwatch.report.records.VERIFY_TAG`) beside the run's records and the rerun's, each in an
event file of its own: the run's own records stay as they were, and the tab marks each verified hunk.
Torch-free: the rerun is a process of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .findings import Finding, Report, Severity, Status
from .patch import Patch, outside, record as hunks_of
from .records import VERIFY_SUFFIX, VERIFY_TAG, tensor_summary

#: The most optimizer steps a rerun makes unless ``--verify-steps`` says otherwise.
VERIFY_STEPS = 50
#: A file over this many bytes (not Python source), or a folder holding no Python source and over
#: this many bytes in all, that nothing changed since the run started, is linked instead of copied.
LINK_OVER = 1 << 20
#: Seconds before the run started from which a change counts (a file system's clock may lag the wall clock).
CLOCK_MARGIN = 2.0
#: The most bytes the scratch copy may copy (what it links does not count).
COPY_LIMIT = 2 << 30
#: Folders linked whole: history and installed libraries (a folder holding ``pyvenv.cfg`` too).
LINKED_WHOLE = (".git", "site-packages", "dist-packages")
#: Folders left out of the copy (Python writes them again as it imports).
SKIPPED = ("__pycache__",)
#: What a patched finding turned out to be in the rerun.
FIXED, STILL_OPEN, UNDECIDED, GONE = "fixed", "still_open", "undecided", "gone"


class Refused(ValueError):
    """No verification: the run cannot be run again as it was (the message is one line)."""


def command(script: str | None, module: str | None, argv: Sequence[str], *, cwd: str, logdir: str | None,
            strict: bool, patience: int, ignore: Mapping[str, str] | None, max_steps: int | None) -> dict[str, Any]:
    """What a ``leafwatch run`` records of itself (its record's ``"command"``): enough to run it again."""
    return {"by": "leafwatch run", "python": sys.executable, "cwd": os.path.abspath(cwd), "script": script, "module": module, "args": list(argv),
            "options": {"logdir": logdir, "strict": strict, "patience": patience, "ignore": dict(ignore or {}),
                        "max_steps": max_steps},
            "started": time.time(), "ended": None}


@dataclasses.dataclass(frozen=True)
class Original:
    """The run to verify: what it ran (its record's ``"command"``), its report, its patch as it applies now,
    and the folder of its records (None: it wrote none), where the verification record goes."""

    run: Mapping[str, Any]
    report: Report
    patch: Patch
    folder: str | None
    hunks: Sequence[Mapping[str, Any]] | None = None

    @property
    def steps(self) -> int:
        """The optimizer steps the run made (as it ended; its last report's step for a run still writing)."""
        ended = self.run.get("ended")
        made = ended.get("step") if isinstance(ended, Mapping) else None
        return made if isinstance(made, int) and not isinstance(made, bool) else self.report.step or 0


def of_record(data: Mapping[str, Any], patch: Patch, folder: str, label: str) -> Original:
    """The run whose ``leafwatch/report`` record is ``data`` (read from ``folder``, named ``label``).

    Raises:
        Refused: the record was not written by ``leafwatch run`` (a Monitor, a callback, an earlier leafwatch).
    """
    run = data.get("command")
    if not isinstance(run, Mapping) or run.get("by") != "leafwatch run" or not isinstance(run.get("cwd"), str):
        raise Refused(f"run {label} was not made by `leafwatch run` (a Monitor, a callback or an earlier leafwatch "
                      "wrote its record): there is no command to run again")
    hunks = (data.get("patch") or {}).get("hunks")
    return Original(run, Report.from_dict(data), patch, folder, hunks if isinstance(hunks, list) else None)


# -- the scratch copy -------------------------------------------------------------------------
@dataclasses.dataclass
class Copy:
    """A scratch copy of ``source`` at ``root``: what was linked instead of copied, and its stamp then."""

    source: str
    root: str
    linked: list[str] = dataclasses.field(default_factory=list)
    stamps: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    copied: int = 0

    def inside(self, path: str) -> str:
        """Where ``path`` (under the source) is in the copy."""
        return os.path.normpath(os.path.join(self.root, os.path.relpath(os.path.abspath(path), self.source)))

    def changed(self) -> list[str]:
        """The linked files and folders that changed since they were linked (the rerun wrote to the original)."""
        return [path for path, stamp in self.stamps.items() if _stamp(path) != stamp]


def _stamp(path: str) -> tuple[int, int]:
    """(size in bytes, newest modification in ns) of a file, or of a folder and everything in it."""
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            info = os.stat(path)
            return info.st_size, info.st_mtime_ns
        size, newest = 0, os.stat(path).st_mtime_ns
        for folder, folders, files in os.walk(path):
            for name in folders + files:
                info = os.lstat(os.path.join(folder, name))
                size, newest = size + info.st_size, max(newest, info.st_mtime_ns)
        return size, newest
    except OSError:
        return -1, -1


def _python(name: str) -> bool:
    return name.endswith((".py", ".pyi", ".pth"))


def _whole(path: str, name: str) -> bool:
    return name in LINKED_WHOLE or os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def _scan(folder: str, skip: set[str], sizes: dict[str, tuple[int, int, bool]]) -> tuple[int, int, bool]:
    """``sizes[folder]``: (bytes in all, newest modification in ns, holds Python source), for every folder
    under ``folder`` that is copied or may be linked."""
    total, newest, python = 0, os.stat(folder).st_mtime_ns, False
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.path in skip or entry.name in SKIPPED or entry.is_symlink():
                continue
            if entry.is_dir():
                if _whole(entry.path, entry.name):
                    continue
                size, changed, holds = _scan(entry.path, skip, sizes)
            elif entry.is_file():
                info = entry.stat()
                size, changed, holds = info.st_size, info.st_mtime_ns, _python(entry.name)
            else:
                continue
            total, newest, python = total + size, max(newest, changed), python or holds
    sizes[folder] = (total, newest, python)
    return sizes[folder]


def copy_folder(source: str, into: str, *, skip: Iterable[str], started: float) -> Copy:
    """Copy ``source`` to ``into`` (made), leaving out ``skip`` (the log folders) and ``__pycache__``.

    The rule: Python source is always copied; a file over :data:`LINK_OVER` bytes, or a folder without
    Python source over that size in all, is linked (a symlink to the original) when nothing in it changed
    since the run started (``started``, a wall time, less :data:`CLOCK_MARGIN`): the run only read it,
    and the rerun, which makes no more steps than the run, reads it too; ``.git``, ``site-packages`` and
    virtual environments are linked whole. Everything else is copied (with its times). A symlink is
    copied as a symlink (one that points into ``source`` by an absolute path points into the copy).

    Raises:
        Refused: more than :data:`COPY_LIMIT` bytes would be copied.
        OSError: a file could not be read or written.
    """
    source, into = os.path.abspath(source), os.path.abspath(into)
    skipped = {os.path.abspath(p) for p in skip} | {into}
    copy, sizes = Copy(source, into), {}
    _scan(source, skipped, sizes)
    os.makedirs(into, exist_ok=True)
    _place(copy, source, into, skipped, sizes, (started - CLOCK_MARGIN) * 1e9)
    return copy


def _place(copy: Copy, folder: str, target: str, skip: set[str], sizes: dict[str, tuple[int, int, bool]],
           started: float) -> None:
    """Copy or link what ``folder`` holds into ``target`` (:func:`copy_folder`'s rule)."""
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            path, there = entry.path, os.path.join(target, entry.name)
            if path in skip or entry.name in SKIPPED:
                continue
            if entry.is_symlink():
                pointed = os.readlink(path)
                if os.path.isabs(pointed) and not outside(pointed, copy.source):
                    pointed = copy.inside(pointed)
                os.symlink(pointed, there)
            elif entry.is_dir():
                size, newest, python = sizes.get(path, (0, 0, True))
                if _whole(path, entry.name) or (not python and size > LINK_OVER and newest < started):
                    _link(copy, path, there, watch=not _whole(path, entry.name))
                else:
                    os.mkdir(there)
                    _place(copy, path, there, skip, sizes, started)
                    shutil.copystat(path, there)
            elif entry.is_file():
                info = entry.stat()
                if not _python(entry.name) and info.st_size > LINK_OVER and info.st_mtime_ns < started:
                    _link(copy, path, there, watch=True)
                else:
                    copy.copied += info.st_size
                    if copy.copied > COPY_LIMIT:
                        raise Refused(f"over {COPY_LIMIT >> 30} GiB would be copied from {copy.source}, more than a "
                                      "scratch copy takes: start the run in the folder of its own code")
                    shutil.copy2(path, there)


def _link(copy: Copy, path: str, there: str, *, watch: bool) -> None:
    os.symlink(path, there, target_is_directory=os.path.isdir(path))
    copy.linked.append(os.path.relpath(path, copy.source) + (os.sep if os.path.isdir(path) else ""))
    if watch:
        copy.stamps[path] = _stamp(path)


def apply_to(patch: Patch, copy: Copy) -> None:
    """Write each patched file into the copy.

    Raises:
        Refused: a file of the copy is not the text the patch was made from (it changed since the run).
        OSError: a file could not be written.
    """
    for f in patch.files:
        if outside(f.path, copy.source) is not None:
            raise Refused(f"{f.path} is patched but lies outside the folder the run was started in ({copy.source})")
        there = copy.inside(f.path)
        with open(there, encoding="utf-8", newline="") as current:
            if current.read() != f.before:
                raise Refused(f"{f.relative} changed since the run: run it again to verify a patch of it as it is now")
        os.chmod(there, os.stat(there).st_mode | 0o200)
        with open(there, "w", encoding="utf-8", newline="") as out:
            out.write(f.after)


# -- the rerun -------------------------------------------------------------------------------
def rerun_command(run: Mapping[str, Any], copy: Copy, logdir: str, steps: int) -> list[str]:
    """``leafwatch run`` with the recorded Python and options, ``--logdir`` in the scratch folder and ``--max-steps``.

    Raises:
        Refused: the script lies outside the folder the run was started in (its copy would not be run).
    """
    options, python = run.get("options") or {}, run.get("python")
    python = python if isinstance(python, str) and os.path.isfile(python) else sys.executable  # (the run's, when it is there)
    line = [python, "-m", "leafwatch", "run", "--logdir", logdir, "--max-steps", str(steps)]
    if options.get("strict"):
        line.append("--strict")
    if options.get("patience", 1) != 1:
        line += ["--patience", str(options["patience"])]
    for pattern, reason in (options.get("ignore") or {}).items():
        line += ["--ignore", f"{pattern}={reason}"]
    args = [str(a) for a in run.get("args") or ()]
    if run.get("module"):
        return [*line, "-m", str(run["module"]), *args]
    script = str(run.get("script"))
    where = outside(os.path.join(copy.source, script), copy.source)
    if where is not None:
        raise Refused(f"the script {script}: {where}; only a script in that folder is run from its copy")
    return [*line, copy.inside(os.path.join(copy.source, script)) if os.path.isabs(script) else script, *args]


def rerun_environment(copy: Copy) -> dict[str, str]:
    """This environment, with each ``PYTHONPATH`` folder under the source moved into the copy, and no
    bytecode written (nothing is written into a linked folder)."""
    env = dict(os.environ)
    paths = [copy.inside(p) if os.path.isabs(p) and outside(p, copy.source) is None else p
             for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _rerun(line: list[str], cwd: str, copy: Copy, log: str) -> int:
    """Run ``line`` in ``cwd`` (in the copy), its output into ``log``; its exit code."""
    with open(log, "w", encoding="utf-8") as out:
        out.write(f"$ cd {cwd} && {' '.join(line)}\n")
        out.flush()
        return subprocess.run(line, cwd=cwd, env=rerun_environment(copy), stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, check=False).returncode


#: Reads the latest report record under a log folder: (the record, the folder it is in), or None.
Read = Callable[[str], "tuple[Mapping[str, Any], str] | None"]


# -- the outcome -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one finding of the run turned out to be in the rerun."""

    kind: str
    name: str
    outcome: str
    decided_step: int

    def line(self, reached: int) -> str:
        said = self.outcome.replace("_", " ")  # `still_open`: still open
        why = f" (the run decided it at step {self.decided_step}; the rerun made {reached})" \
            if self.outcome == UNDECIDED and self.decided_step > reached else \
            " (the rerun left it undecided: it ended before the checks that decide it)" if self.outcome == UNDECIDED else ""
        return f"{said}: {self.kind} {self.name}{why}"


def _holds(f: Finding) -> bool:
    """An error or warning that holds at the end (open, or intermittent)."""
    return f.status in (Status.OPEN, Status.INTERMITTENT) and f.severity != Severity.INFO


def decided_at(f: Finding) -> int:
    """The optimizer step at which the run decided ``f`` (the last of its tensors'; 0: at start)."""
    steps = []
    for t in (f, *f.members):
        decided = t.details.get("decided_step")
        steps.append(decided if isinstance(decided, int) and not isinstance(decided, bool) else t.first_step or 0)
    return max(steps)


def _names(f: Finding) -> set[str]:
    """What a finding names: itself and each of its tensors (a mistake's name follows its members)."""
    return {f.name, *f.names}


def judge(report: Report, patched: set[tuple[str, str]], rerun: Report | None,
          reached: int) -> tuple[list[Outcome], list[Outcome], list[Finding]]:
    """The outcome of each patched finding of ``report`` (fixed, still open, undecided), of each other
    open one (still open, gone, undecided), and the rerun's new findings (open there, not in the run).

    A finding of the rerun is the same as one of the run when they are of one kind and name one tensor
    (or the same thing) alike. A finding the rerun holds (open or intermittent) is still open; one the run
    decided at a step later than the rerun reached (``reached``: the optimizer steps it made), or that the
    rerun left undecided (it ended before the checks that decide it), is undecided; else it is fixed. No
    rerun report: everything is undecided.
    """
    later_findings = list(rerun.findings) if rerun is not None else []
    fixes, others = [], []
    held = [f for f in report.findings if _holds(f)]
    for f in held:
        key, decided = (str(f.kind), f.name), decided_at(f)
        same = [g for g in later_findings if g.kind == f.kind and _names(g) & _names(f)]
        if any(_holds(g) for g in same):
            outcome = STILL_OPEN
        elif rerun is None or decided > reached or any(g.reason.name == "undecided" for g in same):
            outcome = UNDECIDED
        else:
            outcome = FIXED if key in patched else GONE
        (fixes if key in patched else others).append(Outcome(key[0], key[1], outcome, decided))
    new = [g for g in later_findings
           if _holds(g) and not any(f.kind == g.kind and _names(f) & _names(g) for f in held)]
    return fixes, others, new


# -- the verification --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Rerun:
    """A rerun made ready: the scratch folder, the copy, where it runs, its command, log folder and log."""

    scratch: str
    copy: Copy
    cwd: str
    line: list[str]
    logdir: str
    log: str
    steps: int


def prepare(original: Original, steps: int) -> Rerun:
    """The scratch copy of the run's folder with the patch applied, and the command that runs it again
    for the steps the run made, at most ``steps`` (at least one: a run that crashed before its first step).

    Raises:
        Refused: a patched file changed since the run, or the script lies outside the folder.
        OSError: the copy failed.
    """
    run, options = original.run, original.run.get("options") or {}
    cwd = os.path.abspath(str(run["cwd"]))
    logdir = os.path.join(cwd, str(options["logdir"])) if options.get("logdir") else None
    scratch = tempfile.mkdtemp(prefix="leafwatch-verify-")
    started = run.get("started")
    copy = copy_folder(cwd, os.path.join(scratch, os.path.basename(cwd) or "root"),
                       skip=[p for p in (logdir, original.folder) if p],
                       started=started if isinstance(started, (int, float)) else 0.0)
    apply_to(original.patch, copy)
    inside = logdir is not None and outside(logdir, cwd) is None
    rerun_logdir = copy.inside(logdir) if inside else os.path.join(scratch, "logs")  # type: ignore[arg-type]
    limit = max(1, min(original.steps, steps))  # (a run that crashed before its first step: the rerun checks one)
    return Rerun(scratch, copy, copy.inside(cwd), rerun_command(run, copy, rerun_logdir, limit), rerun_logdir,
                 os.path.join(scratch, "rerun.log"), limit)


def verify(original: Original, *, steps: int = VERIFY_STEPS, say: Callable[[str], None], read: Read) -> int:
    """Prove ``original``'s patch by running the patched copy again (this module's docstring); each
    finding's outcome goes to ``say``, one line each; ``read`` reads the rerun's record
    (:func:`leafwatch.report.reader.latest_record`). The exit code: 0 when every patched finding is
    fixed and nothing new appeared, 1 otherwise, 2 when the run cannot be run again (said on one line)."""
    if not original.patch.files:
        say("verify: nothing to verify: the patch holds no file")
        return 0
    try:
        rerun = prepare(original, steps)
    except Refused as refused:
        say(f"verify: refused: {refused}")
        return 2
    except OSError as error:
        say(f"verify: refused: can't copy {error.filename or 'the folder'}: {error.strerror or error}")
        return 2
    code = _rerun(rerun.line, rerun.cwd, rerun.copy, rerun.log)
    found = read(rerun.logdir)
    data = found[0] if found is not None else None
    reached = data.get("step") if data is not None and isinstance(data.get("step"), int) else 0
    patched = {(str(f.kind), f.name) for f in original.report.findings if f.is_open} - {
        (o.kind, o.name) for o in original.patch.left_out}  # the open findings whose fix the patch holds
    fixes, others, new = judge(original.report, patched, Report.from_dict(data) if data else None, reached)
    problems = _problems(original, rerun, code, data)
    exit_code = 0 if all(o.outcome == FIXED for o in fixes) and not new and not problems else 1
    for line in _said(original, rerun, code, reached, fixes, others, new, problems, exit_code):
        say(line)
    record = _record(original, rerun, code, data, steps, fixes, others, new, problems, exit_code)
    for folder in (original.folder, found[1] if found is not None else None):
        if folder is not None and os.path.isdir(folder):
            write_record(folder, record, original.report.step or 0)
    return exit_code


def _problems(original: Original, rerun: Rerun, code: int, data: Mapping[str, Any] | None) -> list[str]:
    """What else failed: no record, the patched script crashed where the run's did not, a linked file changed."""
    problems = []
    ended = ((data or {}).get("command") or {}).get("ended") or {}
    was = original.run.get("ended") or {}
    before = was.get("exit_code")
    script = ended.get("exit_code") if ended else code
    if not ended.get("stopped_by") and script not in (0, None, before):
        then = f"was stopped by leafwatch ({was['stopped_by']})" if was.get("stopped_by") else f"exited {before or 0}"
        problems.append(f"the patched script exited {script} where the run's {then}{_last_line(rerun.log)}")
    elif data is None:
        problems.append(f"the rerun wrote no leafwatch record (exit {code}){_last_line(rerun.log)}")
    problems += [f"the rerun changed {path}, linked from the original folder (not copied: nothing in it had "
                 "changed since the run started)" for path in rerun.copy.changed()]
    return problems


def _last_line(log: str) -> str:
    """``: LAST LINE`` of the rerun's output (its exception, usually), or nothing."""
    try:
        with open(log, encoding="utf-8", errors="replace") as out:
            lines = [line.strip() for line in out if line.strip() and not line.startswith("leafwatch")]
    except OSError:
        return ""
    return f": {lines[-1]}" if lines else ""


def _said(original: Original, rerun: Rerun, code: int, reached: int, fixes: list[Outcome], others: list[Outcome],
          new: list[Finding], problems: list[str], exit_code: int) -> list[str]:
    """The lines of a verification: where it ran, each finding's outcome, what is new, what failed, the verdict."""
    made = original.steps
    lines = [f"verify: copied {rerun.copy.source} to {rerun.copy.root} and applied the patch there"]
    if rerun.copy.linked:
        lines.append(f"verify: linked, not copied (read only: over 1 MiB, unchanged since the run started, or "
                     f"installed): {', '.join(rerun.copy.linked)}")
    lines.append(f"verify: ran `leafwatch run {' '.join(rerun.line[4:])}` there (the run made {made} optimizer "
                 f"steps, the rerun makes at most {rerun.steps}): it made {reached}, exit {code}; its output: {rerun.log}")
    lines += [f"verify: {o.line(reached)}" for o in fixes]
    lines += [f"verify: new: {f.kind} {f.name}: {f.message}" for f in new]
    lines += [f"verify: not in the patch, {o.line(reached)}" for o in others]
    lines += [f"verify: {p}" for p in problems]
    counts = {outcome: sum(o.outcome == outcome for o in fixes) for outcome in (FIXED, STILL_OPEN, UNDECIDED)}
    tally = ", ".join(f"{n} {outcome.replace('_', ' ')}" for outcome, n in counts.items() if n)
    if exit_code == 0:
        lines.append(f"verify: the patch is proven: {tally}, nothing new")
    else:
        lines.append(f"verify: not proven: {tally}{f', {len(new)} new' if new else ', nothing new'}"
                     f"{f', {len(problems)} more problem' + ('s' if len(problems) > 1 else '') if problems else ''}")
    return lines


def _record(original: Original, rerun: Rerun, code: int, data: Mapping[str, Any] | None, steps: int,
            fixes: list[Outcome], others: list[Outcome], new: list[Finding], problems: list[str],
            exit_code: int) -> dict[str, Any]:
    """The ``leafwatch/verify`` record (:data:`leafwatch.report.records.RECORD_FORMAT`)."""
    hunks = original.hunks if original.hunks is not None else \
        hunks_of(original.report.findings, str(original.run["cwd"]))["hunks"]  # (worked out again when not recorded)
    diffs = {(h.get("kind"), h.get("name")): h.get("diff") for h in hunks if isinstance(h, Mapping)}
    ended = ((data or {}).get("command") or {}).get("ended") or {}
    return {"step": original.steps, "steps": (data or {}).get("step") or 0, "limit": steps,
            "rerun": {"folder": rerun.copy.root, "logdir": rerun.logdir, "command": rerun.line, "exit_code": code,
                      "stopped": ended.get("stopped_by") is not None, "log": rerun.log},
            "hunks": [{**dataclasses.asdict(o), "diff": diffs.get((o.kind, o.name))} for o in fixes],
            "left_out": [{"kind": o.kind, "name": o.name, "outcome": o.outcome} for o in others],
            "new": [{"kind": str(f.kind), "name": f.name, "severity": str(f.severity), "message": f.message} for f in new],
            "problems": problems, "exit_code": exit_code}


def write_record(folder: str, record: Mapping[str, Any], step: int) -> None:
    """Write ``record`` as a ``leafwatch/verify`` record into an event file of its own in ``folder``."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from .records import RECORD_VERSION

    writer = EventFileWriter(folder, filename_suffix=VERIFY_SUFFIX)
    try:
        payload = json.dumps({"version": RECORD_VERSION, **record})
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=tensor_summary(VERIFY_TAG, payload)))
    finally:
        writer.close()


__all__ = ["CLOCK_MARGIN", "COPY_LIMIT", "FIXED", "GONE", "LINKED_WHOLE", "LINK_OVER", "STILL_OPEN", "UNDECIDED", "VERIFY_STEPS", "Copy", "Original",
           "Outcome", "Refused", "Rerun", "apply_to", "command", "copy_folder", "decided_at", "judge", "of_record",
           "prepare", "rerun_command", "rerun_environment", "verify", "write_record"]

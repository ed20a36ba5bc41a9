"""``leafwatch report``: read leafwatch's records back from TensorBoard event files.

Every run folder under the log directory (nested folders too) that holds a ``leafwatch/report``
record gets its findings table, from the latest such record; ``--json`` prints them as JSON.
Lightning writes each run of an experiment beside the earlier ones (``version_0``, ``version_1``,
... under one folder): only the newest version of each is judged, the older ones are named on
one line with their open errors (``--all`` judges every run). An event file that cannot be read
(cut off, overwritten) is named on one line and its run is not judged; the others still are.
The exit code says whether a finding at or above ``--fail-on`` is open in a judged run, so that
CI can gate on a training run. ``--diff`` prints the open findings' code fixes as one patch
(:mod:`.patch`), ``--verify`` proves it first by running the run's command again on a patched copy
(:mod:`.verify`). Only TensorBoard's event file reader is used: no torch needed here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .findings import Report
from .patch import Patch, PatchRefused, exit_code, nothing_to_give, of_records, patch_main
from .verify import VERIFY_STEPS, Refused, of_record, verify
from .records import REPORT_TAG, decode
from ..options import folder_problem, positive_int

FAIL_ON = ("error", "warning", "never")
#: Exit codes: findings at or above --fail-on open; no run could be read (or LOGDIR is no folder).
EXIT_FINDINGS, EXIT_NO_DATA = 1, 2
#: The folder Lightning's ``TensorBoardLogger`` (and ``CSVLogger``) makes for each run of an experiment.
VERSION_FOLDER = re.compile(r"^version_(\d+)$")


@dataclasses.dataclass
class RunReport:
    """The latest leafwatch record of one run folder."""

    run: str
    path: str
    wall_time: float
    data: dict[str, Any]

    @property
    def report(self) -> Report:
        return Report.from_dict(self.data)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "path": self.path, "wall_time": self.wall_time, **self.data}


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """An event file that could not be read to its end, and why (its run is not judged)."""

    path: str
    why: str
    run: str

    def __str__(self) -> str:
        return f"unreadable: {self.path}: {self.why}; run {self.run} is not judged"


@dataclasses.dataclass
class Reading:
    """What ``leafwatch report`` read under a log folder: the runs it judges, the older versions it
    does not (each experiment's newest is judged), and the event files it could not read."""

    judged: list[RunReport]
    older: list[RunReport]
    unreadable: list[Unreadable]

    def notes(self) -> list[str]:
        """One line per unreadable file, then one naming the older versions and their open errors."""
        lines = [str(u) for u in self.unreadable]
        if self.older:
            lines.append("older versions, not judged (the newest version of each experiment is; --all judges "
                         "every run): " + ", ".join(f"{r.run} ({_errors(r)})" for r in self.older))
        return lines


def _errors(run: RunReport) -> str:
    errors = len(run.report.at_least("error"))
    return f"{errors} open error{'s' if errors != 1 else ''}" if errors else "no open error"


class _Damaged(Exception):
    """An event file that cannot be read past some byte."""


def _run_folders(logdir: str) -> Iterator[tuple[str, list[str]]]:
    """Each folder under ``logdir`` (itself included) with its event files, sorted by name."""
    from tensorboard.backend.event_processing import io_wrapper

    for folder, subfolders, files in os.walk(logdir):
        subfolders.sort()
        events = sorted(f for f in files if io_wrapper.IsTensorFlowEventsFile(f))
        if events:
            yield folder, [os.path.join(folder, f) for f in events]


def _events(path: str) -> Iterator[Any]:
    """The events of one event file, in order.

    Raises:
        _Damaged: a record is cut off or fails its checksum (TensorBoard's reader stops there without
            a word: the bytes it read fall short of the file's size), or it holds no event.
    """
    from google.protobuf.message import DecodeError
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.proto import event_pb2

    size = os.path.getsize(path)
    read = 0
    for record in event_file_loader.RawEventFileLoader(path).Load():
        try:
            event = event_pb2.Event.FromString(record)
        except DecodeError:
            raise _Damaged(f"the record at byte {read} is not a TensorBoard event") from None
        read += len(record) + 16  # a length (8 bytes) and its checksum (4), the record, its checksum (4)
        yield event
    if read < size:
        raise _Damaged(f"it cannot be read past byte {read} of {size}: cut off (by a run still writing it, or one that "
                       "was killed) or overwritten")


def _latest_record(files: Sequence[str], damaged: list[tuple[str, str]]) -> tuple[float, dict[str, Any]] | None:
    """The latest leafwatch report record in ``files`` (by wall time); each file that cannot be read
    to its end is added to ``damaged`` with why."""
    best: tuple[tuple[float, int, int], dict[str, Any]] | None = None
    for file_index, path in enumerate(files):
        try:
            for event_index, event in enumerate(_events(path)):
                found = _record_of(event)
                key = (event.wall_time, file_index, event_index)
                if found is not None and (best is None or key >= best[0]):
                    best = (key, found)
        except (_Damaged, OSError) as error:
            damaged.append((path, str(error) if isinstance(error, _Damaged) else error.strerror or str(error)))
    return None if best is None else (best[0][0], best[1])


def _record_of(event: Any) -> dict[str, Any] | None:
    """The ``leafwatch/report`` record an event holds (None when none this version reads)."""
    for value in event.summary.value:
        if value.tag == REPORT_TAG and value.HasField("tensor") and value.tensor.string_val:
            data = decode(value.tensor.string_val[0])
            if data is not None:
                return data
    return None


def run_label(folder: str, logdir: str) -> str:
    """How a run is named: its path under ``logdir``, or the folder's own name when the event
    files are in ``logdir`` itself (``leafwatch report runs/lit/version_0`` -> ``version_0``).

    Example::

        >>> run_label("runs/lit/version_0", "runs"), run_label("runs/lit/version_0", "runs/lit/version_0/")
        ('lit/version_0', 'version_0')
    """
    run = os.path.relpath(folder, logdir)
    if run == os.curdir:
        run = os.path.basename(os.path.abspath(folder)) or os.path.abspath(folder)
    return run.replace(os.sep, "/")


def read_logdir(logdir: str, argument: str = "logdir", *, every: bool = False) -> Reading:
    """The latest leafwatch record of every run under ``logdir``, in folder order: judged, or an older
    version (each experiment's newest ``version_N`` is judged; ``every``: every run is), and the event
    files that could not be read (a run with one is not judged: its latest state is unknown).

    Raises:
        ValueError: ``logdir`` is not a folder (a file, or nothing); the message calls it ``argument``.
    """
    problem = folder_problem(logdir, argument)
    if problem is not None:
        raise ValueError(problem)
    runs: list[RunReport | None] = []
    unreadable: list[Unreadable] = []
    folders: list[str] = []
    for folder, files in _run_folders(logdir):
        damaged: list[tuple[str, str]] = []
        found = _latest_record(files, damaged)
        label = run_label(folder, logdir)
        unreadable += [Unreadable(path, why, label) for path, why in damaged]
        if found is None and not damaged:
            continue  # no leafwatch data: another tool's event files
        folders.append(folder)
        runs.append(None if damaged or found is None else
                    RunReport(run=label, path=folder, wall_time=found[0], data=found[1]))
    newest = set(range(len(folders))) if every else _newest_versions(folders)
    return Reading(judged=[r for i, r in enumerate(runs) if r is not None and i in newest],
                   older=[r for i, r in enumerate(runs) if r is not None and i not in newest],
                   unreadable=unreadable)


def _newest_versions(folders: Sequence[str]) -> set[int]:
    """The indexes of the folders that are judged: every folder not named ``version_N``, and of the
    ``version_N`` folders under one parent, the one of the highest N (Lightning's newest)."""
    newest: dict[str, tuple[int, int]] = {}
    judged = set()
    for index, folder in enumerate(folders):
        parent, name = os.path.split(os.path.normpath(os.path.abspath(folder)))
        version = VERSION_FOLDER.match(name)
        if version is None:
            judged.add(index)
        elif parent not in newest or int(version.group(1)) > newest[parent][0]:
            newest[parent] = (int(version.group(1)), index)
    return judged | {index for _, index in newest.values()}


def read_reports(logdir: str, argument: str = "logdir") -> list[RunReport]:
    """The latest leafwatch record of every run under ``logdir`` that could be read, in folder order
    (every version: what ``leafwatch report --all`` judges).

    Raises:
        ValueError: ``logdir`` is not a folder (a file, or nothing); the message calls it ``argument``.
    """
    return read_logdir(logdir, argument, every=True).judged


def latest_record(logdir: str) -> tuple[dict[str, Any], str] | None:
    """The newest report record under ``logdir`` (by wall time) and the folder it is in; None when there is
    none (or ``logdir`` is no folder): what ``--verify`` reads of its rerun."""
    try:
        runs = read_reports(logdir)
    except ValueError:
        return None
    newest = max(runs, key=lambda r: r.wall_time, default=None)
    return None if newest is None else (newest.data, newest.path)


def failing(reports: Sequence[RunReport], fail_on: str) -> bool:
    """Whether a finding at least as severe as ``fail_on`` is open in any run."""
    if fail_on not in FAIL_ON:
        raise ValueError(f"`fail_on` can be one of {', '.join(FAIL_ON)}, got {fail_on!r}")
    return fail_on != "never" and any(r.report.at_least(fail_on) for r in reports)


def format_text(reports: Sequence[RunReport]) -> str:
    return "\n\n".join(f"run: {r.run}\n{r.report}" for r in reports)


def format_json(logdir: str, reading: Reading | Sequence[RunReport]) -> str:
    """The runs judged as JSON (``"runs"``), with the older versions not judged (``"not_judged"``: run,
    path, open errors) and the files that could not be read (``"unreadable"``: path, why, run)."""
    if not isinstance(reading, Reading):
        reading = Reading(list(reading), [], [])
    return json.dumps({"logdir": logdir, "runs": [r.to_dict() for r in reading.judged],
                       "not_judged": [{"run": r.run, "path": r.path, "open_errors": len(r.report.at_least("error"))}
                                      for r in reading.older],
                       "unreadable": [dataclasses.asdict(u) for u in reading.unreadable]}, indent=2)


# -- the command line -----------------------------------------------------------------------
def configure_report_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("logdir", metavar="LOGDIR", help="a TensorBoard log directory (searched recursively)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument("--fail-on", choices=FAIL_ON, default=None,
                        help="exit 1 when a finding at least this severe is open (default: error)")
    parser.add_argument("--all", action="store_true", dest="every",
                        help="judge every run; by default only the newest version_N of each experiment (Lightning's "
                        "runs side by side) is judged, and the older ones are named on one line")
    patching = parser.add_mutually_exclusive_group()
    patching.add_argument("--diff", action="store_true",
                          help="print the open findings' code fixes as one unified diff (for `git apply`, in the "
                          "folder the run was started in); exit 0 when it holds every one, 1 when some could not "
                          "be placed, 2 when it is refused")
    patching.add_argument("--fix", action="store_true", help="apply that patch to the files in place and say what "
                          "changed (same exit codes)")
    parser.add_argument("--backup", action="store_true", help="with --fix: keep each changed file as FILE.orig")
    parser.add_argument("--verify", action="store_true",
                        help="with --diff: apply the patch to a scratch copy of the run's folder, run its `leafwatch "
                        "run` command there again, and say per finding whether it is fixed, still open or undecided, "
                        "and any new one; exit 0 when every patched finding is fixed and nothing new appeared, else 1")
    parser.add_argument("--verify-steps", type=positive_int, default=None, metavar="N",
                        help=f"with --verify: the rerun makes as many optimizer steps as the run, at most N "
                        f"(default {VERIFY_STEPS})")
    return parser


def _usage_problem(args: argparse.Namespace) -> str | None:
    """Why these options do not go together (None when they do)."""
    mixed = next((f"--{o}" for o, given in (("fail-on", args.fail_on is not None), ("json", args.json)) if given), None)
    patching = "--diff" if args.diff else "--fix" if args.fix else None
    if patching is not None and mixed is not None:
        return (f"{patching} and {mixed} do not go together: {patching}'s exit code says whether the patch holds "
                "every code fix")
    if args.backup and not args.fix:
        return "--backup goes with --fix"
    if args.verify and not args.diff:
        return "--verify goes with --diff (it proves the patch --diff prints)"
    if args.verify_steps is not None and not args.verify:
        return "--verify-steps goes with --verify"
    return None


def report_main(args: argparse.Namespace) -> int:
    """Print the reports found under ``args.logdir`` (or their patch: ``--diff``, ``--fix``); the exit code."""
    problem = _usage_problem(args)
    if problem is not None:
        sys.stderr.write(f"leafwatch report: {problem}\n")
        return EXIT_NO_DATA
    try:
        reading = read_logdir(args.logdir, "LOGDIR", every=args.every)
    except ValueError as error:
        sys.stderr.write(f"leafwatch report: {error}\n")
        return EXIT_NO_DATA
    notes = "".join(f"leafwatch report: {line}\n" for line in reading.notes())
    if not reading.judged:
        sys.stderr.write(notes + _nothing_read(args.logdir, reading))
        return EXIT_NO_DATA
    if args.diff or args.fix:
        sys.stderr.write(notes)
        if args.verify:
            return verify_main([(r.data, r.path, r.run) for r in reading.judged],
                               steps=args.verify_steps or VERIFY_STEPS)
        return patch_main([r.data for r in reading.judged], fix=args.fix, backup=args.backup)
    sys.stdout.write((format_json(args.logdir, reading) if args.json else format_text(reading.judged)) + "\n")
    sys.stdout.flush()
    sys.stderr.write(notes)
    return EXIT_FINDINGS if failing(reading.judged, args.fail_on or "error") else 0


def verify_main(runs: Sequence[tuple[Mapping[str, Any], str, str]], *, steps: int) -> int:
    """``leafwatch report DIR --diff --verify``: the patch of the one run ``runs`` holds (its record, its
    folder, its name) on stdout, what it leaves out on stderr, then its verification (:func:`verify`)
    on stderr; the exit code (2, on one line, when it is not one run made by ``leafwatch run``, or the
    patch is refused)."""
    out, err = sys.stdout, sys.stderr
    if len(runs) != 1:
        err.write(f"leafwatch report: --verify runs one run again, and {len(runs)} were read "
                  f"({', '.join(label for _, _, label in runs)}): give the log folder of one run\n")
        return 2
    (data, folder, label), = runs
    try:
        original = of_record(data, Patch((), ()), folder, label)
        made = of_records([data])
    except (PatchRefused, Refused) as refused:
        err.write(f"leafwatch report: {'no patch' if isinstance(refused, PatchRefused) else '--verify'}: {refused}\n")
        return 2
    original = dataclasses.replace(original, patch=made)
    out.write(made.diff)
    out.flush()
    err.write("".join(f"{o}\n" for o in made.left_out))
    empty = nothing_to_give(made)
    if empty is not None:
        err.write(f"leafwatch report: {empty}\n")
    said = verify(original, steps=steps, say=lambda line: err.write(f"leafwatch report: {line}\n"), read=latest_record)
    return max(exit_code(made), said)


def _nothing_read(logdir: str, reading: Reading) -> str:
    """The line of a log folder where no run could be judged."""
    if reading.unreadable:
        return "leafwatch report: no run could be judged: the event files named above cannot be read\n"
    return (f"leafwatch report: no leafwatch data under {logdir!r}: no event file there holds a "
            f"`{REPORT_TAG}` record. Write one with `leafwatch run --logdir {logdir} script.py`, "
            "the LeafWatch callback or `Monitor(..., writer=SummaryWriter(logdir))`.\n")

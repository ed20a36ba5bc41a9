"""``leafwatch report``: read leafwatch's records back from TensorBoard event files.

Every run folder under the log directory (nested folders too) that holds a ``leafwatch/report``
record gets its findings table, from the latest such record; ``--json`` prints them as JSON.
The exit code says whether a finding at or above ``--fail-on`` is open, so that CI can gate on
a training run. Only TensorBoard's event file reader is used: no torch needed here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from .findings import Report
from .patch import patch_main
from .records import REPORT_TAG, decode
from ..options import folder_problem

FAIL_ON = ("error", "warning", "never")
#: Exit codes: findings at or above --fail-on open; no leafwatch data (or LOGDIR is no folder).
EXIT_FINDINGS, EXIT_NO_DATA = 1, 2


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


def _run_folders(logdir: str) -> Iterator[tuple[str, list[str]]]:
    """Each folder under ``logdir`` (itself included) with its event files, sorted by name."""
    from tensorboard.backend.event_processing import io_wrapper

    for folder, subfolders, files in os.walk(logdir):
        subfolders.sort()
        events = sorted(f for f in files if io_wrapper.IsTensorFlowEventsFile(f))
        if events:
            yield folder, [os.path.join(folder, f) for f in events]


def _latest_record(files: Sequence[str]) -> tuple[float, dict[str, Any]] | None:
    from tensorboard.backend.event_processing import event_file_loader

    best: tuple[tuple[float, int, int], dict[str, Any]] | None = None
    for file_index, path in enumerate(files):
        for event_index, event in enumerate(event_file_loader.EventFileLoader(path).Load()):
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.tag != REPORT_TAG or not value.HasField("tensor") or not value.tensor.string_val:
                    continue
                data = decode(value.tensor.string_val[0])
                if data is None:
                    continue
                key = (event.wall_time, file_index, event_index)
                if best is None or key >= best[0]:
                    best = (key, data)
    return None if best is None else (best[0][0], best[1])


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


def read_reports(logdir: str, argument: str = "logdir") -> list[RunReport]:
    """The latest leafwatch record of every run under ``logdir``, in folder order.

    Raises:
        ValueError: ``logdir`` is not a folder (a file, or nothing); the message calls it ``argument``.
    """
    problem = folder_problem(logdir, argument)
    if problem is not None:
        raise ValueError(problem)
    out = []
    for folder, files in _run_folders(logdir):
        found = _latest_record(files)
        if found is not None:
            out.append(RunReport(run=run_label(folder, logdir), path=folder, wall_time=found[0], data=found[1]))
    return out


def failing(reports: Sequence[RunReport], fail_on: str) -> bool:
    """Whether a finding at least as severe as ``fail_on`` is open in any run."""
    if fail_on not in FAIL_ON:
        raise ValueError(f"`fail_on` can be one of {', '.join(FAIL_ON)}, got {fail_on!r}")
    return fail_on != "never" and any(r.report.at_least(fail_on) for r in reports)


def format_text(reports: Sequence[RunReport]) -> str:
    return "\n\n".join(f"run: {r.run}\n{r.report}" for r in reports)


def format_json(logdir: str, reports: Sequence[RunReport]) -> str:
    return json.dumps({"logdir": logdir, "runs": [r.to_dict() for r in reports]}, indent=2)


# -- the command line -----------------------------------------------------------------------
def configure_report_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("logdir", metavar="LOGDIR", help="a TensorBoard log directory (searched recursively)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument("--fail-on", choices=FAIL_ON, default=None,
                        help="exit 1 when a finding at least this severe is open (default: error)")
    patching = parser.add_mutually_exclusive_group()
    patching.add_argument("--diff", action="store_true",
                          help="print the open findings' code fixes as one unified diff (for `git apply`, in the "
                          "folder the run was started in); exit 0 when it holds every one, 1 when some could not "
                          "be placed, 2 when it is refused")
    patching.add_argument("--fix", action="store_true", help="apply that patch to the files in place and say what "
                          "changed (same exit codes)")
    parser.add_argument("--backup", action="store_true", help="with --fix: keep each changed file as FILE.orig")
    return parser


def report_main(args: argparse.Namespace) -> int:
    """Print the reports found under ``args.logdir`` (or their patch: ``--diff``, ``--fix``); the exit code."""
    mixed = next((f"--{o}" for o, given in (("fail-on", args.fail_on is not None), ("json", args.json)) if given), None)
    patching = "--diff" if args.diff else "--fix" if args.fix else None
    if patching is not None and mixed is not None:
        sys.stderr.write(f"leafwatch report: {patching} and {mixed} do not go together: {patching}'s exit code "
                         "says whether the patch holds every code fix\n")
        return EXIT_NO_DATA
    if args.backup and not args.fix:
        sys.stderr.write("leafwatch report: --backup goes with --fix\n")
        return EXIT_NO_DATA
    try:
        reports = read_reports(args.logdir, "LOGDIR")
    except ValueError as error:
        sys.stderr.write(f"leafwatch report: {error}\n")
        return EXIT_NO_DATA
    if not reports:
        sys.stderr.write(f"leafwatch report: no leafwatch data under {args.logdir!r}: no event file there holds a "
                         f"`{REPORT_TAG}` record. Write one with `leafwatch run --logdir {args.logdir} script.py`, "
                         "the LeafWatch callback or `Monitor(..., writer=SummaryWriter(logdir))`.\n")
        return EXIT_NO_DATA
    if patching is not None:
        return patch_main([r.data for r in reports], fix=args.fix, backup=args.backup)
    sys.stdout.write((format_json(args.logdir, reports) if args.json else format_text(reports)) + "\n")
    return EXIT_FINDINGS if failing(reports, args.fail_on or "error") else 0

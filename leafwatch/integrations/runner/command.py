"""The ``leafwatch run`` command: run a script (or ``-m module``) as ``__main__`` under a
:class:`~leafwatch.integrations.runner.session.Session`, print the summary, and exit with the
code :func:`exit_code` gives."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import runpy
import sys
import traceback
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch import nn

from ...monitor import Monitor
from ...observe import frames, inventory
from ...observe.crashes import Context
from ...report import patch
from ...report import verify as verification
from ...report.findings import Report
from ...report.format import shown
from ...report.reader import latest_record
from ...options import LeafwatchWarning, WarnOnce, folder_problem, non_negative_int, parse_ignore, positive_int
from ...observe.excepthook import print_notes
from .session import MaxStepsStop, Session, StrictStop

#: Exit code of a ``--strict`` run with an open error (stopped at the check that decided it, or
#: ended with it).
STRICT_EXIT_CODE = 1
#: Exit code of bad arguments (an unusable ``--logdir`` included), before the script starts.
USAGE_EXIT_CODE = 2
#: Exit code of a ``--strict`` run where a part of the check failed inside leafwatch (sysexits'
#: EX_SOFTWARE): its report may miss findings.
INCOMPLETE_EXIT_CODE = 70


# -- running the script ---------------------------------------------------------------------
def _system_exit_code(code: Any) -> int:
    """What ``sys.exit(code)`` makes the interpreter return (a message is printed, as Python does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{code}\n")
    return 1


def run_target(script: str | None, module: str | None, argv: Sequence[str],
               explain: Callable[[BaseException], Sequence[str]] | None = None,
               ended: dict[str, Any] | None = None) -> int:
    """Run a script path or a module as ``__main__`` with ``argv`` after its name; its exit code.

    Exceptions raised by the script are printed with their traceback and give 1 (130 for
    KeyboardInterrupt), as the interpreter does; ``explain`` is handed the exception first (it may add
    notes to it, which the traceback shows) and returns what to print right after the traceback.
    :class:`StrictStop` and :class:`MaxStepsStop` are let through. ``ended``: filled with the script's module-level variables when
    it ends (the caller reads them for its summary, then clears them).
    """
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    try:
        target = module if module is not None else script
        assert target is not None
        sys.argv = [target, *argv]
        sys.path[:1] = [os.getcwd() if module is not None else os.path.dirname(os.path.abspath(target))]
        if module is not None:
            scope = runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            scope = runpy.run_path(target, run_name="__main__")
        if ended is not None and isinstance(scope, dict):
            ended.update(scope)
        return 0
    except SystemExit as stop:
        return _system_exit_code(stop.code)
    except (StrictStop, MaxStepsStop):
        raise
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException as error:
        later = _explained(explain, error)
        # The traceback without leafwatch's and runpy's own frames on top.
        tb, here = error.__traceback__, os.path.dirname(os.path.abspath(__file__))
        skip = (here, os.path.dirname(runpy.__file__) + os.sep + "runpy.py", "<frozen runpy>")
        while tb is not None and tb.tb_frame.f_code.co_filename.startswith(skip):
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb)
        print_notes(later)
        return 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _explained(explain: Callable[[BaseException], Sequence[str]] | None, error: BaseException) -> Sequence[str]:
    """What ``explain`` prints after the script's traceback; its failure is warned, never raised."""
    try:
        return explain(error) if explain is not None else ()
    except Exception as failure:
        WarnOnce("the exception is printed as it is, without leafwatch's note.")("explaining the exception", failure)
        return ()


def run(script: str | None, argv: Sequence[str] = (), *, module: str | None = None,
        logdir: str | None = None, strict: bool = False, patience: int = 1,
        ignore: dict[str, str] | None = None, diff: str | None = None, max_steps: int | None = None,
        verify: bool = False, verify_steps: int = verification.VERIFY_STEPS) -> int:
    """Run a script (or ``module``) under leafwatch; returns the exit code.

    Args:
        script: Path of the script (None with ``module``).
        argv: The script's arguments.
        module: Run this module as ``python -m`` would.
        logdir: Write TensorBoard records there.
        strict: Stop at the first check with an open error finding (exit code 1).
        patience: Checks a parameter may go without a gradient before it is reported.
        ignore: Name pattern -> reason; matching findings are reported as ignored.
        diff: Write the patch of the open findings' code fixes to this file (paths relative to
            the working folder when the run starts; see :mod:`leafwatch.report.patch`).
        max_steps: Stop the script when it calls the optimizer step after this many (all optimizers
            together); what waits for a later step is left undecided.
        verify, verify_steps: With ``diff``: run the patched script again (at most ``verify_steps``
            optimizer steps) in a scratch copy of the working folder (:mod:`leafwatch.report.verify`).

    Returns:
        The script's exit code, or 1 when ``strict`` stopped it; with ``diff`` (and the script's
        code 0), 2 when the patch is refused and 1 when it misses an open code fix, or, with
        ``verify``, when a patched finding is not proven fixed or a new one appeared.

    Raises:
        ValueError: an argument out of its range (:func:`_check_arguments`).
    """
    _check_arguments(script, module, patience, max_steps, verify, diff, verify_steps)
    command = verification.command(script, module, argv, cwd=os.getcwd(), logdir=logdir, strict=strict,
                                   patience=patience, ignore=ignore, max_steps=max_steps)
    session = Session(logdir=logdir, strict=strict, patience=patience, ignore=ignore, max_steps=max_steps,
                      command=command)
    session.install()
    stopped: StrictStop | MaxStepsStop | None = None
    crashed: list[list[nn.Module]] = []  # the modules that ran when the script raised (for the structure scan)

    def explain(error: BaseException) -> Sequence[str]:
        crashed.append(session.found.top_modules())
        with _script_as_main(error):
            return session.crashed(error, [Context(tuple(crashed[0]))])

    ended: dict[str, Any] = {}  # the script's variables once it ended, until the run is closed
    code = 1  # (an exception of leafwatch's own that leaves run_target)
    try:
        code = run_target(script, module, argv, explain, ended)
    except (StrictStop, MaxStepsStop) as stop:
        stopped = stop
        code = 0  # the script did not end: its own code is unknown
    finally:
        command["ended"] = _ending(session, None if stopped is not None else code, stopped)
        report = _close(session, ended, crashed=bool(crashed) or isinstance(stopped, MaxStepsStop))
    if crashed and not session.found.optimizers:  # no check ran: what the structure alone shows
        report = _structure_scan(crashed[0], session, report)
    _say_stopped(session, stopped)
    session.write(session.summary(report, crashed=bool(crashed)))
    crashed.clear()
    final = _final_code(session, report, code, strict=strict, stopped=isinstance(stopped, StrictStop))
    return final if diff is None else _patched(final, diff, report, command, logdir, verify_steps if verify else None)


def _patched(final: int, diff: str, report: Report, command: dict[str, Any], logdir: str | None,
             verify_steps: int | None) -> int:
    """``--diff FILE`` written, whatever the run's exit code ``final`` (a crash's fixes too), and, with
    ``verify_steps``, proven by ``--verify``: ``final``, or when it is 0 the patch's exit code."""
    made = _write_patch(diff, report, command["cwd"])
    if made is None:
        return final or USAGE_EXIT_CODE
    if verify_steps is None:
        return final or patch.exit_code(made)
    folder = None if logdir is None else os.path.join(command["cwd"], logdir)  # (the script may have changed folder)
    said = verification.verify(verification.Original(command, report, made, folder), steps=verify_steps,
                               say=lambda line: sys.stderr.write(f"leafwatch run: {line}\n"), read=latest_record)
    return final or max(patch.exit_code(made), said)


def _check_arguments(script: str | None, module: str | None, patience: int, max_steps: int | None, verify: bool,
                     diff: str | None, verify_steps: int) -> None:
    """:func:`run`'s arguments, checked.

    Raises:
        ValueError: neither or both of ``script`` and ``module``; ``patience`` or ``verify_steps`` below 1,
            ``max_steps`` below 0; ``verify`` without ``diff``.
    """
    if (script is None) == (module is None):
        raise ValueError(f"give exactly one of `script` and `module`, got script={script!r}, module={module!r}")
    for name, value, least in (("patience", patience, 1), ("max_steps", max_steps, 0), ("verify_steps", verify_steps, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"`{name}` must be an int >= {least}, got {value!r}")
    if verify and diff is None:
        raise ValueError("`verify` proves the patch `diff` writes: give `diff` too")


def _ending(session: Session, code: int | None, stopped: StrictStop | MaxStepsStop | None) -> dict[str, Any]:
    """How the script ended (its exit code, or the option with which leafwatch stopped it), told to the
    session for its last record; the same, for ``--verify``."""
    stopped_by = None if stopped is None else "--strict" if isinstance(stopped, StrictStop) else "--max-steps"
    session.ended(exit_code=code, stopped_by=stopped_by)
    return {"exit_code": code, "stopped_by": stopped_by, "step": session.steps}


def _say_stopped(session: Session, stopped: StrictStop | MaxStepsStop | None) -> None:
    """The line that says leafwatch stopped the script, and why."""
    if isinstance(stopped, StrictStop):
        first = stopped.report.at_least("error")[0]
        session.write(f"leafwatch: --strict stopped the script at optimizer step {stopped.step}: "
                      f"{first.severity.upper()} {first.kind} {shown(first)}.")
    elif stopped is not None:
        session.write(f"leafwatch: --max-steps {stopped.step} stopped the script when it called optimizer step "
                      f"{stopped.step + 1} (neither checked nor made): what waits for a later step is left undecided.")


def _close(session: Session, ended: dict[str, Any], *, crashed: bool) -> Report:
    """Close the run, reading what the script left at its module level (``ended``) as it left it; then forget it."""
    try:
        with _as_main(ended):
            return session.close(crashed=crashed)
    finally:
        ended.clear()


def _final_code(session: Session, report: Report, code: int, *, strict: bool, stopped: bool) -> int:
    """:func:`exit_code`, said when ``--strict`` decides it."""
    failed = session.failed_parts
    unseen = [f"no step of `{f.name}` was seen" for f in report.findings if f.reason.name == "unchecked_optimizer"]
    final = exit_code(code, report, strict=strict, incomplete=bool(failed or unseen))
    if strict and not stopped and code == 0 and final == STRICT_EXIT_CODE:
        errors = report.at_least("error")
        session.write(f"leafwatch: --strict: the run ended with {len(errors)} open error(s) "
                       f"(first: {errors[0].kind} {shown(errors[0])}): exit {STRICT_EXIT_CODE}.")
    elif final == INCOMPLETE_EXIT_CODE:
        why = ", ".join([*unseen, *([f"{', '.join(failed)} failed"] if failed else [])])
        session.write(f"leafwatch: --strict: the check is incomplete ({why}): exit {INCOMPLETE_EXIT_CODE}.")
    return final


def _write_patch(path: str, report: Report, root: str) -> patch.Patch | None:
    """Write the patch of ``report`` to ``path`` (the files as the run read them; empty when it holds no
    file, which one more line says, never silently); what is left out goes to stderr, one line each. The
    patch (its :func:`~leafwatch.report.patch.exit_code`: 0 when it holds every code fix, 1 when not), or
    None when it is refused (said on one line)."""
    try:
        made = patch.build(report.findings, root, patch.run_lines)
        with open(path, "w", encoding="utf-8") as out:
            out.write(made.diff)
    except (patch.PatchRefused, OSError) as refused:
        sys.stderr.write(f"leafwatch run: no patch: {refused}\n")
        return None
    sys.stderr.write("".join(f"leafwatch run: {o}\n" for o in made.left_out))
    empty = patch.nothing_to_give(made)
    if empty is not None:
        sys.stderr.write(f"leafwatch run: {empty} ({path} is empty)\n")
    return made


@contextlib.contextmanager
def _script_as_main(error: BaseException) -> Iterator[None]:
    """``__main__`` is the script again while its exception is explained (runpy put leafwatch's back when
    the exception left it): the source of the classes the script defined is found by their module."""
    scope = next((f.f_globals for f, _ in frames.in_traceback(error.__traceback__)
                  if f.f_globals.get("__name__") == "__main__" and f.f_globals.get("__file__")), None)
    with _as_main(scope):
        yield


@contextlib.contextmanager
def _as_main(scope: dict[str, Any] | None) -> Iterator[None]:
    """``__main__`` holds ``scope`` (the script's variables) for the length of the block: nothing when there
    is none, or when ``__main__`` holds it already."""
    saved = sys.modules.get("__main__")
    if not scope or saved is None or getattr(saved, "__dict__", None) is scope:
        yield
        return
    stand_in = types.ModuleType("__main__")
    stand_in.__dict__.update(scope)
    sys.modules["__main__"] = stand_in
    try:
        yield
    finally:
        sys.modules["__main__"] = saved
        stand_in.__dict__.clear()


class _StructureScan(Monitor):
    """A scan of the modules that ran, for a run whose script raised before any optimizer stepped."""

    _observes = False  # no global hook: the script has ended


def _structure_scan(modules: list[nn.Module], session: Session, report: Report) -> Report:
    """What the structure of ``modules`` shows (no gradient exists to check: orphans, non-leaf attributes), with
    the findings of the crash itself (``report``'s); ``report`` when there is nothing to scan or the scan fails
    (warned)."""
    if not modules:
        return report
    try:
        roots = inventory.name_roots(modules, session.found.script_variables())
        with warnings.catch_warnings():  # (every parameter frozen: the summary says "nothing to check" itself)
            warnings.filterwarnings("ignore", message="leafwatch: nothing to check", category=LeafwatchWarning)
            scan = _StructureScan(roots=roots, ignore=session.ignore or None, diagnose=False, verbose=False,
                                  distributed=False, check_values_every_n_steps=0)
            scan.scan()
            found = scan.close()
        return Report([*report.tensors(), *found.tensors()], step=found.step, nothing_to_check=found.nothing_to_check)
    except Exception as failure:
        WarnOnce("the summary says what the run saw without it.")("the structure scan of a run that raised", failure)
        return report


def exit_code(script_code: int, report: Report, *, strict: bool, incomplete: bool) -> int:
    """The exit code of ``leafwatch run``, by precedence (usage errors, 2, are decided before the
    script starts and never get here).

    Args:
        script_code: The script's own exit code (0 when ``--strict`` stopped it).
        report: The final report.
        strict: Whether ``--strict`` was given.
        incomplete: Whether a part of the check failed inside leafwatch.

    Returns:
        The script's non-zero code; else :data:`STRICT_EXIT_CODE` for an open error under
        ``strict``; else :data:`INCOMPLETE_EXIT_CODE` for an incomplete check under ``strict``;
        else 0.

    Example::

        >>> from leafwatch import Finding, Report
        >>> bad = Report([Finding("not_in_optimizer", "scale", "error", "never changes")], step=10)
        >>> exit_code(5, bad, strict=True, incomplete=True), exit_code(0, bad, strict=True, incomplete=True)
        (5, 1)
        >>> exit_code(0, Report(step=10), strict=True, incomplete=True), exit_code(0, bad, strict=False, incomplete=False)
        (70, 0)
    """
    if script_code != 0:
        return script_code
    if strict and report.at_least("error"):
        return STRICT_EXIT_CODE
    if strict and incomplete:
        return INCOMPLETE_EXIT_CODE
    return 0


# -- the command line -----------------------------------------------------------------------
#: The exit codes of ``leafwatch run``, first match wins (shown by ``leafwatch run --help``).
EXIT_CODES_HELP = f"""exit codes, first match wins:
  the script's own non-zero exit code (1 for an uncaught exception, 130 for Ctrl-C)
  {USAGE_EXIT_CODE}   bad arguments, an unusable --logdir: the script is not run
  {STRICT_EXIT_CODE}   --strict and an open error: at the check that decided it (the script stops there),
      or at the end of the run
  {INCOMPLETE_EXIT_CODE}  --strict and a part of the check failed inside leafwatch (the report may miss findings), or
      the model trained with an optimizer whose steps leafwatch could not see (nothing was checked)
  {USAGE_EXIT_CODE}   --diff FILE and the patch is refused (two fixes on the same lines, or FILE can't be written), or
      --verify refused (the script lies outside this folder, the copy failed)
  1   --diff FILE and an open code fix could not be placed in the patch, or --verify and a patched
      finding is still open or undecided, a new one appeared, or the rerun failed
  0   otherwise (without --strict or --diff, findings never change the exit code)"""


def configure_run_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXIT_CODES_HELP
    parser.add_argument("--logdir", metavar="DIR",
                        help="write TensorBoard records to DIR (created; checked before the script starts)")
    parser.add_argument("--strict", action="store_true",
                        help=f"stop the script at the check that decides an error and exit {STRICT_EXIT_CODE} "
                        "(also for an error decided at the end of the run)")
    parser.add_argument("--patience", type=positive_int, default=1, metavar="N",
                        help="checks a parameter may go without a gradient before it is reported (default 1)")
    parser.add_argument("--ignore", action="append", default=[], metavar="PATTERN[=REASON]",
                        help="report findings whose name matches the glob PATTERN as ignored (repeatable)")
    parser.add_argument("--diff", metavar="FILE",
                        help="write the open findings' code fixes to FILE as one unified diff (for `git apply` in "
                        "this folder); the script's own output stays apart")
    parser.add_argument("--verify", action="store_true",
                        help="with --diff: apply the patch to a scratch copy of this folder, run the script there "
                        "again under leafwatch, and say per finding whether it is fixed, still open or undecided, "
                        "and any new one (docs/patch.md)")
    parser.add_argument("--verify-steps", type=positive_int, default=None, metavar="N",
                        help=f"with --verify: the rerun makes as many optimizer steps as this run, at most N "
                        f"(default {verification.VERIFY_STEPS})")
    parser.add_argument("--max-steps", type=non_negative_int, default=None, metavar="N",
                        help="stop the script when it calls the optimizer step after N (all optimizers together): "
                        "the run ends there, what waits for a later step is left undecided")
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE",
                        help="run a library module as a script (the rest of the line is its arguments)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="script.py [args ...]",
                        help="the script and its arguments")
    return parser


def run_main(args: argparse.Namespace) -> int:
    """Run what ``args`` (from the ``run`` parser) names; the exit code."""
    try:
        ignore = parse_ignore(args.ignore)
    except ValueError as error:
        return _usage_error(str(error))
    if args.module is not None:
        if not args.module:
            return _usage_error("-m needs a module name")
        if args.script_args:
            return _usage_error(f"give a script or -m MODULE, not both (got {args.script_args[0]!r})")
        module, argv, script = args.module[0], args.module[1:], None
        if _package_without_main(module):
            return _usage_error(f"No module named {module}.__main__; {module!r} is a package and cannot be directly "
                                "executed (it has no __main__.py)")
    else:
        if not args.script_args:
            return _usage_error("give a script to run: leafwatch run [options] script.py [args ...]")
        script, argv, module = args.script_args[0], args.script_args[1:], None
        if not os.path.exists(script):
            return _usage_error(f"can't open file {script!r}: no such file")
        if os.path.isdir(script) and not os.path.isfile(os.path.join(script, "__main__.py")):
            return _usage_error(f"can't find '__main__.py' in {script!r}: give a script of that folder, or add a "
                                "__main__.py to run the folder")
    if args.verify and args.diff is None:
        return _usage_error("--verify proves the patch that --diff FILE writes: give --diff FILE too")
    if args.verify_steps is not None and not args.verify:
        return _usage_error("--verify-steps goes with --verify")
    problem = None if args.logdir is None else folder_problem(args.logdir, "--logdir", create=True)
    if problem is not None:
        return _usage_error(problem)
    return run(script, argv, module=module, logdir=args.logdir, strict=args.strict, patience=args.patience,
               ignore=ignore, diff=args.diff, max_steps=args.max_steps, verify=args.verify,
               verify_steps=args.verify_steps or verification.VERIFY_STEPS)


def _package_without_main(module: str) -> bool:
    """Whether ``module`` is a package with no ``__main__.py`` (found without importing it: only a top-level
    name is looked up; a dotted one is left to runpy, which imports its parents anyway)."""
    if "." in module:
        return False
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    locations = None if spec is None else spec.submodule_search_locations
    return locations is not None and not any(os.path.isfile(os.path.join(str(loc), "__main__.py")) for loc in locations)


def _usage_error(problem: str) -> int:
    sys.stderr.write(f"leafwatch run: {problem}\n")
    return USAGE_EXIT_CODE

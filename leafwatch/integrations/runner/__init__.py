"""``leafwatch run``: audit an unmodified PyTorch script, the way ``python -m cProfile`` runs one.

The script runs as ``__main__`` with its own ``sys.argv``; leafwatch only adds global hooks: an
optimizer step pre-hook checks each optimizer that steps (:mod:`.session` says when the first
check comes and how long optimizer membership waits), and a module forward pre-hook names the
modules that run until their roots are stable (:mod:`leafwatch.observe.discovery`). A tensor no
stepping optimizer holds is an error (a warning while an optimizer the script holds has not
stepped: an error at the end of the run if it never does).

Findings go to stderr once each as they appear (one short line with the fix, and the step it
was decided when later than the step it was first seen), and the table of all of them, causes
included, at exit; the script's stdout is its own, and the exit code follows
:func:`~.command.exit_code` (:mod:`.command`).
"""

from __future__ import annotations

from ...options import parse_ignore
from .command import EXIT_CODES_HELP, INCOMPLETE_EXIT_CODE, STRICT_EXIT_CODE, USAGE_EXIT_CODE, configure_run_parser, exit_code, run, run_main, run_target
from .session import EVERY_STEP_VALUE_CHECKS, LATE_OPTIMIZER_CHECKS, Session, StrictStop

__all__ = ["EVERY_STEP_VALUE_CHECKS", "EXIT_CODES_HELP", "INCOMPLETE_EXIT_CODE", "LATE_OPTIMIZER_CHECKS",
           "STRICT_EXIT_CODE", "USAGE_EXIT_CODE", "Session", "StrictStop", "configure_run_parser", "exit_code",
           "parse_ignore", "run", "run_main", "run_target"]

"""The ``leafwatch`` command: ``leafwatch demo`` (and room for ``run`` and ``report``).

Each subcommand is one entry of :data:`SUBCOMMANDS`: a function that adds its arguments to its
parser, and the module and function that run it (imported only when that subcommand runs, so
``leafwatch --help`` stays fast).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from .integrations.environment import tensorboard_command
from .options import folder_problem, positive_int


class Subcommand(NamedTuple):
    """One subcommand: its one-line help, the ``"module:function"`` that adds its arguments to its
    parser, and the one that runs it with the parsed arguments (returning the exit code)."""

    help: str
    add_arguments: str
    target: str


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--logdir", default="runs", help="where TensorBoard event files go (default: runs)")
    parser.add_argument("--steps", type=positive_int, default=20, help="training steps (default: 20)")


SUBCOMMANDS: dict[str, Subcommand] = {
    "demo": Subcommand("train a small Lightning model with three seeded bugs on CPU and show what leafwatch finds",
                       "leafwatch.cli:_demo_arguments", "leafwatch.cli:demo_main"),
    "run": Subcommand("run an unmodified PyTorch script and name every tensor that does not train",
                      "leafwatch.integrations.runner:configure_run_parser", "leafwatch.integrations.runner:run_main"),
    "report": Subcommand("print the findings leafwatch wrote to TensorBoard logs (exit 1 on findings, for CI)",
                         "leafwatch.report.reader:configure_report_parser", "leafwatch.report.reader:report_main"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``leafwatch`` parser; with ``only``, the arguments of that subcommand alone are added
    (the others keep their name and help), so ``leafwatch report`` does not import what
    ``leafwatch run`` needs (torch)."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="leafwatch", description="Name every PyTorch tensor that will not train, "
                                     "say why, and give the one-line fix.")
    parser.add_argument("--version", action="version", version=f"leafwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=command.help, description=command.help)
        if only is not None and name != only:
            continue
        _load_target(command.add_arguments)(subparser)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the top-level options
    take no value), when that is a subcommand."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if first in SUBCOMMANDS else None


def _load_target(target: str) -> Callable[..., Any]:
    module_name, _, function = target.partition(":")
    return getattr(importlib.import_module(module_name), function)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``leafwatch`` command line; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=_command_of(argv))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(_load_target(SUBCOMMANDS[args.command].target)(args) or 0)


# -- demo ---------------------------------------------------------------------------------------
def demo_main(args: argparse.Namespace) -> int:
    """Train the seeded-bug demo (:mod:`leafwatch.demo`), print the findings table and, last, the
    command that opens TensorBoard in this environment (:func:`leafwatch.integrations.environment.tensorboard_command`).
    An unusable ``--logdir`` exits 2 before anything is imported or trained, as in ``leafwatch run``."""
    problem = folder_problem(args.logdir, "--logdir", create=True)
    if problem is not None:
        print(f"leafwatch demo: {problem}", file=sys.stderr)
        return 2
    try:
        from .integrations.lightning import LeafWatch  # noqa: F401  (fails early with the install hint)
        from . import demo as example
    except ImportError as error:
        print(f"leafwatch demo: {error}", file=sys.stderr)
        return 1
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # keep the demo's output to the findings
    logdir = Path(args.logdir)
    print(f"leafwatch demo: training a small classifier with {len(example.BUGS)} seeded bugs "
          f"({', '.join(example.BUGS)}) for {args.steps} steps on CPU ...", flush=True)
    started = time.perf_counter()
    report: Any = example.train(logdir, max_steps=args.steps, verbose=False)
    elapsed = time.perf_counter() - started
    print(f"\n{report}\n")
    print(f"Trained in {elapsed:.1f} s; the findings are also in TensorBoard (scalars, text and the Leafwatch tab).")
    print(f"Open the dashboard with:\n\n    {tensorboard_command(logdir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

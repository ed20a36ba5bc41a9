"""Argument validation, ``ignore`` patterns and warn-once: shared by every front-end.

Torch-free. ``ignore`` patterns are matched against a finding's name and aliases: a pattern equal
to a name matches it literally (so ``gains[0]`` ignores the orphan ``gains[0]``); otherwise it is a
glob (``*`` any run of characters, ``?`` one character, ``[abc]`` one of a set, as in
:mod:`fnmatch`). The first matching pattern wins and gives the reason.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .observe.frames import stacklevel_outside

# -- the library's exception and warnings --------------------------------------------------------
class LeafwatchError(RuntimeError):
    """Raised for findings in strict mode; ``report`` holds the :class:`~leafwatch.Report`."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class LeafwatchAssertionError(LeafwatchError, AssertionError):
    """Raised by :func:`leafwatch.assert_trains`: a :class:`LeafwatchError` that test frameworks
    also see as a failed assertion (``except AssertionError`` catches it)."""


class LeafwatchWarning(UserWarning):
    """The category of every warning leafwatch emits, so users can filter them."""


class LeafwatchInternalWarning(LeafwatchWarning):
    """leafwatch's own failure (never a finding): training goes on without the part that failed.

    A test suite can make these errors without touching the warnings about findings:
    ``filterwarnings = ["error::leafwatch.LeafwatchInternalWarning"]``.
    """


#: The reason given to patterns passed without one.
DEFAULT_IGNORE_REASON = "ignored by the user"


def got(value: Any) -> str:
    """How an error message shows a wrong value: ``type: repr`` on one line (the type alone
    when the repr spans lines, as an optimizer's or a module's does)."""
    text = repr(value)
    return type(value).__name__ if "\n" in text else f"{type(value).__name__}: {text:.80}"


def validate_int(value: Any, argument: str, minimum: int) -> int:
    """``value`` if it is an int >= ``minimum``.

    Raises:
        TypeError: not an int (a bool is not one).
        ValueError: below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{argument}` must be an int, got {type(value).__name__}: {value!r:.80}")
    if value < minimum:
        raise ValueError(f"`{argument}` must be >= {minimum}, got {value}")
    return value


def validate_bool(value: Any, argument: str) -> bool:
    """``value`` if it is a bool.

    Raises:
        TypeError: anything else.
    """
    if not isinstance(value, bool):
        raise TypeError(f"`{argument}` must be a bool, got {type(value).__name__}: {value!r:.80}")
    return value


def validate_ignore(ignore: Any, default_reason: str = DEFAULT_IGNORE_REASON) -> dict[str, str]:
    """``ignore`` as a dict pattern -> reason (a sequence of patterns gets ``default_reason``).

    Raises:
        TypeError: a str, or neither a mapping nor a sequence; a reason that is not a str.
        ValueError: an empty or non-str pattern.
    """
    if ignore is None:
        return {}
    if isinstance(ignore, str):
        raise TypeError(f"`ignore` must be a mapping pattern -> reason or a sequence of patterns, got a str: {ignore!r}; wrap it in a list")
    if isinstance(ignore, Mapping):
        items = list(ignore.items())
    elif isinstance(ignore, (list, tuple, set, frozenset)):
        items = [(p, default_reason) for p in ignore]
    else:
        raise TypeError(f"`ignore` must be a mapping pattern -> reason or a sequence of patterns, got {type(ignore).__name__}: {ignore!r:.80}")
    out = {}
    for pattern, reason in items:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"`ignore` patterns must be non-empty str, got {pattern!r}")
        if not isinstance(reason, str):
            raise TypeError(f"`ignore` reasons must be str, got {type(reason).__name__} for pattern {pattern!r}")
        out[pattern] = reason
    return out


def parse_ignore(values: Sequence[str] | None) -> dict[str, str]:
    """``["head.*=frozen on purpose", "aux.*"]`` -> ``{"head.*": "frozen on purpose", "aux.*": ...}``.

    The command-line form of ``ignore`` (``--ignore PATTERN[=REASON]``).

    Raises:
        ValueError: for an empty pattern.
    """
    out: dict[str, str] = {}
    for value in values or ():
        pattern, _, reason = value.partition("=")
        pattern = pattern.strip()
        if not pattern:
            raise ValueError(f"`--ignore` takes PATTERN[=REASON] with a non-empty pattern, got {value!r}")
        out[pattern] = reason.strip() or "ignored on the command line"
    return out


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be an int >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an int >= 0."""
    return _int_at_least(text, 0)


def folder_problem(path: str, argument: str, *, create: bool = False) -> str | None:
    """What is wrong with ``path`` as the folder ``argument`` names, in one clause that names
    both, or None: ``leafwatch demo``, ``run`` (``--logdir``) and ``report`` (``LOGDIR``) say it
    before they start.

    Args:
        path: The path as the user gave it.
        argument: What the command line calls it (``--logdir``, ``LOGDIR``).
        create: A log directory: create it when missing (its parents too) and check that a
            file can be written in it. Without it a missing folder is a problem.

    Returns:
        ``"`--logdir` 'afile.txt' is a file, not a folder"`` and the like, or None.

    Example::

        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        ...     folder_problem(f.name, "--logdir") == f"`--logdir` {f.name!r} is a file, not a folder"
        True
        >>> folder_problem("no/such/folder", "LOGDIR")
        "`LOGDIR` 'no/such/folder' does not exist"
    """
    given = f"`{argument}` {path!r}"
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{given} {_not_a_folder(path)}"
    if not os.path.isdir(path):
        if not create:
            return f"{given} does not exist"
        above = os.path.dirname(os.path.normpath(path))
        while above and not os.path.exists(above) and os.path.dirname(above) != above:
            above = os.path.dirname(above)
        if above and os.path.exists(above) and not os.path.isdir(above):
            return f"{given} cannot be created: {above!r} {_not_a_folder(above)}"
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as error:
            return f"{given} cannot be created ({error.strerror or error})"
    if create:
        try:
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as error:
            return f"{given} is not writable ({error.strerror or error})"
    return None


def _not_a_folder(path: str) -> str:
    return "is a file, not a folder" if os.path.isfile(path) else "is not a folder"


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether an ``ignore`` pattern matches a name: literally when equal, else as a glob."""
    return pattern == name or fnmatch.fnmatchcase(name, pattern)


def matching_pattern(ignore: Mapping[str, str], names: Iterable[str]) -> str | None:
    """The first pattern of ``ignore`` (in its order) that matches one of ``names``."""
    names = tuple(names)
    return next((p for p in ignore if any(pattern_matches(p, n) for n in names)), None)


def warn_unmatched_ignore(ignore: Mapping[str, str], names: Iterable[str]) -> None:
    """Warn, at the user's line, for each ``ignore`` pattern that matches none of ``names`` (a typo?)."""
    names = set(names)
    for pattern in ignore:
        if not any(pattern_matches(pattern, n) for n in names):
            warnings.warn(f"leafwatch: `ignore` pattern {pattern!r} matches no parameter or tensor name "
                          f"(for example {sorted(names)[:3]})", LeafwatchWarning, stacklevel=stacklevel_outside())


class WarnOnce:
    """Internal failures warn once per place (a :class:`LeafwatchInternalWarning`) and never stop training.

    Args:
        goes_on: What the warning says happens next.
    """

    def __init__(self, goes_on: str = "training goes on, leafwatch skips this part.") -> None:
        self.seen: set[str] = set()
        self.goes_on = goes_on

    def __call__(self, where: str, error: BaseException, stacklevel: int = 3) -> None:
        if where in self.seen:
            return
        self.seen.add(where)
        warnings.warn(f"leafwatch: internal failure in {where} ({type(error).__name__}: {error}); {self.goes_on}",
                      LeafwatchInternalWarning, stacklevel=stacklevel)

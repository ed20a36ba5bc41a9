"""The note on a crashing exception: leafwatch's explanation added to the very exception torch raised.

PEP 678: on Python 3.11 and later each finding that explains the exception becomes one note
(``error.add_note(text)``: its message, cause and fix, one line each, prefixed ``leafwatch:``), which
the traceback printer shows right after the exception's message; the exception keeps its identity,
type, message and traceback, only ``__notes__`` grows. On 3.10 an exception cannot carry a note:
:func:`add` returns the text, and the door that prints the traceback prints it right after.
An exception that already carries leafwatch's note (two doors saw it) gets none again.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..report.format import FindingText, note_text

#: Whether this Python prints an exception's notes with its traceback (PEP 678, Python 3.11+).
ATTACHES = sys.version_info >= (3, 11)
#: How every line of leafwatch's notes starts.
PREFIX = "leafwatch:"


def noted(error: BaseException) -> bool:
    """Whether ``error`` carries a note of leafwatch's already."""
    notes = getattr(error, "__notes__", None)
    return isinstance(notes, list) and any(isinstance(n, str) and n.startswith(PREFIX) for n in notes)


def add(error: BaseException, findings: Sequence[FindingText]) -> list[str]:
    """Add one note per finding to ``error``; returns the notes still to print after its traceback
    (all of them where notes are not printed, Python 3.10; none once added)."""
    texts = [note_text(f) for f in findings]
    if not texts or noted(error):
        return []
    if not ATTACHES:
        return texts
    for i, text in enumerate(texts):
        try:
            error.add_note(text)
        except Exception:  # an exception class that refuses notes: they are printed instead
            return texts[i:]
    return []

"""The words of findings on a console and in markdown: one place for every front-end.

Torch-free. ``str(report)``, ``report.to_markdown()``, the Lightning callback's warnings,
``leafwatch run``'s lines and ``leafwatch report`` all render findings here:

- :func:`finding_line`: one short line as a finding first appears (severity, kind, name, when,
  the one-line fix), for a console warning or a progress bar;
- :func:`report_text`: the full table (message, cause, fix per finding) for summaries;
- :func:`report_markdown`: the same as a markdown table (TensorBoard's Text tab).

An ignored finding prints as ``IGNORED`` with the reason given in ``ignore=`` / ``--ignore
PATTERN=REASON``; a finding of the structure scan at fit start (step 0) says "at start".

The functions read findings through :class:`FindingText` (what a :class:`~leafwatch.Finding`
has), so that this module needs nothing else of leafwatch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .names import compress_names

#: How a finding's status and severity words are compared here (the ``Status`` and ``Severity``
#: members of :mod:`leafwatch.report.findings` are these strings).
OPEN, IGNORED = "open", "ignored"
#: Why a report without findings says "nothing to check" rather than "no findings" (its
#: ``nothing_to_check``), and the warning that says so once.
NOTHING_TO_CHECK = "no tensor requires grad and nothing is watched"


class FindingText(Protocol):
    """What rendering reads of a finding (a :class:`~leafwatch.Finding` has all of it)."""

    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def cause(self) -> str: ...
    @property
    def fix(self) -> str: ...
    @property
    def remedy(self) -> Any: ...
    @property
    def first_step(self) -> int | None: ...
    @property
    def ranks(self) -> tuple[int, ...]: ...
    @property
    def details(self) -> Mapping[str, Any]: ...
    @property
    def is_open(self) -> bool: ...


def when(step: int | None) -> str:
    """``"at step 3"``; ``"at start"`` for step 0 (the scan before the first optimizer step).

    Example::

        >>> when(3), when(0), when(None)
        ('at step 3', 'at start', '')
    """
    return "" if step is None else "at start" if step == 0 else f"at step {step}"


def since(step: int | None) -> str:
    """``"(since step 3)"``, ``"(since start)"``, or nothing when the step is unknown."""
    return "" if step is None else "(since start)" if step == 0 else f"(since step {step})"


def decided_step(f: FindingText) -> int | None:
    """The step a finding was decided, when later than the step it was first seen (a suspicion
    held for evidence or for an optimizer that may step late); else None."""
    step = f.details.get("decided_step")
    return step if isinstance(step, int) and f.first_step is not None and step > f.first_step else None


def seen_when(f: FindingText) -> str:
    """``"at step 2"``, or ``"seen at step 2, decided at step 27"`` for a finding decided later.

    Example::

        >>> from leafwatch import Finding
        >>> seen_when(Finding("not_in_optimizer", "scale", "error", "m", first_step=2,
        ...                   details={"decided_step": 27}))
        'seen at step 2, decided at step 27'
    """
    decided = decided_step(f)
    return when(f.first_step) if decided is None else f"seen {when(f.first_step)}, decided at step {decided}"


def ignored_because(f: FindingText) -> str:
    """Why a finding is ignored: the reason given with its ``ignore`` pattern, and the pattern."""
    reason = str(f.details.get("ignored_because") or "ignored by the user")
    pattern = f.details.get("pattern")
    return f"{reason} (pattern {pattern!r})" if pattern else reason


def _tensors(f: FindingText) -> tuple[Any, ...]:
    """The per-tensor findings of a mistake (none for one tensor: its name says it)."""
    members = tuple(getattr(f, "members", ()) or ())
    return members if len(members) > 1 else ()


def shown(f: FindingText) -> str:
    """A finding's name as code (`` `encoder.weight` ``), or as the words it is when no variable names the
    tensor ("the float64 copy passed to `Adam` at train.py:3": ``details["described"]``)."""
    return f.name if f.details.get("described") else f"`{f.name}`"


def located(f: FindingText) -> str:
    """``, cut by `.detach()` at deep.py:13``: where a mistake of one place is (its ``details["location"]``)."""
    location = f.details.get("location")
    return f", {location}" if location else ""


def tensor_count(f: FindingText) -> str:
    """`` (492 tensors: experts.{2..6,8..499})`` for a mistake of several tensors."""
    members = _tensors(f)
    if not members:
        return ""
    names = compress_names((m.name for m in members), limit=3)
    return f" ({len(members)} tensors: {names})" if names != f.name else f" ({len(members)} tensors)"


def _ignored_members(f: FindingText) -> str:
    """Which tensors of a mistake that stays open the ``ignore`` patterns took out."""
    ignored = [m for m in _tensors(f) if m.status == IGNORED]
    if not ignored or f.status == IGNORED:
        return ""
    names = compress_names(m.name for m in ignored)
    return f"{len(ignored)} of them ignored ({names}): {ignored_because(ignored[0])}"


def _ranks(f: FindingText) -> str:
    return f" on rank(s) {', '.join(map(str, f.ranks))}" if f.ranks else ""


#: How a fix's remedy reads (its ``applicability``): code to paste, or advice in words.
FIX_MARKS = {"code": "code", "words": "advice"}


def fix_mark(f: FindingText) -> str:
    """`` (code)`` or `` (advice)``: what the fix is (empty without a fix)."""
    remedy = f.remedy  # (a fix written by hand without one: advice)
    mark = FIX_MARKS.get(str(remedy.applicability if remedy is not None else "words")) if f.fix else None
    return f" ({mark})" if mark else ""


def finding_line(f: FindingText) -> str:
    """The one short line said when a finding first appears: severity, kind, name, when, and
    the one-line fix (the message when there is no fix). The cause waits for the table.

    Example::

        >>> from leafwatch import Finding
        >>> from leafwatch.report.reasons import Written
        >>> print(finding_line(Finding("missing_grad", "head.weight", "error", Written(
        ...     message="no gradient", cause="never ran", fix="call `head` in forward()"), first_step=0)))
        leafwatch: ERROR missing_grad `head.weight` at start. Fix (advice): call `head` in forward()
    """
    if f.status == IGNORED:
        return f"leafwatch: ignored {f.kind} {shown(f)}: {ignored_because(f)}"
    head = f"leafwatch: {f.severity.upper()} {f.kind} {shown(f)}{tensor_count(f)}{located(f)}"
    step = seen_when(f)
    if step:
        head += f"{',' if located(f) else ''} {step}"
    if f.status != OPEN:
        head += f" ({f.status})"
    head += _ranks(f)
    return f"{head}. Fix{fix_mark(f)}: {f.fix}" if f.fix else f"{head}: {f.message}"


def note_text(f: FindingText) -> str:
    """A finding as the note leafwatch adds to a crashing exception: its message, cause and fix, one
    line each, each prefixed ``leafwatch:`` (the fix marked as code or advice).

    Example::

        >>> from leafwatch import Finding
        >>> from leafwatch.report.reasons import Written
        >>> from leafwatch.report.words import code
        >>> print(note_text(Finding("non_leaf", "w", "error", Written(message="`w` is not a leaf tensor.",
        ...     cause="a dtype conversion", fix="convert first: `w = w0.double().requires_grad_()`",
        ...     remedy=code("w = w0.double().requires_grad_()")))))
        leafwatch: `w` is not a leaf tensor.
        leafwatch: cause: a dtype conversion
        leafwatch: fix (code): convert first: `w = w0.double().requires_grad_()`
    """
    lines = [f"leafwatch: {f.message}"]
    if f.cause:
        lines.append(f"leafwatch: cause: {f.cause}")
    if f.fix:
        lines.append(f"leafwatch: fix{fix_mark(f)}: {f.fix}")
    return "\n".join(lines)


def warning_text(f: FindingText) -> str:
    """A finding said the moment it is made, as one warning (``watch()`` on a non-leaf): its message, cause
    and fix on one line, the fix marked as code or advice."""
    fix = f" Fix{fix_mark(f)}: {f.fix}" if f.fix else ""
    return f"leafwatch: {f.message} {f.cause}{fix}"


def _head(text: str, step: int | None) -> str:
    moment = when(step)
    return f"{text} {moment}" if moment else text


def report_text(findings: Sequence[FindingText], step: int | None = None, *, nothing_to_check: bool = False) -> str:
    """The findings table: per finding its line, the message, the cause and the fix; an ignored
    finding gives the reason it is ignored instead of the cause and the fix. Without findings,
    "no findings", or "nothing to check" when the check had nothing to look at.

    Example::

        >>> from leafwatch import Finding
        >>> print(report_text([Finding("missing_grad", "aux.bias", "error", "`aux.bias` got no gradient.",
        ...     status="ignored", first_step=1, details={"ignored_because": "kept for fine-tuning"})], step=4))
        leafwatch: 0 open of 1 finding(s) at step 4
          IGNORED missing_grad        aux.bias (since step 1)
              `aux.bias` got no gradient.
              ignored: kept for fine-tuning
    """
    if not findings:
        if nothing_to_check:
            return f"{_head('leafwatch: nothing to check', step)}: {NOTHING_TO_CHECK}"
        return _head("leafwatch: no findings", step)
    n_open = sum(1 for f in findings if f.is_open)
    lines = [_head(f"leafwatch: {n_open} open of {len(findings)} finding(s)", step)]
    for f in findings:
        ignored = f.status == IGNORED
        label = "IGNORED" if ignored else f.severity.upper()
        status = "" if f.status == OPEN or ignored else f" [{f.status}]"
        seen = since(f.first_step)
        decided = decided_step(f)
        if seen and decided is not None:
            seen = f"{seen[:-1]}, decided at step {decided})"
        lines += [f"  {label:7} {f.kind:19} {f.name}{located(f)}{status}{' ' + seen if seen else ''}{_ranks(f)}",
                  f"      {f.message}"]
        if ignored:
            lines.append(f"      ignored: {ignored_because(f)}")
            continue
        if _ignored_members(f):
            lines.append(f"      ignored: {_ignored_members(f)}")
        if f.cause:
            lines.append(f"      cause: {f.cause}")
        if f.fix:
            lines.append(f"      fix{fix_mark(f)}: {f.fix}")
    return "\n".join(lines)


def escape_markdown(text: str) -> str:
    """A table cell's text: pipes escaped, one line."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def report_markdown(findings: Sequence[FindingText], step: int | None = None, *, nothing_to_check: bool = False) -> str:
    """The findings as a markdown table (with the blank line before it that TensorBoard needs)."""
    if not findings:
        return f"**leafwatch**: nothing to check: {NOTHING_TO_CHECK}." if nothing_to_check else "**leafwatch**: no findings."
    n_open = sum(1 for f in findings if f.is_open)
    rows = [_head(f"**leafwatch**: {n_open} open finding(s)", step), "",
            "| severity | kind | name | status | cause | fix | seen since |", "|---|---|---|---|---|---|---|"]
    for f in findings:
        ignored = f.status == IGNORED
        seen = "" if f.first_step is None else ("start" if f.first_step == 0 else f"step {f.first_step}")
        if seen and decided_step(f) is not None:
            seen += f" (decided at step {decided_step(f)})"
        cells = [str(f.severity), str(f.kind), f"{shown(f)}{tensor_count(f)}{located(f)}", str(f.status),
                 f"ignored: {ignored_because(f)}" if ignored else (f.cause or f.message),
                 "" if ignored else f"{fix_mark(f)} {f.fix}".lstrip(), seen]
        rows.append("| " + " | ".join(escape_markdown(c) for c in cells) + " |")
    return "\n".join(rows)


__all__ = ["NOTHING_TO_CHECK", "FindingText", "decided_step", "escape_markdown", "finding_line", "fix_mark",
           "ignored_because", "located", "note_text", "report_markdown", "report_text", "seen_when", "shown", "since",
           "tensor_count", "warning_text", "when"]

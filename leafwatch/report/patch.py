"""The open code fixes of a run as one unified diff: ``leafwatch report --diff`` / ``--fix`` and
``leafwatch run --diff FILE``.

Each finding's :class:`~leafwatch.report.words.Remedy` says whether its fix is code and, when the
place was found, where it goes (:class:`~leafwatch.report.words.Edit`: insert after a statement, or
replace it). :func:`build` gathers the edits of the open findings, keeps those in the user's own
files (inside the folder the run was started in, never an installed library), drops identical
edits two findings share, refuses two edits on overlapping lines (:class:`PatchRefused`, never a
corrupt patch) and writes one ``--- a/PATH`` / ``+++ b/PATH`` diff per file, as ``git apply`` and
``patch -p1`` expect it in that folder. Every open finding it leaves out is said (:class:`LeftOut`).

A run records what the patch needs once, when its findings change (:func:`record`): that folder,
each edited file's sha256 as the run read it, and each finding's own hunk (for the tab), so that
``leafwatch report`` refuses a file that changed since (:class:`PatchRefused`). Torch-free.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import linecache
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TextIO

from .findings import Finding, Report
from .words import Edit

#: Reads a file's lines (each ending with its newline), as the run read it or as it is now.
Reader = Callable[[str], Sequence[str]]
#: Folder names that mark an installed library.
_INSTALLED = ("site-packages", "dist-packages")


class PatchRefused(ValueError):
    """No patch: two edits overlap, or a file changed since the run (the message is one line)."""


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """An open finding whose fix is not in the patch, and why; ``code``: its fix is code (so the
    patch is partial), else advice."""

    kind: str
    name: str
    why: str
    code: bool

    def __str__(self) -> str:
        return f"not in the patch: {self.kind} {self.name}: {self.why}"


@dataclasses.dataclass(frozen=True)
class FilePatch:
    """One file of a patch: its path (absolute, and relative to the root), its text before and after."""

    path: str
    relative: str
    before: str
    after: str
    edits: int

    def diff(self) -> str:
        """The unified diff of the file (3 lines of context), ``a/`` and ``b/`` before its path; a last
        line without a newline is marked as ``diff`` marks it."""
        lines = difflib.unified_diff(self.before.splitlines(keepends=True), self.after.splitlines(keepends=True),
                                     f"a/{self.relative}", f"b/{self.relative}", n=3)
        return "".join(line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n" for line in lines)


@dataclasses.dataclass(frozen=True)
class Patch:
    """The patch of a run: its files in path order and the open findings it leaves out."""

    files: tuple[FilePatch, ...]
    left_out: tuple[LeftOut, ...]

    @property
    def diff(self) -> str:
        return "".join(f.diff() for f in self.files)

    @property
    def complete(self) -> bool:
        """Every open code fix is in it."""
        return not any(o.code for o in self.left_out)


def disk_lines(path: str) -> list[str]:
    """A file's lines as it is now (``keepends``), read as Python reads source (UTF-8)."""
    with open(path, encoding="utf-8", newline="") as source:
        return source.read().splitlines(keepends=True)


def run_lines(path: str) -> list[str]:
    """A file's lines as the run read them (:mod:`linecache`, which the fixes read the source through)."""
    return list(linecache.getlines(path))


def digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def edits_of(finding: Finding) -> tuple[list[Edit], str | None]:
    """The edits of an open finding's code fix (its own, else its tensors'), or why there are none."""
    remedy = finding.remedy
    members = [m.remedy for m in finding.members if m.is_open and m.remedy is not None]
    remedies = [remedy] if remedy is not None and remedy.applicability == "code" else members
    if not remedies or any(r.applicability != "code" for r in remedies):
        return [], "its fix is advice, not code" if remedy is not None or finding.fix else "it has no fix"
    if any(r.edit is None for r in remedies):
        return [], "its code has no place in a file (leafwatch could not find the statement it belongs to)"
    return [r.edit for r in remedies if r.edit is not None], None


def outside(path: str, root: str) -> str | None:
    """Why ``path`` is not the user's own file under ``root`` (None when it is)."""
    path, root = os.path.abspath(path), os.path.abspath(root)
    try:
        inside = os.path.commonpath([path, root]) == root
    except ValueError:  # another drive
        inside = False
    if not inside:
        return f"{path} is outside the folder the run was started in ({root})"
    if any(part in _INSTALLED for part in os.path.relpath(path, root).split(os.sep)):
        return f"{path} belongs to an installed library"
    return None


def _overlap(a: Edit, b: Edit) -> bool:
    """Whether two edits of one file touch the same lines (identical edits never get here)."""
    if a.action == b.action == "insert_after":
        return False
    if a.action == "insert_after":
        a, b = b, a
    if b.action == "insert_after":  # (after a replaced statement's last line: it goes after the new text)
        return a.start <= b.end < a.end
    return a.start <= b.end and b.start <= a.end


def apply_edits(lines: Sequence[str], edits: Sequence[Edit]) -> str:
    """The text of ``lines`` with ``edits`` (one file's, not overlapping) made; inserts after one line
    keep the order they are given in, and go after the new text where that line ends a replaced span."""
    out = list(lines)
    order = sorted(range(len(edits)), key=lambda i: (edits[i].end, edits[i].action == "insert_after", i), reverse=True)
    for i in order:
        edit = edits[i]
        text = edit.text if edit.text.endswith("\n") else edit.text + "\n"
        new = text.splitlines(keepends=True)
        if edit.end > len(out) or edit.start < 1:
            raise PatchRefused(f"{edit.path}: lines {edit.start}-{edit.end} are past its end ({len(out)} lines): "
                               "it changed since the run")
        if edit.end == len(out) and out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        if edit.action == "replace":
            out[edit.start - 1:edit.end] = new
        else:
            out[edit.end:edit.end] = new
    return "".join(out)


def build(findings: Iterable[Finding], root: str, read: Reader = disk_lines,
          hashes: Mapping[str, str] | None = None) -> Patch:
    """The patch of the open findings' code fixes under ``root``.

    Args:
        findings: A report's findings (mistakes); only the open ones count.
        root: The folder the run was started in: the patch's paths are relative to it.
        read: Reads a file's lines.
        hashes: Absolute path -> the sha256 the run recorded; a file whose text differs is refused.

    Raises:
        PatchRefused: two edits overlap, or a file differs from what the run read.
    """
    root = os.path.abspath(root)
    per_file: dict[str, list[Edit]] = {}
    left_out: list[LeftOut] = []
    for finding in sorted((f for f in findings if f.is_open), key=Finding.sort_key):
        edits, why = edits_of(finding)
        code = finding.remedy is not None and finding.remedy.applicability == "code" or bool(edits)
        why = why or next((w for w in (outside(e.path, root) for e in edits) if w), None)
        if why is not None:
            left_out.append(LeftOut(str(finding.kind), finding.name, why, code))
            continue
        for edit in edits:
            listed = per_file.setdefault(os.path.abspath(edit.path), [])
            if edit not in listed:
                listed.append(edit)
    files = []
    for path in sorted(per_file):
        edits, relative = per_file[path], os.path.relpath(path, root).replace(os.sep, "/")
        ordered = sorted(edits, key=lambda e: (e.start, e.end))
        for a, b in zip(ordered, ordered[1:]):
            if _overlap(a, b):
                raise PatchRefused(f"two fixes edit the same lines of {relative} ({a.start}-{a.end} and "
                                   f"{b.start}-{b.end}): apply them by hand, one at a time")
        try:
            lines = list(read(path))
        except OSError as error:
            raise PatchRefused(f"{relative}: can't read it ({error.strerror or error})") from None
        expected = (hashes or {}).get(path)
        if expected is not None and digest(lines) != expected:
            raise PatchRefused(f"{relative} changed since the run (its sha256 differs from the one the run "
                               "recorded): run it again to get a patch for it as it is now")
        before = "".join(lines)
        files.append(FilePatch(path, relative, before, apply_edits(lines, edits), len(edits)))
    return Patch(tuple(files), tuple(left_out))


def of_records(records: Sequence[Mapping[str, Any]]) -> Patch:
    """The patch of the runs whose report records (``leafwatch/report``) are ``records``, checked
    against the files as they are now.

    Raises:
        PatchRefused: a record carries no ``"patch"`` (written before leafwatch recorded one), the
            runs were started in different folders, or :func:`build` refuses.
    """
    roots, hashes, findings = set(), {}, []
    for data in records:
        saved = data.get("patch")
        if not isinstance(saved, Mapping) or not isinstance(saved.get("root"), str):
            raise PatchRefused("the run was recorded without what a patch needs (by an earlier leafwatch): "
                               "run it again to get its patch")
        roots.add(saved["root"])
        hashes.update(saved.get("files") or {})
        findings.extend(Report.from_dict(data).findings)
    if len(roots) > 1:
        raise PatchRefused(f"the runs were started in different folders ({', '.join(sorted(roots))}): "
                           "give the log folder of one run")
    return build(findings, roots.pop(), disk_lines, hashes) if roots else Patch((), ())


def apply(patch: Patch, backup: bool = False) -> list[str]:
    """Write ``patch``'s files in place (each first kept as ``FILE.orig`` with ``backup``); one line
    per file saying what changed."""
    said = []
    for f in patch.files:
        if backup:
            with open(f"{f.path}.orig", "w", encoding="utf-8", newline="") as out:
                out.write(f.before)
        with open(f.path, "w", encoding="utf-8", newline="") as out:
            out.write(f.after)
        kept = f" (was kept as {f.relative}.orig)" if backup else ""
        said.append(f"patched {f.relative}: {f.edits} edit{'s' if f.edits != 1 else ''}{kept}")
    return said


def nothing_to_give(patch: Patch) -> str | None:
    """Why ``patch`` holds no file, in one line (None when it holds one): no open finding, or what the
    open findings left out of it have instead of a placed code fix.

    Example::

        >>> nothing_to_give(Patch((), (LeftOut("missing_grad", "aux", "its fix is advice, not code", False),) * 2))
        'no code fix to give: 2 open findings have advice only'
        >>> nothing_to_give(Patch((), ()))
        'no code fix to give: no open findings'
    """
    if patch.files:
        return None
    if not patch.left_out:
        return "no code fix to give: no open findings"
    counts = {"a code fix that could not be placed": sum(o.code for o in patch.left_out),
              "no fix": sum(not o.code and o.why == "it has no fix" for o in patch.left_out)}
    counts = {"advice only": len(patch.left_out) - sum(counts.values()), **counts}
    said = [(n, what) for what, n in counts.items() if n]
    total = len(patch.left_out)
    if len(said) == 1:
        return f"no code fix to give: {total} open finding{'s' if total != 1 else ''} {_have(total)} {said[0][1]}"
    parts = [f"{n} {_have(n)} {what}" for n, what in said]
    return f"no code fix to give: of {total} open findings, {', '.join(parts[:-1])} and {parts[-1]}"


def _have(n: int) -> str:
    return "has" if n == 1 else "have"


def exit_code(patch: Patch) -> int:
    """0 when the patch holds every open code fix, 1 when some could not be placed in it."""
    return 0 if patch.complete else 1


def patch_main(records: Sequence[Mapping[str, Any]], *, fix: bool = False, backup: bool = False,
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``leafwatch report --diff`` (print the patch of ``records``) or ``--fix`` (apply it); each
    finding left out on ``err``, one line each, and with ``--diff`` of no file, one more saying why
    (:func:`nothing_to_give`); the exit code (2 when the patch is refused)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        patch = of_records(records)
    except PatchRefused as refused:
        err.write(f"leafwatch report: no patch: {refused}\n")
        return 2
    if fix:
        try:
            said = apply(patch, backup)
        except OSError as error:
            err.write(f"leafwatch report: no patch: can't write {error.filename}: {error.strerror}\n")
            return 2
        out.write("".join(f"{line}\n" for line in said) or "nothing to patch\n")
    else:
        out.write(patch.diff)
    err.write("".join(f"{o}\n" for o in patch.left_out))
    empty = nothing_to_give(patch)
    if empty is not None and not fix:
        err.write(f"leafwatch report: {empty}\n")
    return exit_code(patch)


def record(findings: Iterable[Finding], root: str, read: Reader = run_lines) -> dict[str, Any]:
    """What a run records for its patch (the ``"patch"`` of its report record): the folder it was
    started in, each edited file's sha256 as the run read it, and each open finding's own hunk.
    Called when the findings change, never on a healthy step."""
    root = os.path.abspath(root)
    files: dict[str, str] = {}
    hunks = []
    for finding in findings:
        try:
            own = build([finding], root, read)
        except PatchRefused:
            continue
        if not own.files:  # not open, or its fix is not placed code in the user's files
            continue
        for f in own.files:
            files[f.path] = digest(f.before.splitlines(keepends=True))
        hunks.append({"kind": str(finding.kind), "name": finding.name, "diff": own.diff})
    return {"root": root, "files": files, "hunks": hunks}


__all__ = ["FilePatch", "LeftOut", "Patch", "PatchRefused", "apply", "apply_edits", "build", "digest", "disk_lines",
           "edits_of", "exit_code", "nothing_to_give", "of_records", "outside", "patch_main", "record", "run_lines"]

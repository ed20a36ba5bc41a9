"""Where a LightningModule's ``configure_optimizers`` builds its optimizer, and that statement with
more tensors given to it: the place of the code fix of a tensor left out of it.

Read from the module's source when the finding is made (never on a healthy step): the one call of
the optimizer's class inside ``configure_optimizers`` (``return torch.optim.SGD(self.parameters(),
lr=0.01)``, ``opt = AdamW(groups)``); its ``params`` argument is rewritten in the user's own words,
the rest of the statement (comments, other arguments) left as it is.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import textwrap
from typing import Any

from ..observe.source import Source
from ..report.reasons import Span


def _char(line: str, col: int) -> int:
    """The character index of the UTF-8 byte offset ``col`` (what ``ast`` gives) in ``line``."""
    return len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))


def configured_at(model: Any, cls: str | None) -> Span | None:
    """The statement of ``type(model).configure_optimizers`` that calls the optimizer class ``cls``
    (exactly one such call), as a :class:`~leafwatch.report.reasons.Span` with its lines (``statement``),
    the first and last character offsets of its params argument in them (``params``), whether that
    argument is a list of dicts (``groups``) and the offsets of the statement itself (``own``: its comment
    after it left out); None when not found."""
    function = getattr(type(model), "configure_optimizers", None)
    code = getattr(function, "__code__", None)
    if cls is None or code is None:
        return None
    path = os.path.abspath(inspect.getsourcefile(function) or code.co_filename)
    lines, tree = linecache.getlines(path), Source().tree(path)
    method = next((f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and f.name == "configure_optimizers"
                   and min([f.lineno, *(d.lineno for d in f.decorator_list)]) == code.co_firstlineno), None) \
        if tree is not None else None
    calls = [c for c in ast.walk(method) if isinstance(c, ast.Call)  # `SGD(...)`, `torch.optim.SGD(...)`
             and getattr(c.func, "attr", getattr(c.func, "id", None)) == cls] if method else []
    if len(calls) != 1:
        return None
    call = calls[0]
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "params"), None)
    statement = min((s for s in ast.walk(method) if isinstance(s, ast.stmt) and s is not method
                     and s.lineno <= call.lineno and (s.end_lineno or s.lineno) >= (call.end_lineno or call.lineno)),
                    key=lambda s: (s.end_lineno or s.lineno) - s.lineno, default=None)
    if arg is None or statement is None or arg.end_lineno is None or arg.end_col_offset is None:
        return None
    start, end = statement.lineno, statement.end_lineno or statement.lineno
    text = lines[start - 1:end]
    first = sum(len(line) for line in text[:arg.lineno - start]) + _char(lines[arg.lineno - 1], arg.col_offset)
    last = sum(len(line) for line in text[:arg.end_lineno - start]) + _char(lines[arg.end_lineno - 1], arg.end_col_offset)
    groups = isinstance(arg, ast.List) and bool(arg.elts) and all(isinstance(e, ast.Dict) for e in arg.elts)
    indent = text[0][:len(text[0]) - len(text[0].lstrip())]
    own = sum(len(line) for line in text[:-1]) + _char(text[-1], statement.end_col_offset or 0)
    return Span(path, start, end, indent, "".join(text), (first, last), groups, (len(indent), own))


def given_too(at: Span, params: str) -> tuple[str, str] | None:
    """The lines of the statement at ``at`` (:func:`configured_at`) with ``params`` (a list display or
    an iterable of tensors, in code) given to its optimizer too (a group of their own after a list of
    groups, else one list of both), and that statement alone as code to paste; None when the
    result is no statement."""
    statement, (first, last) = at.statement or "", at.params or (0, 0)
    old = statement[first:last]
    listed = params.startswith("[") and params.endswith("]")
    if at.groups:
        inner = old[1:-1].rstrip().rstrip(",")
        new = f'[{inner}, {{"params": {params}}}]'
    else:
        extra = params[1:-1] if listed else f"*{params}"
        new = f"[{old[1:-1].rstrip().rstrip(',')}, {extra}]" if _is_list_display(old) else f"[*{old}, {extra}]"
    written = statement[:first] + new + statement[last:]
    own_first, own_last = at.own or (0, len(statement))
    snippet = textwrap.dedent(" " * own_first + written[own_first:own_last + len(new) - len(old)]).strip()
    try:
        ast.parse(textwrap.dedent(written))
        ast.parse(snippet)
    except SyntaxError:
        return None
    return written, snippet


def _is_list_display(source: str) -> bool:
    try:
        return isinstance(ast.parse(source.strip(), mode="eval").body, ast.List)
    except SyntaxError:
        return False


__all__ = ["configured_at", "given_too"]

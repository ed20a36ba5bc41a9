"""The user's source as a crash door reads it: the statements around a line of a frame (the innermost
statement, the block and the loops that hold it, the function it runs in), which names a statement reads and
assigns, and where a statement stands in its file (its lines and their indentation).

Read only once an exception reached a door, from :mod:`linecache` (no file is opened for a step), each file
parsed once per explanation (:class:`Source`), and nothing is kept after it: the words and the edits of a fix
are worked out by the detectors from what is read here.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import os
from collections.abc import Callable, Iterator
from types import FrameType

#: The statements a loop body or a branch holds.
_BODIES = ("body", "orelse", "finalbody", "handlers")
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclasses.dataclass(frozen=True)
class Span:
    """Where a statement stands: the absolute path of its file, its first and last line (from 1), and the
    indentation of its first line."""

    path: str
    start: int
    end: int
    indent: str


class Source:
    """The files one explanation reads, each parsed once."""

    def __init__(self) -> None:
        self._trees: dict[str, ast.Module | None] = {}

    def tree(self, path: str) -> ast.Module | None:
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse("".join(linecache.getlines(path)))
            except (SyntaxError, ValueError):
                self._trees[path] = None
        return self._trees[path]

    @staticmethod
    def lines(path: str) -> list[str]:
        return linecache.getlines(path)

    def text(self, path: str, node: ast.AST) -> str:
        """The source of ``node`` as written (one statement or expression)."""
        return ast.get_source_segment("".join(self.lines(path)), node) or ast.unparse(node)

    def span(self, path: str, node: ast.stmt) -> Span:
        first = self.lines(path)[node.lineno - 1] if 0 < node.lineno <= len(self.lines(path)) else ""
        return Span(os.path.abspath(path), node.lineno, node.end_lineno or node.lineno,
                    first[:len(first) - len(first.lstrip())])

    def scope(self, frame: FrameType) -> ast.AST | None:
        """The function (or the module) whose code ``frame`` runs."""
        code = frame.f_code
        tree = self.tree(code.co_filename)
        if tree is None or code.co_name == "<module>":
            return tree
        return next((f for f in ast.walk(tree) if isinstance(f, _FUNCTIONS) and f.name == code.co_name
                     and min([f.lineno, *(d.lineno for d in f.decorator_list)]) == code.co_firstlineno), None)


def blocks(node: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every statement list under ``node`` (its own body first), not those of the functions and classes it
    defines."""
    for field in _BODIES:
        body = getattr(node, field, None)
        if isinstance(body, list) and body and isinstance(body[0], (ast.stmt, ast.excepthandler)):
            statements = [s for s in body if isinstance(s, ast.stmt)]
            if statements:
                yield statements
            for child in body:
                if not isinstance(child, (*_FUNCTIONS, ast.ClassDef, ast.Lambda)):
                    yield from blocks(child)


def holding(scope: ast.AST, line: int) -> tuple[list[ast.stmt], int] | None:
    """The innermost statement list of ``scope`` with a statement whose lines hold ``line``, and the index of the
    first such statement (``a(); b()`` on one line: ``a()``'s)."""
    found = None
    for body in blocks(scope):
        for i, statement in enumerate(body):
            if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
                if found is None or statement.lineno > found[0][found[1]].lineno or body is not found[0] \
                        and statement.lineno == found[0][found[1]].lineno:
                    found = (body, i)
                break
    return found


def on_line(body: list[ast.stmt], index: int) -> list[ast.stmt]:
    """The statement at ``index`` and those after it on its last line (``a(); b()``)."""
    last = body[index].end_lineno or body[index].lineno
    return [s for s in body[index:] if s.lineno <= last]


def loops_around(scope: ast.AST, line: int) -> list[ast.For | ast.AsyncFor | ast.While]:
    """The loops of ``scope`` (not of the functions it defines) whose body holds ``line``, outermost first."""
    out = []
    for body in blocks(scope):
        for statement in body:
            if isinstance(statement, _LOOPS) and statement.body[0].lineno <= line <= (statement.end_lineno or 0):
                out.append(statement)
    return sorted(out, key=lambda loop: loop.lineno)


def reads(node: ast.AST) -> set[str]:
    """The names ``node`` reads."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def assigns(statement: ast.stmt) -> set[str]:
    """The names a statement assigns (its targets, a loop's or a ``with``'s variables), not those of the
    statements it holds."""
    if isinstance(statement, ast.Assign):
        targets: list[ast.AST] = list(statement.targets)
    elif isinstance(statement, (ast.AugAssign, ast.AnnAssign, *_LOOPS[:2])):
        targets = [statement.target]
    elif isinstance(statement, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in statement.items if item.optional_vars is not None]
    else:
        targets = []
    return {name for t in targets for name in _bound(t)}


def _bound(target: ast.AST) -> Iterator[str]:
    """The names a target binds (``a``, ``a, (b, *c)``), not the objects it changes (``a.x``, ``a[0]``)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _bound(element)
    elif isinstance(target, ast.Starred):
        yield from _bound(target.value)


def last_assignment(body: list[ast.stmt], before: int, name: str) -> int | None:
    """The index in ``body`` of the last statement before index ``before`` that assigns ``name``."""
    return next((i for i in range(before - 1, -1, -1) if name in assigns(body[i])), None)


def assigned_in(node: ast.AST, name: str) -> list[ast.stmt]:
    """Every statement under ``node`` (its nested blocks included, not its functions) that assigns ``name``."""
    return [s for body in blocks(node) for s in body if name in assigns(s)]


def backward_receiver(statement: ast.stmt) -> str | None:
    """``loss`` of the statement ``loss.backward(...)`` (None for another statement)."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "backward" \
            and isinstance(call.func.value, ast.Name):
        return call.func.value.id
    return None


def is_routine(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``function`` is a routine that needs no autograd of its own (an init routine): it returns nothing,
    is no ``forward``, and calls no ``backward()``, ``torch.autograd.grad`` or optimizer ``step()``."""
    if function.name in ("forward", "training_step", "__call__"):
        return False
    for node in ast.walk(function):
        if isinstance(node, (ast.Yield, ast.YieldFrom)) or isinstance(node, ast.Return) and node.value is not None:
            return False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("backward", "grad",
                                                                                                      "step"):
            return False
    return True


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def is_name(node: ast.AST, name: str) -> bool:
    """Whether ``node`` is the name ``name``, read or assigned."""
    return isinstance(node, ast.Name) and node.id == name


# -- rewriting a statement ---------------------------------------------------------------------------------
#: ``(line, start column, end column, text)``: the columns of a line from ``start`` to ``end`` replaced by ``text``
#: (columns count in UTF-8 bytes, as :mod:`ast` counts them; ``start == end`` inserts).
Change = tuple[int, int, int, str]


def rewritten(source: Source, path: str, statements: list[ast.stmt], matches: Callable[[ast.AST], bool],
              suffix: str) -> tuple[Span, str]:
    """The lines from the first of ``statements`` to the last, with ``suffix`` after each expression that
    ``matches`` in them (the lines between as they are)."""
    first, last = statements[0], statements[-1]
    spots = [(n.end_lineno, n.end_col_offset, n.end_col_offset, suffix) for s in statements for n in ast.walk(s)
             if matches(n) and n.end_lineno is not None and n.end_col_offset is not None]
    span = source.span(path, first)
    return Span(span.path, first.lineno, last.end_lineno or last.lineno, span.indent), \
        changed(source.lines(path), first, spots, last)  # type: ignore[arg-type]


def changed(lines: list[str], first: ast.stmt, changes: list[Change], last: ast.stmt | None = None) -> str:
    """The lines of ``first`` to ``last`` with each change made."""
    end = (last or first).end_lineno or first.lineno
    out = [line.encode() for line in lines[first.lineno - 1:end]]
    for line, start, stop, text in sorted(changes, key=lambda c: (c[0], c[1]), reverse=True):
        row = out[line - first.lineno]
        out[line - first.lineno] = row[:start] + text.encode() + row[stop:]
    return "".join(b.decode() for b in out)

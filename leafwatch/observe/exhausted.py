"""What ``optimizer got an empty parameter list`` shows when the optimizer was handed a one-shot iterator the
script had used up already: a ``filter(lambda p: p.requires_grad, model.parameters())`` or a
``model.parameters()`` kept in a variable, iterated by a count or a log line before the optimizer got it.

Said only where the object torch was handed is an iterator (``iter(x) is x``) that a variable of the user's
holds, assigned by a statement of the frame that built the optimizer; an empty list (a model without parameters)
shows none of it. No words: the crash detector says.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from types import FrameType
from typing import Any

from .source import Source, Span, blocks, reads


@dataclasses.dataclass(frozen=True)
class ExhaustedIterator:
    """The optimizer built at ``place`` (its class) was handed ``name``, an iterator of type ``kind`` made at
    ``made_at`` (the right-hand side ``value`` as written, the statement at ``at``) and used up by the statement at
    ``used_at`` (as written: ``used``) before."""

    place: str
    optimizer: str
    name: str
    kind: str
    made_at: str | None
    value: str | None
    at: Span | None
    used_at: str | None
    used: str | None


def is_iterator(value: Any) -> bool:
    """Whether ``value`` is an iterator (one pass only: a ``filter``, a generator, ``model.parameters()``)."""
    return isinstance(value, Iterator)


def read(optimizer: Any, handed: Any, frame: FrameType, line: int, name: str, source: Source) -> ExhaustedIterator | None:
    """How ``name`` of ``frame`` (the iterator ``handed`` to ``optimizer`` on ``line``) was made, and which statement
    between its assignment and ``line`` used it up."""
    scope = source.scope(frame)
    if scope is None or not is_iterator(handed):
        return None
    path = frame.f_code.co_filename
    statements = sorted((s for body in blocks(scope) for s in body), key=lambda s: s.lineno)
    made = [s for s in statements if s.lineno < line and isinstance(s, ast.Assign) and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name) and s.targets[0].id == name]
    assignment = made[-1] if made else None
    start = assignment.end_lineno or assignment.lineno if assignment is not None else 0
    users = [s for s in statements if start < s.lineno < line and name in reads(_own(s))]
    used = users[0] if users else None
    return ExhaustedIterator(
        f"{path}:{line}", type(optimizer).__name__, name, type(handed).__name__,
        f"{path}:{assignment.lineno}" if assignment is not None else None,
        source.text(path, assignment.value) if assignment is not None else None,
        source.span(path, assignment) if assignment is not None else None,
        f"{path}:{used.lineno}" if used is not None else None,
        source.text(path, used) if used is not None else None)


def _own(statement: ast.stmt) -> ast.AST:
    """The part of a statement that runs before the statements it holds (a loop's iterable, a branch's test)."""
    if isinstance(statement, (ast.For, ast.AsyncFor)):
        return statement.iter
    if isinstance(statement, (ast.If, ast.While)):
        return statement.test
    if isinstance(statement, (ast.With, ast.AsyncWith)):
        return ast.Tuple([item.context_expr for item in statement.items], ast.Load())
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Try)):
        return ast.Pass()
    return statement

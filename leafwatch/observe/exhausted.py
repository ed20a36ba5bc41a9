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
import inspect
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch

from .source import Source, Span, blocks, is_name


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
            and is_name(s.targets[0], name)]
    assignment = made[-1] if made else None
    start = assignment.end_lineno or assignment.lineno if assignment is not None else 0
    used = next((s for s in statements if start < s.lineno < line and _iterates(s, name, frame)), None)
    if used is None:  # nothing went through it before: it was empty from the start (every parameter frozen)
        return None
    return ExhaustedIterator(
        f"{path}:{line}", type(optimizer).__name__, name, type(handed).__name__,
        f"{path}:{assignment.lineno}" if assignment is not None else None,
        source.text(path, assignment.value) if assignment is not None else None,
        source.span(path, assignment) if assignment is not None else None,
        f"{path}:{used.lineno}", source.text(path, used))


#: Built-ins that go through the iterable they are given.
_CONSUMERS = frozenset({"list", "tuple", "set", "frozenset", "sorted", "sum", "any", "all", "max", "min", "dict",
                        "len", "next"})


def _iterates(node: ast.AST, name: str, frame: FrameType) -> bool:
    """Whether the statement ``node`` goes through the iterator ``name``: a loop or a comprehension over it, a
    built-in that consumes its argument (``list(params)``, ``sum(...)``), or an optimizer built from it."""
    if isinstance(node, (ast.For, ast.AsyncFor)) and is_name(node.iter, name):
        return True
    for n in ast.walk(_own(node)):
        if isinstance(n, ast.comprehension) and is_name(n.iter, name):
            return True
        if isinstance(n, ast.Call) and n.args and is_name(n.args[0], name):
            func = n.func.id if isinstance(n.func, ast.Name) else None
            if func in _CONSUMERS or _optimizer_class(n.func, frame):
                return True
    return False


def _optimizer_class(node: ast.expr, frame: FrameType) -> bool:
    """Whether ``node`` names an optimizer class in ``frame`` (``torch.optim.SGD``, ``Adam``): module attributes and
    variables only, nothing of the user's runs."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return False
    value = frame.f_locals.get(node.id, frame.f_globals.get(node.id))
    for part in parts:
        value = vars(value).get(part) if inspect.ismodule(value) else None
    return isinstance(value, type) and issubclass(value, torch.optim.Optimizer)


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

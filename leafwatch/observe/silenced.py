"""The silenced error: a loss cut from its graph, then made to require grad by hand.

``element 0 of tensors does not require grad`` is often "fixed" with ``loss.requires_grad = True``,
``loss.requires_grad_()`` or ``torch.tensor(loss.item(), requires_grad=True)``: backward then runs on
a leaf that no parameter lies behind, and nothing trains. Such a loss is a leaf (no ``grad_fn``) that
requires grad. What is read here, only once a check found parameters without a gradient: the loss
(given, or a variable of the user's frames that ``backward()`` reached), the statement of the user's
code that set its ``requires_grad`` by hand, and the cut the statement that made it shows (``.item()``,
a comparison, ``.detach()``, NumPy, ``torch.no_grad()``). Nothing here runs on a healthy step.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import linecache
from collections.abc import Container, Iterator
from types import FrameType
from typing import Any

import torch

from . import frames
from .crashes import _statements
from .source import Source, is_name, keyword

#: How many user frames, and values in each, are read for the loss.
_MAX_FRAMES = 8
_MAX_VALUES = 256

#: The calls that leave autograd, as a statement shows them (the method name -> the op's words).
_CUT_METHODS = {"item": "`.item()`", "tolist": "`.tolist()`", "numpy": "`.numpy()`", "detach": "`.detach()`",
                "detach_": "`.detach_()`"}
#: The factories that make a new leaf of values.
_FACTORIES = ("tensor", "as_tensor", "from_numpy", "scalar_tensor")
_COMPARISONS = {ast.Gt: ">", ast.GtE: ">=", ast.Lt: "<", ast.LtE: "<=", ast.Eq: "==", ast.NotEq: "!="}


@dataclasses.dataclass(frozen=True)
class Site:
    """A statement of the user's code: what it does (``op``), where, and its text."""

    op: str
    file: str
    line: int
    function: str
    statement: str


@dataclasses.dataclass(frozen=True)
class Silenced:
    """A hand-set loss: the user's name for it, the statement that set its ``requires_grad`` by hand
    (``op``: ``attribute``, ``method`` or ``rewrap``) and the cut the statement that made it shows
    (None: not seen)."""

    loss: str | None
    hand: Site | None
    cut: Site | None


def hand_set(t: Any) -> bool:
    """Whether ``t`` is a loss whose ``requires_grad`` was set by hand: a leaf that requires grad, no
    ``nn.Parameter``, made of no parameter (no ``grad_fn``)."""
    return isinstance(t, torch.Tensor) and t.grad_fn is None and t.requires_grad \
        and not isinstance(t, torch.nn.Parameter)


def hand_set_leaf(t: Any) -> torch.Tensor | None:
    """The hand-set leaf that ``t`` is, or that the one op that made ``t`` took as its only tensor input
    (``loss / accumulate_grad_batches``, as Lightning divides it); None otherwise. A handful of attribute
    reads: the Lightning callback asks it of each loss before backward."""
    if not isinstance(t, torch.Tensor):
        return None
    fn = t.grad_fn
    if fn is None:
        return t if hand_set(t) else None
    inputs = [n for n, _ in fn.next_functions if n is not None]
    leaf = getattr(inputs[0], "variable", None) if len(inputs) == 1 else None
    return leaf if hand_set(leaf) else None


def in_frames(exclude: Container[int]) -> tuple[torch.Tensor, str, FrameType] | None:
    """The loss ``backward()`` was called on, read from the user's frames (innermost first): a
    one-element hand-set leaf that backward reached (its ``.grad`` is set) and that is none of
    ``exclude`` (the tensors an optimizer holds or leafwatch watches); None when none is seen."""
    return next(((value, name, frame) for frame, name, value in _named(frames.user_frames())
                 if hand_set(value) and value.grad is not None and value.numel() == 1 and id(value) not in exclude), None)


def named_in(loss: torch.Tensor, frame: FrameType | None) -> str | None:
    """The variable of ``frame`` (and the user's frames above it) that holds ``loss``."""
    found = _named(frames.outside(frame)) if frame is not None else ()
    return next((name for _, name, value in found if value is loss), None)


def _named(stack: Iterator[FrameType]) -> Iterator[tuple[FrameType, str, Any]]:
    """``(frame, variable, value)`` of the first frames of ``stack`` (and of the first values of each)."""
    for frame in itertools.islice(stack, _MAX_FRAMES):
        for name, value in itertools.islice(list(frame.f_locals.items()), _MAX_VALUES):
            if isinstance(name, str) and name.isidentifier():
                yield frame, name, value


def read(loss: torch.Tensor, frame: FrameType | None, name: str | None) -> Silenced:
    """What the user's code shows of the hand-set ``loss`` held by ``name`` in ``frame``: the statement
    that set its ``requires_grad`` by hand, and the cut in the statement that made it."""
    scope = Source().scope(frame) if frame is not None and name is not None else None
    if scope is None:
        return Silenced(name, None, None)
    path, function = frame.f_code.co_filename, frame.f_code.co_name
    lines = list(_statements(scope))
    hands = [(n, op) for n in lines for op in [_hand_op(n, name)] if op is not None]
    if not hands:
        return Silenced(name, None, None)
    before = [h for h in hands if h[0].lineno <= frame.f_lineno]
    node, op = (before or hands)[-1]
    hand = _site(op, path, node, function)
    if op == "rewrap":
        cut = _cut_in(node, path, function)
    else:
        made = [n for n in lines if isinstance(n, ast.Assign) and n.lineno < node.lineno
                and any(is_name(t, name) for t in n.targets)]
        cut = _cut_in(made[-1], path, function) if made else None
    return Silenced(name, hand, cut)


def _hand_op(statement: ast.stmt, name: str) -> str | None:
    """``attribute`` (``name.requires_grad = True``), ``method`` (``name.requires_grad_()``), ``rewrap``
    (``name = torch.tensor(..., requires_grad=True)``) or None."""
    if isinstance(statement, ast.Assign):
        if any(isinstance(t, ast.Attribute) and t.attr == "requires_grad" and is_name(t.value, name)
               for t in statement.targets) and _true(statement.value):
            return "attribute"
        call = statement.value
        if any(is_name(t, name) for t in statement.targets) and isinstance(call, ast.Call) \
                and _called(call) in _FACTORIES and _true(keyword(call, "requires_grad")):
            return "rewrap"
    value = statement.value if isinstance(statement, (ast.Expr, ast.Assign)) else None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "requires_grad_" \
            and is_name(value.func.value, name):
        given = [*value.args, *(k.value for k in value.keywords if k.arg == "requires_grad")]
        if not given or _true(given[0]):
            return "method"
    return None


def _true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _cut_in(statement: ast.stmt, path: str, function: str) -> Site | None:
    """The first op in ``statement`` that leaves autograd, as its text shows it."""
    for node in _walk(statement):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CUT_METHODS:
            return _site(_CUT_METHODS[node.func.attr], path, statement, function)
        if isinstance(node, ast.Compare) and type(node.ops[0]) in _COMPARISONS:
            return _site(f"a comparison (`{_COMPARISONS[type(node.ops[0])]}`)", path, statement, function)
    return None


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``node``, each after those it holds (the innermost call first)."""
    for child in ast.iter_child_nodes(node):
        yield from _walk(child)
    yield node


def _site(op: str, path: str, node: ast.stmt, function: str) -> Site:
    text = ast.get_source_segment("".join(linecache.getlines(path)), node) or ""
    return Site(op, path, node.lineno, function, text.strip())


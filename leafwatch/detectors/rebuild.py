"""The optimizer built after the last change to the model: its statement moved below the change, or built again
right after it, with the LR schedulers built on it.

A layer replaced or resized, a conversion, adapters added after ``optimizer = SGD(model.parameters(), ...)`` leave the
optimizer holding the old tensors and none of the new ones. ``add_param_group`` of the new ones keeps the old ones in
the optimizer (stepped for nothing; and ``add_param_group`` of a whole module that still holds tensors the optimizer
has raises ``ValueError: some parameters appear in more than one parameter group``); the fix a good engineer writes
builds the optimizer once the model is final. Read from the user's source when the finding is decided: the
optimizer's statement (``at``, a plain assignment of its variable) and the user's statement that made the change, in
the same scope (never inside a function where the optimizer's name is not bound). When the change stands in the
optimizer's own block and nothing between reads the optimizer but an LR scheduler built on it, the statements move
(the optimizer's, then the schedulers', right after the change; below the whole loop or block that holds the change
when the optimizer is not used in it: a loop that wraps layers in adapters); when it stands in a block nested in a
later statement that uses the optimizer (a loop over folds or stages that trains), the optimizer's statement and the
schedulers' are repeated right after the change, so they run as often as it does. The optimizer's statement must
read the variable the change assigns or changes (else running it again would rebuild the old model's optimizer).
Anything else (a ``load_state_dict`` of the optimizer before the change: a resumed run whose state must be kept) gets
no rebuild: the caller keeps ``add_param_group`` of the new tensors.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import os
import re
import textwrap
from collections.abc import Iterable, Sequence

from ..report.reasons import Span
from ..report.words import Edit
from ..observe.source import Source, holding
from .fixes import short_place, span_of

#: A call that builds an LR scheduler on an optimizer (torch's ``lr_scheduler.*``, ``OneCycleLR``, transformers'
#: ``get_linear_schedule_with_warmup``): read from the callee's name.
_SCHEDULER = re.compile(r"sched|LR$|lr_lambda", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Rebuilt:
    """The optimizer built after the change: its statement (and the schedulers' statements) as the user wrote them
    (``code``) and on one line (``shown``, for the words), where the change stands (``after``, ``file:line``), whether
    the statements move there (else they are repeated there), the names of the schedulers built again, and the edit."""

    code: str
    shown: str
    after: str
    moved: bool
    schedulers: tuple[str, ...]
    edit: Edit


def _bodies(node: ast.AST) -> Iterable[list[ast.stmt]]:
    """Every list of statements under ``node`` (a module's, a function's, a loop's, an ``if``'s, a handler's ...)."""
    for child in ast.walk(node):
        for field in ("body", "orelse", "finalbody"):
            value = getattr(child, field, None)
            if isinstance(value, list) and isinstance(child, (ast.stmt, ast.Module, ast.excepthandler)):
                yield value


def _holding(at: Span) -> tuple[list[ast.stmt], int] | None:
    """The block holding the statement ``at`` (that starts at its first line), and its index there."""
    tree = Source().tree(at.path)
    for body in _bodies(tree) if tree is not None else ():
        for i, s in enumerate(body):
            if s.lineno == at.start:
                return body, i
    return None


def _innermost(statement: ast.stmt, line: int) -> ast.stmt | None:
    """The innermost statement of ``statement`` (itself included) that holds ``line``, in the same scope; None when
    the line is in a function or a class it defines (where the optimizer's name may not be bound)."""
    held = holding(statement, line)  # (never in the functions and classes it defines)
    found = statement if held is None else held[0][held[1]]
    return None if any(isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for s in (statement, found)) \
        else found


def _root(node: ast.AST) -> str | None:
    """``model`` of ``model``, ``model.fc``, ``model[0].base``; None for anything else (a call's result, a literal)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _changed_roots(change: ast.stmt) -> set[str]:
    """The variables ``change`` assigns or changes: the roots of its targets (``model`` of ``model = ...``,
    ``model.fc = ...``, ``model[i] = ...``), or of a call statement's receiver and arguments (``model`` of
    ``model.load_state_dict(torch.load(path), assign=True)``, ``reshape_head(model, 3)``)."""
    if isinstance(change, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        nodes: list[ast.AST] = list(change.targets if isinstance(change, ast.Assign) else [change.target])
        nodes = [e for n in nodes for e in (n.elts if isinstance(n, (ast.Tuple, ast.List)) else [n])]
    elif isinstance(change, ast.Expr) and isinstance(change.value, ast.Call):
        call = change.value
        nodes = [*([call.func.value] if isinstance(call.func, ast.Attribute) else []), *call.args,
                 *(k.value for k in call.keywords)]
    else:
        return set()
    return {r for r in map(_root, nodes) if r is not None}


def _reads(statement: ast.stmt, variable: str) -> bool:
    return any(isinstance(n, (ast.Name, ast.Attribute)) and ast.unparse(n) == variable for n in ast.walk(statement))


def _scheduler(statement: ast.stmt, variable: str) -> str | None:
    """The variable of an LR scheduler ``statement`` builds on the optimizer ``variable`` (``scheduler`` of
    ``scheduler = StepLR(optimizer, ...)``), else None."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.value, ast.Call)):
        return None
    call = statement.value
    callee = ast.unparse(call.func).rpartition(".")[2]
    given = [*call.args, *(k.value for k in call.keywords)]
    if _SCHEDULER.search(callee) and any(ast.unparse(a) == variable for a in given):
        return ast.unparse(statement.targets[0])
    return None


def _lines(path: str, statement: ast.stmt) -> list[str]:
    return linecache.getlines(path)[statement.lineno - 1:statement.end_lineno or statement.lineno]


def rebuilt(at: Span | None, change: Span | None, variable: str | None) -> Rebuilt | None:
    """The optimizer ``variable``, built at ``at``, built again after the statement at ``change`` (see the module's
    docstring); None where that cannot be done truly."""
    if at is None or change is None or not variable or at.path != change.path or change.start <= at.end:
        return None
    held = _holding(at)
    if held is None:
        return None
    body, i = held
    built = body[i]
    if not (isinstance(built, ast.Assign) and any(ast.unparse(t) == variable for t in built.targets)):
        return None
    later = next((j for j in range(i + 1, len(body)) if body[j].lineno <= change.start <= (body[j].end_lineno or 0)),
                 None)
    if later is None:
        return None
    made = _innermost(body[later], change.start)
    reads = {n.id for n in ast.walk(built.value) if isinstance(n, ast.Name)}
    roots = _changed_roots(made) if made is not None else set()
    if made is None or made.lineno != change.start or not roots & reads:
        return None  # running the optimizer's statement again would not see the change
    stored = {n.id for s in body[i + 1:later + 1] for n in ast.walk(s) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Store)}
    if (stored - roots) & reads:
        return None  # a value it reads (`lr = ...`) is set again before the change: built later, it would differ
    if made is not body[later] and not _reads(body[later], variable):
        made = body[later]  # a loop (or block) that only changes the model: the optimizer goes below it, built once
    between = body[i + 1:later]
    schedulers = [s for s in between if _scheduler(s, variable)]
    loads = any(isinstance(n, ast.Call) and ast.unparse(n.func) == f"{variable}.load_state_dict"
                for n in ast.walk(body[later]))  # a resumed run
    if any(_reads(s, variable) for s in between if s not in schedulers) or _reads(made, variable) or loads:
        return None  # the optimizer is used before the change (its state loaded): keep it, add the new tensors
    return _placed(at.path, built, schedulers, made, made is body[later])


def _shown(path: str, built: ast.stmt, schedulers: Sequence[ast.stmt]) -> str:
    """The statements on one line, each as the user wrote it when it is one line (else as ``ast`` writes it)."""
    return "; ".join("".join(_lines(path, s)).strip() if s.lineno == s.end_lineno else ast.unparse(s)
                     for s in (built, *schedulers))


def _placed(path: str, built: ast.stmt, schedulers: Sequence[ast.stmt], made: ast.stmt, moved: bool) -> Rebuilt:
    """The optimizer's statement and its schedulers' moved right below ``made``, in their block (``moved``), or
    repeated right after it (at its indentation)."""
    statements, end = (built, *schedulers), made.end_lineno or made.lineno
    if moved:
        taken = {n for s in statements for n in range(s.lineno, (s.end_lineno or s.lineno) + 1)}
        lines = linecache.getlines(path)
        kept = [lines[n - 1] for n in range(built.lineno, end + 1) if n not in taken]
        text = "".join(line for s in statements for line in _lines(path, s))
        edit = Edit(os.path.abspath(path), built.lineno, end, "replace", "".join(kept) + text)
    else:
        text = "".join(textwrap.dedent("".join(_lines(path, s))) for s in statements)
        after = span_of(path, made)
        edit = after.edit("insert_after", textwrap.indent(text, after.indent))
    names = tuple(ast.unparse(s.targets[0]) for s in schedulers)  # type: ignore[attr-defined]
    return Rebuilt(text.strip("\n"), _shown(path, built, schedulers), f"{os.path.abspath(path)}:{made.lineno}", moved,
                   names, edit)


def after_change(at: Span | None, places: Sequence[str]) -> Span | None:
    """Of the user's statements that ran the change (``places``, ``file:line``, the innermost frame first: a
    module's ``__init__``'s ``setattr``, then ``model = Hetero(model)``), the first that stands after the
    optimizer's statement ``at`` in its scope: in its block, or in a block nested in a later statement of it
    (never in a function the block only calls). None when none does."""
    held = _holding(at) if at is not None else None
    if held is None:
        return None
    body, i = held
    for place in places:
        path, _, line = place.rpartition(":")
        if not line.isdigit() or os.path.abspath(path) != at.path:
            continue
        for later in body[i + 1:]:
            if later.lineno <= int(line) <= (later.end_lineno or later.lineno):
                found = _innermost(later, int(line))
                if found is not None:
                    return span_of(at.path, found)  # type: ignore[union-attr]
    return None


def after_last(spans: Sequence[Span | None], rebuilds: Sequence[Rebuilt | None]) -> Rebuilt | None:
    """The rebuild after the last of the changes that made the tensors of one mistake (each found), else None."""
    if not spans or not all(spans):
        return None
    last = max(range(len(spans)), key=lambda i: spans[i].end)  # type: ignore[union-attr]
    return rebuilds[last]


def words(built: Rebuilt, variable: str | None) -> str:
    """How the optimizer is built after the last change: its statement moved there, or repeated there."""
    which = f"`{variable}`" if variable else "the optimizer"
    place = short_place(built.after)
    them = "" if not built.schedulers else (
        f" and the LR scheduler{'s' if len(built.schedulers) > 1 else ''} built on it "
        f"({', '.join(f'`{s}`' for s in built.schedulers)})")
    how = (f"move its statement{' and the statement of' + them[4:] if them else ''} right below the change at {place}"
           if built.moved else f"build it{them} again right after the change at {place}, in that block")
    return (f"build {which} after the last change to the model, so that it holds the new parameters and none of "
            f"the old ones: {how}: `{built.shown}` (the same class, groups and settings)")

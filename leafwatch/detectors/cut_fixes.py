"""Cuts at a known line, as code: the user's statement without the op that cut the graph, read when the
finding is decided (never on a healthy step).

- a ``.detach()`` or ``.data`` the cut recorder located: the statement without it (``h = relu(fc(x)).detach()``
  -> ``h = relu(fc(x))``), unless what follows needs NumPy (``.detach().cpu().numpy()``: without the
  ``.detach()``, ``.numpy()`` would raise);
- a NumPy round trip (``torch.from_numpy(np.clip(h.detach().cpu().numpy(), 0, 6))``): the torch op that
  is the NumPy one, on the tensor itself (``torch.clamp(h, 0, 6)``, :data:`NUMPY_TWINS`); where torch has
  none, the NumPy op is named and the fix stays advice;
- a module run with grad off: the ``with torch.no_grad():`` block of its parent's class that calls it, its
  body moved out of the block, or the ``@torch.no_grad()`` decorator of the method that calls it, dropped.

Only a statement of one line edited at one place is rewritten; anything else is left to the words.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import linecache
import os
import textwrap
from typing import Any

from ..observe.source import Source
from ..report.words import Edit
from .fixes import innermost, is_code, rewritten, span_of

#: NumPy ops and the torch op that computes the same from the same arguments (``np.clip(a, lo, hi)`` is
#: ``torch.clamp(t, lo, hi)``); the keywords NumPy spells differently are renamed (``a_min`` -> ``min``).
NUMPY_TWINS = {"clip": "clamp", "exp": "exp", "log": "log", "log1p": "log1p", "expm1": "expm1", "tanh": "tanh",
               "abs": "abs", "absolute": "abs", "sqrt": "sqrt", "square": "square", "sin": "sin", "cos": "cos",
               "power": "pow", "negative": "neg", "reciprocal": "reciprocal"}
_KEYWORDS = {"a_min": "min", "a_max": "max"}
#: What makes a NumPy array of a tensor, or a number: a ``.detach()`` followed by one of them feeds NumPy.
_TO_NUMPY = ("numpy", "tolist", "item")
_TO_TORCH = {f"torch.{t}" for t in ("from_numpy", "tensor", "as_tensor", "Tensor", "FloatTensor")}
_GRAD_OFF = ("no_grad", "inference_mode")
#: The statements a cut stands in.
_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)


@dataclasses.dataclass(frozen=True)
class CutFix:
    """A cut's fix read from the user's line: the statement rewritten (``corrected``, placed by ``edit``);
    ``numpy``: the op feeds a NumPy round trip; ``twin``: the NumPy op and the torch op that replaced it;
    ``missing``: the NumPy op torch has no twin for (the fix stays words)."""

    corrected: str | None = None
    edit: Edit | None = None
    numpy: bool = False
    twin: tuple[str, str] | None = None
    missing: str | None = None
    #: A cut by grad mode off: ``"block"`` (the ``with`` block undone) or ``"decorator"`` (dropped from ``function``).
    how: str = ""
    function: str = ""


def _rewritten(path: str, statement: ast.stmt, node: ast.expr, text: str) -> CutFix | None:
    """``statement`` with ``node`` (on one line) spelled ``text``: its code and its edit."""
    found = rewritten(path, statement, node, text, _in_function)
    return None if found is None else CutFix(*found)


def _in_function(snippet: str) -> bool:
    """Whether ``snippet`` is code in a function's body (a forward's ``return ...`` included)."""
    return is_code(snippet) or is_code("def _():\n" + textwrap.indent(snippet, "    "))


def cut_fix(op: str, path: str, line: int) -> CutFix | None:
    """The fix of the cut ``op`` (``"`.detach()`"``, ``"`.data`"``) at ``path:line``; None when the line holds
    no single such op (or cannot be read: the fix is left to the words)."""
    try:
        tree = Source().tree(path)
        if tree is not None and op in ("`torch.no_grad()`", "`torch.inference_mode()`"):
            off = _grad_off_at(path, tree, line)
            return None if off is None else CutFix(off.corrected, off.edit, how=off.how, function=off.function)
        statement = innermost(tree, line, _SIMPLE) if tree is not None else None
        if statement is None:
            return None
        if op == "`.detach()`":
            found = [n for n in ast.walk(statement) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and n.func.attr == "detach" and not n.args and not n.keywords]
        elif op == "`.data`":
            found = [n for n in ast.walk(statement) if isinstance(n, ast.Attribute) and n.attr == "data"
                     and isinstance(n.ctx, ast.Load)]
        else:
            return None
        if len(found) != 1:
            return None
        node = found[0]
        receiver = node.func.value if isinstance(node, ast.Call) else node.value  # type: ignore[attr-defined]
        base = ast.get_source_segment("".join(linecache.getlines(path)), receiver)
        parents = {child: parent for parent in ast.walk(statement) for child in ast.iter_child_nodes(parent)}
        top = node
        while isinstance(parents.get(top), (ast.Attribute, ast.Call)) and not _is_numpy_call(parents[top], top) \
                and not (isinstance(top, ast.Attribute) and top.attr in _TO_NUMPY):
            top = parents[top]
        if isinstance(top, ast.Attribute) and top.attr in _TO_NUMPY or _is_numpy_call(parents.get(top), top):
            return _round_trip(path, statement, top, base, parents, tree)  # type: ignore[arg-type]
        return _rewritten(path, statement, node, base) if base else None
    except Exception:  # a source leafwatch cannot read as it expects
        return None


def _is_numpy_call(parent: ast.AST | None, child: ast.AST) -> bool:
    """Whether ``parent`` is a NumPy call (``np.clip(...)``, ``numpy.asarray(...)``) taking ``child`` as an argument."""
    return (isinstance(parent, ast.Call) and child in parent.args and isinstance(parent.func, ast.Attribute)
            and isinstance(parent.func.value, ast.Name) and parent.func.value.id in ("np", "numpy"))


def _round_trip(path: str, statement: ast.stmt, node: ast.AST, base: str | None,
                parents: dict[ast.AST, ast.AST], tree: ast.Module) -> CutFix:
    """A cut that feeds NumPy: the round trip ``torch.from_numpy(np.op(<tensor>...numpy(), ...))`` replaced by
    the torch op on the tensor itself, where torch has one and the statement holds the whole trip."""
    while node in parents and not _is_numpy_call(parents[node], node):
        node = parents[node]
        if node is statement:
            return _spread_trip(path, tree, statement, base) or CutFix(numpy=True)
        if not isinstance(node, (ast.Attribute, ast.Call)):
            return CutFix(numpy=True)
    call = parents.get(node)
    if not isinstance(call, ast.Call) or not _is_numpy_call(call, node) or call.args[0] is not node:
        return CutFix(numpy=True)
    name = call.func.attr  # type: ignore[union-attr]
    twin = NUMPY_TWINS.get(name)
    wrapper = parents.get(call)
    if twin is None:
        return CutFix(numpy=True, missing=name if name not in ("asarray", "array") else None)
    if not (isinstance(wrapper, ast.Call) and wrapper.args and wrapper.args[0] is call and ast.unparse(wrapper.func) in
            _TO_TORCH) or base is None or any(k.arg not in _KEYWORDS for k in call.keywords):
        return CutFix(numpy=True, missing=None, twin=(name, twin))
    found = _rewritten(path, statement, wrapper, f"torch.{twin}({_arguments(path, base, call)})")
    return dataclasses.replace(found or CutFix(), numpy=True, twin=(name, twin))


def _spread_trip(path: str, tree: ast.Module, statement: ast.stmt, base: str | None) -> CutFix | None:
    """A round trip over three statements of one block, as it is often written: ``a = t.detach().cpu().numpy()``,
    ``a = np.clip(a, lo, hi)``, ``t = torch.from_numpy(a)`` (names free, the arrays used nowhere else): the three
    replaced by ``t = torch.clamp(t, lo, hi)``. None when the statements are not those."""
    if base is None:
        return None
    body = next((b for n in ast.walk(tree) for b in (getattr(n, "body", None), getattr(n, "orelse", None))
                 if isinstance(b, list) and statement in b), [])
    i = body.index(statement) if statement in body else -1
    trip = body[i:i + 3] if i >= 0 else []
    names = [_assigned_name(s) for s in trip]
    if len(trip) != 3 or None in names:
        return None
    op, made = trip[1].value, trip[2].value  # type: ignore[attr-defined]
    if not (isinstance(op, ast.Call) and _is_numpy_call(op, op.args[0] if op.args else None)  # type: ignore[arg-type]
            and isinstance(op.args[0], ast.Name) and op.args[0].id == names[0]):
        return None
    if op.func.attr not in NUMPY_TWINS:  # type: ignore[attr-defined]
        return CutFix(numpy=True, missing=op.func.attr)  # type: ignore[attr-defined]
    if any(k.arg not in _KEYWORDS for k in op.keywords):
        return None
    made_call = made.func.value if isinstance(made, ast.Call) and isinstance(made.func, ast.Attribute) \
        and not made.args and isinstance(made.func.value, ast.Call) else made  # `torch.from_numpy(a).float()`
    if not (isinstance(made_call, ast.Call) and ast.unparse(made_call.func) in _TO_TORCH
            and len(made_call.args) == 1 and isinstance(made_call.args[0], ast.Name) and made_call.args[0].id == names[1]):
        return None
    later = [n.id for rest in body[i + 3:] for n in ast.walk(rest) if isinstance(n, ast.Name)]
    if any(name in later for name in names[:2] if name != names[2]):
        return None  # an array used further on: the trip stays, in words
    name, twin = op.func.attr, NUMPY_TWINS[op.func.attr]  # type: ignore[attr-defined]
    text = "".join(linecache.getlines(path))
    tail = ast.get_source_segment(text, made)[len(ast.get_source_segment(text, made_call) or ""):]  # type: ignore[index]
    snippet = f"{names[2]} = torch.{twin}({_arguments(path, base, op)}){tail}"
    if not is_code(snippet):
        return None
    at = span_of(path, statement)
    edit = Edit(at.path, at.start, trip[2].end_lineno or trip[2].lineno, "replace", f"{at.indent}{snippet}\n")
    return CutFix(snippet, edit, numpy=True, twin=(name, twin))


def _arguments(path: str, base: str, call: ast.Call) -> str:
    """The arguments of the NumPy ``call`` for its torch twin: ``base`` (the tensor) first, then the others as
    written, NumPy's keywords renamed (``a_min`` -> ``min``)."""
    text = "".join(linecache.getlines(path))
    rest = [ast.get_source_segment(text, a) or "" for a in call.args[1:]]
    rest += [f"{_KEYWORDS.get(k.arg, k.arg)}={ast.get_source_segment(text, k.value)}"  # type: ignore[arg-type]
             for k in call.keywords]
    return ", ".join([base, *rest])


def _assigned_name(statement: ast.stmt) -> str | None:
    """``a`` of ``a = ...`` (one target, a name)."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        return statement.targets[0].id
    return None


# -- a module run with grad off ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GradOff:
    """Where the user's code switches grad off around a module's call: ``how`` (``"block"``: a ``with
    torch.no_grad():``, ``"decorator"``: ``@torch.no_grad()`` on the method that calls it), its ``file:line``,
    and the code without it (``corrected``, placed by ``edit``)."""

    how: str
    place: str
    corrected: str
    edit: Edit
    function: str = ""


def grad_off(module_name: str, modules: dict[str, Any]) -> GradOff | None:
    """The one place of the class of the module above ``module_name`` (or above one of its ancestors) that calls
    it with grad off; None when there is none, or more than one (or a source cannot be read)."""
    try:
        parts = module_name.split(".") if module_name else []
        for depth in range(len(parts), 0, -1):
            parent, attr = ".".join(parts[:depth - 1]), parts[depth - 1]
            owner = modules.get(parent)
            if owner is None or not attr.isidentifier():
                continue
            found = _grad_off_calls(type(owner), attr)
            if found is not None:
                return found
        return None
    except Exception:  # a source leafwatch cannot read as it expects: the fix is left to the words
        return None


def _grad_off_calls(cls: type, attr: str) -> GradOff | None:
    try:
        path = inspect.getsourcefile(cls)
        _, first = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return None
    tree = Source().tree(path) if path else None
    if tree is None or cls.__module__.startswith("torch"):
        return None
    node = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == cls.__name__ and c.lineno >= first),
                None)
    places = []
    for func in (f for f in ast.walk(node) if isinstance(f, ast.FunctionDef)) if node is not None else ():
        if not any(_calls(n, attr) for n in ast.walk(func)):
            continue
        decorators = [d for d in func.decorator_list if _grad_off(d)]
        places += [(func, decorators[0])] if decorators else []
        places += [(w, None) for w in ast.walk(func) if isinstance(w, ast.With)
                   and any(_grad_off(i.context_expr) for i in w.items) and any(_calls(n, attr) for n in ast.walk(w))]
    if len(places) != 1:
        return None
    owner, decorator = places[0]
    if decorator is None:
        return _without_block(path, owner, attr)  # type: ignore[arg-type]
    return _without_decorator(path, owner, decorator)  # type: ignore[arg-type]


def _grad_off_at(path: str, tree: ast.Module, line: int) -> GradOff | None:
    """Grad mode off at ``line``: the innermost ``with torch.no_grad():`` block holding it, undone; else the one
    function of the file decorated with ``@torch.no_grad()`` that the statement at ``line`` calls, undecorated."""
    blocks = [w for w in ast.walk(tree) if isinstance(w, ast.With) and any(_grad_off(i.context_expr) for i in w.items)
              and w.lineno <= line <= (w.end_lineno or w.lineno)]
    if blocks:
        return _without_block(path, max(blocks, key=lambda w: w.lineno))
    statement = innermost(tree, line, _SIMPLE)
    called = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
              for n in ast.walk(statement) if isinstance(n, ast.Call)} if statement is not None else set()
    decorated = [(f, d) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in called
                 for d in f.decorator_list if _grad_off(d)]
    return _without_decorator(path, *decorated[0]) if len(decorated) == 1 else None


def _calls(node: ast.AST, attr: str) -> bool:
    """``self.<attr>(...)``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "self")


def _grad_off(node: ast.expr) -> bool:
    """``torch.no_grad()`` / ``torch.inference_mode()`` (called or not)."""
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target) in {f"torch.{n}" for n in _GRAD_OFF}


def _without_block(path: str, block: ast.With, attr: str | None = None) -> GradOff | None:
    """The ``with`` block's body in its place, one level out; where ``attr`` is given and one statement of a longer
    body calls ``self.<attr>``, that statement alone, the statements before and after it kept in the block (each
    part in a block of its own, in their order)."""
    if len(block.items) != 1 or block.items[0].optional_vars is not None or not block.body:
        return None
    lines = linecache.getlines(path)
    head = lines[block.lineno - 1]
    indent = head[:len(head) - len(head.lstrip())]
    ends = [b.lineno - 1 for b in block.body[1:]] + [block.end_lineno or block.lineno]
    parts = ["".join(lines[b.lineno - 1:end]) for b, end in zip(block.body, ends)]
    calling = [i for i, b in enumerate(block.body) if any(_calls(n, attr) for n in ast.walk(b))] if attr else []
    k = calling[0] if len(calling) == 1 and len(parts) > 1 else None
    body = "".join(parts) if k is None else parts[k]
    moved = textwrap.indent(textwrap.dedent(body), indent)
    snippet = textwrap.dedent(moved).strip()
    if not _in_function(snippet):
        return None
    if k is not None:
        moved = (head + "".join(parts[:k]) if k else "") + moved + (head + "".join(parts[k + 1:]) if parts[k + 1:] else "")
    edit = Edit(os.path.abspath(path), block.lineno, block.end_lineno or block.lineno, "replace", moved)
    return GradOff("block", f"{os.path.basename(path)}:{block.lineno}", snippet, edit)


def _without_decorator(path: str, func: ast.FunctionDef, decorator: ast.expr) -> GradOff | None:
    """The method's lines from the decorator to its ``def`` line, the decorator left out."""
    start = decorator.lineno
    if decorator.end_lineno != start or func.lineno <= start:
        return None
    kept = "".join(linecache.getlines(path)[start:func.lineno])
    copy = ast.parse(ast.unparse(func)).body[0]  # the method as code, without the decorator
    copy.decorator_list = [d for d in copy.decorator_list if not _grad_off(d)]  # type: ignore[attr-defined]
    snippet = ast.unparse(copy)
    edit = Edit(os.path.abspath(path), start, func.lineno, "replace", kept)
    return GradOff("decorator", f"{os.path.basename(path)}:{start}", snippet, edit, func.name)

"""What ``element 0 of tensors does not require grad and does not have a grad_fn`` shows beyond "no graph":
where the script lost it, in the forms users meet.

- :class:`FrozenPart`: every parameter frozen, and what the script meant to train: a module it tried to unfreeze
  with ``module.requires_grad = True`` (a plain attribute torch ignores), the part it gave the optimizer;
- :class:`GradOffFunction`: the loss computed through a function decorated with ``@torch.no_grad()`` (an
  evaluation helper used in the training step): the function, its decorator and the call;
- :class:`DetachedReturn`: a LightningModule's ``training_step`` that returns its loss ``.detach()``-ed (or a
  dict holding it): the ``.detach()`` and its line.

Each is read from the objects (the decorated function is torch's wrapper of the user's, the module's attribute is
in its ``__dict__``) and the source that made them. No words: the crash detector says.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import Any

import torch
from torch import nn

from . import frames
from .source import Source, Span, assigns, blocks, changed, holding, last_assignment, loops_around, on_line, reads


@dataclasses.dataclass(frozen=True)
class Unfrozen:
    """``module.requires_grad = True``: a plain attribute on the module (``module``: the user's code for it), the
    statement (``at``, as written, its span): its parameters keep ``requires_grad=False``."""

    module: str
    at: str | None
    statement: str | None
    span: Span | None


@dataclasses.dataclass(frozen=True)
class FrozenPart:
    """What a fully frozen script meant to train: the modules it tried to unfreeze by an attribute, the parts of a
    model the optimizer (``optimizer``, the user's variable) was given (``whole``: every parameter of the model), and
    the line after which an unfreeze goes (before the loop that runs the steps, or after the optimizer's statement)."""

    unfrozen: tuple[Unfrozen, ...]
    optimizer: str | None
    parts: tuple[str, ...]
    whole: bool
    after: Span | None


@dataclasses.dataclass(frozen=True)
class GradOffFunction:
    """The loss was computed through ``function`` (as the script calls it, at ``called_at``), decorated with
    ``decorator`` (as written, at ``at``) that turns grad mode off; ``span`` holds the decorator's lines to the
    first line of the definition, ``kept`` the same lines without the decorator, ``definition`` that first line."""

    function: str
    decorator: str
    at: str
    called_at: str
    span: Span
    kept: str
    definition: str


@dataclasses.dataclass(frozen=True)
class DetachedReturn:
    """``cls.method`` returns its loss ``.detach()``-ed: the statement (``at``, as written, its span), the same
    lines without that ``.detach()``, and the call as written (``loss.detach()``)."""

    cls: str
    method: str
    at: str
    statement: str
    span: Span
    fixed: str
    call: str


def code_path(owner: str, path: str) -> str:
    """``model.fc``, ``model.blocks[0]`` for the module ``path`` under the variable ``owner``."""
    out = owner
    for part in path.split(".") if path else ():
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out


# -- every parameter frozen -----------------------------------------------------------------------------------
def frozen_part(models: list[tuple[str | None, nn.Module]], optimizers: Iterable[tuple[str, torch.optim.Optimizer]],
                frames: list[FrameType], frame: FrameType | None, line: int | None, source: Source,
                resolve: Callable[[ast.expr, FrameType], Any]) -> FrozenPart | None:
    """What the script meant to train of ``models`` (named, every parameter frozen)."""
    unfrozen: list[Unfrozen] = []
    parts: list[str] = []
    optimizer_name, whole = None, False
    for owner, root in models:
        if owner is None:
            continue
        marked = [(code_path(owner, path), m) for path, m in itertools.islice(root.named_modules(), 10_000)
                  if vars(m).get("requires_grad") is True]
        unfrozen += [_unfrozen(code, module, frames, source, resolve) for code, module in marked]
        for name, optimizer in optimizers:
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            given = _covered(root, held)
            if given:
                optimizer_name, whole = name, given == [""]
                parts += [code_path(owner, path) for path in given]
    if not unfrozen and not parts:
        return None
    return FrozenPart(tuple(unfrozen), optimizer_name, tuple(dict.fromkeys(parts)), whole,
                      _unfreeze_at(frame, line, optimizer_name, source))


def _covered(root: nn.Module, held: set[int]) -> list[str]:
    """The largest modules of ``root`` whose parameters are all in ``held`` ("" for ``root`` itself), when
    ``held`` is made of ``root``'s parameters only."""
    mine = {id(p) for p in root.parameters()}
    if not held or not held <= mine:
        return []
    covered: list[str] = []
    for path, module in itertools.islice(root.named_modules(), 10_000):
        ids = {id(p) for p in module.parameters()}
        if ids and ids <= held and not any(path.startswith(c + ".") or c == "" for c in covered):
            covered.append(path)
    return covered


def _unfrozen(code: str, module: nn.Module, frames: list[FrameType], source: Source,
              resolve: Callable[[ast.expr, FrameType], Any]) -> Unfrozen:
    """Where the script set ``module.requires_grad = True``: a statement of the files of ``frames`` whose target's
    object, read in that frame, is ``module``."""
    for frame in frames:
        path = frame.f_code.co_filename
        tree = source.tree(path)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                    and node.targets[0].attr == "requires_grad" and resolve(node.targets[0].value, frame) is module:
                return Unfrozen(code, f"{path}:{node.lineno}", source.text(path, node), source.span(path, node))
    return Unfrozen(code, None, None, None)


def _unfreeze_at(frame: FrameType | None, line: int | None, optimizer: str | None, source: Source) -> Span | None:
    """The line an unfreeze goes after: the one before the outermost loop that runs ``line`` of ``frame``, else the
    optimizer's statement when it stands before ``line`` in the same block."""
    scope = source.scope(frame) if frame is not None else None
    if scope is None or line is None:
        return None
    path = frame.f_code.co_filename  # type: ignore[union-attr]
    loops = loops_around(scope, line)
    if loops and loops[0].lineno > 1:
        at = source.span(path, loops[0])
        return Span(at.path, loops[0].lineno - 1, loops[0].lineno - 1, at.indent)
    held = holding(scope, line)
    made = last_assignment(held[0], held[1], optimizer) if held is not None and optimizer else None
    if made is None:
        return None
    at = source.span(path, held[0][made])  # type: ignore[index]
    return Span(at.path, at.end, at.end, at.indent)


# -- a function decorated with no_grad --------------------------------------------------------------------------
def _grad_off(decorator: ast.expr, scope: Mapping[str, Any]) -> bool:
    """Whether a decorator turns grad mode off: ``torch.no_grad()`` (or bare), ``torch.inference_mode()``,
    ``torch.set_grad_enabled(False)``, however the module spells ``torch``."""
    call = decorator if isinstance(decorator, ast.Call) else None
    target = _attribute(call.func if call is not None else decorator, scope)
    args = [a.value for a in call.args if isinstance(a, ast.Constant)] if call is not None else []
    if target is torch.no_grad:
        return True
    if target is torch.inference_mode:
        return args in ([], [True])
    return target is torch.set_grad_enabled and args == [False]


def _attribute(node: ast.expr, scope: Mapping[str, Any]) -> Any:
    """The object a dotted name reads (``torch.no_grad``) in ``scope``, module attributes only."""
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _attribute(node.value, scope)
        return vars(owner).get(node.attr) if inspect.ismodule(owner) else None
    return None


def grad_off_function(frame: FrameType, line: int, root: torch.Tensor, source: Source,
                      resolve: Callable[[ast.expr, FrameType], Any]) -> GradOffFunction | None:
    """A function decorated to run with grad mode off, called by the statements that computed ``root`` (the
    failing statement of ``frame`` at ``line``, and those it reads from in its block)."""
    scope = source.scope(frame)
    held = holding(scope, line) if scope is not None else None
    if held is None:
        return None
    body, index = held
    path = frame.f_code.co_filename
    statements = on_line(body, index)
    wanted = set().union(*map(reads, statements))
    for k in range(index - 1, max(-1, index - 30), -1):
        if assigns(body[k]) & wanted:
            statements.append(body[k])
            wanted |= reads(body[k])
    for statement in statements:
        for call in (n for n in ast.walk(statement) if isinstance(n, ast.Call)):
            function = resolve(call.func, frame)
            found = _decorated(function, source) if inspect.isfunction(function) else None
            if found is not None:
                return GradOffFunction(source.text(path, call.func), found[0], found[1], f"{path}:{statement.lineno}",
                                       *found[2:])
    return None


def _decorated(function: Any, source: Source) -> tuple[str, str, Span, str, str] | None:
    """The decorator (as written, where) that turns grad mode off on ``function``: torch's wrapper of a function
    of the user's, whose definition has that decorator."""
    wrapped = inspect.getattr_static(function, "__wrapped__", None)
    code = getattr(wrapped, "__code__", None) if inspect.isfunction(wrapped) else None
    if code is None or not frames.is_users_file(code.co_filename):  # a library's function: no edit of its file
        return None
    path = code.co_filename
    definition = _definition(code, source)
    for decorator in definition.decorator_list if definition is not None else ():
        if _grad_off(decorator, wrapped.__globals__):  # type: ignore[union-attr]
            lines = source.lines(path)
            at = source.span(path, definition)
            span = Span(at.path, decorator.lineno, definition.lineno, at.indent)
            kept = "".join(lines[(decorator.end_lineno or decorator.lineno):definition.lineno])
            return ("@" + source.text(path, decorator), f"{path}:{decorator.lineno}", span, kept,
                    lines[definition.lineno - 1].strip())
    return None


# -- a training_step that returns its loss detached --------------------------------------------------------------
def detached_return(modules: Iterable[nn.Module], source: Source) -> DetachedReturn | None:
    """The ``.detach()`` of the loss a LightningModule's ``training_step`` returns (itself, or under ``"loss"`` of
    a dict), in the first such module of ``modules``."""
    for module in modules:
        if not any(c.__name__ == "LightningModule" for c in type(module).__mro__):
            continue
        method = inspect.getattr_static(type(module), "training_step", None)
        code = getattr(method, "__code__", None)
        if code is not None and not frames.is_users_file(code.co_filename):
            continue
        definition = _definition(code, source) if code is not None else None
        if definition is None:
            continue
        for node in (n for body in blocks(definition) for n in body if isinstance(n, ast.Return) and n.value):
            detach = _returned_detach(node.value, definition)  # type: ignore[arg-type]
            if detach is not None:
                statement, call = detach
                path = code.co_filename
                cut = (call.end_lineno, call.func.value.end_col_offset, call.end_col_offset, "")  # type: ignore[attr-defined]
                return DetachedReturn(type(module).__name__, "training_step", f"{path}:{statement.lineno}",
                                      source.text(path, statement), source.span(path, statement),
                                      changed(source.lines(path), statement, [cut]),  # type: ignore[list-item]
                                      source.text(path, call))
    return None


def _definition(code: Any, source: Source) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    tree = source.tree(code.co_filename)
    return next((f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and f.name == code.co_name and min([f.lineno, *(d.lineno for d in f.decorator_list)])
                 == code.co_firstlineno), None) if tree is not None else None


def _is_detach(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach" \
        and not node.args and not node.keywords and node.end_lineno == node.func.value.end_lineno


def _returned_detach(value: ast.expr, definition: ast.AST) -> tuple[ast.stmt, ast.Call] | None:
    """The statement and the ``.detach()`` call of the loss ``value`` returns: ``loss.detach()``, ``{"loss":
    loss.detach(), ...}``, or a name the function assigned that way."""
    loss = value
    if isinstance(value, ast.Dict):
        loss = next((v for k, v in zip(value.keys, value.values) if isinstance(k, ast.Constant) and k.value == "loss"),
                    None)  # type: ignore[assignment]
    statement = next((s for body in blocks(definition) for s in body
                      if s.lineno <= value.lineno <= (s.end_lineno or s.lineno)), None)
    if _is_detach(loss) and statement is not None:
        return statement, loss  # type: ignore[return-value]
    if isinstance(loss, ast.Name):
        made = [s for body in blocks(definition) for s in body if isinstance(s, ast.Assign) and loss.id in assigns(s)
                and s.lineno < value.lineno]
        if made and _is_detach(made[-1].value):
            return made[-1], made[-1].value  # type: ignore[return-value]
    return None

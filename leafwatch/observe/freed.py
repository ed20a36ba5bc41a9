"""What ``Trying to backward through the graph a second time`` shows beyond a non-leaf made once by hand: the
three ways users meet it, read from the failing backward's graph, the user's frames and their source.

- :class:`Carried`: a variable carried from one iteration to the next with its graph (a recurrent hidden state,
  ``out, h_state = rnn(x, h_state)``, never detached): the statement that carries it reads it, what it makes this
  iteration feeds the failing backward, so that backward goes back into the earlier iteration's freed graph;
- :class:`ComputedOnce`: a value computed once, before the loop (or in ``__init__``), from a parameter the user
  trains (``std = log_std.exp()``, ``self.prototypes = F.normalize(self.emb.weight)``): its graph was freed by
  the first backward;
- :class:`FreedByEarlier`: one output used by two losses in one iteration (a GAN's ``fake`` fed to D's loss, whose
  ``backward()`` freed ``fake``'s graph, then to G's loss).

Each is said only where both the objects (the graph the failing backward reached) and the source (the statement
that carries it, the earlier ``backward()`` between the two uses) show it. No words: ``detectors/freed.py`` says.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
from collections.abc import Iterable, Iterator, Mapping
from types import FrameType
from typing import Any

import torch
from torch import nn

from . import frames, graph
from .graphless import code_path
from .source import (Source, Span, assigned_in, assigns, backward_receiver, blocks, changed, holding, keyword, loops_around,
                     reads, rewritten)

#: Autograd nodes a walk of one variable's graph may visit.
_MAX_NODES = 5_000


@dataclasses.dataclass(frozen=True)
class Carried:
    """A variable (``h_state``, a tensor or a tuple of them) carried across iterations with its graph: the
    statement that carries it (``carried_at``, as written), whether it may be None at the loop's top, the
    script's own ``repackage_hidden`` when it has one, and the first statement of the loop (the fix goes above)."""

    name: str
    count: int | None
    carried_at: str
    statement: str
    maybe_none: bool
    helper: str | None
    top: Span | None


@dataclasses.dataclass(frozen=True)
class ComputedOnce:
    """A non-leaf computed once from the parameters ``sources`` (the user's names) and used at every step: a
    variable (``name``, its statement, the first statement of the loop that runs the steps: it is computed there
    too) or a module attribute made in ``__init__`` (``owner`` class, the attribute, ``self``'s name there, the
    right-hand side, the statement's span, the rest of ``__init__`` and its indentation, for a property that
    computes it)."""

    name: str
    sources: tuple[str, ...]
    made_at: str | None
    statement: str
    origin: graph.Origin | None
    top: Span | None = None
    owner: str | None = None
    attr: str | None = None
    me: str | None = None
    value: str | None = None
    at: Span | None = None
    rest: str = ""
    indent: str = ""


@dataclasses.dataclass(frozen=True)
class FreedByEarlier:
    """A tensor (``fake``) made in this iteration and used by two losses: the earlier one's ``backward()``
    (``earlier`` at ``earlier_at``) freed its graph. ``optimizers``: the optimizer that trains what made it and the
    one that trains the earlier loss's other parameters, when they differ (two networks: a GAN); ``detach``: the
    statements that feed it to the earlier loss, with ``.detach()`` added; ``retain``: the earlier ``backward()``
    with ``retain_graph=True``."""

    name: str
    made_at: str
    earlier: str
    earlier_at: str
    used_at: tuple[str, ...]
    optimizers: tuple[str, str] | None
    detach: tuple[Span, str] | None
    retain: tuple[Span, str] | None


def trainable_leaves(scopes: Any, modules: Iterable[tuple[str | None, nn.Module]]) -> dict[int, str]:
    """Tensor id -> the user's name of every tensor meant to train: the parameters of the user's modules
    (``model.emb.weight``), the leaves the user's variables hold that require grad, what an optimizer holds."""
    named: dict[int, str] = {}
    for frame, name, value in scopes.values():
        if isinstance(value, torch.Tensor) and value.is_leaf and value.requires_grad:
            named.setdefault(id(value), name)
    for owner, module in modules:
        for path, p in itertools.islice(module.named_parameters(), 100_000):
            named.setdefault(id(p), code_path(owner, path) if owner else path)
    for held in scopes.holders():
        named.setdefault(held, "")
    return named


def sources(t: torch.Tensor, trainable: Mapping[int, str]) -> tuple[str, ...] | None:
    """The user's names ("" where it has none) of the trainable leaves ``t`` is made from (the parameters among
    them included); None when the walk of its graph was cut."""
    leaves, complete = graph.leaves_of(t.grad_fn, limit=_MAX_NODES)
    if not complete:
        return None
    return tuple(dict.fromkeys(trainable.get(id(leaf), "") for leaf in leaves
                               if id(leaf) in trainable or isinstance(leaf, nn.Parameter)))


# -- a variable carried across iterations ------------------------------------------------------------------
def _tensors(value: Any) -> list[torch.Tensor]:
    if not frames.readable(value):
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and len(value) <= 16:
        return [t for v in value for t in _tensors(v)]
    return []


def _reached(value: Any, reached: Mapping[int, Any]) -> bool:
    return any(t.grad_fn is not None and id(t.grad_fn) in reached for t in _tensors(value))


def carried(frame: FrameType, source: Source, reached: Mapping[int, Any]) -> list[Carried]:
    """The variables of ``frame`` carried across the iterations of the loop that runs its current line: assigned
    in that loop by one statement only, which reads them, holding a graph (a non-leaf that requires grad), and
    what that statement made in this iteration (or the variable itself, when it has not run yet) is reached by
    the failing backward."""
    scope = source.scope(frame)
    loops = loops_around(scope, frame.f_lineno) if scope is not None else []
    if not loops:
        return []
    loop, path, local = loops[-1], frame.f_code.co_filename, frame.f_locals
    out = []
    for name, value in list(local.items())[:1000]:
        tensors = _tensors(value)
        if not tensors or not any(t.requires_grad and t.grad_fn is not None for t in tensors):
            continue
        statements = assigned_in(loop, name)
        if len(statements) != 1 or isinstance(statements[0], (ast.For, ast.AsyncFor)):
            continue
        statement = statements[0]
        if name not in reads(statement) or not any(_reached(local.get(t), reached) for t in assigns(statement)):
            continue
        before = [s for body in blocks(scope) for s in body if s.lineno < loop.lineno and name in assigns(s)]
        maybe_none = bool(before) and isinstance(getattr(before[-1], "value", None), ast.Constant) \
            and before[-1].value.value is None  # type: ignore[attr-defined]
        out.append(_carried(name, value, frame, f"{path}:{statement.lineno}", source.text(path, statement), maybe_none,
                            source.span(path, loop.body[0])))
    return out


def _carried(name: str, value: Any, frame: FrameType | None, carried_at: str, statement: str, maybe_none: bool,
             top: Span | None) -> Carried:
    """``name`` carried with ``value``: a tensor, or a tuple of them (which the script's ``repackage_hidden``, when
    ``frame``'s module has one, detaches)."""
    several = isinstance(value, (tuple, list))
    helper = several and frame is not None and callable(frame.f_globals.get("repackage_hidden"))
    return Carried(name, len(value) if several else None, carried_at, statement, maybe_none,
                   "repackage_hidden" if helper else None, top)


def carried_attributes(modules: Iterable[tuple[str | None, nn.Module]], frame: FrameType | None, source: Source,
                       reached: Mapping[int, Any]) -> list[Carried]:
    """The module attributes carried across calls with their graph (``out, self.hidden = self.lstm(x, self.hidden)``
    in ``forward``): one statement of the class assigns the attribute beside an output and reads it, and the
    attribute's graph meets the failing backward's; the fix goes at the top of ``frame``'s loop."""
    scope = source.scope(frame) if frame is not None else None
    loops = loops_around(scope, frame.f_lineno) if scope is not None else []  # type: ignore[union-attr]
    top = source.span(frame.f_code.co_filename, loops[-1].body[0]) if loops else None  # type: ignore[union-attr]
    out = []
    for name, module, attr, value in _attributes((owner, root) for owner, root in modules if owner):
        tensors = [t for t in _tensors(value) if t.grad_fn is not None]
        found = _carrying_statement(type(module), attr, source) if any(_meets(t, reached) for t in tensors) else None
        if found is not None:
            out.append(_carried(name, value, frame, *found, False, top))
    return out


def _attributes(modules: Iterable[tuple[str | None, nn.Module]]) -> Iterator[tuple[str, nn.Module, str, Any]]:
    """The plain attributes (not ``_private``) of the modules and their submodules, bounded: each with the user's
    name for it (``model.rnn.hidden``), its module and its value."""
    for owner, root in modules:
        for prefix, module in itertools.islice(root.named_modules(), 10_000):
            for attr, value in list(vars(module).items())[:200]:
                if not attr.startswith("_"):
                    yield ".".join(p for p in (owner, prefix, attr) if p), module, attr, value


def _meets(t: torch.Tensor, reached: Mapping[int, Any]) -> bool:
    return any(id(n) in reached for n in graph.iter_nodes(t.grad_fn, _MAX_NODES))


def _class_def(cls: type, source: Source) -> tuple[str, ast.ClassDef | None]:
    """The file and the definition of ``cls`` (a class of the user's code only: a library's file is never edited)."""
    if frames.library_class(cls) is not None:
        return "", None
    try:
        path, first = inspect.getsourcefile(cls), inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return "", None
    tree = source.tree(path) if path else None
    klass = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == cls.__name__
                  and min([c.lineno, *(d.lineno for d in c.decorator_list)]) == first), None) if tree else None
    return path or "", klass


def _carrying_statement(cls: type, attr: str, source: Source) -> tuple[str, str] | None:
    """``path:line`` and text of the statement of ``cls``'s methods that assigns ``self.attr`` beside another
    target and reads ``self.attr`` (a class of the user's code only)."""
    path, klass = _class_def(cls, source)
    for method in klass.body if klass is not None else ():
        if not isinstance(method, ast.FunctionDef) or method.name == "__init__" or not method.args.args:
            continue
        me = method.args.args[0].arg
        for statement in (s for body in blocks(method) for s in body):
            target = statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 else None
            elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else []
            mine = [e for e in elements if isinstance(e, ast.Attribute) and e.attr == attr
                    and isinstance(e.value, ast.Name) and e.value.id == me]
            if mine and len(elements) > 1 and any(
                    isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.value, ast.Name) and n.value.id == me
                    for n in ast.walk(statement.value)):
                return f"{path}:{statement.lineno}", source.text(path, statement)
    return None


# -- a value computed once from a parameter -----------------------------------------------------------------
def computed_once_variable(frame: FrameType, name: str, value: torch.Tensor, source: Source, names: tuple[str, ...],
                           made_at: str | None, where_line: int | None) -> ComputedOnce:
    """``name`` of ``frame``, made once from the trainable leaves ``names``, with the loop of the frame's current
    line that runs the steps (its value is computed at the top of it)."""
    path = frame.f_code.co_filename
    scope = source.scope(frame)
    line = int(made_at.rpartition(":")[2]) if made_at else None
    statement = next((s for body in blocks(scope) for s in body if s.lineno == line), None) if scope and line else None
    loops = loops_around(scope, where_line or frame.f_lineno) if scope is not None else []
    top = source.span(path, loops[-1].body[0]) if loops and statement is not None \
        and statement.lineno < loops[-1].lineno and isinstance(statement, ast.Assign) else None
    return ComputedOnce(name, tuple(n for n in names if n), made_at,
                        source.text(path, statement) if statement is not None else "", graph.origin(value), top)


def computed_once_attributes(modules: Iterable[tuple[str | None, nn.Module]], persistent: Any,
                             trainable: Mapping[int, str], source: Source) -> list[ComputedOnce]:
    """The module attributes (not registered) that hold a non-leaf made in ``__init__`` from trainable leaves and
    that the failing backward went through after an earlier one freed them."""
    out = []
    for name, module, attr, value in _attributes(modules):
        names = sources(value, trainable) if persistent(value) else None
        if names:
            out.append(_from_init(name, type(module), attr, tuple(n for n in names if n), value, source))
    return out


def _from_init(name: str, cls: type, attr: str, sources: tuple[str, ...], value: torch.Tensor,
               source: Source) -> ComputedOnce:
    """What a property computing ``cls``'s attribute needs: the assignment in ``__init__`` (when it is the only
    one, and reads nothing of ``__init__``'s own but ``self`` and the module's names)."""
    origin = graph.origin(value)
    path, klass = _class_def(cls, source)
    init = next((f for f in klass.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None) if klass else None
    if init is None or not init.args.args:
        return ComputedOnce(name, sources, None, "", origin, owner=cls.__name__, attr=attr)
    me = init.args.args[0].arg
    found = [s for body in blocks(init) for s in body if isinstance(s, ast.Assign) and len(s.targets) == 1
             and ast.unparse(s.targets[0]) == f"{me}.{attr}"]
    if len(found) != 1 or found[0] not in init.body:
        return ComputedOnce(name, sources, None, "", origin, owner=cls.__name__, attr=attr)
    statement = found[0]
    own = {a.arg for a in (*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs)}
    own |= {n for s in init.body for n in assigns(s)} | {a.arg for a in (init.args.vararg, init.args.kwarg) if a}
    own -= {me}
    lines = source.lines(path)
    readable = not (reads(statement.value) & own)
    return ComputedOnce(name, sources, f"{path}:{statement.lineno}", source.text(path, statement), origin,
                        owner=cls.__name__, attr=attr, me=me, value=source.text(path, statement.value) if readable else None,
                        at=source.span(path, statement), rest="".join(lines[(statement.end_lineno or 0):init.end_lineno]),
                        indent=source.span(path, init).indent)


# -- one output, two losses ----------------------------------------------------------------------------------
def freed_by_earlier(frame: FrameType, line: int, source: Source, reached: Mapping[int, Any], made_before: Any,
                     optimizers: Mapping[int, tuple[str, torch.optim.Optimizer]]) -> list[FreedByEarlier]:
    """The variables of ``frame`` made in the block of its current ``line`` and freed by a ``backward()`` of
    that block between their statement and ``line``: of a loss that used them (its graph reaches theirs)."""
    scope = source.scope(frame)
    held = holding(scope, line) if scope is not None else None
    if held is None:
        return []
    body, index = held
    path, local = frame.f_code.co_filename, frame.f_locals
    out = []
    for i in range(index):
        loss = backward_receiver(body[i])
        earlier = local.get(loss) if loss else None
        call = body[i].value if loss else None  # type: ignore[attr-defined]
        if not isinstance(earlier, torch.Tensor) or earlier.grad_fn is None or keyword(call, "retain_graph") is not None:
            continue
        own = {id(n) for n in graph.iter_nodes(earlier.grad_fn, _MAX_NODES)}
        for j in range(i):
            for name in sorted(assigns(body[j])):
                value = local.get(name)
                if not isinstance(value, torch.Tensor) or value.grad_fn is None or id(value.grad_fn) not in own \
                        or id(value.grad_fn) not in reached or not made_before(value) \
                        or any(name in assigns(s) for s in body[j + 1:index]):
                    continue
                out.append(_freed_by(name, value, earlier, loss, body, j, i, path, source, optimizers))  # type: ignore[arg-type]
    return out


def _feeding(body: list[ast.stmt], made: int, until: int, name: str, loss: str) -> list[ast.stmt]:
    """The statements between ``made`` and ``until`` that read ``name`` and whose targets the statement that
    assigned ``loss`` reads (through the statements between)."""
    wanted, out = {loss}, []
    for k in range(until - 1, made, -1):
        statement = body[k]
        if assigns(statement) & wanted:
            wanted |= reads(statement)
            if name in reads(statement):
                out.append(statement)
    return sorted(out, key=lambda s: s.lineno)


def _freed_by(name: str, value: torch.Tensor, earlier: torch.Tensor, loss: str, body: list[ast.stmt], made: int,
              backward: int, path: str, source: Source,
              optimizers: Mapping[int, tuple[str, torch.optim.Optimizer]]) -> FreedByEarlier:
    uses = _feeding(body, made, backward, name, loss)
    mine, _ = graph.leaves_of(value.grad_fn, _MAX_NODES)
    theirs, _ = graph.leaves_of(earlier.grad_fn, _MAX_NODES)
    others = [t for t in theirs if all(t is not m for m in mine)]
    holder = next((optimizers[id(t)] for t in mine if id(t) in optimizers), None)
    trainer = next((optimizers[id(t)] for t in others if id(t) in optimizers), None)
    two = (holder[0], trainer[0]) if holder and trainer and holder[1] is not trainer[1] \
        and not any(id(t) in {id(p) for g in trainer[1].param_groups for p in g["params"]} for t in mine) else None
    detach = rewritten(source, path, uses, lambda n: isinstance(n, ast.Name) and n.id == name
                        and isinstance(n.ctx, ast.Load), ".detach()") if uses else None
    call = body[backward].value  # type: ignore[attr-defined]
    column = call.end_col_offset - 1
    at = (call.end_lineno, column, column, ", retain_graph=True" if call.args or call.keywords else "retain_graph=True")
    retain = (source.span(path, body[backward]), changed(source.lines(path), body[backward], [at]))
    return FreedByEarlier(name, f"{path}:{body[made].lineno}", loss, f"{path}:{body[backward].lineno}",
                          tuple(f"{path}:{s.lineno}" for s in uses), two, detach, retain)

"""What a crash shows of a leaf mistake: the exception torch raised, read from its traceback.

Most users meet leafwatch's bug class as an exception. :func:`read` recognises four of torch's by their
type and message (:func:`recognise`) and reads, from the frames the exception passed through and the
objects they hold, the plain facts that explain it: the tensor and the user's name for it, the op that
made it a non-leaf, the statement that assigned it, the modules of the user's frames and what their
parameters require, what an open Monitor's tracer saw of the last forward. No words: the crash detector
(``detectors/crashes.py``) decides and says.

Nothing here runs unless an exception reached a door (the excepthook of
:mod:`leafwatch.observe.excepthook`, ``leafwatch run``, the Lightning callback). Every walk is bounded
(frames, variables, autograd nodes, modules); the objects read are handed to the detector and dropped
with the observation, so nothing of the user's outlives the door's call. No user code runs: variables
and attributes are read with ``vars()`` and a module's registered dicts, never with ``getattr``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import linecache
import os
import re
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from types import FrameType
from typing import Any

import torch
from torch import nn

from . import frames, graph
from .cuts import CutSite
from .inventory import Inventory

#: torch raised ``can't optimize a non-leaf Tensor`` (an optimizer was handed a non-leaf).
OPTIMIZED_NON_LEAF = "optimized_non_leaf"
#: torch raised ``Trying to backward through the graph a second time``.
GRAPH_FREED = "graph_freed"
#: torch raised ``element 0 of tensors does not require grad and does not have a grad_fn``.
NO_GRAPH = "no_graph"
#: torch raised ``a leaf Variable that requires grad is being used in an in-place operation``.
LEAF_IN_PLACE = "leaf_in_place"

_ERRORS = (
    (ValueError, re.compile(r"can't optimize a non-leaf Tensor"), OPTIMIZED_NON_LEAF),
    (RuntimeError, re.compile(r"Trying to backward through the graph a second time"), GRAPH_FREED),
    (RuntimeError, re.compile(r"element (\d+) of tensors does not require grad and does not have a grad_fn"), NO_GRAPH),
    (RuntimeError, re.compile(r"a leaf Variable that requires grad is being used in an in-place operation"),
     LEAF_IN_PLACE),
)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_MAX_FRAMES = 30
_MAX_VALUES = 1000
_MAX_MODULES = 64
#: Autograd nodes a walk of one persistent tensor's own graph may visit.
_MAX_OWN_NODES = 2_000
#: How torch.nn.init spells the initialisers of the in-place methods (the same arguments, in order).
INITIALISERS = {"normal_": "normal_", "uniform_": "uniform_", "zero_": "zeros_", "fill_": "constant_"}


@dataclasses.dataclass(frozen=True)
class Context:
    """What a door knows beyond the traceback: the modules it watches (by the user's names where it
    knows them: Lightning's ``self``) and an open Monitor's tracer (what its hooks saw of the last forward)."""

    modules: tuple[nn.Module, ...] = ()
    names: Mapping[int, str] = dataclasses.field(default_factory=dict)
    tracer: Any = None


@dataclasses.dataclass(frozen=True)
class NonLeaf:
    """A non-leaf tensor a crash involves, as the user reaches it: the variable (``w``) or the module's
    variable (``owner``: ``model``, ``self``) and the attribute path under it (``body.scale``)."""

    path: str
    owner: str | None
    origin: graph.Origin | None
    #: The user's name for the leaf that gets its gradient instead (None: a temporary nothing holds).
    leaf_name: str | None
    #: ``path:line`` of the statement that assigned the variable (a plain variable only).
    assigned_at: str | None = None
    #: The module that holds it as a plain attribute, and the attribute (a fix registers it there).
    module: nn.Module | None = None
    attr: str | None = None


@dataclasses.dataclass(frozen=True)
class OptimizedNonLeaf:
    """``can't optimize a non-leaf Tensor``: the user's line that built the optimizer, its class, the tensor."""

    place: str
    optimizer: str
    tensor: NonLeaf


@dataclasses.dataclass(frozen=True)
class FreedGraph:
    """``backward through the graph a second time``: the tensors that persist across steps (module
    attributes, the user's variables) whose graph an earlier backward freed, reached by this backward."""

    place: str
    tensors: tuple[NonLeaf, ...]


@dataclasses.dataclass(frozen=True)
class Model:
    """A module of the user's frames: the user's name for it and how many of its parameters require grad."""

    name: str | None
    cls: str
    parameters: int
    trainable: int


@dataclasses.dataclass(frozen=True)
class NoGraph:
    """``element 0 of tensors does not require grad``: the tensor backward was called on (the user's name
    for it), whether it is an inference tensor, the models of the user's frames, and what a Monitor's tracer
    saw of the last forward: the modules that ran only with grad mode off, the cuts it recorded."""

    place: str
    loss: str | None
    inference: bool
    models: tuple[Model, ...]
    grad_off: tuple[tuple[str | None, str], ...] = ()
    cuts: tuple[CutSite, ...] = ()


@dataclasses.dataclass(frozen=True)
class InPlaceOnLeaf:
    """``a leaf Variable that requires grad is being used in an in-place operation``: the receiver on the
    failing line of the user's frame, the in-place method called on it (None for ``w += ...`` or
    ``w[0] = ...``) and its positional arguments as written, the statement, and how the user's module
    spells ``torch`` and ``torch.nn``."""

    place: str
    receiver: str
    is_parameter: bool
    method: str | None
    arguments: tuple[str, ...]
    keywords: bool
    statement: str
    #: The statement is that very call (``w.normal_()``), so a call of torch.nn.init can replace it.
    whole: bool
    torch_name: str | None
    nn_name: str | None


Crash = OptimizedNonLeaf | FreedGraph | NoGraph | InPlaceOnLeaf


def recognise(error: BaseException) -> tuple[str, re.Match[str]] | None:
    """Which of the recognised torch errors ``error`` is (and its message's match), else None."""
    text = str(error) if isinstance(error, (ValueError, RuntimeError)) else ""
    for kind, pattern, name in _ERRORS:
        found = pattern.search(text) if isinstance(error, kind) else None
        if found is not None:
            return name, found
    return None


def read(error: BaseException, contexts: Iterable[Context] = ()) -> Crash | None:
    """What the traceback of ``error`` shows of the leaf mistake behind it; None for any other
    exception, or when what explains it is not there (no user frame, no tensor to name)."""
    recognised = recognise(error)
    if recognised is None:
        return None
    where = frames.in_traceback(error.__traceback__)
    user = [(f, line) for f, line in reversed(where) if frames.is_users(f)][:_MAX_FRAMES]
    # Where the exception was caught (a framework's loop), the user's frames above it: `trainer.fit(...)`.
    above = [(f, f.f_lineno) for f in itertools.islice(frames.user_frames(depth=2), _MAX_FRAMES)]
    scopes = Scopes([f for f, _ in (*user, *above)])
    first = (user or above or [None])[0]
    place = f"{first[0].f_code.co_filename}:{first[1]}" if first is not None else None
    name, found = recognised
    contexts = list(contexts)
    if name == OPTIMIZED_NON_LEAF:
        return _optimized(where, user, scopes, place)
    if name == GRAPH_FREED:
        return _freed(where, scopes, contexts, place)
    if name == NO_GRAPH:
        return _no_graph(where, scopes, contexts, place, int(found.group(1)))
    return _in_place(user, scopes) if user else None


# -- the user's variables -------------------------------------------------------------------------------
class Scopes:
    """The variables of the user's frames, innermost first: each frame's locals, the attributes of its
    ``self``, its module's globals (the readable values, bounded), read once."""

    def __init__(self, user_frames: Iterable[FrameType]) -> None:
        self.frames: list[FrameType] = []
        self.scopes: list[tuple[FrameType, str, dict[str, Any]]] = []
        seen: set[int] = set()
        for frame in user_frames:
            if id(frame) in seen:
                continue
            seen.add(id(frame))
            self.frames.append(frame)
            local = frame.f_locals
            self.scopes.append((frame, "", _readable(local)))
            owner = local.get("self")
            if owner is not None and frames.readable(owner) and hasattr(owner, "__dict__"):
                self.scopes.append((frame, "self.", _readable(vars(owner))))
            if frame.f_globals is not local:
                self.scopes.append((frame, "", _readable(frame.f_globals)))

    def values(self) -> Iterator[tuple[FrameType, str, Any]]:
        for frame, prefix, scope in self.scopes:
            for key, value in scope.items():
                yield frame, prefix + key, value

    def name_of(self, obj: Any) -> tuple[str, FrameType] | None:
        """The user's variable for ``obj`` (``w``, ``self.scale``) and the frame that holds it."""
        return next(((name, frame) for frame, name, value in self.values() if value is obj), None)

    def modules(self, contexts: Iterable[Context] = ()) -> list[tuple[str | None, nn.Module]]:
        """The top modules of the user's frames and of the doors' contexts (none held by another one),
        each with the user's name for it (None where none is known)."""
        named: dict[int, tuple[str | None, nn.Module]] = {}
        for _, name, value in self.values():
            if isinstance(value, nn.Module):
                named.setdefault(id(value), (name, value))
        for context in contexts:
            for module in context.modules:
                if isinstance(module, nn.Module) and named.get(id(module), (None,))[0] is None:
                    named[id(module)] = (context.names.get(id(module)), module)
        below: set[int] = set()
        for _, module in named.values():
            below.update(id(m) for m in itertools.islice(module.modules(), 1, 100_000))
        return [(name, m) for name, m in named.values() if id(m) not in below][:_MAX_MODULES]


def _readable(scope: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in itertools.islice(scope.items(), _MAX_VALUES)
            if isinstance(key, str) and key.isidentifier() and not key.startswith("_") and frames.readable(value)}


def _statements(node: ast.AST) -> Iterator[ast.stmt]:
    """The statements under ``node`` in order, not those of the functions and classes it defines."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            yield child
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            yield from _statements(child)


def _tree(path: str) -> ast.Module | None:
    try:
        return ast.parse("".join(linecache.getlines(path)))
    except (SyntaxError, ValueError):
        return None


def assigned_at(frame: FrameType, line: int | None, variable: str) -> str | None:
    """``path:line`` of the last statement before ``line`` that assigned ``variable`` in the scope of
    ``frame`` (its function, or its module for a global; None for ``line``: any line), None when not found."""
    path, code = frame.f_code.co_filename, frame.f_code
    tree = _tree(path)
    if tree is None:
        return None
    node: ast.AST | None = tree
    if variable in frame.f_locals and code.co_name != "<module>":
        node = next((f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and min([f.lineno, *(d.lineno for d in f.decorator_list)]) == code.co_firstlineno), None)
    elif code.co_name != "<module>":
        line = None  # a global read inside a function: the module assigned it before the call
    found = [n for n in _statements(node) if isinstance(n, ast.Assign) and (line is None or n.lineno <= line)
             and any(isinstance(t, ast.Name) and t.id == variable for t in n.targets)] if node is not None else []
    return f"{path}:{found[-1].lineno}" if found else None


def _statement_at(path: str, line: int) -> ast.stmt | None:
    """The innermost statement of the file at ``line``."""
    tree = _tree(path)
    around = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)
              and n.lineno <= line <= (n.end_lineno or n.lineno)] if tree is not None else []
    return min(around, key=lambda n: (n.end_lineno or n.lineno) - n.lineno, default=None)


# -- the tensors torch was working on -------------------------------------------------------------------
def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value[:256] if isinstance(t, torch.Tensor)]
    return []


def backward_roots(where: list[tuple[FrameType, int]]) -> list[torch.Tensor]:
    """The tensors the failing ``backward()`` / ``torch.autograd.grad`` was called on, read from torch's
    innermost frame that holds them (the engine's ``t_outputs``, ``backward``'s ``tensors``, ``Tensor.backward``'s
    ``self``)."""
    for frame, _ in reversed(where):
        code = frame.f_code
        if not code.co_filename.startswith(_TORCH_DIR):
            continue
        local = frame.f_locals
        for key in ("t_outputs", "tensors", "outputs"):
            found = _tensors(local.get(key))
            if found:
                return found
        if code.co_name == "backward" and isinstance(local.get("self"), torch.Tensor):
            return [local["self"]]
    return []


def _leaf_name(t: torch.Tensor, scopes: Scopes) -> str | None:
    leaves, _ = graph.leaves_of(t.grad_fn, limit=256)
    found = scopes.name_of(leaves[0]) if leaves else None
    return found[0] if found is not None else None


def _optimized(where: list[tuple[FrameType, int]], user: list[tuple[FrameType, int]], scopes: Scopes,
               place: str | None) -> OptimizedNonLeaf | None:
    for frame, _ in reversed(where):
        if frame.f_code.co_name != "add_param_group" or not frame.f_code.co_filename.startswith(_TORCH_DIR):
            continue
        local = frame.f_locals
        group = local.get("param_group")
        candidates = [local.get("param"), *(_tensors(group.get("params")) if isinstance(group, dict) else [])]
        tensor = next((t for t in candidates if isinstance(t, torch.Tensor) and not t.is_leaf and not t.retains_grad),
                      None)
        if tensor is None or place is None:
            return None
        found = scopes.name_of(tensor)
        name, holder = found if found is not None else (None, None)
        line = next((line for f, line in user if f is holder), None)
        at = assigned_at(holder, line, name) if holder is not None and name is not None and name.isidentifier() else None
        owner = local.get("self")
        return OptimizedNonLeaf(place, type(owner).__name__ if owner is not None else "the optimizer",
                                NonLeaf(name or "", None, graph.origin(tensor), _leaf_name(tensor, scopes), at))
    return None


# -- a graph freed by an earlier backward -----------------------------------------------------------------
def _saved(node: Any) -> tuple[bool, bool]:
    """Whether an autograd node's saved tensors were freed by a backward, and whether it holds some still."""
    freed = holds = False
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except RuntimeError:  # "Trying to backward through the graph a second time ..."
            freed = True
            continue
        except Exception:
            continue
        holds = holds or isinstance(value, torch.Tensor) or (
            isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value))
    return freed, holds


def made_before_a_backward(t: torch.Tensor) -> bool:
    """Whether the graph that made ``t`` was freed by an earlier backward: a node of it lost its saved
    tensors, and none still holds any (a graph made since would: an RNN state made this step from
    the last one's)."""
    freed = False
    for node in graph.iter_nodes(t.grad_fn, _MAX_OWN_NODES):
        lost, holds = _saved(node)
        if holds:
            return False
        freed = freed or lost
    return freed


def _persistent(t: Any, reached: Mapping[int, Any], roots: list[torch.Tensor]) -> bool:
    return (isinstance(t, torch.Tensor) and not t.is_leaf and t.requires_grad and id(t.grad_fn) in reached
            and not any(t is root for root in roots) and made_before_a_backward(t))


def _assigned(node: ast.AST, matches: Any) -> bool:
    """Whether a statement under ``node`` assigns a target that ``matches``."""
    for n in ast.walk(node):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(
            n, (ast.AugAssign, ast.AnnAssign, ast.For)) else []
        if any(matches(t) for target in targets for t in ast.walk(target)):
            return True
    return False


def assigned_in_a_loop(path: str, variable: str) -> bool:
    """Whether the file assigns ``variable`` inside a loop anywhere (a value made again at each step,
    such as a hidden state carried over: ``h = rnn(x, h)``), or cannot be read."""
    tree = _tree(path)
    if tree is None:
        return True
    return any(_assigned(loop, lambda t: isinstance(t, ast.Name) and t.id == variable)
               for loop in ast.walk(tree) if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)))


def assigned_once(cls: type, attr: str) -> bool:
    """Whether the class (or one of its bases outside torch) assigns ``.attr`` in ``__init__`` only, outside
    any loop: an attribute made once, not at each call (``self.h = ...`` in ``forward``)."""
    found = False
    for klass in cls.__mro__:
        if klass.__module__.startswith(("torch", "builtins")):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        matches = lambda t: isinstance(t, ast.Attribute) and t.attr == attr  # noqa: E731
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and _assigned(function, matches):
                if function.name != "__init__" or any(_assigned(loop, matches) for loop in ast.walk(function)
                                                       if isinstance(loop, (ast.For, ast.AsyncFor, ast.While))):
                    return False
                found = True
    return found


def _freed(where: list[tuple[FrameType, int]], scopes: Scopes, contexts: list[Context],
           place: str | None) -> FreedGraph | None:
    roots = backward_roots(where)
    if not roots or place is None:
        return None
    reached: dict[int, Any] = {}  # the nodes themselves: an id is only known while its node lives
    seen: set[int] = set()
    for root in roots:
        if root.grad_fn is not None:
            reached.update((id(n), n) for n in graph.iter_nodes(root.grad_fn, graph.MAX_NODES, seen))
    found: dict[int, NonLeaf] = {}
    modules = scopes.modules(contexts)
    parameters: set[int] = set()
    for owner, module in modules:
        inventory = Inventory(module)
        parameters.update(inventory.tensors)
        for orphan in inventory.orphans():
            t = orphan.tensor
            if id(t) in found or orphan.container != "attribute" or not _persistent(t, reached, roots):
                continue
            module_name, _, attr = orphan.name.rpartition(".")
            holder = inventory.modules.get(module_name)
            if holder is not None and assigned_once(type(holder), attr):
                found[id(t)] = NonLeaf(orphan.name, owner, graph.origin(t), _leaf_name(t, scopes), module=holder,
                                       attr=attr)
    for frame, name, value in scopes.values():
        if id(value) in found or "." in name or not _persistent(value, reached, roots) \
                or assigned_in_a_loop(frame.f_code.co_filename, name):
            continue
        leaves, complete = graph.leaves_of(value.grad_fn, limit=_MAX_OWN_NODES)
        if not complete or any(isinstance(leaf, nn.Parameter) or id(leaf) in parameters for leaf in leaves):
            continue  # made from the model's parameters: an output or a state carried across steps
        line = next((line for f, line in where if f is frame), None)
        found[id(value)] = NonLeaf(name, None, graph.origin(value), _leaf_name(value, scopes),
                                   assigned_at(frame, line, name))
    return FreedGraph(place, tuple(found.values())) if found else None


# -- a backward of a tensor without a graph ----------------------------------------------------------------
def _models(modules: list[tuple[str | None, nn.Module]]) -> tuple[Model, ...]:
    out = []
    for name, module in modules:
        params = list(itertools.islice(module.parameters(), 100_000))
        if params:
            out.append(Model(name, type(module).__name__, len(params), sum(p.requires_grad for p in params)))
    return tuple(out)


def _what_the_tracer_saw(contexts: list[Context], names: Mapping[int, str | None]
                         ) -> tuple[tuple[tuple[str | None, str], ...], tuple[CutSite, ...]]:
    """The modules an open Monitor's hooks saw run only with grad mode off since its last check (the top
    ones, each under the user's name for its root when it has one root), and the cuts its recorder saw."""
    off: list[tuple[str | None, str]] = []
    sites: list[CutSite] = []
    for context in contexts:
        tracer = context.tracer
        if tracer is None:
            continue
        owner = names.get(id(context.modules[0])) if len(context.modules) == 1 else None
        ran = {name for name, record in tracer.records.items() if record.calls and not record.grad_enabled}
        off += [(owner, name) for name in sorted(ran)
                if not any(name.startswith(other + ".") or (other == "" and name) for other in ran if other != name)]
        sites += [cut.site for cut in tracer.cuts]
    return tuple(off), tuple(dict.fromkeys(sites))


def _no_graph(where: list[tuple[FrameType, int]], scopes: Scopes, contexts: list[Context], place: str | None,
              index: int) -> NoGraph | None:
    roots = backward_roots(where)
    if index >= len(roots) or place is None:
        return None
    root = roots[index]
    if root.grad_fn is not None or root.requires_grad:
        return None
    found = scopes.name_of(root)
    modules = scopes.modules(contexts)
    off, sites = _what_the_tracer_saw(contexts, {id(m): name for name, m in modules})
    return NoGraph(place, found[0] if found is not None else None, root.is_inference(), _models(modules), off, sites)


# -- an in-place op on a leaf that requires grad -----------------------------------------------------------
_MISSING = object()


def _resolve(node: ast.expr, frame: FrameType) -> Any:
    """The object an expression of the user's line names (``w``, ``self.w``, ``model.fc.weight``,
    ``params[0]``), read without running code of the user's; ``_MISSING`` for anything else."""
    if isinstance(node, ast.Name):
        for scope in (frame.f_locals, frame.f_globals):
            if node.id in scope:
                return scope[node.id]
        return _MISSING
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, frame)
        if owner is _MISSING or not frames.readable(owner):
            return _MISSING
        if isinstance(owner, nn.Module):
            for registered in (owner._parameters, owner._buffers, owner._modules):
                if node.attr in registered:
                    return registered[node.attr]
        return getattr(owner, "__dict__", {}).get(node.attr, _MISSING)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        owner = _resolve(node.value, frame)
        if isinstance(owner, (list, tuple, dict, nn.ModuleList, nn.ParameterList, nn.Sequential, nn.ModuleDict,
                              nn.ParameterDict)):
            try:
                return owner[node.slice.value]
            except (IndexError, KeyError, TypeError):
                return _MISSING
    return _MISSING


def _receivers(statement: ast.stmt) -> Iterator[tuple[ast.expr, ast.Call | None]]:
    """The expressions a statement changes in place: the receiver of each ``x.method_(...)`` call, the
    target of ``x += ...``, the container of ``x[i] = ...``."""
    if isinstance(statement, ast.AugAssign):
        yield statement.target, None
    targets = statement.targets if isinstance(statement, ast.Assign) else \
        [statement.target] if isinstance(statement, (ast.AugAssign, ast.AnnAssign)) else []
    for target in targets:
        if isinstance(target, ast.Subscript):
            yield target.value, None
    for node in ast.walk(statement):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr.endswith("_") and not node.func.attr.startswith("_"):
            yield node.func.value, node


def _spelling(scope: Mapping[str, Any], target: Any) -> str | None:
    return next((key for key, value in itertools.islice(scope.items(), 2_000) if value is target
                 and isinstance(key, str) and not key.startswith("_")), None)


def _in_place(user: list[tuple[FrameType, int]], scopes: Scopes) -> InPlaceOnLeaf | None:
    frame, line = user[0]
    path = frame.f_code.co_filename
    statement = _statement_at(path, line)
    if statement is None:
        return None
    for receiver, call in _receivers(statement):
        t = _resolve(receiver, frame)
        if not (isinstance(t, torch.Tensor) and t.is_leaf and t.requires_grad):
            continue
        whole = isinstance(statement, ast.Expr) and statement.value is call
        written = ast.get_source_segment("".join(linecache.getlines(path)), statement) or ast.unparse(statement)
        nn_name = _spelling(frame.f_globals, nn)
        torch_name = _spelling(frame.f_globals, torch)
        return InPlaceOnLeaf(
            f"{path}:{line}", ast.unparse(receiver), isinstance(t, nn.Parameter),
            call.func.attr if call is not None else None,  # type: ignore[union-attr]
            tuple(ast.unparse(a) for a in call.args) if call is not None else (),
            bool(call.keywords) if call is not None else False, written, whole, torch_name,
            nn_name if nn_name is not None else f"{torch_name}.nn" if torch_name is not None else None)
    return None

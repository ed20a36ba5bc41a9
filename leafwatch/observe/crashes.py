"""What a crash shows of a leaf mistake: the exception torch raised, read from its traceback.

Most users meet leafwatch's bug class as an exception. :func:`read` recognises six of torch's by their
type and message (:func:`recognise`: the table ``_ERRORS`` at the end, each with its reader) and reads, from the frames the exception passed through and the
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
import os
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import FrameType
from typing import Any

import torch
from torch import nn

from . import exhausted, frames, freed, graph, graphless, source, stepped, unhooked
from .cuts import CutSite
from .inventory import Inventory

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
class Traceback:
    """What every reader of a recognised error starts from: its message's match, the frames of its
    traceback (outermost first), the user's frames among them (innermost first), their variables, the doors'
    contexts, the user's line (``path:line``) and the source read once."""

    found: re.Match[str]
    where: list[tuple[FrameType, int]]
    user: list[tuple[FrameType, int]]
    scopes: Scopes
    contexts: list[Context]
    place: str | None
    source: source.Source

    def torch_frames(self, function: str | None = None) -> Iterator[FrameType]:
        """torch's frames of the traceback, innermost first (those that run ``function`` only, when given)."""
        return (f for f, _ in reversed(self.where) if f.f_code.co_filename.startswith(_TORCH_DIR)
                and function in (None, f.f_code.co_name))


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
    """``can't optimize a non-leaf Tensor``: the user's line that built the optimizer, its class, and every
    non-leaf it was handed (torch refuses the first; the others would be refused next)."""

    place: str
    optimizer: str
    tensors: tuple[NonLeaf, ...]


@dataclasses.dataclass(frozen=True)
class FreedGraph:
    """``backward through the graph a second time``: the tensors that persist across steps (module
    attributes, the user's variables) whose graph an earlier backward freed, reached by this backward."""

    place: str
    tensors: tuple[NonLeaf, ...]
    carried: tuple[freed.Carried, ...] = ()
    once: tuple[freed.ComputedOnce, ...] = ()
    earlier: tuple[freed.FreedByEarlier, ...] = ()


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
    frozen: graphless.FrozenPart | None = None
    function: graphless.GradOffFunction | None = None
    detached: graphless.DetachedReturn | None = None


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
    #: The other statements of the same function (or block) that change a leaf in place, ``(path:line, as written)``.
    others: tuple[tuple[str, str], ...] = ()
    #: The function that runs them when it returns nothing (an init routine), and where its definition starts.
    routine: str | None = None
    decorate: source.Span | None = None
    #: The statements from the first to the last, adjacent in one block, and the same lines under ``torch.no_grad()``.
    guarded: tuple[source.Span, str] | None = None


Crash = (OptimizedNonLeaf | FreedGraph | NoGraph | InPlaceOnLeaf | stepped.SteppedBeforeBackward
         | exhausted.ExhaustedIterator)


def recognise(error: BaseException) -> tuple[Callable[[Traceback], Crash | None], re.Match[str]] | None:
    """Which of the recognised torch errors ``error`` is: its reader (below) and its message's match, else None."""
    text = str(error) if isinstance(error, (ValueError, RuntimeError)) else ""
    for kind, pattern, reader in _ERRORS:
        found = pattern.search(text) if isinstance(error, kind) else None
        if found is not None:
            return reader, found
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
    first = (user or above or [None])[0]
    place = f"{first[0].f_code.co_filename}:{first[1]}" if first is not None else None
    reader, found = recognised
    return reader(Traceback(found, where, user, Scopes([f for f, _ in (*user, *above)]), list(contexts),
                            place, source.Source()))


# -- the user's variables -------------------------------------------------------------------------------
class Scopes:
    """The variables of the user's frames, innermost first: each frame's locals, the attributes of its
    ``self``, its module's globals (the readable values, bounded), read once."""

    def __init__(self, user_frames: Iterable[FrameType]) -> None:
        self.frames: list[FrameType] = list(dict.fromkeys(user_frames))  # (a frame both raised and caught: once)
        self.scopes: list[tuple[FrameType, str, dict[str, Any]]] = []
        for frame in self.frames:
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

    def _named(self, kind: type) -> dict[int, tuple[str | None, Any]]:
        """Object id -> the innermost variable for it and the object, for each ``kind`` the user's variables hold."""
        found: dict[int, tuple[str | None, Any]] = {}
        for _, name, value in self.values():
            if isinstance(value, kind):
                found.setdefault(id(value), (name, value))
        return found

    def optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        """The optimizers the user's variables hold, each with the innermost variable for it."""
        return list(self._named(torch.optim.Optimizer).values())  # type: ignore[arg-type]

    def holders(self) -> dict[int, tuple[str, torch.optim.Optimizer]]:
        """Tensor id -> the optimizer of :meth:`optimizers` that holds it (the first), with its variable."""
        held: dict[int, tuple[str, torch.optim.Optimizer]] = {}
        for name, optimizer in self.optimizers():
            for group in optimizer.param_groups:
                for p in group["params"][:100_000]:
                    held.setdefault(id(p), (name, optimizer))
        return held

    def modules(self, contexts: Iterable[Context] = ()) -> list[tuple[str | None, nn.Module]]:
        """The top modules of the user's frames and of the doors' contexts (none held by another one),
        each with the user's name for it (None where none is known)."""
        named = self._named(nn.Module)
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


def assigned_at(frame: FrameType, line: int | None, variable: str, read_source: source.Source) -> str | None:
    """``path:line`` of the last statement before ``line`` that assigned ``variable`` in the scope of
    ``frame`` (its function, or its module for a global; None for ``line``: any line), None when not found."""
    path = frame.f_code.co_filename
    if variable not in frame.f_locals and frame.f_code.co_name != "<module>":
        line = None  # a global read inside a function: the module assigned it before the call
    node = read_source.scope(frame) if variable in frame.f_locals else read_source.tree(path)
    found = [n for n in _statements(node) if isinstance(n, ast.Assign) and (line is None or n.lineno <= line)
             and any(isinstance(t, ast.Name) and t.id == variable for t in n.targets)] if node is not None else []
    return f"{path}:{found[-1].lineno}" if found else None


def _statement_at(path: str, line: int, read_source: source.Source) -> ast.stmt | None:
    """The innermost statement of the file at ``line``."""
    tree = read_source.tree(path)
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


def backward_roots(tb: Traceback) -> list[torch.Tensor]:
    """The tensors the failing ``backward()`` / ``torch.autograd.grad`` was called on, read from torch's
    innermost frame that holds them (the engine's ``t_outputs``, ``backward``'s ``tensors``, ``Tensor.backward``'s
    ``self``)."""
    for frame in tb.torch_frames():
        local = frame.f_locals
        for key in ("t_outputs", "tensors", "outputs"):
            found = _tensors(local.get(key))
            if found:
                return found
        if frame.f_code.co_name == "backward" and isinstance(local.get("self"), torch.Tensor):
            return [local["self"]]
    return []


def _leaf_name(t: torch.Tensor, scopes: Scopes) -> str | None:
    leaves, _ = graph.leaves_of(t.grad_fn, limit=256)
    found = scopes.name_of(leaves[0]) if leaves else None
    return found[0] if found is not None else None


def _optimized(tb: Traceback) -> OptimizedNonLeaf | None:
    frame = next(tb.torch_frames("add_param_group"), None)
    local = frame.f_locals if frame is not None else {}
    group = local.get("param_group")
    candidates = [local.get("param"), *(_tensors(group.get("params")) if isinstance(group, dict) else [])]
    tensors = list({id(t): t for t in candidates if isinstance(t, torch.Tensor) and not t.is_leaf
                    and not t.retains_grad}.values())
    if not tensors or tb.place is None:
        return None
    owner = local.get("self")
    return OptimizedNonLeaf(tb.place, type(owner).__name__ if owner is not None else "the optimizer",
                            tuple(_non_leaf(t, tb) for t in tensors))


def _non_leaf(tensor: torch.Tensor, tb: Traceback) -> NonLeaf:
    """A non-leaf handed to an optimizer: the user's variable for it and the statement that assigned it."""
    found = tb.scopes.name_of(tensor)
    name, holder = found if found is not None else (None, None)
    line = next((line for f, line in tb.user if f is holder), None)
    at = assigned_at(holder, line, name, tb.source) if holder is not None and name is not None and name.isidentifier() \
        else None
    return NonLeaf(name or "", None, graph.origin(tensor), _leaf_name(tensor, tb.scopes), at)


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


def _assigned(node: ast.AST, matches: Any) -> bool:
    """Whether a statement under ``node`` assigns a target that ``matches``."""
    for n in ast.walk(node):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(
            n, (ast.AugAssign, ast.AnnAssign, ast.For)) else []
        if any(matches(t) for target in targets for t in ast.walk(target)):
            return True
    return False


def _assigned_in_a_loop(node: ast.AST, matches: Any) -> bool:
    """Whether a loop under ``node`` assigns a target that ``matches``."""
    return any(_assigned(loop, matches) for loop in ast.walk(node)
               if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)))


def assigned_in_a_loop(path: str, variable: str, read_source: source.Source) -> bool:
    """Whether the file assigns ``variable`` inside a loop anywhere (a value made again at each step,
    such as a hidden state carried over: ``h = rnn(x, h)``), or cannot be read."""
    tree = read_source.tree(path)
    return tree is None or _assigned_in_a_loop(tree, lambda t: isinstance(t, ast.Name) and t.id == variable)


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
                if function.name != "__init__" or _assigned_in_a_loop(function, matches):
                    return False
                found = True
    return found


def _reached(roots: list[torch.Tensor]) -> dict[int, Any]:
    """The autograd nodes a backward from ``roots`` reaches, by id (the nodes themselves: an id is only known
    while its node lives)."""
    reached: dict[int, Any] = {}
    seen: set[int] = set()
    for root in roots:
        if root.grad_fn is not None:
            reached.update((id(n), n) for n in graph.iter_nodes(root.grad_fn, graph.MAX_NODES, seen))
    return reached


def _made_once_attributes(modules: list[tuple[str | None, nn.Module]], persistent: Callable[[Any], bool],
                          scopes: Scopes) -> dict[int, NonLeaf]:
    """The non-leaf module attributes made once in ``__init__`` (not from the model's parameters) that the
    failing backward went through after an earlier one freed them."""
    found: dict[int, NonLeaf] = {}
    for owner, module in modules:
        inventory = Inventory(module)
        for orphan in inventory.orphans():
            t = orphan.tensor
            if id(t) in found or orphan.container != "attribute" or not persistent(t):
                continue
            module_name, _, attr = orphan.name.rpartition(".")
            holder = inventory.modules.get(module_name)
            if holder is not None and assigned_once(type(holder), attr):
                found[id(t)] = NonLeaf(orphan.name, owner, graph.origin(t), _leaf_name(t, scopes), module=holder,
                                       attr=attr)
    return found


def _freed(tb: Traceback) -> FreedGraph | None:
    roots = backward_roots(tb)
    if not roots or tb.place is None:
        return None
    reached, scopes, user = _reached(roots), tb.scopes, tb.user

    def persistent(t: Any) -> bool:
        return (isinstance(t, torch.Tensor) and not t.is_leaf and t.requires_grad and id(t.grad_fn) in reached
                and not any(t is root for root in roots) and made_before_a_backward(t))

    modules = scopes.modules(tb.contexts)
    trainable = freed.trainable_leaves(scopes, modules)
    earlier = {e.name: e for e in (freed.freed_by_earlier(user[0][0], user[0][1], tb.source, reached,
                                                          made_before_a_backward, scopes.holders()) if user else [])}
    found = _made_once_attributes(modules, persistent, scopes)
    once = freed.computed_once_attributes(modules, persistent, trainable, tb.source)
    for frame, name, value in scopes.values():
        if id(value) in found or "." in name or name in earlier or not persistent(value) \
                or assigned_in_a_loop(frame.f_code.co_filename, name, tb.source) or any(c.name == name for c in once):
            continue
        names = freed.sources(value, trainable)
        if names is None:
            continue
        line = next((line for f, line in tb.where if f is frame), None)
        made_at = assigned_at(frame, line, name, tb.source)
        if names:  # made from a parameter the user trains: computed once, freed by the first backward
            once.append(freed.computed_once_variable(frame, name, value, tb.source, names, made_at, line))
        else:
            found[id(value)] = NonLeaf(name, None, graph.origin(value), _leaf_name(value, scopes), made_at)
    carried = {c.name: c for f, _ in user[:4] for c in freed.carried(f, tb.source, reached)}
    carried.update((c.name, c) for c in freed.carried_attributes(modules, user[0][0] if user else None, tb.source,
                                                                 reached))
    if not (found or carried or once or earlier):
        return None
    return FreedGraph(tb.place, tuple(found.values()), tuple(carried.values()), tuple(once), tuple(earlier.values()))


# -- an optimizer step between a forward and its backward ----------------------------------------------------
def _stepped(tb: Traceback) -> stepped.SteppedBeforeBackward | None:
    roots = backward_roots(tb)
    if len(roots) != 1 or roots[0].grad_fn is None or not tb.user:
        return None
    leaves, _ = graph.leaves_of(roots[0].grad_fn, limit=graph.MAX_NODES)
    changed = stepped.modified(tb.found.string, roots, leaves)
    if not changed:
        return None

    def module_of(tensors: list[torch.Tensor]) -> str | None:
        ids = {id(t) for t in tensors}
        return next((name for name, m in tb.scopes.modules() if name and ids & {id(p) for p in m.parameters()}), None)

    frame, line = tb.user[0]
    return stepped.read(frame, line, roots[0], changed, tb.source, tb.scopes.holders(), module_of)


# -- an optimizer handed an iterator used up already ---------------------------------------------------------
def _emptied(tb: Traceback) -> exhausted.ExhaustedIterator | None:
    frame = next((f for f in tb.torch_frames("__init__") if isinstance(f.f_locals.get("self"), torch.optim.Optimizer)),
                 None)
    handed = frame.f_locals.get("params") if frame is not None else None
    found = tb.scopes.name_of(handed) if exhausted.is_iterator(handed) else None
    line = next((line for f, line in tb.user if found is not None and f is found[1]), None)
    if frame is None or found is None or line is None or not found[0].isidentifier():
        return None
    return exhausted.read(frame.f_locals["self"], handed, found[1], line, found[0], tb.source)


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


def _no_graph(tb: Traceback) -> NoGraph | None:
    roots, index = backward_roots(tb), int(tb.found.group(1))
    if index >= len(roots) or tb.place is None:
        return None
    root = roots[index]
    if root.grad_fn is not None or root.requires_grad:
        return None
    found = tb.scopes.name_of(root)
    modules = tb.scopes.modules(tb.contexts)
    off, sites = _what_the_tracer_saw(tb.contexts, {id(m): name for name, m in modules})
    models = _models(modules)
    frame, line = tb.user[0] if tb.user else (None, None)
    frozen = graphless.frozen_part([(n, m) for n, m in modules if any(True for _ in m.parameters())],
                                   tb.scopes.optimizers(), tb.scopes.frames, frame, line, tb.source, unhooked.resolve) \
        if models and not any(m.trainable for m in models) else None
    function = graphless.grad_off_function(frame, line, root, tb.source, unhooked.resolve) if frame is not None else None
    detached = graphless.detached_return([m for _, m in modules], tb.source) if function is None else None
    return NoGraph(tb.place, found[0] if found is not None else None, root.is_inference(), models, off, sites, frozen,
                   function, detached)


# -- an in-place op on a leaf that requires grad -----------------------------------------------------------
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


def _changes_a_leaf(statement: ast.stmt, frame: FrameType) -> tuple[ast.expr, ast.Call | None, torch.Tensor] | None:
    """The receiver (and the in-place call) of ``statement`` that is a leaf requiring grad, read in ``frame``."""
    for receiver, call in _receivers(statement):
        t = unhooked.resolve(receiver, frame)
        if isinstance(t, torch.Tensor) and t.is_leaf and t.requires_grad:
            return receiver, call, t
    return None


def _in_place(tb: Traceback) -> InPlaceOnLeaf | None:
    if not tb.user:
        return None
    (frame, line), read_source = tb.user[0], tb.source
    path = frame.f_code.co_filename
    statement = _statement_at(path, line, read_source)
    found = _changes_a_leaf(statement, frame) if statement is not None else None
    if found is None:
        return None
    receiver, call, t = found
    whole = isinstance(statement, ast.Expr) and statement.value is call
    nn_name, torch_name = _spelling(frame.f_globals, nn), _spelling(frame.f_globals, torch)
    return InPlaceOnLeaf(
        f"{path}:{line}", ast.unparse(receiver), isinstance(t, nn.Parameter),
        call.func.attr if call is not None else None,  # type: ignore[union-attr]
        tuple(ast.unparse(a) for a in call.args) if call is not None else (),
        bool(call.keywords) if call is not None else False, read_source.text(path, statement), whole, torch_name,
        nn_name if nn_name is not None else f"{torch_name}.nn" if torch_name is not None else None,
        **_routine(frame, statement, torch_name, read_source))  # type: ignore[arg-type]


def _routine(frame: FrameType, failing: ast.stmt, torch_name: str | None, read_source: source.Source) -> dict[str, Any]:
    """The other statements of the function (or, at a module's level, of the block) that changes a leaf in
    place on ``failing``, and the fix for all of them: the function under ``@torch.no_grad()`` when it returns
    nothing (an init routine), else the statements, when adjacent, under one ``with torch.no_grad():``."""
    path, scope = frame.f_code.co_filename, read_source.scope(frame)
    held = source.holding(scope, failing.lineno) if scope is not None else None
    if held is None:
        return {}
    function = isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef))
    statements = [s for body in source.blocks(scope) for s in body] if function else held[0]  # type: ignore[arg-type]
    changing = sorted((s for s in statements if s.lineno == failing.lineno or not hasattr(s, "body")
                       and _changes_a_leaf(s, frame) is not None), key=lambda s: s.lineno)
    others = tuple((f"{path}:{s.lineno}", read_source.text(path, s)) for s in changing if s.lineno != failing.lineno)
    if not others:
        return {}
    out: dict[str, Any] = {"others": others}
    if function and source.is_routine(scope) and torch_name is not None:  # type: ignore[arg-type]
        first = min([scope.lineno, *(d.lineno for d in scope.decorator_list)])  # type: ignore[union-attr]
        at = read_source.span(path, scope)  # type: ignore[arg-type]
        out.update(routine=scope.name, decorate=source.Span(at.path, first, first, at.indent))  # type: ignore[union-attr]
        return out
    body = held[0]
    index = [body.index(s) for s in changing if s in body]
    if torch_name is not None and len(index) == len(changing) and index == list(range(index[0], index[-1] + 1)):
        at = read_source.span(path, body[index[0]])
        lines = read_source.lines(path)[at.start - 1:body[index[-1]].end_lineno]
        text = f"{at.indent}with {torch_name}.no_grad():\n" + "".join(f"    {line}" if line.strip() else line for line in lines)
        out["guarded"] = (source.Span(at.path, at.start, body[index[-1]].end_lineno or at.start, at.indent), text)
    return out


#: The torch errors of the leaf class, recognised by their type and message, each with its reader.
_ERRORS = (
    (ValueError, re.compile(r"can't optimize a non-leaf Tensor"), _optimized),
    (RuntimeError, re.compile(r"Trying to backward through the graph a second time"), _freed),
    (RuntimeError, re.compile(r"element (\d+) of tensors does not require grad and does not have a grad_fn"),
     _no_graph),
    (RuntimeError, re.compile(r"a leaf Variable that requires grad is being used in an in-place operation"), _in_place),
    (RuntimeError, re.compile(r"one of the variables needed for gradient computation has been modified by an inplace "
                              r"operation"), _stepped),
    (ValueError, re.compile(r"optimizer got an empty parameter list"), _emptied),
)

"""What a training step runs, discovered as it runs, for every front-end (:class:`Discovery`).

- A global module forward pre-hook sees the modules that run; the *roots* among them (modules that
  are neither a submodule of another one that ran, nor kept in one of its plain lists, dicts or
  attributes) give the qualified names: with one root no prefix, with several a prefix from the
  class name. Once the roots are stable the hook is removed; it comes back for a few steps when
  an optimizer steps with parameters that no known module owns.
- A root is judged when an optimizer (stepping or held by the script) holds one of its tensors,
  or when gradients reach it although no optimizer holds any of its tensors (the gradient rule:
  a forgotten optimizer, or a fixed network that still requires grad). A root that gets no
  gradient and that no optimizer holds (an EMA copy, a teacher, a target network) is not judged.
- The frames of user code at an optimizer step (:func:`user_frames`) give the modules that own
  unknown parameters, the optimizers the script holds, and whether the loop runs at the
  script's module level. A module found there that the hook, armed, never saw run is
  :attr:`Discovery.unhooked` (:mod:`leafwatch.observe.unhooked`): used without a call the hooks see
  when its own tensors got gradients (``called_directly``), else never run.
- What the user's variables hold is read without running code of theirs: an object whose class
  overrides ``__getattribute__`` (torch's deprecated ``torch.distributed.reduce_op``, which warns
  at each read) is passed over (:func:`leafwatch.observe.frames.readable`), properties are never
  evaluated (``vars()``, not ``getattr``), and the walk of :func:`paths_to` stays out of module
  objects (a library's namespace is no path to the user's modules).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from . import follow, frames, graph, inventory
from .unhooked import Unhooked
from ..options import LeafwatchInternalWarning

#: Optimizer steps the roots must stay unchanged before the global module hooks are removed.
STABLE_STEPS = 2
#: The first this many optimizer steps read the script's module-level variables (and each step
#: that gives an optimizer new parameters).
SCRIPT_SCANS = 3
_MAX_FRAMES = 30
_MAX_LOCALS = 1000
_MAX_GLOBALS = 2_000
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def user_frames() -> Iterator[Any]:
    """The frames of user code of the caller's stack, innermost first, at most :data:`_MAX_FRAMES`:
    :func:`leafwatch.observe.frames.user_frames` passing over leafwatch's and torch's own frames only
    (a framework's frame, such as a Trainer's, may hold the script's objects)."""
    return itertools.islice(frames.user_frames(frameworks=False, skip=(_TORCH_DIR,), depth=2), _MAX_FRAMES)


def _frame_values(frame: Any) -> list[Any]:
    """A frame's local values and, for a method, the attributes of ``self``: the readable ones
    (:func:`leafwatch.observe.frames.readable`)."""
    values = list(frame.f_locals.values())
    owner = frame.f_locals.get("self")
    if frames.readable(owner):
        with contextlib.suppress(TypeError):  # no `self`, or one without attributes
            values.extend(vars(owner).values())
    return [value for value in values[:_MAX_LOCALS] if frames.readable(value)]


def _script_scope() -> dict[str, Any]:
    """The module-level variables of the script (``__main__``), at most :data:`_MAX_GLOBALS`, the
    readable ones (:func:`leafwatch.observe.frames.readable`)."""
    scope = getattr(sys.modules.get("__main__"), "__dict__", None)
    if not isinstance(scope, dict):
        return {}
    return {key: value for key, value in list(scope.items())[:_MAX_GLOBALS] if frames.readable(value)}


def remember(seen: dict[int, weakref.ReferenceType], module: nn.Module) -> None:
    """Keep ``module`` in ``seen`` (id -> weak reference) until it is freed."""
    key = id(module)
    with contextlib.suppress(TypeError):  # a module class that refuses weak references
        seen[key] = weakref.ref(module, lambda _, key=key: seen.pop(key, None))


def optimizer_ids(optimizers: Iterable[torch.optim.Optimizer]) -> set[int]:
    """The ids of every tensor the optimizers hold."""
    return {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}


def _tops(modules: list[nn.Module]) -> list[nn.Module]:
    """The modules of ``modules`` that no other one of them holds (registered or in a container)."""
    below: set[int] = set()
    for module in modules:
        if id(module) not in below:
            below.update(id(m) for m in _contained_modules(module))
    return [m for m in modules if id(m) not in below]


def _contained_modules(module: nn.Module) -> list[nn.Module]:
    """Every module below ``module``: registered submodules and modules kept in plain containers
    (the walk :func:`leafwatch.observe.inventory.contained` does for orphans)."""
    out: list[nn.Module] = []
    seen: set[int] = {id(module)}
    stack = [module]
    while stack:
        current = stack.pop()
        below: list[Any] = list(current._modules.values())
        below.extend(value for _, value, kinds in inventory.contained(current)
                     if kinds and isinstance(value, nn.Module))
        for sub in below:
            if isinstance(sub, nn.Module) and id(sub) not in seen:
                seen.add(id(sub))
                out.append(sub)
                stack.append(sub)
    return out


class Discovery:
    """The modules a training step runs, found as it runs: one discovery for every front-end.

    - ``leafwatch run`` (no ``model``): every root module the script trains, the optimizers it
      holds (stepped or not), its module-level tensors; :meth:`step` at each optimizer step.
    - A front-end given a ``model`` (the callbacks, an attached Monitor): the modules a step runs
      beyond it, with a tensor that requires grad the model does not hold (sentence-transformers'
      ``SoftmaxLoss`` held as ``trainer.loss``, a head a ``Trainer`` subclass owns, a module the
      script keeps apart), each named by the user's path to it; :meth:`update` at each check.

    Args:
        model: The model a front-end holds (its tensors are never extra), or None.
        owners: Name -> object the user reaches modules through (``{"trainer": trainer}``),
            called at each update; the script's module-level variables come after them.
        on_roots: Called with the new named roots each time they change (``leafwatch run``).
    """

    def __init__(self, model: nn.Module | None = None, owners: Callable[[], dict[str, Any]] | None = None,
                 on_roots: Callable[[dict[str, nn.Module]], None] | None = None,
                 on_first_module: Callable[[nn.Module], None] | None = None) -> None:
        self._model = weakref.ref(model) if model is not None else None
        self.owners, self.on_roots = owners or dict, on_roots
        #: Called before the first forward of the first module with parameters seen (``leafwatch run``
        #: builds its Monitor there, so that its hooks see the first step as an attached one's do).
        self.on_first_module = on_first_module
        #: Optimizer steps seen, all optimizers together.
        self.steps = 0
        #: The optimizers that stepped, in the order of their first step.
        self.optimizers: list[torch.optim.Optimizer] = []
        self.step_counts: dict[int, int] = {}
        #: Whether the loop that steps runs at the script's module level.
        self.loop_at_module_level = False
        #: The modules found in the frames that the hook, watching the step, never saw run, and how they were used.
        self.unhooked = Unhooked()
        self.seen: dict[int, weakref.ReferenceType] = {}
        self._handles: list[Any] = []
        self._opt_keys: dict[int, tuple[int, ...]] = {}
        self._roots: dict[str, nn.Module] = {}
        self._roots_key: tuple[int, ...] = ()
        self._paths: dict[int, str] = {}
        self._owned: set[int] = set()
        self._accepted_unknown: set[int] = set()
        self._stable = 0
        self._held_optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._variables: dict[int, str] = {}
        #: Root modules (by id) no optimizer holds a tensor of that got a gradient.
        self._outside: dict[int, weakref.ReferenceType] = {}
        self._outside_ids: tuple[int, dict[int, tuple[str, str]]] = (-1, {})
        #: The script's module-level tensors at the last scan: through an optimizer holding one, else weakly.
        self._script_tensors: dict[str, follow.Ref] = {}
        self._script_watched: set[str] = set()

    # -- the global module hook ------------------------------------------------------------------
    def arm(self) -> None:
        """Install the global module forward pre-hook (a no-op when installed)."""
        if self._handles:
            return
        self._handles.append(torch.nn.modules.module.register_module_forward_pre_hook(self._on_forward_pre))
        self._stable = 0

    def disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.unhooked.not_run.clear()  # (unwatched from now on: whether they run is no longer seen)

    @property
    def armed(self) -> bool:
        """Whether the global module hook is installed (removed once the roots are stable)."""
        return bool(self._handles)

    @property
    def roots(self) -> dict[str, nn.Module]:
        """The named root modules found so far (a copy)."""
        return dict(self._roots)

    def paths(self) -> dict[int, str]:
        """Module id -> the user's code for each extra module a path reaches (``trainer.loss``)."""
        return dict(self._paths)

    def _on_forward_pre(self, module: nn.Module, args: Any) -> None:
        if id(module) not in self.seen:
            remember(self.seen, module)
            if self.on_first_module is not None and next(module.parameters(), None) is not None and \
                    not inventory.functional_copy(module):
                first, self.on_first_module = self.on_first_module, None
                first(module)
        if self.unhooked.called_directly or self.unhooked.not_run:  # a module the frames gave runs after all
            self.unhooked.ran(id(module))

    def modules_seen(self) -> list[nn.Module]:
        return [m for m in (ref() for ref in list(self.seen.values())) if m is not None]

    def top_modules(self) -> list[nn.Module]:
        """The modules seen running that no other one of them holds (registered or in a plain container)
        and that hold a tensor (a parameter, or one that requires grad unregistered): what a structure scan
        reads when no optimizer stepped (``leafwatch run``'s script raised first)."""
        return [m for m in _tops(self.modules_seen())
                if any(True for _ in m.parameters()) or inventory.Inventory(m).orphans()]

    def _new_roots(self, tops: list[nn.Module]) -> bool:
        """Count a stable update, or take ``tops`` as the roots when they changed (True)."""
        key = tuple(id(m) for m in tops)
        if key == self._roots_key:
            self._stable += 1
            return False
        self._stable, self._roots_key = 0, key
        return True

    # -- a front-end's check ---------------------------------------------------------------------
    def update(self) -> dict[str, nn.Module] | None:
        """Before a front-end's check: the roots to read (the model as ``""``, each extra module
        by its path) when the extra modules changed, else None. A failure here never reaches the
        training loop: it is warned once, and the extra modules are no longer read."""
        try:
            return self._update()
        except Exception as error:
            self.disarm()
            warnings.warn(f"leafwatch: reading the modules a step runs beyond the model failed "
                          f"({type(error).__name__}: {error}); training goes on, they are not checked.",
                          LeafwatchInternalWarning, stacklevel=2)
            return None

    def _update(self) -> dict[str, nn.Module] | None:
        model = self._model() if self._model is not None else None
        if model is None or not self.armed:
            return None
        inside = {id(p) for p in model.parameters()}
        held = {id(model), *(id(m) for m in _contained_modules(model))}
        extras = [m for m in self.modules_seen() if id(m) not in held and not inventory.functional_copy(m)
                  and any(p.requires_grad and id(p) not in inside for p in m.parameters())]
        tops = _tops(extras)
        if not self._new_roots(tops):
            if self._stable >= STABLE_STEPS:
                self.disarm()
            return None
        names = self._paths = paths_to(tops, {**self.owners(), **_script_scope()})
        self._roots = {"": model}
        for m in tops:  # a module no path reaches: its class name, as leafwatch run names roots
            name = names.get(id(m)) or type(m).__name__
            while name in self._roots:
                name += "_"
            self._roots[name] = m
        return self.roots

    # -- an optimizer step -----------------------------------------------------------------------
    def step(self, optimizer: torch.optim.Optimizer, *, checked: bool) -> tuple[int, bool]:
        """Take note of a step of ``optimizer``: its count and whether it holds new parameters.

        Args:
            optimizer: The optimizer about to step (or that just stepped, with a closure).
            checked: Whether a check already ran (the module hook may then go once stable).

        Returns:
            How many times ``optimizer`` stepped, and whether its parameter groups changed.
        """
        self.steps += 1
        oid = id(optimizer)
        count = self.step_counts.get(oid, 0) + 1
        self.step_counts[oid] = count
        if count == 1:
            self.optimizers.append(optimizer)
        key = tuple(len(g["params"]) for g in optimizer.param_groups)
        new_params = self._opt_keys.get(oid) != key
        self._opt_keys[oid] = key
        if new_params:
            unknown = optimizer_ids([optimizer]) - self._owned - self._accepted_unknown
            if unknown:
                watched = self.armed  # armed before this step: the hook saw the step's forward
                self.arm()
                self._find_owners(unknown, watched)
        if self._handles or new_params:
            self.update_roots(checked)
        return count, new_params

    def _find_owners(self, unknown: set[int], watched: bool) -> None:
        """Remember the modules in the step's calling frames (locals, ``self``) owning ``unknown``: a
        container that never runs a forward of its own (an ``nn.ModuleDict`` whose members are called
        one by one) is found there, the training loop holds it in a variable. When the hook ``watched``
        the step's forward, those it never saw run are :attr:`unhooked`."""
        for frame in (stack := list(user_frames())):
            for value in _frame_values(frame):
                if isinstance(value, nn.Module) and id(value) not in self.seen:
                    if any(id(p) in unknown for p in value.parameters()):
                        if watched:
                            self.unhooked.note(value, _used_without_running(value, unknown, self.seen), self.seen, stack)
                        remember(self.seen, value)

    def find_optimizers(self, built: Iterable[torch.optim.Optimizer] = (), *, ended: bool = False) -> None:
        """Remember the optimizers the script holds in the calling frames (``ended``: its module-level variables),
        stepped or not (a variable, ``self.x``, a plain dict or list there), and ``built``: those seen built, wherever
        they are held; and whether the loop that steps runs at the script's module level."""
        self._held_optimizers.update(built)
        first = None if ended else frames.user_frame()  # the user's own code (a library's loop, skorch's fit, is not)
        if first is not None and first.f_code.co_name == "<module>":
            self.loop_at_module_level = True
        for values in [list(_script_scope().values())] if ended else map(_frame_values, user_frames()):
            for value in values:
                items = [value]
                if isinstance(value, (dict, list, tuple)) and len(value) <= 64:
                    items = value.values() if isinstance(value, dict) else value
                self._held_optimizers.update(o for o in map(_real_optimizer, items) if o is not None)

    def waiting_optimizers(self) -> list[torch.optim.Optimizer]:
        """Optimizers the script holds that have not stepped (yet)."""
        return [o for o in list(self._held_optimizers) if id(o) not in self.step_counts]

    def outside_root_tensors(self) -> dict[int, tuple[str, str]]:
        """The ids of the tensors of root modules no optimizer holds any tensor of, each with the
        root's name in the script (its module-level variable, else the root's name) and the
        variable of the script's only stepping optimizer ("" when not one); once per step."""
        if self._outside_ids[0] == self.steps:
            return self._outside_ids[1]
        held = optimizer_ids([*self.optimizers, *self.waiting_optimizers()])
        variables = self.script_variables()
        optimizer = variables.get(id(self.optimizers[0]), "") if len(self.optimizers) == 1 else ""
        out: dict[int, tuple[str, str]] = {}
        for name, root in self._roots.items():
            if id(root) in self._outside:
                params = [id(p) for p in root.parameters()]
                if not held.intersection(params):
                    out.update(dict.fromkeys(params, (variables.get(id(root), name), optimizer)))
        self._outside_ids = (self.steps, out)
        return out

    def script_variables(self) -> dict[int, str]:
        """Id of each module and optimizer of the script's module-level variables -> its name (the
        first name: a loop variable comes later; ``opts[1]`` for an optimizer of a plain list), read while the script runs and kept (names and
        ids only) for the fixes decided after it ended."""
        variables: dict[int, str] = {}
        for key, value in _script_scope().items():
            if key.startswith("_"):
                continue
            if isinstance(value, (nn.Module, torch.optim.Optimizer)):
                variables.setdefault(id(value), key)
            elif isinstance(value, (list, tuple)) and key.isidentifier():  # `opts[1]`, before the loop's `opt`
                for i, item in enumerate(value[:100]):
                    if isinstance(item, torch.optim.Optimizer):
                        variables.setdefault(id(item), f"{key}[{i}]")
        if variables:
            self._variables = variables
        return dict(self._variables)

    # -- roots -----------------------------------------------------------------------------------
    def update_roots(self, checked: bool) -> None:
        """Read the roots again (a change goes to ``on_roots``); remove the module hook once stable."""
        # With the optimizers held that have not stepped (yet): a network whose optimizer never steps is judged.
        in_optimizers = optimizer_ids([*self.optimizers, *self.waiting_optimizers()])
        kept: list[tuple[nn.Module, set[int]]] = []  # each root, with its registered and unregistered tensors
        for module in _tops([m for m in self.modules_seen() if not inventory.functional_copy(m)]):  # (not higher's fnet)
            if type(module).__module__.startswith("torch.") and not any(True for _ in module.parameters()):
                continue  # a loss or an activation called at the top level
            inv = inventory.Inventory(module)
            owned = set(inv.tensors) | {id(o.tensor) for o in inv.orphans()}
            if not owned:
                continue
            if owned & in_optimizers or not inv.tensors:
                kept.append((module, owned))
            elif id(module) in self._outside or any(p.grad is not None for p in module.parameters()):
                self._outside[id(module)] = weakref.ref(module)  # gradients but no optimizer: the gradient rule
                kept.append((module, owned))
        owned = set().union(*(o for _, o in kept))
        if self._new_roots([m for m, _ in kept]):
            self._roots = inventory.name_roots([m for m, _ in kept], self.script_variables())
            if self.on_roots is not None:
                self.on_roots(dict(self._roots))  # rebuilt at the next check
        self._owned = owned
        if self._handles and self._stable >= STABLE_STEPS and self.step_counts:
            # Stable: what no root owns now is a tensor of the script's own (or a stale one).
            self._accepted_unknown |= optimizer_ids(self.optimizers) - owned
            if all(c >= 2 for c in self.step_counts.values()) or checked:
                self.disarm()

    # -- the script's module-level tensors ---------------------------------------------------------
    def scan_script_globals(self, watches: Any) -> None:
        """Watch the script's module-level tensors that require grad and stay the same tensor
        from one scan to the next (an activation or a loss is a new tensor each step), or that an
        optimizer holds (at the first scan): a leaf in
        no optimizer is ``not_in_optimizer``, one an optimizer holds must get a gradient, a
        non-leaf is ``non_leaf``, under its variable name. ``watches``: the Monitor's watch set."""
        found = {name: value for name, value in _script_scope().items()
                 if isinstance(value, torch.Tensor) and value.requires_grad and not name.startswith("__")
                 and id(value) not in self._owned}
        in_optimizers = optimizer_ids(self.optimizers)
        for name, t in found.items():
            before = self._script_tensors.get(name)
            # (a tensor an optimizer holds persists: watched at first sight)
            if (before is None or before() is not t) and id(t) not in in_optimizers or name in self._script_watched:
                continue
            if not t.is_leaf and graph.computed_from(t, self._owned | in_optimizers | {
                    id(p) for m in self.modules_seen() for p in m.parameters(recurse=False)}):
                continue  # an output or a loss kept at module level (made from tensors held or of modules that ran)
            # The Monitor reports it with the rest (no warning at the watch, as watch() gives).
            watches.add(t, name, named_by_caller=True, expect_leaf=True, expect_grad=id(t) in in_optimizers,
                                location="the script's module level")
            self._script_watched.add(name)
        self._script_tensors = {name: follow.follow(t, optimizers=self.optimizers) for name, t in found.items()}



def _used_without_running(module: nn.Module, ids: set[int], seen: dict[int, Any]) -> set[int]:
    """The ids of ``module`` and its submodules not in ``seen`` (they did not run through ``module(x)``, nor
    did the frames give them earlier) that own, themselves, a tensor of ``ids`` that has a gradient: the
    forward that used them was not called through ``module(x)``; none when a library's copy ran (higher's ``fnet``:
    their gradients came through it)."""
    if any(inventory.functional_copy(m) for m in (ref() for ref in list(seen.values())) if m is not None):
        return set()
    return {id(m) for m in module.modules() if id(m) not in seen
            and any(id(p) in ids and p.grad is not None for p in m.parameters(recurse=False))}


def _real_optimizer(value: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer a script's variable holds (an accelerate or Fabric wrapper unwrapped:
    the global step hooks see the real one), or None."""
    if not frames.readable(value):  # an item of a plain container the script holds
        return None
    if not (isinstance(value, torch.optim.Optimizer) or type(value).__name__.endswith("Optimizer")):
        return None
    try:
        inner, deepspeed = inventory.unwrap_optimizer(value)
    except Exception:
        return None
    return inner if isinstance(inner, torch.optim.Optimizer) and not deepspeed else None


def paths_to(modules: list[nn.Module], owners: dict[str, Any], depth: int = 3) -> dict[int, str]:
    """The shortest path of names, attributes and indexes from ``owners`` to each module:
    ``trainer.loss.classifier``, ``heads[0]``; a module no path reaches is left out.

    Example::

        >>> import torch, types
        >>> loss = torch.nn.Module(); loss.classifier = torch.nn.Linear(2, 2)
        >>> holder = types.SimpleNamespace(loss=loss)  # (a class made here would be leafwatch's own: never read)
        >>> paths_to([loss.classifier], {"trainer": holder})[id(loss.classifier)]
        'trainer.loss.classifier'
    """
    wanted = {id(m) for m in modules}
    found: dict[int, str] = {}
    queue = [(name, value, 0) for name, value in owners.items() if name.isidentifier() and not name.startswith("_")]
    visited: set[int] = set()
    while queue and len(found) < len(wanted) and len(visited) < _MAX_LOCALS:
        path, value, level = queue.pop(0)
        if id(value) in visited:
            continue
        visited.add(id(value))
        if id(value) in wanted:
            found.setdefault(id(value), path)
        if level < depth:
            queue.extend((path + key, child, level + 1) for key, child in _children(value))
    return found


def _children(value: Any) -> list[tuple[str, Any]]:
    """The ``(path step, object)`` below ``value`` that can lead to a module: none below an object
    that runs code of its own when read (:func:`leafwatch.observe.frames.readable`) or below a
    module object (``torch.distributed``: a library's namespace, never the user's path to a module)."""
    if not frames.readable(value) or isinstance(value, types.ModuleType):
        return []
    if isinstance(value, (list, tuple)) and len(value) <= 64:
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, dict) and len(value) <= 64:
        return [(f"[{k!r}]", v) for k, v in value.items() if isinstance(k, (str, int))]
    if isinstance(value, (torch.Tensor, str, bytes, int, float, type)) or not hasattr(value, "__dict__"):
        return []
    try:
        attributes = list(vars(value).items())
    except TypeError:
        return []
    keys: list[tuple[str, Any]] = []
    if isinstance(value, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):  # indexed: `blocks[0]`, `heads['a']`
        keys = [(f"[{int(k)}]" if isinstance(value, (nn.Sequential, nn.ModuleList)) else f"[{k!r}]", m)
                for k, m in value._modules.items() if m is not None]
    elif isinstance(value, nn.Module):
        attributes = list(value._modules.items()) + attributes
    # The public attributes that may lead to a module: containers, optimizers, and plain objects of the user's
    # or a library's (a skorch ``NeuralNet``), not a tensor, a number, a string, a class, a function, a module
    # object, or an object that runs code of its own when read.
    return keys + [(f".{k}", v) for k, v in attributes if isinstance(k, str) and k.isidentifier() and not k.startswith("_")
                   and frames.readable(v)
                   and (isinstance(v, (nn.Module, list, tuple, dict, torch.optim.Optimizer))
                        or (hasattr(v, "__dict__") and not isinstance(v, (torch.Tensor, type, types.ModuleType))
                            and not callable(v)))]


def user_scope() -> dict[str, Any]:
    """The variables of the user's 8 innermost frames on the stack, innermost first (a name seen first wins):
    where a callback or a step hook finds the user's names for the objects it was not handed. The
    readable ones only (:func:`leafwatch.observe.frames.readable`): the callers read them."""
    scope: dict[str, Any] = {}
    for frame in itertools.islice(frames.user_frames(depth=2), 8):
        for key, value in list(frame.f_locals.items())[:_MAX_LOCALS]:
            if key not in scope and frames.readable(value):
                scope[key] = value
    return scope

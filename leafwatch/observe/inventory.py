"""Who owns which tensor: qualified names and aliases, optimizer sets, and orphans.

Built once from a model and its optimizers and rebuilt only when the parameter sets change
(see :mod:`leafwatch.observe.structure`). Nothing here runs per step.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import follow as follow_
from . import frames, graph
from .names import ancestors
from ..options import got

def _wrapper_types() -> tuple[type, ...]:
    types: list[type] = [nn.DataParallel, nn.parallel.DistributedDataParallel]
    # Importing dynamo takes seconds; nothing is compiled (or Fabric-wrapped) before its package is imported.
    for module_name, class_name in _OPTIONAL_WRAPPERS:
        found = getattr(sys.modules.get(module_name), class_name, None)
        if isinstance(found, type):
            types.append(found)
    return tuple(types)


#: Module wrappers that can only exist once their package is imported: (module, class).
_OPTIONAL_WRAPPERS = (
    ("torch._dynamo.eval_frame", "OptimizedModule"),
    ("lightning.fabric.wrappers", "_FabricModule"),
    ("lightning_fabric.wrappers", "_FabricModule"),
    # Opacus's ``GradSampleModule`` (every grad-sample mode) and its DDP wrapper: ``make_private``'s model.
    ("opacus.grad_sample.gsm_base", "AbstractGradSampleModule"),
    ("opacus.distributed", "DifferentiallyPrivateDistributedDataParallel"),
)
#: The attributes that hold the wrapped module, in the order they are tried: Fabric's user
#: module first (its ``_forward_module`` may itself be a DDP wrapper around it); Opacus's ``_module``.
_INNER_MODULE_ATTRIBUTES = ("_original_module", "_orig_mod", "module", "_forward_module", "_module")
#: The attributes that hold the optimizer a wrapper steps: ``.optimizer`` (accelerate, Fabric, Lightning,
#: DeepSpeed), ``.original_optimizer`` (Opacus's ``DPOptimizer``, which never runs ``Optimizer.__init__``).
_INNER_OPTIMIZER_ATTRIBUTES = ("optimizer", "original_optimizer")
#: Name segments that only wrappers insert: Fabric, ``torch.compile``, FSDP, activation checkpointing.
_WRAPPER_SEGMENTS = frozenset({"_forward_module", "_original_module", "_orig_mod", "_fsdp_wrapped_module",
                               "_checkpoint_wrapped_module"})


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP/DataParallel, ``torch.compile``, Lightning Fabric and Opacus wrappers.

    Example::

        >>> from torch import nn
        >>> net = nn.Linear(2, 1)
        >>> unwrap(nn.DataParallel(net)) is net
        True
    """
    wrappers = _wrapper_types()
    while isinstance(model, wrappers):
        inner = next((m for m in (getattr(model, a, None) for a in _INNER_MODULE_ATTRIBUTES)
                      if isinstance(m, nn.Module)), None)
        if inner is None:
            break
        model = inner
    return model


def clean_name(name: str) -> str:
    """A qualified name without the segments wrappers insert (``_orig_mod.``, ``_forward_module.``,
    ``_fsdp_wrapped_module.``, ...): the name the user's own module gives. (A root wrapper's own segment,
    DDP's ``module.`` or Opacus's ``_module.``, never appears: :func:`unwrap` takes the wrapper off first.)

    Example::

        >>> clean_name("encoder._orig_mod.layer._forward_module.weight")
        'encoder.layer.weight'
    """
    return name if "_" not in name else ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


def unwrap_optimizer(optimizer: Any) -> tuple[Any, bool]:
    """The optimizer under its wrappers, and whether one of them comes from DeepSpeed.

    Follows the ``.optimizer`` chain: accelerate's ``AcceleratedOptimizer``, Lightning Fabric's
    ``_FabricOptimizer``, Lightning's ``LightningOptimizer``, DeepSpeed's wrappers, and any other
    wrapper that exposes the real optimizer as ``.optimizer`` and has ``param_groups`` (a learning
    rate scheduler also holds ``.optimizer`` but is no wrapper: it is returned as it is); and
    ``.original_optimizer``, Opacus's ``DPOptimizer`` (from ``PrivacyEngine.make_private``: it never runs
    ``Optimizer.__init__``, so torch's step hooks fire for the optimizer it steps, never for it). Runs once
    per optimizer given or adopted, never per step.

    Args:
        optimizer: A torch optimizer or a wrapper around one.

    Returns:
        ``(innermost, deepspeed)``: the last object of the ``.optimizer`` chain, and whether an
        object of the chain comes from DeepSpeed (whose inner optimizer steps flat master copies,
        not the model's parameters).

    Example::

        >>> import torch
        >>> sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> class Wrapper:
        ...     def __init__(self, optimizer): self.optimizer = optimizer
        ...     param_groups = property(lambda self: self.optimizer.param_groups)
        >>> unwrap_optimizer(Wrapper(sgd)) == (sgd, False)
        True
        >>> scheduler = torch.optim.lr_scheduler.StepLR(sgd, step_size=1)
        >>> unwrap_optimizer(scheduler)[0] is scheduler  # holds `.optimizer`, but is no wrapper
        True
    """
    seen: set[int] = set()
    deepspeed = False
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        module = type(optimizer).__module__ or ""
        deepspeed = deepspeed or module.startswith("deepspeed") or "DeepSpeed" in type(optimizer).__name__
        try:
            inner = next((found for found in (getattr(optimizer, a, None) for a in _INNER_OPTIMIZER_ATTRIBUTES)
                          if found is not None), None) if hasattr(optimizer, "param_groups") else None
        except Exception:  # a property that fails: not a wrapper we can see through
            inner = None
        if inner is None or isinstance(inner, (str, bytes, Mapping)):
            break
        optimizer = inner
    return optimizer, deepspeed


def functional_copy(module: nn.Module) -> bool:
    """Whether ``module`` is a library's functional copy of a module: its class is defined in an installed
    package and its tensors are no parameters (no ``nn.Parameter``: fast weights it computes, as higher's
    ``innerloop_ctx`` / ``monkeypatch`` give). It is no model of the user's: the module it copies is.

    Example::

        >>> from torch import nn
        >>> functional_copy(nn.Linear(2, 1))  # a library's class, with its own parameters
        False
    """
    if frames.library_class(type(module)) is None:
        return False
    tensors = False
    for m in module.modules():
        for t in m._parameters.values():
            if isinstance(t, nn.Parameter):
                return False  # (a library's module with parameters of its own: read at its first one)
            tensors = tensors or isinstance(t, torch.Tensor)
    return tensors


def is_uninitialized(t: torch.Tensor) -> bool:
    """Whether ``t`` is a lazy module's tensor not materialized yet (no shape, no data)."""
    return nn.parameter.is_lazy(t)


def has_values(t: torch.Tensor) -> bool:
    """Whether ``t``'s shape and data can be read: not uninitialized and not on the meta device."""
    return not nn.parameter.is_lazy(t) and not t.is_meta


def shape_of(t: torch.Tensor) -> tuple[int, ...] | None:
    """``t``'s shape, or None for an uninitialized (lazy) tensor, which has none yet."""
    return None if nn.parameter.is_lazy(t) else tuple(t.shape)


def shape_text(t: torch.Tensor) -> str:
    """How a name-less tensor is described: ``tensor of shape (2, 3)`` or ``uninitialized tensor``.

    Example::

        >>> import torch
        >>> shape_text(torch.zeros(2, 3)), shape_text(torch.nn.UninitializedParameter())
        ('tensor of shape (2, 3)', 'uninitialized tensor')
    """
    shape = shape_of(t)
    return "uninitialized tensor" if shape is None else f"tensor of shape {shape}"


@dataclasses.dataclass
class ParamInfo:
    name: str
    module: str
    attribute: str
    aliases: tuple[str, ...] = ()
    #: A buffer registered with ``requires_grad=True``, not a parameter.
    buffer: bool = False


@dataclasses.dataclass
class Orphan:
    name: str
    tensor: torch.Tensor
    container: str  # "attribute", "list", "dict", "dataclass", "namedtuple"
    module_in_container: bool = False
    #: The plain containers on the access path, outermost first (``("dict", "dict")``).
    containers: tuple[str, ...] = ()


def describe_tensor(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": shape_of(t), "dtype": str(t.dtype).replace("torch.", ""), "device": str(t.device)}


_MODULE_INTERNALS = frozenset(vars(nn.Module()).keys()) | {"training"}
_MAX_CONTAINER_ITEMS = 64
#: How deep plain containers are looked into (a dict of dicts of Parameters is depth 2).
_MAX_CONTAINER_DEPTH = 4


def _container_items(value: Any) -> tuple[str, Iterable[tuple[str, Any]]] | None:
    """The kind of a plain container (``"list"``/``"dict"``/``"namedtuple"``/``"dataclass"``) and its
    ``(access suffix, item)`` pairs, at most a bounded number; None for anything else."""
    n = _MAX_CONTAINER_ITEMS
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return "namedtuple", ((f".{f}", getattr(value, f)) for f in value._fields[:n])
    if isinstance(value, (list, tuple)):
        return "list", ((f"[{i}]", item) for i, item in enumerate(value[:n]))
    if isinstance(value, dict) and not isinstance(value, nn.Module):
        return "dict", ((f"[{k!r}]", item) for k, item in itertools.islice(value.items(), n))
    if dataclasses.is_dataclass(value) and not isinstance(value, (type, nn.Module)):
        return "dataclass", ((f".{f.name}", getattr(value, f.name, None)) for f in dataclasses.fields(value)[:n])
    return None


def contained(module: nn.Module) -> Iterable[tuple[str, Any, tuple[str, ...]]]:
    """The tensors and modules a module keeps in plain containers among its attributes.

    Walks lists, tuples, dicts, namedtuples and dataclass instances, nested up to a bounded
    depth, without entering tensors or modules. Yields ``(access path, value, containers)``
    where ``containers`` names the plain containers on the path, outermost first; a tensor or
    module held directly as an attribute is yielded with no containers. An object that runs code
    of its own when read (:func:`leafwatch.observe.frames.readable`: torch's deprecated
    ``torch.distributed.reduce_op`` warns) is passed over unread.
    """
    for attr, value in vars(module).items():
        if attr in _MODULE_INTERNALS:
            continue
        stack: list[tuple[str, Any, tuple[str, ...]]] = [(attr, value, ())]
        while stack:
            path, item, kinds = stack.pop()
            if not frames.readable(item):
                continue
            if isinstance(item, (torch.Tensor, nn.Module)):
                yield path, item, kinds
                continue
            found = _container_items(item) if len(kinds) < _MAX_CONTAINER_DEPTH else None
            if found is None:
                continue
            # Reversed onto the stack: items come out in their order.
            stack.extend(reversed([(path + suffix, sub, kinds + (found[0],)) for suffix, sub in found[1]]))


class Inventory:
    """Names, owners and optimizer membership of every tensor leafwatch looks at."""

    def __init__(self, model: nn.Module | Mapping[str, nn.Module] | None,
                 optimizers: Sequence[torch.optim.Optimizer] = ()) -> None:
        # Several roots (``leafwatch run`` finds them by watching modules run) get a name prefix each.
        roots = model if isinstance(model, Mapping) else ({"": model} if model is not None else {})
        self.roots: dict[str, nn.Module] = {prefix: unwrap(m) for prefix, m in roots.items()}
        self.model = next(iter(self.roots.values()), None)
        self.params: dict[int, ParamInfo] = {}
        self.tensors: dict[int, torch.Tensor] = {}
        self.buffers: set[int] = set()
        #: Buffer id -> its qualified name (``actor.action_low``).
        self.buffer_names: dict[int, str] = {}
        self.modules: dict[str, nn.Module] = {}
        for prefix, root in self.roots.items():
            self._read_model(root, prefix)
        self.optimizers = list(optimizers)
        self.optimizer_params: list[list[torch.Tensor]] = [[p for group in opt.param_groups for p in group["params"]]
                                                           for opt in self.optimizers]
        self.in_optimizer: set[int] = {id(p) for ps in self.optimizer_params for p in ps}
        #: Object id -> the user's variable for it, when a front-end knows them (``leafwatch run``
        #: reads the script's variables while it runs): the fixes name them.
        self.variables: Callable[[], dict[int, str]] | None = None
        #: The registration mark when the optimizers were handed over, and where the Monitor's observer
        #: saw a tensor registered after a mark (:meth:`leafwatch.observe.observer.Observer.appeared`).
        self.optimizers_mark: int | None = None
        self.appeared: Callable[[torch.Tensor, int | None], tuple[str, str, tuple[str, ...]] | None] = lambda t, after: None
        #: The registration mark when an optimizer was built, where its statement stands and the
        #: variable it assigns, when seen (:meth:`leafwatch.observe.observer.Observer.built`).
        self.built: Callable[[torch.optim.Optimizer], tuple[int, str, str] | None] = lambda optimizer: None
        #: ``(the library, its path:line)`` when a library's code built the optimizer, not the user's
        #: (:meth:`leafwatch.observe.observer.Observer.built_by`).
        self.built_by: Callable[[torch.optim.Optimizer], tuple[str, str] | None] = lambda optimizer: None
        #: Every optimizer that exists, seen built, stepped or not
        #: (:meth:`leafwatch.observe.observer.Observer.built_optimizers`).
        self.existing: Callable[[], list[torch.optim.Optimizer]] = list
        #: What the fixes looked up for this snapshot (variables, framework), asked once per object.
        self.fix_names: dict[Any, Any] = {}

    # -- the model ---------------------------------------------------------------------------
    def _read_model(self, model: nn.Module, prefix: str = "") -> None:
        for module_name, module in model.named_modules(remove_duplicate=False, prefix=prefix):
            name = clean_name(module_name)
            self.modules.setdefault(name, module)
            for attr, p in module._parameters.items():
                if p is None:
                    continue
                qualified = f"{name}.{attr}" if name else attr
                info = self.params.get(id(p))
                if info is None:
                    self.params[id(p)] = ParamInfo(qualified, name, attr)
                    self.tensors[id(p)] = p
                elif qualified != info.name and qualified not in info.aliases:
                    info.aliases += (qualified,)
            for attr, b in module._buffers.items():
                if b is None:
                    continue
                self.buffers.add(id(b))
                qualified = f"{name}.{attr}" if name else attr
                self.buffer_names.setdefault(id(b), qualified)
                if b.requires_grad and b.is_leaf and id(b) not in self.params:
                    # A buffer registered with requires_grad=True (meant as a parameter): read like one.
                    self.params[id(b)] = ParamInfo(qualified, name, attr, buffer=True)
                    self.tensors[id(b)] = b

    def name(self, t: torch.Tensor) -> str | None:
        info = self.params.get(id(t))
        return info.name if info is not None else None

    def follow(self, t: torch.Tensor) -> follow_.Ref:
        """``t`` followed through the module or optimizer of this reading that holds it (a swap keeps
        it followed), or weakly when none holds it (:mod:`leafwatch.observe.follow`). Looks where the
        reading says it is, never through every module: a fresh leaf of the loss is followed at once."""
        info = self.params.get(id(t))
        qualified = info.name if info is not None else self.buffer_names.get(id(t))
        module_name, _, attribute = (qualified or "").rpartition(".")
        module = self.modules.get(module_name) if qualified is not None else None
        if module is not None:
            # (a wrapper that shares its inner module's name, torch.compile's: the inner one holds it)
            held = follow_.in_module(module, t, attribute) or follow_.in_module(unwrap(module), t, attribute)
            if held is not None:
                return held
        holders = [opt for opt, params in zip(self.optimizers, self.optimizer_params) if any(p is t for p in params)] \
            if id(t) in self.in_optimizer else []
        return follow_.follow(t, optimizers=holders)

    def known_names(self) -> dict[int, str]:
        return {k: v.name for k, v in self.params.items()}

    def all_names(self) -> set[str]:
        """Every name a finding on this structure can have: parameters, aliases, orphans."""
        return {n for info in self.params.values() for n in (info.name, *info.aliases)} | {o.name for o in self.orphans()}

    def trainable(self) -> list[tuple[ParamInfo, torch.Tensor]]:
        return [(self.params[k], t) for k, t in self.tensors.items() if t.requires_grad]

    def trainable_paths(self) -> tuple[str, ...]:
        """Every name of a trainable tensor, aliases included (a loss module that holds the model
        names its tensors too), and one marker under each path above a root named by a path
        (``trainer`` above ``trainer.head``): the user reaches more than leafwatch reads there, so
        no mistake is named by it (:func:`leafwatch.report.history.lift_to_modules`)."""
        names = [n for info, _ in self.trainable() for n in (info.name, *info.aliases)]
        names += [f"{above}.<not read>" for prefix in self.roots for above in ancestors(prefix)]
        return tuple(names)

    # -- orphans -----------------------------------------------------------------------------
    def orphans(self) -> list[Orphan]:
        """Tensors that need grad but are not registered: plain attributes, Python lists/dicts. What a
        library's module holds (its class defined in an installed package: higher's ``_fast_params``) is that
        library's own storage, never a would-be parameter of the user's: it is not looked into. torch's own
        modules keep no such tensor: one on an ``nn.Linear`` was put there by the user's code (a LoRA
        factor written by hand), and is looked into."""
        if self.model is None:
            return []
        taken = set(self.tensors) | self.buffers  # registered, or found already
        found: list[Orphan] = []
        for module_name, module in self.modules.items():
            if frames.library_class(type(module)) not in (None, "torch"):
                continue
            prefix = f"{module_name}." if module_name else ""
            for path, value, kinds in contained(module):
                name, container = prefix + path, kinds[-1] if kinds else "attribute"
                if isinstance(value, torch.Tensor):
                    # A non-leaf computed from any of the model's own parameters (weight_norm / spectral_norm /
                    # pruning weights, a stored output or loss, even one that also depends on an orphan, which
                    # is reported on its own) is no would-be parameter.
                    if id(value) in taken or not value.requires_grad \
                            or (not value.is_leaf and graph.computed_from(value, self.tensors)):
                        continue
                    taken.add(id(value))
                    found.append(Orphan(name, value, container, containers=kinds))
                elif isinstance(value, nn.Module) and container != "attribute":
                    for sub, p in value.named_parameters():
                        if id(p) not in taken and p.requires_grad:
                            taken.add(id(p))
                            found.append(Orphan(f"{name}.{clean_name(sub)}", p, container, module_in_container=True,
                                                containers=kinds))
        return found


_OPTIMIZER_FORMS = "a torch.optim.Optimizer or a sequence of them"
#: What error messages add about wrappers.
WRAPPERS_ACCEPTED = ("a wrapper is accepted when it exposes the real optimizer as `.optimizer` (or "
                     "`.original_optimizer`, as Opacus's does) and has `param_groups`: accelerate's, Lightning's, "
                     "Fabric's, Opacus's")


def as_optimizer(value: Any, argument: str = "optimizer") -> torch.optim.Optimizer:
    """The real torch optimizer of ``value``: itself, or the one under its wrappers.

    Raises:
        TypeError: neither an optimizer nor a wrapper around one (the message names ``argument``
            and the value received).
        ValueError: a DeepSpeed optimizer: it steps flat master copies, not the model's
            parameters, so its membership cannot be judged.
    """
    inner, deepspeed = unwrap_optimizer(value)
    if deepspeed:
        raise ValueError(
            f"`{argument}` is a DeepSpeed optimizer ({got(value)}): it steps flat master copies, not the "
            "model's parameters; pass no optimizer (every trainable parameter is checked for a gradient)")
    if not isinstance(inner, torch.optim.Optimizer):
        raise TypeError(f"`{argument}` must be a torch.optim.Optimizer, got {got(value)} ({WRAPPERS_ACCEPTED})")
    return inner


def normalize_optimizers(optimizers: Any, argument: str = "optimizers") -> list[torch.optim.Optimizer]:
    """One optimizer or a sequence of them -> a list of real optimizers (wrappers unwrapped).

    Raises:
        TypeError: anything else, naming ``argument``, the value and the index in a sequence.
        ValueError: a DeepSpeed optimizer (see :func:`as_optimizer`).
    """
    if optimizers is None:
        return []
    many = isinstance(optimizers, (list, tuple))
    out: list[torch.optim.Optimizer] = []
    for i, opt in enumerate(optimizers if many else [optimizers]):
        try:
            inner = as_optimizer(opt, f"{argument}[{i}]" if many else argument)
        except TypeError:
            at = f" at index {i}" if many else ""
            raise TypeError(f"`{argument}` must be {_OPTIMIZER_FORMS}, got {got(opt)}{at} "
                            f"({WRAPPERS_ACCEPTED})") from None
        if all(inner is not o for o in out):
            out.append(inner)
    return out


def name_roots(modules: Sequence[nn.Module], variables: Mapping[int, str] | None = None) -> dict[str, nn.Module]:
    """Names for root modules: one root gets no prefix; several the script's variable for each
    (``variables``: module id -> the module-level name, ``generator``), else their class name
    (``Generator``, ``Discriminator``; ``Linear``, ``Linear_1`` for two of one class).

    Example::

        >>> from torch import nn
        >>> list(name_roots([nn.Linear(1, 1), nn.Linear(1, 1), nn.ReLU()]))
        ['Linear', 'Linear_1', 'ReLU']
    """
    if len(modules) == 1:
        return {"": modules[0]}
    roots: dict[str, nn.Module] = {}
    counts: dict[str, int] = {}
    named = {id(m): variables[id(m)] for m in modules if variables and id(m) in variables}
    taken = set(named.values())
    for module in modules:
        if id(module) in named:
            roots[named[id(module)]] = module
            continue
        base = type(module).__name__
        while base in taken:
            base += "_"
        n = counts.get(base, 0)
        counts[base] = n + 1
        roots[base if n == 0 else f"{base}_{n}"] = module
    return roots


_ROOTS_FORMS = "a mapping name -> torch.nn.Module or a sequence of modules"
_TENSORS_FORMS = "a mapping name -> tensor or a sequence of tensors"


def normalize_roots(roots: Any, argument: str = "roots") -> dict[str, nn.Module] | None:
    """``roots`` as a dict name -> module (a sequence is named by :func:`name_roots`), or None.

    Raises:
        TypeError: neither a mapping of str -> module nor a sequence of modules (a single module,
            ``nn.Sequential`` included, is rejected: pass it as ``model``).
        ValueError: the same module twice.
    """
    if roots is None:
        return None
    if isinstance(roots, nn.Module):
        raise TypeError(f"`{argument}` must be {_ROOTS_FORMS}, got a single module ({got(roots)}); "
                        "pass it as `model`, or as `[module]`")
    if isinstance(roots, Mapping):
        out = _checked_items(roots.items(), argument, nn.Module, "torch.nn.Module")
    elif isinstance(roots, (list, tuple)):
        for i, module in enumerate(roots):
            if not isinstance(module, nn.Module):
                raise TypeError(f"`{argument}` must be {_ROOTS_FORMS}, got {got(module)} at index {i}")
        out = name_roots(list(roots))
    else:
        raise TypeError(f"`{argument}` must be {_ROOTS_FORMS}, got {got(roots)}")
    if len({id(m) for m in out.values()}) != len(out):
        raise ValueError(f"`{argument}` holds the same module twice: {sorted(out)}")
    return out


def normalize_model(model: Any, argument: str = "model", call: str = "Monitor") -> nn.Module | None:
    """``model`` as given (a module or None); a TypeError naming ``argument`` otherwise, and for an
    optimizer given first, the order ``call`` (the function the user called) takes them in."""
    if model is None or isinstance(model, nn.Module):
        return model
    hint = f" (an optimizer goes second: `{call}(model, optimizer)`)" if isinstance(model, torch.optim.Optimizer) else ""
    raise TypeError(f"`{argument}` must be a torch.nn.Module, got {got(model)}{hint}")


def normalize_tensors(tensors: Any, argument: str = "tensors") -> dict[str, torch.Tensor]:
    """A mapping name -> tensor, or a sequence of tensors (named ``tensors[i]``)."""
    if tensors is None:
        return {}
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"`{argument}` must be {_TENSORS_FORMS}, got a single Tensor; pass [t] or {{'name': t}}")
    if isinstance(tensors, Mapping):
        items: Iterable[tuple[Any, Any]] = tensors.items()
    elif isinstance(tensors, (list, tuple)):
        items = ((f"tensors[{i}]", t) for i, t in enumerate(tensors))
    else:
        raise TypeError(f"`{argument}` must be {_TENSORS_FORMS}, got {got(tensors)}")
    return _checked_items(items, argument, torch.Tensor, "torch.Tensor")


def _checked_items(items: Iterable[tuple[Any, Any]], argument: str, kind: type, what: str) -> dict[str, Any]:
    """``items`` as a dict; TypeError naming ``argument`` for a key that is no str or a value that is no ``kind``."""
    out = {}
    for name, value in items:
        if not isinstance(name, str):
            raise TypeError(f"`{argument}` keys must be str, got {got(name)}")
        if not isinstance(value, kind):
            raise TypeError(f"`{argument}[{name!r}]` must be a {what}, got {got(value)}")
        out[name] = value
    return out

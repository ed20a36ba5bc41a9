"""Who owns which tensor: qualified names and aliases, optimizer sets, and orphans.

Built once from a model and its optimizers and rebuilt only when the parameter sets change
(see :mod:`leafwatch.structure`). Nothing here runs per step.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import graph
from .options import got

def _wrapper_types() -> tuple[type, ...]:
    types: list[type] = [nn.DataParallel, nn.parallel.DistributedDataParallel]
    # Importing dynamo takes seconds; a model can only be compiled once something imported it.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    if isinstance(optimized, type):
        types.append(optimized)
    return tuple(types)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP/DataParallel/torch.compile wrappers."""
    wrappers = _wrapper_types()
    while isinstance(model, wrappers):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def clean_name(name: str) -> str:
    """Drop ``torch.compile``'s ``_orig_mod.`` from a qualified name."""
    return name.replace("_orig_mod.", "")


@dataclasses.dataclass
class ParamInfo:
    name: str
    module: str
    attribute: str
    aliases: tuple[str, ...] = ()


@dataclasses.dataclass
class Orphan:
    name: str
    tensor: torch.Tensor
    container: str  # "attribute", "list", "dict", "dataclass", "namedtuple"
    module_in_container: bool = False
    #: The plain containers on the access path, outermost first (``("dict", "dict")``).
    containers: tuple[str, ...] = ()


def describe_tensor(t: torch.Tensor) -> dict[str, Any]:
    return {
        # A lazy module's parameter has no shape until its first forward.
        "shape": None if nn.parameter.is_lazy(t) else tuple(t.shape),
        "dtype": str(t.dtype).replace("torch.", ""),
        "device": str(t.device),
    }


_MODULE_INTERNALS = frozenset(vars(nn.Module()).keys()) | {"training"}
_MAX_CONTAINER_ITEMS = 64
#: How deep plain containers are looked into (a dict of dicts of Parameters is depth 2).
_MAX_CONTAINER_DEPTH = 4


def _container_kind(value: Any) -> str | None:
    """``"list"``/``"dict"``/``"namedtuple"``/``"dataclass"`` for a plain container, else None."""
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return "namedtuple"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict) and not isinstance(value, nn.Module):
        return "dict"
    if dataclasses.is_dataclass(value) and not isinstance(value, (type, nn.Module)):
        return "dataclass"
    return None


def _container_items(value: Any, kind: str) -> Iterable[tuple[str, Any]]:
    """The ``(access suffix, item)`` pairs of a plain container, at most a bounded number."""
    if kind == "namedtuple":
        return ((f".{f}", getattr(value, f)) for f in value._fields[:_MAX_CONTAINER_ITEMS])
    if kind == "list":
        return ((f"[{i}]", item) for i, item in enumerate(value[:_MAX_CONTAINER_ITEMS]))
    if kind == "dict":
        return ((f"[{k!r}]", item) for k, item in itertools.islice(value.items(), _MAX_CONTAINER_ITEMS))
    return ((f".{f.name}", getattr(value, f.name, None))
            for f in dataclasses.fields(value)[:_MAX_CONTAINER_ITEMS])


def contained(module: nn.Module) -> Iterable[tuple[str, Any, tuple[str, ...]]]:
    """The tensors and modules a module keeps in plain containers among its attributes.

    Walks lists, tuples, dicts, namedtuples and dataclass instances, nested up to a bounded
    depth, without entering tensors or modules. Yields ``(access path, value, containers)``
    where ``containers`` names the plain containers on the path, outermost first; a tensor or
    module held directly as an attribute is yielded with no containers.
    """
    for attr, value in vars(module).items():
        if attr in _MODULE_INTERNALS:
            continue
        stack: list[tuple[str, Any, tuple[str, ...]]] = [(attr, value, ())]
        while stack:
            path, item, kinds = stack.pop()
            if isinstance(item, (torch.Tensor, nn.Module)):
                yield path, item, kinds
                continue
            kind = _container_kind(item) if len(kinds) < _MAX_CONTAINER_DEPTH else None
            if kind is None:
                continue
            # Reversed onto the stack: items come out in their order.
            stack.extend(reversed([(path + suffix, sub, kinds + (kind,)) for suffix, sub in _container_items(item, kind)]))


class Inventory:
    """Names, owners and optimizer membership of every tensor leafwatch looks at."""

    def __init__(
        self,
        model: nn.Module | Mapping[str, nn.Module] | None,
        optimizers: Sequence[torch.optim.Optimizer] = (),
    ) -> None:
        # Several roots (``leafwatch run`` finds them by watching modules run) get a name prefix each.
        roots = model if isinstance(model, Mapping) else ({"": model} if model is not None else {})
        self.roots: dict[str, nn.Module] = {prefix: unwrap(m) for prefix, m in roots.items()}
        self.model = next(iter(self.roots.values()), None)
        self.params: dict[int, ParamInfo] = {}
        self.tensors: dict[int, torch.Tensor] = {}
        self.buffers: set[int] = set()
        self.module_names: dict[int, str] = {}
        self.modules: dict[str, nn.Module] = {}
        for prefix, root in self.roots.items():
            self._read_model(root, prefix)
        self.optimizers = list(optimizers)
        self.optimizer_params: list[list[torch.Tensor]] = [
            [p for group in opt.param_groups for p in group["params"]] for opt in self.optimizers
        ]
        self.in_optimizer: set[int] = {id(p) for ps in self.optimizer_params for p in ps}

    # -- the model ---------------------------------------------------------------------------
    def _read_model(self, model: nn.Module, prefix: str = "") -> None:
        for module_name, module in model.named_modules(remove_duplicate=False, prefix=prefix):
            name = clean_name(module_name)
            self.modules.setdefault(name, module)
            self.module_names.setdefault(id(module), name)
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
            for b in module._buffers.values():
                if b is not None:
                    self.buffers.add(id(b))

    def name(self, t: torch.Tensor) -> str | None:
        info = self.params.get(id(t))
        return info.name if info is not None else None

    def known_names(self) -> dict[int, str]:
        return {k: v.name for k, v in self.params.items()}

    def all_names(self) -> set[str]:
        """Every name a finding on this structure can have: parameters, aliases, orphans."""
        names = {info.name for info in self.params.values()}
        names |= {a for info in self.params.values() for a in info.aliases}
        return names | {o.name for o in self.orphans()}

    def trainable(self) -> list[tuple[ParamInfo, torch.Tensor]]:
        return [(self.params[k], t) for k, t in self.tensors.items() if t.requires_grad]

    # -- orphans -----------------------------------------------------------------------------
    def orphans(self) -> list[Orphan]:
        """Tensors that need grad but are not registered: plain attributes, Python lists/dicts."""
        if self.model is None:
            return []
        registered = set(self.tensors) | self.buffers
        found: list[Orphan] = []
        seen: set[int] = set()

        def consider(name: str, value: Any, container: str, kinds: tuple[str, ...]) -> None:
            if isinstance(value, torch.Tensor):
                if id(value) in registered or id(value) in seen or not value.requires_grad:
                    return
                if not value.is_leaf and self._derived_from_parameters(value):
                    # weight_norm / spectral_norm / pruning weights, and stored outputs or losses:
                    # computed from the model's own parameters, not would-be parameters.
                    return
                seen.add(id(value))
                found.append(Orphan(name, value, container, containers=kinds))
            elif isinstance(value, nn.Module) and container != "attribute":
                for sub, p in value.named_parameters():
                    if id(p) in registered or id(p) in seen or not p.requires_grad:
                        continue
                    seen.add(id(p))
                    found.append(Orphan(f"{name}.{clean_name(sub)}", p, container, module_in_container=True,
                                        containers=kinds))

        for module_name, module in self.modules.items():
            prefix = f"{module_name}." if module_name else ""
            for path, value, kinds in contained(module):
                if not kinds:
                    if isinstance(value, torch.Tensor):
                        consider(prefix + path, value, "attribute", kinds)
                    continue
                consider(prefix + path, value, kinds[-1], kinds)
        return found

    def _derived_from_parameters(self, t: torch.Tensor) -> bool:
        """Whether a non-leaf was computed from at least one registered parameter.

        Any one is enough: a loss kept in ``self.outputs`` that also depends on an orphan is
        not a parameter itself (the orphan is reported on its own).
        """
        leaves, complete = graph.leaves_of(t.grad_fn, limit=2_000)
        if not complete:
            return True
        return any(id(leaf) in self.tensors for leaf in leaves)

    # -- the optimizers ----------------------------------------------------------------------
    def foreign_optimizer_tensors(self) -> list[tuple[int, torch.Tensor]]:
        """Tensors an optimizer holds that the model does not register, with the optimizer index."""
        out = []
        for i, ps in enumerate(self.optimizer_params):
            for p in ps:
                if id(p) not in self.tensors:
                    out.append((i, p))
        return out


def normalize_optimizers(optimizers: Any, argument: str = "optimizers") -> list[torch.optim.Optimizer]:
    """One optimizer or a sequence of them -> a list; anything else is a TypeError."""
    if optimizers is None:
        return []
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    if isinstance(optimizers, (list, tuple)):
        out = []
        for i, opt in enumerate(optimizers):
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(
                    f"`{argument}` must be a torch.optim.Optimizer or a sequence of them, "
                    f"got {got(opt)} at index {i}"
                )
            out.append(opt)
        return out
    raise TypeError(
        f"`{argument}` must be a torch.optim.Optimizer or a sequence of them, "
        f"got {got(optimizers)}"
    )


def normalize_model(model: Any, argument: str = "model") -> nn.Module | None:
    if model is None or isinstance(model, nn.Module):
        return model
    hint = " (an optimizer goes second: `Monitor(model, optimizer)`)" if isinstance(model, torch.optim.Optimizer) else ""
    raise TypeError(f"`{argument}` must be a torch.nn.Module, got {got(model)}{hint}")


def normalize_tensors(tensors: Any, argument: str = "tensors") -> dict[str, torch.Tensor]:
    """A mapping name -> tensor, or a sequence of tensors (named ``tensors[i]``)."""
    if tensors is None:
        return {}
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"`{argument}` must be a mapping name -> tensor or a sequence of tensors, got a single Tensor; pass [t] or {{'name': t}}")
    if isinstance(tensors, Mapping):
        items: Iterable[tuple[Any, Any]] = tensors.items()
    elif isinstance(tensors, (list, tuple)):
        items = ((f"tensors[{i}]", t) for i, t in enumerate(tensors))
    else:
        raise TypeError(
            f"`{argument}` must be a mapping name -> tensor or a sequence of tensors, got {got(tensors)}"
        )
    out: dict[str, torch.Tensor] = {}
    for name, t in items:
        if not isinstance(name, str):
            raise TypeError(f"`{argument}` keys must be str, got {got(name)}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"`{argument}[{name!r}]` must be a torch.Tensor, got {got(t)}")
        out[name] = t
    return out

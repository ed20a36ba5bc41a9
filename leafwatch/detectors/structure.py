"""The structure detector: what a reading of the model and its optimizers says, before any gradient.

A pure function of the :class:`~leafwatch.observe.inventory.Inventory` (and of the names the last
reading saw): trainable tensors in no optimizer, frozen ones kept in one, optimizers that hold
replaced tensors (stale optimizers), trainable tensors kept where ``.parameters()`` never looks
(a plain list or dict: orphans), tensors on another device or dtype than the rest of the model.
:func:`verdicts` turns a reading into the history's verdicts: what the last reading found and
this one does not is resolved.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from . import fixes, leaves, membership, ranks, rebuild
from ..observe import graph
from ..report.findings import STRUCTURAL_KINDS, WAITING_KINDS, Finding, Waiting
from ..report.history import FindingsView
from ..observe.inventory import Inventory, Orphan, is_uninitialized, shape_of, shape_text
from ..report.verdicts import Verdict, Verdicts
from ..observe import replaced
from .constructors import make
from ..report.reasons import Reason, Span
from ..report.words import ADVICE, Members, Remedy, Words, code
from .leaves import non_leaf
from .watched import watched_findings
from ..observe.evidence import INVENTORY, REBUILT, SEEN, STEP, Evidence


def scan(evidence: Evidence, state: None, view: FindingsView) -> Verdicts:
    """Before any gradient exists: the structure (read for the scan), and what is wrong already (a watched non-leaf)."""
    out = _reading(evidence, view, evidence[REBUILT], before_gradients=True)
    entries = evidence[SEEN].watch_entries()
    return out + [Verdict.open(f) for f in watched_findings(
        entries, evidence[STEP], {e.name: True for e in entries}, evidence[INVENTORY])]


def judge(evidence: Evidence, state: None, view: FindingsView) -> Verdicts | None:
    """At a check: what a new reading of the structure says (nothing when it did not change)."""
    return _reading(evidence, view, evidence[REBUILT]) if evidence[REBUILT] is not None else None


def _reading(evidence: Evidence, view: FindingsView, inv: Inventory, before_gradients: bool = False) -> Verdicts:
    """A reading of the structure: its verdicts. A trainable tensor of the model in no optimizer is
    held for the optimizer-membership check (:mod:`leafwatch.detectors.membership`), which decides by
    the gradient rule; before any gradient, every finding of a kind that may wait is held for the first check."""
    cache, step = evidence[SEEN].cache, evidence[STEP]
    found = structural(inv, step=step, previous_names=cache.previous_names, stale=cache.stale, seen_frozen=cache.seen_frozen)
    shown, held = [], []
    model_tensors = {info.name for info in inv.params.values()}
    for f in found:
        if f.kind == "not_in_optimizer" and f.name in model_tensors:
            held.append(f.with_details(pending=Waiting.MEMBERSHIP))
        elif before_gradients and f.kind in WAITING_KINDS:
            held.append(f.with_details(pending=Waiting.STRUCTURE))
        else:
            shown.append(f)
    out = verdicts(view, shown, step, held)
    sharded = ranks.sharded_finding(cache.grad_view, step)
    if sharded is not None and view.get(sharded.key) is None and all(f.key != sharded.key for f in shown):
        out.append(Verdict.open(sharded))
    return out


def verdicts(view: FindingsView, found: Iterable[Finding], step: int | None,
             held: Iterable[Finding] = ()) -> Verdicts:
    """A new reading of the structure: open structural findings not in ``found`` are resolved,
    ``found`` is opened and ``held`` (structural suspicions that wait for a check) is held; a
    hold never takes back a finding already shown.
    """
    new = {f.key: f for f in found}
    waiting = {f.key: f for f in held}
    # A tensor outside the model (detectors.outside) is judged at checks, not from the structure.
    out: Verdicts = [Verdict.resolve(f.key, step) for f in view
                     if f.kind in STRUCTURAL_KINDS and f.key not in new and f.key not in waiting
                     and not f.details.get("outside")]
    out += [Verdict.open(f) for f in new.values()]
    out += [Verdict.hold(f) for f in waiting.values()]
    return out


def structural(inventory: Inventory, *, step: int | None,
               previous_names: Mapping[int, str] | None = None,
               stale: replaced.Replaced | None = None,
               seen_frozen: set[int] | frozenset[int] = frozenset()) -> list[Finding]:
    """Optimizer membership, stale and frozen tensors, orphans and devices: no gradient needed.

    ``stale`` is :func:`leafwatch.observe.replaced.pair` of this inventory when the caller has it already.
    """
    return [*_optimizer_membership(inventory, step, previous_names or {}, stale, seen_frozen),
            *(_orphan_finding(orphan, inventory, step) for orphan in inventory.orphans()), *_devices(inventory, step)]


def _optimizer_membership(inv: Inventory, step: int | None, previous_names: Mapping[int, str],
                          stale: replaced.Replaced | None, seen_frozen: set[int] | frozenset[int]) -> list[Finding]:
    if not inv.optimizers:
        return []
    out: list[Finding] = []
    for i, params in enumerate(inv.optimizer_params):
        for j, p in enumerate(params):
            if not p.is_leaf:
                name = inv.name(p)
                found = non_leaf(name or f"the {shape_text(p)} at index {j} of optimizer {i}", p, step=step,
                                 inventory=inv, where=" (held by an optimizer)")
                out.append(found if name else found.with_details(described=True))
    excluded = {k: (info, inv.tensors[k]) for k, info in inv.params.items()
                if k not in inv.in_optimizer and inv.tensors[k].requires_grad}
    found = stale if stale is not None else replaced.pair(inv, previous_names)
    olds = {id(pair.new): pair for pair in found.pairs}
    for k in {**olds, **found.swapped}:
        excluded.pop(k, None)
        out.append(_module_replaced(k, found.swapped[k], step, inv) if k in found.swapped
                   else stale_param(olds[k], step, inv))
    for i, old in sorted(found.unpaired.items()):
        out.append(stale_group(i, old, step, inv, harmless=not found.unstepped))
    for k, (info, p) in excluded.items():
        if k in seen_frozen:
            out.append(make(UnfrozenAfter(target=fixes.inventory_target(inv),
                                          param_code=fixes.model_tensor_code(info.name, inv)),
                            info.name, "error", tensor=p, step=step, aliases=info.aliases))
            continue
        out.append(membership.not_in_optimizer(info, p, step=step, inventory=inv))
    out.extend(_frozen_in_optimizer(inv, step))
    return out


def _frozen_in_optimizer(inv: Inventory, step: int | None) -> list[Finding]:
    """Tensors an optimizer holds that do not require grad: a plain tensor (an error: it was
    meant to train), a frozen parameter or a registered buffer (information: the optimizer skips
    it). The frozen ones of one optimizer are one mistake, named by the optimizer."""
    out: list[Finding] = []
    for i, params in enumerate(inv.optimizer_params):
        holder: str | None = None
        for j, p in enumerate(params):
            if p.requires_grad:
                continue
            buffer, name = inv.buffer_names.get(id(p)), inv.name(p)
            plain = buffer is None and not isinstance(p, torch.nn.Parameter)
            if name is None and buffer is None and not plain:
                continue
            if not plain and holder is None:
                holder = fixes.variable_for(inv.optimizers[i], inv.variables, inv.fix_names) or f"optimizers[{i}]"
            if buffer is not None:
                out.append(make(Buffer(optimizer=i), buffer, "info", tensor=p, step=step, optimizer=i, group=holder))
                continue
            named = {} if name else {"described": True}
            reason = _plain_tensor(p, i, inv) if plain else Frozen(optimizer=i)
            name = name or f"the {shape_text(p)} at index {j}"
            out.append(make(reason, name, "error" if plain else "info",
                            tensor=p, step=step, optimizer=i, **named, **({} if plain else {"group": holder})))
    return out


class Buffer(Reason, kind="frozen_in_optimizer", name="buffer", fixes="never"):
    """Optimizer ``optimizer`` holds a registered buffer: harmless, it gets no gradient."""

    optimizer: int

    def words(self, m: Members) -> Words:
        i = self.optimizer
        if m.single:
            message = (f"optimizer {i} holds the buffer {m.who}, which is not a parameter: it gets no gradient, "
                       "so the optimizer skips it.")
        else:
            message = (f"optimizer {i} holds the buffers `{m.name}`, which are not parameters: they get no gradient, "
                       "so the optimizer skips them.")
        return Words(message,
                     f"{m.who} is a registered buffer, handed to the optimizer with the parameters (an optimizer "
                     "built from a state dict's or a TensorDict's values rather than from `parameters()`).",
                     "nothing, it is harmless; to keep the optimizer to what trains, build it from `parameters()`")


def _plain_tensor(p: torch.Tensor, i: int, inv: Inventory) -> PlainTensor:
    """:class:`PlainTensor` of ``p``, held by optimizer ``i``: with the user's statement that made it rewritten to
    make a tensor that requires grad (``log_var = torch.zeros(1).requires_grad_()``), where the user's variable
    for it and its assignment are found."""
    # an integer tensor cannot require grad: no code asks it to
    variable = fixes.variable_for(p, inv.variables, inv.fix_names) if p.is_floating_point() or p.is_complex() else None
    if variable is None or not all(part.isidentifier() for part in variable.split(".")):
        return PlainTensor(optimizer=i)
    leaf = fixes.leaf_fix_args(variable, None, tensor=p)
    return PlainTensor(optimizer=i, variable=variable, leaf_code=leaf.leaf_code, at=leaf.at)


class PlainTensor(Reason, kind="frozen_in_optimizer", name="plain_tensor", fixes="sometimes"):
    """Optimizer ``optimizer`` holds a plain tensor created without ``requires_grad=True``: the user's
    ``variable`` for it, and its assignment rewritten to ask for grad (``leaf_code``, standing ``at``)."""

    optimizer: int
    variable: str | None = None
    leaf_code: str | None = None
    at: Span | None = None

    def words(self, m: Members) -> Words:
        snippet, at = self.leaf_code, self.at
        fix, remedy = "create it with `requires_grad=True`", ADVICE
        if snippet is not None and m.single:
            fix, remedy = f"{fix}: `{snippet}`", code(snippet, None if at is None else at.put(snippet, "replace"))
        return Words(f"optimizer {self.optimizer} holds {m.who}, which does not require grad: it will not train.",
                     "a plain tensor created without `requires_grad=True` was passed to the optimizer", fix, remedy)


class Frozen(Reason, kind="frozen_in_optimizer", name="frozen", fixes="never"):
    """Optimizer ``optimizer`` holds a frozen parameter: it skips it."""

    optimizer: int

    def words(self, m: Members) -> Words:
        return Words(f"optimizer {self.optimizer} holds {m.who}, which is frozen (requires_grad=False): "
                     "the optimizer skips it.",
                     f"{m.who} is frozen (requires_grad=False) but still listed in the optimizer.",
                     "nothing, if freezing is intended; to train it call `requires_grad_(True)`")


class UnfrozenAfter(Reason, kind="not_in_optimizer", name="unfrozen_after"):
    """Frozen when the optimizer was built and unfrozen after it, without being added to it."""

    target: fixes.Target
    param_code: str | None = None

    def words(self, m: Members) -> Words:
        if self.target.framework == "lightning":
            fix, remedy = ("when unfreezing, add it to the optimizer too: Lightning's "
                           "`BaseFinetuning.unfreeze_and_add_param_group` does both, for the modules you unfreeze"), ADVICE
        else:
            add, remedy = fixes.add_words(fixes.params_of(m.each("param_code")), self.target)
            fix = "when unfreezing, " + add
        return Words(f"{m.who} requires grad but is in no optimizer: it gets gradients and never changes.",
                     f"{m.who} was frozen when the optimizer was built and unfrozen after it "
                     "(`requires_grad_(True)`), without being added to the optimizer.", fix, remedy)


_LIGHTNING_REBUILD = ("build the optimizer in `configure_optimizers` after the model is changed (in `setup` or "
                      "`__init__`), so that it holds the {which} parameters")


def _chosen(inv: Inventory, optimizer: int | None) -> list[Any]:
    optimizers = inv.optimizers
    return [optimizers[optimizer]] if optimizer is not None and 0 <= optimizer < len(optimizers) else list(optimizers)


def _replaced_at(new: torch.Tensor, inv: Inventory, target: fixes.Target) -> Span | None:
    """Where the user's statement that made the new tensor stands, when the registration hooks saw it
    made: of the user's frames that ran the registration (innermost first:
    ``Hetero.__init__``'s ``setattr``, then ``model = Hetero(model)``), the first statement that stands
    after the optimizer's in its scope (:func:`~leafwatch.detectors.rebuild.after_change`). A fix that adds the new tensors goes there,
    not after the optimizer's statement, where the name still holds the old module; none found (or not
    seen made: after the optimizer's statement the fix would name tensors not made yet): None, the fix
    is not placed."""
    seen = inv.appeared(new, 0)
    if seen is not None:
        return rebuild.after_change(target.at, seen[2])
    # not seen made (a deep copy registers nothing): the user's last assignment of the model's variable
    model = inv.model
    variable = fixes.variable_for(model, inv.variables, inv.fix_names) if isinstance(model, torch.nn.Module) else None
    span = fixes.assigned_at(model, variable) if variable else None
    return None if span is None else rebuild.after_change(target.at, [f"{span.path}:{span.start}"])


class Replaced(Reason, kind="stale_param"):
    """What a tensor that replaced an old one an optimizer still holds shares: the optimizer (its index, and
    ``target``: the user's), the code of the new tensors and where the last of them was made."""

    optimizer: int
    target: fixes.Target
    param_code: str | None = None
    module_params: str | None = None
    replaced_span: Span | None = None
    rebuilt: rebuild.Rebuilt | None = None

    def rebuild(self, m: Members) -> tuple[str, Remedy]:
        """Build the optimizer after the last change to the model (same class, groups and settings), else give the
        new tensors to the optimizer that holds the old ones."""
        target = self.target
        if target.framework == "lightning":
            return _LIGHTNING_REBUILD.format(which="new"), ADVICE
        spans = m.each("replaced_span")  # after the last statement that made a new one (none found: not placed)
        built = rebuild.after_last(spans, m.each("rebuilt"))
        if built is not None:
            return rebuild.words(built, target.variable), code(built.code, built.edit)
        target = dataclasses.replace(target, at=max(spans, key=lambda s: s.end) if all(spans) else None)
        which = f"`{target.variable}`" if target.variable else "your optimizer"
        params = m.shared("module_params") or fixes.params_of(m.each("param_code"))
        add, remedy = fixes.add_words(params, target, what="the new parameters")
        return add + f"; or rebuild {which} after the last change to the model, with the same class and groups", remedy


def _regroup_fix(target: fixes.Target) -> str:
    """Old tensors no current parameter replaced: rebuild the optimizer that holds them."""
    if target.framework == "lightning":
        return _LIGHTNING_REBUILD.format(which="current")
    which = f"`{target.variable}` (your `{target.cls}`)" if target.variable else "your optimizer"
    return (f"rebuild {which} after the last change to the model, with the same class, groups and settings, "
            "so that it holds the current parameters")


def stale_param(pair: replaced.Pair, step: int | None, inv: Inventory) -> Finding:
    """The optimizer steps the old tensor of ``pair.name``; the model's current one is in no optimizer."""
    old_shape, new_shape = shape_of(pair.old), shape_of(pair.new)
    target = fixes.inventory_target(inv, _chosen(inv, pair.optimizer))
    at = _replaced_at(pair.new, inv, target)
    reason = ReplacedTensor(optimizer=pair.optimizer, target=target, param_code=fixes.model_tensor_code(pair.name, inv),
                            replaced_span=at, rebuilt=rebuild.rebuilt(target.at, at, target.variable),
                            old_shape=tuple(old_shape) if old_shape is not None else None,
                            new_shape=tuple(new_shape) if new_shape is not None else None)
    return make(reason, pair.name, "error", tensor=pair.new, step=step, optimizer=pair.optimizer,
                old_shape=list(old_shape) if old_shape is not None else None, paired_by=pair.how,
                group=stale_group_key(pair.optimizer))


class ReplacedTensor(Replaced, name="replaced"):
    """The tensor replaced one the optimizer still holds (``old_shape``: None for an uninitialized lazy one)."""

    old_shape: tuple[int, ...] | None = None
    new_shape: tuple[int, ...] | None = None

    def words(self, m: Members) -> Words:
        if any(r.old_shape is None for r in m.reasons):
            cause = (f"the optimizer was built before the lazy module's first forward and the model was then "
                     f"copied or rebuilt: the optimizer holds the uninitialized original of {m.who}, which never "
                     "materializes and gets no gradient.")
        else:
            resized = [(r.old_shape, r.new_shape) for r in m.reasons if r.new_shape not in (None, r.old_shape)]
            shown = "" if not resized else (
                f", resized from {tuple(resized[0][0])} to {tuple(resized[0][1])}"
                if m.single or len(resized) == len(m.reasons) and len(set(map(str, resized))) == 1 else ", resized")
            cause = (f"{m.who} was replaced after the optimizer was built{shown} (a new layer, a resize, a swapped "
                     "module, or `model.to()` making new Parameters); the optimizer updates the old tensor, which the "
                     "model no longer uses and which gets no gradient.")
        fix, remedy = self.rebuild(m)
        return Words(f"{m.who} is in no optimizer and never changes: optimizer {self.optimizer} still holds the "
                     "tensor it replaced.", cause, fix, remedy)


def _module_replaced(k: int, swapped: tuple[str, int], step: int | None, inv: Inventory) -> Finding:
    """A tensor of a module replaced after the optimizer was built by one with new tensors that replaced
    nothing (``to_hetero``'s copies per edge type, a bigger head): the fix gives the optimizer the module."""
    (module, i), info = swapped, inv.params[k]
    code_ = fixes.variable_for(inv.roots[module], inv.variables, inv.fix_names) if module in inv.roots \
        else fixes.model_tensor_code(module, inv)
    target = fixes.inventory_target(inv, _chosen(inv, i))
    at = _replaced_at(inv.tensors[k], inv, target)
    reason = ModuleReplaced(optimizer=i, owner=code_ or module, target=target,
                            module_params=code_ and fixes.trainable_params_code(code_, inv.modules[module]),
                            param_code=fixes.model_tensor_code(info.name, inv), replaced_span=at,
                            rebuilt=rebuild.rebuilt(target.at, at, target.variable))
    return make(reason, info.name, "error", tensor=inv.tensors[k], step=step, optimizer=i, aliases=info.aliases,
                group=stale_group_key(i))


class ModuleReplaced(Replaced, name="module_replaced"):
    """The module ``owner`` was replaced by one with other tensors; the optimizer holds only the old ones."""

    owner: str = ""

    def words(self, m: Members) -> Words:
        owner, i = self.owner, self.optimizer
        owner = f"`{owner}`" if owner else "the model"
        fix, remedy = self.rebuild(m)
        return Words(
            f"{m.who} is in no optimizer and never changes: optimizer {i} still holds the old tensors of {owner}.",
            f"{owner} was replaced after the optimizer was built by a module with other tensors (a conversion such as "
            f"`to_hetero`, a new layer, a copy): optimizer {i} updates the old tensors, which get no gradient, and no "
            "optimizer holds any of the new ones.", fix, remedy)


def stale_group_key(optimizer: int) -> str:
    """The mistake every ``stale_param`` finding of one optimizer belongs to: the stale optimizer."""
    return f"optimizers[{optimizer}]"


def stale_group(optimizer: int, old: list[tuple[torch.Tensor, str | None]], step: int | None,
                inv: Inventory, harmless: bool) -> Finding:
    """The old tensors of one optimizer that no current parameter replaced: one finding for all.

    ``harmless``: every live parameter of the model is stepped (the fix was applied, or layers were
    only removed): the leftovers get no gradient and the optimizer skips them; information.
    """
    n, names = len(old), [name for _, name in old if name is not None]
    lazy = sum(1 for t, _ in old if is_uninitialized(t))
    details = dict(step=step, optimizer=optimizer, count=n, old_names=names, uninitialized=lazy,
                   group=stale_group_key(optimizer), old_shapes=[None if s is None else list(s) for s in (shape_of(t) for t, _ in old)])
    reason = (Leftovers if harmless else OldTensors)(optimizer=optimizer, count=n, old_names=tuple(names), lazy=lazy,
                                                      target=fixes.inventory_target(inv, _chosen(inv, optimizer)))
    return make(reason, stale_group_key(optimizer), "info" if harmless else "error", **details,
                **({"leftovers": True} if harmless else {}))


def _formerly(names: list[str]) -> str:
    return f" (formerly {', '.join(f'`{x}`' for x in names[:5])}{', ...' if len(names) > 5 else ''})" if names else ""


class Stale(Reason, kind="stale_param"):
    """Old tensors of optimizer ``optimizer`` that no current parameter replaced (``lazy`` of them never
    materialized), formerly named ``old_names``."""

    optimizer: int
    count: int
    old_names: tuple[str, ...]
    lazy: int
    target: fixes.Target


class OldTensors(Stale, name="old_tensors", fixes="never"):
    """The model changed after the optimizer was built, and nothing it uses now is stepped in place of them."""

    def words(self, m: Members) -> Words:
        n, lazy = self.count, self.lazy
        uninitialized = "" if not lazy else (
            f" {lazy} of them {'are' if lazy != 1 else 'is'} still uninitialized: the optimizer was built "
            "before the lazy modules' first forward and the model was then copied or rebuilt, so "
            f"{'they' if lazy != 1 else 'it'} will never materialize.")
        cause = ("the model changed after the optimizer was built (layers removed, replaced or swapped); the "
                 f"optimizer still holds the old tensors, which nothing uses.{uninitialized}")
        return Words(
            f"optimizer {self.optimizer} holds {n} tensor{'s' if n != 1 else ''} that "
            f"{'are' if n != 1 else 'is'} no longer {'parameters' if n != 1 else 'a parameter'} of the model "
            f"and get{'s' if n == 1 else ''} no gradient{_formerly(list(self.old_names))}.", cause,
            _regroup_fix(self.target))


class Leftovers(Stale, name="leftovers", fixes="never"):
    """Old tensors an optimizer still holds once every live parameter is stepped: harmless, costs memory."""

    def words(self, m: Members) -> Words:
        n, lazy, i = self.count, self.lazy, self.optimizer
        them = "them" if n != 1 else "it"
        uninitialized = "" if not lazy else (
            f" {lazy} of them {'are' if lazy != 1 else 'is'} uninitialized lazy parameters that can no longer "
            "materialize.")
        cause = (f"the model changed after the optimizer was built and every parameter it uses now is stepped; the "
                 f"old tensor{'s' if n != 1 else ''} stay{'' if n != 1 else 's'} in optimizer {i}, which "
                 f"skips {them} (no gradient). Harmless, but {them} and {'their' if n != 1 else 'its'} optimizer "
                 f"state cost memory.{uninitialized}")
        return Words(
            f"optimizer {i} still holds {n} old tensor{'s' if n != 1 else ''} the model no longer "
            f"uses{_formerly(list(self.old_names))}: harmless, costs memory.",
            cause, "nothing needed; to free the memory, " + _regroup_fix(self.target))


def _orphan_finding(orphan: Orphan, inv: Inventory, step: int | None) -> Finding:
    t, name = orphan.tensor, orphan.name
    trains = id(t) in inv.in_optimizer
    kinds = orphan.containers or ((orphan.container,) if orphan.container != "attribute" else ())
    attr = name.split("[")[0].split(".")[-1]
    severity = "warning" if trains else "error"
    if kinds:
        fix = fixes.container_args(_owner(inv, name), attr, kinds)
        reason: Orphaned = (ModuleInContainer if orphan.module_in_container else TensorInContainer)(trains=trains, fix=fix)
        return make(reason, name, severity, tensor=t, step=step, container=orphan.container, containers=list(kinds))
    assigned = fixes.parameter_args(_owner(inv, name), name.split(".")[-1])
    if not t.is_leaf:
        found = graph.origin(t)
        return make(NonLeafAttribute(trains=trains, origin=leaves.origin_of(found, inv.known_names()), fix=assigned),
                    name, severity, tensor=t, step=step, container="attribute", op=found.op if found else None)
    return make(PlainAttribute(trains=trains, fix=assigned), name, severity, tensor=t, step=step, container="attribute")


class Orphaned(Reason, kind="orphan_tensor"):
    """A tensor that requires grad held where the model does not register it (``trains``: an optimizer holds it)."""

    trains: bool

    def effect(self) -> str:
        return ("it trains, but `state_dict()` does not save it and `.to()` does not move it"
                if self.trains else "no optimizer built from `model.parameters()` sees it, so it never trains")


class ModuleInContainer(Orphaned, name="module_in_container"):
    """A module kept in a plain container (``fix``: the container and its assignment)."""

    fix: fixes.Container

    def words(self, m: Members) -> Words:
        where = _describe_containers(self.fix.kinds)
        fix, remedy = fixes.container_fix(self.fix, modules=True)
        return Words(f"{m.who} belongs to a module kept in {where}: it is not registered, {self.effect()}.",
                     f"the module is stored in {where}, which `nn.Module` does not look into.", fix, remedy)


class TensorInContainer(Orphaned, name="tensor_in_container"):
    """A tensor kept in a plain container (``fix``: the container and its assignment)."""

    fix: fixes.Container

    def words(self, m: Members) -> Words:
        where = _describe_containers(self.fix.kinds)
        fix, remedy = fixes.container_fix(self.fix, modules=False)
        return Words(f"{m.who} requires grad but sits in {where}: it is not registered, {self.effect()}.",
                     f"tensors in {where} are not parameters of the module.", fix, remedy)


class NonLeafAttribute(Orphaned, name="non_leaf_attribute"):
    """A module attribute that is a non-leaf tensor (``origin``: what made it; ``fix``: its assignment)."""

    origin: leaves.Origin | None
    fix: fixes.Assigned

    def words(self, m: Members) -> Words:
        origin = self.origin
        leaf = origin.leaf if origin is not None else None
        of_a_parameter = leaf is not None and leaf.is_parameter and origin.kind in ("device", "dtype", "copy")  # type: ignore[union-attr]
        note = (" Calling `.to()`/`.cuda()`/`.double()` on an `nn.Parameter` returns a plain non-leaf tensor, not a "
                "Parameter.") if of_a_parameter else ""
        fix, remedy = fixes.parameter_fix(self.fix)
        return Words(f"module attribute {m.who} is a non-leaf tensor, not a Parameter: {self.effect()}, and it has no "
                     ".grad.", leaves.origin_cause(m.name, origin) + note, fix, remedy)


class PlainAttribute(Orphaned, name="plain_attribute"):
    """A module attribute that requires grad but is a plain tensor (``fix``: its assignment)."""

    fix: fixes.Assigned

    def words(self, m: Members) -> Words:
        fix, remedy = fixes.parameter_fix(self.fix)
        return Words(f"module attribute {m.who} requires grad but is a plain tensor, not an `nn.Parameter`: "
                     f"{self.effect()}.", "a tensor assigned as a module attribute is not registered, even with "
                     "`requires_grad=True`.", fix, remedy)


_CONTAINER_WORDS = {"list": "a plain Python list", "dict": "a plain Python dict",
                    "dataclass": "a dataclass", "namedtuple": "a namedtuple"}


def _describe_containers(kinds: tuple[str, ...]) -> str:
    """``("dict", "dict")`` -> "a plain Python dict inside a plain Python dict" (innermost first)."""
    return " inside ".join(_CONTAINER_WORDS.get(k, k) for k in reversed(kinds))


def _owner(inv: Inventory, name: str) -> Any:
    """The module that holds the attribute an orphan's name starts with (``sub.blocks[0].w`` -> ``sub``)."""
    return inv.modules.get(name.split("[")[0].rpartition(".")[0])


def _devices(inv: Inventory, step: int | None) -> list[Finding]:
    """Device and dtype differences that silently change training (see :func:`device_on_purpose`,
    :func:`dtype_changes_training`); deliberate ones (an fp32 island in a half model, a module
    placed on another device) are no finding."""
    trainable = [(info, p) for info, p in inv.trainable() if p.is_floating_point()]
    if len(trainable) < 2:
        return []
    out = []
    devices = Counter(p.device for _, p in trainable)
    dtypes = Counter(p.dtype for _, p in trainable)
    main_device, main_dtype = devices.most_common(1)[0][0], dtypes.most_common(1)[0][0]
    below: dict[str, set[str]] = {}
    if len(devices) > 1:
        for info, p in trainable:
            parts = info.module.split(".") if info.module else []
            for depth in range(len(parts) + 1):
                below.setdefault(".".join(parts[:depth]), set()).add(str(p.device))
    spread = spread_on_purpose(inv)
    for info, p in trainable:
        if p.device != main_device:
            if device_on_purpose(info.module, str(p.device), below, spread):
                continue
            moved = {"device": str(p.device), "main_device": str(main_device)}
        elif p.dtype != main_dtype:
            if not dtype_changes_training(p.dtype, main_dtype):
                continue
            moved = {"dtype": str(p.dtype), "main_dtype": str(main_dtype)}
        else:
            continue
        model = fixes.variable_for(inv.model, inv.variables, inv.fix_names) if inv.model is not None else None
        out.append(make(Device(**moved, model=model), info.name, "warning", tensor=p, step=step, aliases=info.aliases))
    return out


class Device(Reason, kind="device_mismatch", name="device"):
    """A trainable tensor on another ``device`` (or ``dtype``) than the rest of the model (``main_device``,
    ``main_dtype``); ``model``: the user's variable for the model."""

    device: str | None = None
    main_device: str | None = None
    dtype: str | None = None
    main_dtype: str | None = None
    model: str | None = None

    def words(self, m: Members) -> Words:
        if self.device is not None:
            what = f"on {self.device} while the other trainable parameters are on {self.main_device}"
            cause = ("it was created or moved separately from the rest of its module: a tensor on "
                     "another device than the module it belongs to is no placement plan (device_map "
                     "and pipeline stages place whole modules), and a 0-dim one is silently moved "
                     "at every use.")
            to, remedy = _model_to(self.model, repr(self.main_device))
            fix = "move it with the model: register it as a Parameter/buffer of the module and " + to
        else:
            dtype, main = str(self.dtype), str(self.main_dtype)
            short, main_short = dtype.replace("torch.", ""), main.replace("torch.", "")
            what = f"{short} while the other trainable parameters are {main_short}"
            if dtype == "torch.float64":
                cause = ("it was created separately from the rest of the model (a NumPy array is "
                         "float64): it promotes whatever it touches to float64.")
            else:
                cause = (f"it was created or converted separately from the rest of the model: its updates "
                         f"are rounded to {short}, so steps smaller than its resolution are lost "
                         "without an error.")
            to, remedy = _model_to(self.model, main)
            fix = f"create it with `dtype={main}`, or convert the model as a whole: " + to
        return Words(f"{m.who} is {what}.", cause, fix, remedy)


def _model_to(model: str | None, where: str) -> tuple[str, Remedy]:
    """``model.to('cuda:0')`` on the user's variable for the model, else in words."""
    snippet = f"{model}.to({where})"
    if model is not None and fixes.is_code(snippet):
        return f"`{snippet}`", code(snippet)
    return f"call `.to({where})` on your model", ADVICE


def spread_on_purpose(inv: Inventory) -> bool:
    """Whether a root module says it was spread over devices on purpose (``device_map``)."""
    roots = inv.modules.get("")
    candidates = [roots] if roots is not None else [m for n, m in inv.modules.items() if "." not in n]
    return any(getattr(m, "hf_device_map", None) for m in candidates if m is not None)


def device_on_purpose(module: str, device: str, below: dict[str, set[str]], spread: bool) -> bool:
    """A parameter on another device than most is placed there on purpose when the model says
    so (``spread``: a ``device_map``), or when its whole ``module`` ("" for the root; ``below``:
    module name -> the devices of every trainable tensor at or below it) lives on that device and
    that module is not the root: pipeline stages, CPU-offloaded embeddings. A tensor that differs
    from its own module, or a parameter of the root alone, was moved by accident."""
    return spread or (module != "" and below.get(module) == {device})


def dtype_changes_training(dtype: torch.dtype, main_dtype: torch.dtype) -> bool:
    """Whether a parameter kept in ``dtype`` in a model of ``main_dtype`` trains differently unsaid.

    A more precise island in a half-precision model (float32 norms, router gates, `wo`, lm
    heads, embeddings, CLIP's `logit_scale`) is what libraries do on purpose: no. A less precise
    parameter loses its small updates (a float16 tensor in a float32 model): yes. A float64 one
    (born from NumPy) promotes what it touches: yes.
    """
    if dtype == main_dtype or not (dtype.is_floating_point and main_dtype.is_floating_point):
        return False
    return dtype == torch.float64 or torch.finfo(dtype).eps > torch.finfo(main_dtype).eps

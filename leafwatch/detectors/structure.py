"""The structure detector: what a reading of the model and its optimizers says, before any gradient.

A pure function of the :class:`~leafwatch.observe.inventory.Inventory` (and of the names the last
reading saw): trainable tensors in no optimizer, frozen ones kept in one, optimizers that hold
replaced tensors (stale optimizers), trainable tensors kept where ``.parameters()`` never looks
(a plain list or dict: orphans), tensors on another device or dtype than the rest of the model.
:func:`verdicts` turns a reading into the history's verdicts: what the last reading found and
this one does not is resolved.
"""

from __future__ import annotations


from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from . import fixes, leaves, membership, ranks
from ..observe import graph
from ..report.findings import STRUCTURAL_KINDS, WAITING_KINDS, Finding, Waiting
from ..report.history import FindingsView
from ..observe.inventory import Inventory, Orphan, is_uninitialized, shape_of, shape_text
from ..report.verdicts import Verdict, Verdicts
from ..observe import replaced
from .constructors import make
from ..report.words import ADVICE, Members, Remedy, Words, code, renders
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
                          stale: replaced.Replaced | None,
                          seen_frozen: set[int] | frozenset[int] = frozenset()) -> list[Finding]:
    if not inv.optimizers:
        return []
    out: list[Finding] = []
    for i, params in enumerate(inv.optimizer_params):
        for j, p in enumerate(params):
            if not p.is_leaf:
                name = inv.name(p) or f"optimizers[{i}] param {j}"
                out.append(non_leaf(name, p, step=step, inventory=inv, where=" (held by an optimizer)"))
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
            out.append(make("not_in_optimizer", info.name, "error", "unfrozen_after", {
                "target": fixes.inventory_target(inv), "param_code": fixes.model_tensor_code(info.name, inv)},
                tensor=p, step=step, aliases=info.aliases))
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
        for p in params:
            if p.requires_grad:
                continue
            buffer, name = inv.buffer_names.get(id(p)), inv.name(p)
            plain = buffer is None and not isinstance(p, torch.nn.Parameter)
            if name is None and buffer is None and not plain:
                continue
            if not plain and holder is None:
                holder = fixes.variable_for(inv.optimizers[i], inv.variables, inv.fix_names) or f"optimizers[{i}]"
            if buffer is not None:
                out.append(make("frozen_in_optimizer", buffer, "info", "buffer", {"optimizer": i}, tensor=p,
                                step=step, optimizer=i, group=holder))
                continue
            name = name or f"optimizers[{i}] {shape_text(p)}"
            out.append(make("frozen_in_optimizer", name, "error" if plain else "info",
                            "plain_tensor" if plain else "frozen", {"optimizer": i}, tensor=p, step=step,
                            optimizer=i, **({} if plain else {"group": holder})))
    return out


@renders("frozen_in_optimizer", "buffer", fixes="never")
def _buffer(m: Members) -> Words:
    i = m.first["optimizer"]
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


@renders("frozen_in_optimizer", "plain_tensor", fixes="never")
def _plain_tensor(m: Members) -> Words:
    return Words(f"optimizer {m.first['optimizer']} holds {m.who}, which does not require grad: it will not train.",
                 "a plain tensor created without `requires_grad=True` was passed to the optimizer",
                 "create it with `requires_grad=True`")


@renders("frozen_in_optimizer", "frozen", fixes="never")
def _frozen(m: Members) -> Words:
    return Words(f"optimizer {m.first['optimizer']} holds {m.who}, which is frozen (requires_grad=False): "
                 "the optimizer skips it.",
                 f"{m.who} is frozen (requires_grad=False) but still listed in the optimizer.",
                 "nothing, if freezing is intended; to train it call `requires_grad_(True)`")


@renders("not_in_optimizer", "unfrozen_after")
def _unfrozen_after(m: Members) -> Words:
    target = m.first["target"]
    if target["framework"] == "lightning":
        fix, remedy = ("when unfreezing, add it to the optimizer too: Lightning's "
                       "`BaseFinetuning.unfreeze_and_add_param_group` does both, for the modules you unfreeze"), ADVICE
    else:
        add, remedy = fixes.add_words(fixes.params_of(m.each("param_code")), target)
        fix = "when unfreezing, " + add
    return Words(f"{m.who} requires grad but is in no optimizer: it gets gradients and never changes.",
                 f"{m.who} was frozen when the optimizer was built and unfrozen after it "
                 "(`requires_grad_(True)`), without being added to the optimizer.", fix, remedy)


_LIGHTNING_REBUILD = ("build the optimizer in `configure_optimizers` after the model is changed (in `setup` or "
                      "`__init__`), so that it holds the {which} parameters")


def _chosen(inv: Inventory, optimizer: int | None) -> list[Any]:
    optimizers = inv.optimizers
    return [optimizers[optimizer]] if optimizer is not None and 0 <= optimizer < len(optimizers) else list(optimizers)


def _replaced_at(new: torch.Tensor, inv: Inventory, target: Mapping[str, Any]) -> dict[str, Any]:
    """Where the user's statement that made the new tensor stands, when the registration hooks saw it
    made: of the user's frames that ran the registration (innermost first:
    ``Hetero.__init__``'s ``setattr``, then ``model = Hetero(model)``), the first statement that stands
    after the optimizer's, in its file and at its indentation (``replaced_span``). A fix that adds the
    new tensors goes there, not after the optimizer's statement, where the name still holds the old
    module; none found: ``None`` (the fix is not placed)."""
    seen, at = inv.appeared(new, 0), target.get("at")
    if at is None:
        return {}
    if seen is None:  # not seen made: after the optimizer's statement the fix would name tensors not made yet
        return {"replaced_span": None}
    for where in seen[2]:
        span = fixes.statement_span(where)
        if span and at and span["path"] == at["path"] and span["indent"] == at["indent"] and span["start"] > at["end"]:
            return {"replaced_span": span}
    return {"replaced_span": None}


def _rebuild_fix(m: Members) -> tuple[str, Remedy]:
    """Give the new tensors to the optimizer that holds the old ones, or rebuild it (same class and groups)."""
    target = m.first["target"]
    if target["framework"] == "lightning":
        return _LIGHTNING_REBUILD.format(which="new"), ADVICE
    spans = [a["replaced_span"] for a in m.args if "replaced_span" in a]
    if spans:  # after the last statement that made a new one (none found: the fix is not placed)
        target = {**target, "at": max(spans, key=lambda s: s["end"]) if all(spans) else None}
    which = f"`{target['variable']}`" if target["variable"] else "your optimizer"
    params = m.shared("module_params") or fixes.params_of(m.each("param_code"))
    add, remedy = fixes.add_words(params, target, what="the new parameters")
    return add + f"; or rebuild {which} after the last change to the model, with the same class and groups", remedy


def _regroup_fix(target: Mapping[str, Any]) -> str:
    """Old tensors no current parameter replaced: rebuild the optimizer that holds them."""
    if target["framework"] == "lightning":
        return _LIGHTNING_REBUILD.format(which="current")
    which = f"`{target['variable']}` (your `{target['cls']}`)" if target["variable"] else "your optimizer"
    return (f"rebuild {which} after the last change to the model, with the same class, groups and settings, "
            "so that it holds the current parameters")


def stale_param(pair: replaced.Pair, step: int | None, inv: Inventory) -> Finding:
    """The optimizer steps the old tensor of ``pair.name``; the model's current one is in no optimizer."""
    old_shape, new_shape = shape_of(pair.old), shape_of(pair.new)
    return make("stale_param", pair.name, "error", "replaced", {
        "optimizer": pair.optimizer, "old_shape": list(old_shape) if old_shape is not None else None,
        "new_shape": list(new_shape) if new_shape is not None else None,
        "target": (target := fixes.inventory_target(inv, _chosen(inv, pair.optimizer))),
        "param_code": fixes.model_tensor_code(pair.name, inv), **_replaced_at(pair.new, inv, target)},
        tensor=pair.new, step=step, optimizer=pair.optimizer,
        old_shape=list(old_shape) if old_shape is not None else None, paired_by=pair.how,
        group=stale_group_key(pair.optimizer))


@renders("stale_param", "replaced")
def _replaced(m: Members) -> Words:
    if any(a["old_shape"] is None for a in m.args):
        cause = (f"the optimizer was built before the lazy module's first forward and the model was then "
                 f"copied or rebuilt: the optimizer holds the uninitialized original of {m.who}, which never "
                 "materializes and gets no gradient.")
    else:
        resized = [(a["old_shape"], a["new_shape"]) for a in m.args if a["new_shape"] not in (None, a["old_shape"])]
        shown = "" if not resized else (f", resized from {tuple(resized[0][0])} to {tuple(resized[0][1])}"
                                        if m.single or len(resized) == len(m.args) and len(set(map(str, resized))) == 1
                                        else ", resized")
        cause = (f"{m.who} was replaced after the optimizer was built{shown} (a new layer, a resize, a swapped "
                 "module, or `model.to()` making new Parameters); the optimizer updates the old tensor, which the "
                 "model no longer uses and which gets no gradient.")
    fix, remedy = _rebuild_fix(m)
    return Words(f"{m.who} is in no optimizer and never changes: optimizer {m.first['optimizer']} still holds the "
                 "tensor it replaced.", cause, fix, remedy)


def _module_replaced(k: int, swapped: tuple[str, int], step: int | None, inv: Inventory) -> Finding:
    """A tensor of a module replaced after the optimizer was built by one with new tensors that replaced
    nothing (``to_hetero``'s copies per edge type, a bigger head): the fix gives the optimizer the module."""
    (module, i), info = swapped, inv.params[k]
    code_ = fixes.variable_for(inv.roots[module], inv.variables, inv.fix_names) if module in inv.roots \
        else fixes.model_tensor_code(module, inv)
    return make("stale_param", info.name, "error", "module_replaced", {
        "optimizer": i, "owner": code_ or module, "target": (target := fixes.inventory_target(inv, _chosen(inv, i))),
        "module_params": code_ and fixes.trainable_params_code(code_, inv.modules[module]),
        "param_code": fixes.model_tensor_code(info.name, inv), **_replaced_at(inv.tensors[k], inv, target)},
        tensor=inv.tensors[k], step=step, optimizer=i, aliases=info.aliases, group=stale_group_key(i))


@renders("stale_param", "module_replaced")
def _module_replaced_words(m: Members) -> Words:
    owner, i = m.first["owner"], m.first["optimizer"]
    owner = f"`{owner}`" if owner else "the model"
    fix, remedy = _rebuild_fix(m)
    return Words(
        f"{m.who} is in no optimizer and never changes: optimizer {i} still holds the old tensors of {owner}.",
        f"{owner} was replaced after the optimizer was built by a module with other tensors (a conversion such as "
        f"`to_hetero`, a new layer, a copy): optimizer {i} updates the old tensors, which get no gradient, and no "
        "optimizer holds any of the new ones.", fix, remedy)


def stale_group_key(optimizer: int) -> str:
    """The mistake every ``stale_param`` finding of one optimizer belongs to: the stale optimizer."""
    return f"optimizers[{optimizer}]"


def stale_group(optimizer: int, old: list[tuple[torch.Tensor, str | None]], step: int | None,
                inv: Inventory, harmless: bool = False) -> Finding:
    """The old tensors of one optimizer that no current parameter replaced: one finding for all.

    ``harmless``: every live parameter of the model is stepped (the fix was applied, or layers were
    only removed): the leftovers get no gradient and the optimizer skips them; information.
    """
    n, names = len(old), [name for _, name in old if name is not None]
    lazy = sum(1 for t, _ in old if is_uninitialized(t))
    details = dict(step=step, optimizer=optimizer, count=n, old_names=names, uninitialized=lazy,
                   group=stale_group_key(optimizer), old_shapes=[None if s is None else list(s) for s in (shape_of(t) for t, _ in old)])
    args = {"optimizer": optimizer, "count": n, "old_names": names, "lazy": lazy,
            "target": fixes.inventory_target(inv, _chosen(inv, optimizer))}
    if harmless:
        return make("stale_param", stale_group_key(optimizer), "info", "leftovers", args, **details, leftovers=True)
    return make("stale_param", f"optimizers[{optimizer}]", "error", "old_tensors", args, **details)


def _formerly(names: list[str]) -> str:
    return f" (formerly {', '.join(f'`{x}`' for x in names[:5])}{', ...' if len(names) > 5 else ''})" if names else ""


@renders("stale_param", "old_tensors", fixes="never")
def _old_tensors(m: Members) -> Words:
    a = m.first
    n, lazy = a["count"], a["lazy"]
    uninitialized = "" if not lazy else (
        f" {lazy} of them {'are' if lazy != 1 else 'is'} still uninitialized: the optimizer was built "
        "before the lazy modules' first forward and the model was then copied or rebuilt, so "
        f"{'they' if lazy != 1 else 'it'} will never materialize.")
    cause = ("the model changed after the optimizer was built (layers removed, replaced or swapped); the "
             f"optimizer still holds the old tensors, which nothing uses.{uninitialized}")
    return Words(
        f"optimizer {a['optimizer']} holds {n} tensor{'s' if n != 1 else ''} that "
        f"{'are' if n != 1 else 'is'} no longer {'parameters' if n != 1 else 'a parameter'} of the model "
        f"and get{'s' if n == 1 else ''} no gradient{_formerly(a['old_names'])}.", cause, _regroup_fix(a["target"]))


@renders("stale_param", "leftovers", fixes="never")
def _leftovers(m: Members) -> Words:
    """Old tensors an optimizer still holds once every live parameter is stepped: harmless, costs memory."""
    a = m.first
    n, lazy, i = a["count"], a["lazy"], a["optimizer"]
    them = "them" if n != 1 else "it"
    uninitialized = "" if not lazy else (
        f" {lazy} of them {'are' if lazy != 1 else 'is'} uninitialized lazy parameters that can no longer materialize.")
    cause = (f"the model changed after the optimizer was built and every parameter it uses now is stepped; the "
             f"old tensor{'s' if n != 1 else ''} stay{'' if n != 1 else 's'} in optimizer {i}, which "
             f"skips {them} (no gradient). Harmless, but {them} and {'their' if n != 1 else 'its'} optimizer "
             f"state cost memory.{uninitialized}")
    return Words(
        f"optimizer {i} still holds {n} old tensor{'s' if n != 1 else ''} the model no longer "
        f"uses{_formerly(a['old_names'])}: harmless, costs memory.",
        cause, "nothing needed; to free the memory, " + _regroup_fix(a["target"]))


def _orphan_finding(orphan: Orphan, inv: Inventory, step: int | None) -> Finding:
    t, name = orphan.tensor, orphan.name
    trains = id(t) in inv.in_optimizer
    kinds = orphan.containers or ((orphan.container,) if orphan.container != "attribute" else ())
    attr = name.split("[")[0].split(".")[-1]
    severity = "warning" if trains else "error"
    if kinds:
        reason = "module_in_container" if orphan.module_in_container else "tensor_in_container"
        return make("orphan_tensor", name, severity, reason, {
            "trains": trains, "containers": list(kinds), "fix": fixes.container_args(_owner(inv, name), attr, kinds)},
            tensor=t, step=step, container=orphan.container, containers=list(kinds))
    fix_args = fixes.parameter_args(_owner(inv, name), name.split(".")[-1])
    if not t.is_leaf:
        found = graph.origin(t)
        return make("orphan_tensor", name, severity, "non_leaf_attribute", {
            "trains": trains, "origin": leaves.origin_args(found, inv.known_names()), "fix": fix_args},
            tensor=t, step=step, container="attribute", op=found.op if found else None)
    return make("orphan_tensor", name, severity, "plain_attribute", {"trains": trains, "fix": fix_args},
                tensor=t, step=step, container="attribute")


def _effect(m: Members) -> str:
    return ("it trains, but `state_dict()` does not save it and `.to()` does not move it"
            if m.first["trains"] else "no optimizer built from `model.parameters()` sees it, so it never trains")


@renders("orphan_tensor", "module_in_container")
def _module_in_container(m: Members) -> Words:
    where = _describe_containers(tuple(m.first["containers"]))
    fix, remedy = fixes.container_fix(m.first["fix"], modules=True)
    return Words(f"{m.who} belongs to a module kept in {where}: it is not registered, {_effect(m)}.",
                 f"the module is stored in {where}, which `nn.Module` does not look into.", fix, remedy)


@renders("orphan_tensor", "tensor_in_container")
def _tensor_in_container(m: Members) -> Words:
    where = _describe_containers(tuple(m.first["containers"]))
    fix, remedy = fixes.container_fix(m.first["fix"], modules=False)
    return Words(f"{m.who} requires grad but sits in {where}: it is not registered, {_effect(m)}.",
                 f"tensors in {where} are not parameters of the module.", fix, remedy)


@renders("orphan_tensor", "non_leaf_attribute")
def _non_leaf_attribute(m: Members) -> Words:
    origin = m.first["origin"]
    leaf = origin["leaf"] if origin is not None else None
    of_a_parameter = leaf is not None and leaf["is_parameter"] and origin["kind"] in ("device", "dtype", "copy")
    note = (" Calling `.to()`/`.cuda()`/`.double()` on an `nn.Parameter` returns a plain non-leaf tensor, not a "
            "Parameter.") if of_a_parameter else ""
    cause = leaves.origin_cause(m.name, origin) + note
    fix, remedy = fixes.parameter_fix(m.first["fix"])
    return Words(f"module attribute {m.who} is a non-leaf tensor, not a Parameter: {_effect(m)}, and it has no .grad.",
                 cause, fix, remedy)


@renders("orphan_tensor", "plain_attribute")
def _plain_attribute(m: Members) -> Words:
    fix, remedy = fixes.parameter_fix(m.first["fix"])
    return Words(f"module attribute {m.who} requires grad but is a plain tensor, not an `nn.Parameter`: {_effect(m)}.",
                 "a tensor assigned as a module attribute is not registered, even with `requires_grad=True`.",
                 fix, remedy)


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
        out.append(make("device_mismatch", info.name, "warning", "device", {**moved, "model": model},
                        tensor=p, step=step, aliases=info.aliases))
    return out


@renders("device_mismatch", "device")
def _device(m: Members) -> Words:
    a = m.first
    if "device" in a:
        what = f"on {a['device']} while the other trainable parameters are on {a['main_device']}"
        cause = ("it was created or moved separately from the rest of its module: a tensor on "
                 "another device than the module it belongs to is no placement plan (device_map "
                 "and pipeline stages place whole modules), and a 0-dim one is silently moved "
                 "at every use.")
        to, remedy = _model_to(a["model"], repr(a["main_device"]))
        fix = "move it with the model: register it as a Parameter/buffer of the module and " + to
    else:
        short, main_short = a["dtype"].replace("torch.", ""), a["main_dtype"].replace("torch.", "")
        what = f"{short} while the other trainable parameters are {main_short}"
        if a["dtype"] == "torch.float64":
            cause = ("it was created separately from the rest of the model (a NumPy array is "
                     "float64): it promotes whatever it touches to float64.")
        else:
            cause = (f"it was created or converted separately from the rest of the model: its updates "
                     f"are rounded to {short}, so steps smaller than its resolution are lost "
                     "without an error.")
        to, remedy = _model_to(a["model"], a["main_dtype"])
        fix = f"create it with `dtype={a['main_dtype']}`, or convert the model as a whole: " + to
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

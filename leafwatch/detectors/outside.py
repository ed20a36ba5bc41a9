"""Trainable tensors outside the model: they get gradients, but no optimizer steps them.

Two ways leafwatch sees such a tensor:

- a watched leaf (``leafwatch.watch()`` or ``Monitor(tensors=...)``) that got a gradient and is in
  no optimizer (a ``logit_scale`` created beside the model and never given to the optimizer);
- a leaf of the loss's graph (``check(loss=)``, ``audit(loss=)``) that requires grad, is in no
  optimizer, is **the same tensor at consecutive checks** (a persistent tensor the user created)
  and whose value then does not change from one check to the next (one that does is updated by
  hand: manual SGD, a trained perturbation); its value is noted only from its second sighting on. Leaves made fresh each step (WGAN-GP's ``interpolates.requires_grad_(True)``,
  adversarial inputs, input-gradient saliency) are never the same tensor twice, so they are
  never reported. The graph is walked only at the first check, while a suspect waits for its
  second sighting, and after a new missing gradient: never on a healthy step.

Suspects are followed through the module or optimizer that holds them, else held weakly: nothing of
the user's is kept alive.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from . import fixes
from ..observe import follow, frames, graph
from ..observe.discovery import optimizer_ids
from ..report.findings import Finding
from ..observe.inventory import Inventory, shape_text
from ..watching import WatchEntry
from .constructors import make
from ..report.reasons import Reason
from ..report.words import Members, Words
from ..report.verdicts import Verdict, Verdicts
from ..observe.evidence import INVENTORY, LOSS, SEEN, STEP, Evidence
from ..report.history import FindingsView

if TYPE_CHECKING:
    from .gradients import GradientState


def watched_in_no_optimizer(entries: Sequence[WatchEntry], step: int | None, *, model_ids: set[int],
                            in_optimizer: Callable[[WatchEntry], bool], inventory: Inventory | None = None) -> list[Finding]:
    """``not_in_optimizer`` (error) for each watched leaf that got a gradient and no optimizer holds.

    Args:
        entries: The watched tensors.
        step: The step to record.
        model_ids: Ids of the model's parameters (judged by the structural checks instead).
        in_optimizer: Whether an entry's tensor is in one of the optimizers that judge it.
        inventory: The structure (its optimizers and model name the user's variables in the fix).
    """
    out = []
    for entry in entries:
        t = entry.tensor()
        if t is None or not entry.is_leaf or not t.requires_grad or id(t) in model_ids:
            continue
        if t.grad is None and entry.grads_seen == 0:
            continue  # no gradient: that is missing_grad's business
        if not in_optimizer(entry):
            out.append(outside_optimizer(entry.name, t, step, watched_at=entry.location, inventory=inventory,
                                         source="watch"))
    return out


def _leaf_users(loss: torch.Tensor) -> dict[int, tuple[torch.Tensor, str]]:
    """Leaf id -> (leaf, the op that uses it) for every leaf the loss's graph accumulates into."""
    out: dict[int, tuple[torch.Tensor, str]] = {}
    for node in graph.iter_nodes(loss.grad_fn, limit=10 * graph.MAX_NODES):
        for child, _ in getattr(node, "next_functions", ()):
            variable = getattr(child, "variable", None)
            if isinstance(variable, torch.Tensor) and id(variable) not in out:
                out[id(variable)] = (variable, type(node).__name__)
    return out


def caller_name(t: torch.Tensor) -> str | None:
    """The name the first caller outside leafwatch has for ``t`` (a variable, or ``obj.attr`` one
    level down), when exactly one name holds it."""
    frame = frames.user_frame(frameworks=False)
    if frame is None:
        return None
    names: list[str] = []
    for scope in (frame.f_locals, frame.f_globals):
        for key, value in list(scope.items()):
            if key.startswith("__"):
                continue
            if value is t:
                names.append(key)
            elif frames.readable(value) and not isinstance(value, (torch.Tensor, type, type(sys))) \
                    and hasattr(value, "__dict__"):
                try:
                    attrs = vars(value)
                except TypeError:
                    continue
                names.extend(f"{key}.{a}" for a, v in list(attrs.items())[:200] if v is t)
    return names[0] if len(set(names)) == 1 else None


def judged_elsewhere(inv: Inventory | None, optimizers: Iterable[torch.optim.Optimizer],
                     entries: Iterable[WatchEntry]) -> set[int]:
    """Ids that other checks judge: the model's tensors and orphans, every optimizer's tensors,
    watched tensors, and the hidden leaves behind the non-leaves among them (a watched non-leaf,
    a module attribute such as ``self.log_scale = torch.tensor(x, requires_grad=True).float()``, a
    non-leaf an optimizer holds): one mistake, one finding, whose cause already names the leaf
    that gets the gradient."""
    ids = optimizer_ids(optimizers)
    non_leaves: list[torch.Tensor] = [p for opt in optimizers for g in opt.param_groups for p in g["params"]
                                      if isinstance(p, torch.Tensor) and not p.is_leaf]
    for e in entries:
        t = e.tensor()
        ids.add(id(t))
        if t is not None and not e.is_leaf:
            non_leaves.append(t)
    if inv is not None:
        orphans = [o.tensor for o in inv.orphans()]
        ids |= set(inv.tensors) | inv.buffers | {id(t) for t in orphans}
        non_leaves += [t for t in orphans if not t.is_leaf]
    for t in non_leaves:
        if t.grad_fn is not None:
            ids.update(id(leaf) for leaf in graph.leaves_of(t.grad_fn, limit=256)[0])
    return ids


@dataclasses.dataclass(eq=False, slots=True)
class LossLeavesState:
    """Persistent leaves of the loss's graph that no optimizer holds, across checks."""

    _suspects: dict[int, tuple[follow.Ref, str]] = dataclasses.field(default_factory=dict)
    _walked: bool = False
    #: How many times the loss's graph was walked (for tests of the hot path).
    walks: int = 0


def judge_loss(evidence: Evidence, state: LossLeavesState, view: FindingsView, grads: GradientState) -> Verdicts | None:
    """At a check given the loss: its graph's trainable leaves in no optimizer, walked when it pays (the first
    check, a suspect waiting for its second sighting, a new missing gradient); findings for the suspects seen
    again as the same tensor. What other checks judge (model parameters, optimizer tensors, watched tensors,
    orphans) is left out, worked out only when the walk finds a candidate."""
    loss, seen, step = evidence[LOSS], evidence[SEEN], evidence[STEP]
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None \
            or not (not state._walked or state._suspects or grads.new_miss):
        return None
    state._walked = True
    state.walks += 1
    hand, inventory = seen.hands["loss"], seen.cache.inventory
    hand.follow_through(inventory)  # a suspect a module or optimizer holds is followed there, never weakly
    candidates = {k: v for k, v in _leaf_users(loss).items() if v[0].requires_grad}
    if not candidates:
        state._suspects = {}
        return None
    excluded = judged_elsewhere(inventory, [*seen.cache.optimizers, *seen.observer.stepping_optimizers()],
                                seen.watch_entries())
    out: Verdicts = []
    suspects: dict[int, tuple[follow.Ref, str]] = {}
    for k, (t, op) in candidates.items():
        if k in excluded or hand.by_hand(t):
            continue  # judged elsewhere, or updated by hand between checks (a trained perturbation): no finding
        sighted = state._suspects.get(k)
        if sighted is None or sighted[0]() is not t:
            suspects[k] = (hand.follow(t), op)  # first sighting: nothing noted (most are fresh inputs)
            continue
        # The same tensor at consecutive checks: the gradient rule decides from here (the module docstring).
        verdict = hand.verdict(t)
        if verdict == "wait":
            suspects[k] = (hand.follow(t), op)
        elif verdict == "unchanged":
            known = caller_name(t)
            name = known or f"{shape_text(t)} used by {op}"
            out.append(Verdict.open(outside_optimizer(name, t, step, op=op, inventory=inventory, persistent=True,
                                                      **({} if known else {"described": True}))))
    state._suspects = suspects
    hand.keep(suspects)  # only the suspects' values stay noted (and those updated by hand)
    return out


def judge_undecided(evidence: Evidence, state: None, view: FindingsView, leaves: LossLeavesState) -> Verdicts:
    """At the end of a run of one check (``audit()``): info findings for the suspects seen once, since it cannot
    tell a persistent leaf (a forgotten temperature) from one made fresh each step (an adversarial input)."""
    if evidence[SEEN].checks != 1:
        return []
    out: Verdicts = []
    for ref, op in leaves._suspects.values():
        t = ref()
        if t is None:
            continue
        known = caller_name(t)
        name = known or f"a tensor of shape {tuple(t.shape)} used by `{op}`"
        out.append(Verdict.open(make(LossLeaf(code=known, target=_target(evidence[INVENTORY])), name, "info", tensor=t,
                                     step=evidence[STEP], source="outside_model", outside=True, op=op, persistent=None,
                                     **({} if known else {"described": True}))))
    return out


def _target(inventory: Inventory | None) -> fixes.Target:
    return fixes.inventory_target(inventory) if inventory is not None else fixes.Target()


# -- its words ---------------------------------------------------------------------------------
class LossLeaf(Reason, kind="not_in_optimizer", name="loss_leaf"):
    """A leaf of the loss's graph that requires grad and is in no optimizer, seen once (``code``: the user's
    name for it): a persistent tensor or a fresh input, one check cannot tell."""

    code: str | None = None
    target: fixes.Target = fixes.Target()

    def words(self, m: Members) -> Words:
        known = self.code
        add, remedy = fixes.add_words(f"[{known}]" if known else None, self.target)
        return Words(
            f"{m.name} is a leaf of the loss's graph that requires grad and is in no optimizer.",
            "one check cannot tell its two readings apart: if the same tensor is used at every step "
            "(a temperature, a loss weight), no optimizer steps it and it never trains; if it is made "
            "fresh each step (an adversarial input, WGAN-GP's interpolates), nothing is wrong. "
            "A Monitor, which sees the next step, decides.",
            f"if it should train, {add}; if it is fixed, create it without `requires_grad=True`; if it is made fresh "
            "each step, nothing", remedy)


def outside_optimizer(name: str, t: torch.Tensor, step: int | None, *, watched_at: str | None = None,
                      op: str | None = None, inventory: Inventory | None = None, **details: Any) -> Finding:
    """A trainable tensor outside the model that gets gradients and is in no optimizer: how leafwatch saw it
    (``watched_at``: the ``watch()`` call; ``op``: the op of the loss's graph that uses it)."""
    code_ = fixes.tensor_code(name) if graph.code_name(name) else None
    seen = {"watched_at": watched_at} if watched_at is not None else {"op": op} if op is not None else {}
    return make(OutsideModel(watched_at=watched_at, op=op, code=code_, target=_target(inventory)), name, "error",
                tensor=t, step=step, **{"source": "outside_model", "outside": True, **seen, **details})


class OutsideModel(Reason, kind="not_in_optimizer", name="outside_model"):
    """A trainable tensor outside the model that gets gradients and is in no optimizer (``watched_at``: its
    ``watch()`` call; else ``op``: the op of the loss's graph that uses it at every step)."""

    watched_at: str | None = None
    op: str | None = None
    code: str | None = None
    target: fixes.Target = fixes.Target()

    def words(self, m: Members) -> Words:
        code_ = self.code if m.single else None
        add, remedy = fixes.add_words(f"[{code_}]" if code_ else fixes.params_of(m.each("code")), self.target)
        frozen = f"`{code_}.requires_grad_(False)`" if code_ else "call `requires_grad_(False)` on your tensor"
        how = (f"gets gradients (watched at {self.watched_at})" if self.watched_at is not None else
               f"is a leaf of the loss's graph at every step (used by `{self.op}`) and does not change between checks")
        return Words(
            f"{m.who} gets gradients but is in no optimizer: it never changes.",
            f"{m.who} {how}, and it was not passed to any optimizer (left out when the optimizer "
            "was built). If it is meant to stay fixed (a temperature, a teacher), it should not require grad.",
            f"{add} (better: make it an `nn.Parameter` of the model); or, if it is fixed, {frozen}", remedy)

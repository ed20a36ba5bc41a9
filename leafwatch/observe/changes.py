"""Evidence that tells intent from accident for tensors that got no gradient.

Real code does on purpose what a bug does by accident. Three such cases are judged here, only for
the few tensors under suspicion and never on a healthy step:

- **a tensor updated by other means** (an EMA / momentum target network, a mean teacher): no
  gradient reaches it, yet it changes between checks. :class:`ChangeEvidence` looks, cheapest
  first, at ``t._version`` (bumped by in-place ops under ``torch.no_grad()``), at
  ``t.data_ptr()`` (``p.data = new``) and, when neither moved (``p.data.mul_()``), at a small
  fingerprint of the values (the norm and the first elements) computed on the tensor's device
  and read one check later, so that CUDA is never synchronised for it.
- **a tensor updated by hand** (manual SGD, an inner loop, a trained perturbation): it gets
  gradients and no optimizer that steps holds it, yet it changes between checks.
  :class:`HandUpdates` snapshots it at the first check that sees its gradient and compares at
  the next one (the gradient rule's value evidence).
- **a layer skipped on purpose** (LayerDrop, stochastic depth): a layer of an ``nn.ModuleList``
  that does not run while its siblings do. :class:`SiblingSkips` counts how often the siblings
  are skipped and, with the model's declared drop rate where there is one (a ``layerdrop``
  attribute or config field), says how likely it is that a layer skipped at every check so far
  was dropped by chance (``rate ** checks``). It is named (never ran) only once that chance is
  below :data:`LAYERDROP_FALSE_ALARM`: with Wav2Vec2's ``layerdrop=0.1`` after 9 checks, so a
  12-layer model raises a false alarm in at most 12 * 0.1**9 = 1.2e-8 of its runs (a layer
  that ran once is never named "never ran" again: it is intermittent). A rate is declared by an
  attribute named for it, of the stack, an ancestor or its ``config`` (``layerdrop``,
  ``encoder_layerdrop``, torchaudio's ``layer_drop``, x-transformers' ``layer_dropouts``, one per
  layer), or by fairseq's ``LayerDropModuleList(p=...)``. A stack with no
  declared rate whose siblings were never seen both running and skipped has a rate of 0: a
  layer left out of the loop is named at the first check.
"""

from __future__ import annotations

import collections
import dataclasses
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

from . import follow as follow_
from .frames import readable
from .inventory import Inventory, has_values
from .names import ancestors

Verdict = Literal["changed", "unchanged", "unknown"]
#: What :meth:`HandUpdates.verdict` says of a tensor that gets gradients in no optimizer.
HandVerdict = Literal["by_hand", "wait", "unchanged"]

#: The fingerprint holds the norm and this many of the first elements.
FINGERPRINT_ELEMENTS = 8

#: A layer that never ran is named once the chance of it being skipped at every check by a
#: random drop is below this (per layer): with 12 layers, 1.2e-8 per run.
LAYERDROP_FALSE_ALARM = 1e-9
#: At the end of a run, a layer never seen running is named when that chance is below this.
LAYERDROP_END_OF_RUN = 1e-3
#: Names of the attributes that declare a drop rate (on a module or on its ``config``, read with ``getattr``:
#: a Hugging Face config answers through its own ``__getattribute__``).
DROP_RATE_ATTRIBUTES = ("layerdrop", "encoder_layerdrop", "decoder_layerdrop", "layer_drop")
#: An attribute of a module's own ``__dict__`` whose name holds one of these declares one too (x-transformers'
#: ``layer_dropouts``, one rate per layer; ``layer_drop_rate``).
DROP_RATE_NAMES = ("layerdrop", "layer_drop")


# -- change by other means ----------------------------------------------------------------------
class _Fingerprint:
    """A few values of a tensor, copied to the host behind an event (CUDA) or at once (CPU)."""

    def __init__(self, t: torch.Tensor) -> None:
        with torch.no_grad():
            flat = t.detach().reshape(-1)
            if flat.is_complex():  # both parts count: `.float()` would drop the imaginary one
                flat = torch.view_as_real(flat).reshape(-1)
            values = torch.cat([torch.linalg.vector_norm(flat.float()).reshape(1),
                                flat[:FINGERPRINT_ELEMENTS].float()])
            self.event: Any = None
            if values.is_cuda:
                host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
                host.copy_(values, non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record()
                self.host = host
            else:
                self.host = values.cpu()

    def ready(self, wait: bool = False) -> bool:
        if self.event is not None and wait:
            self.event.synchronize()
        return self.event is None or wait or bool(self.event.query())

    def equals(self, other: _Fingerprint) -> bool:
        return self.host.shape == other.host.shape and bool(torch.equal(self.host, other.host))


def _pointer(t: torch.Tensor, readable: bool = False) -> int:
    """Where ``t``'s data lives (0 without storage). ``readable``: known to have values (a tensor
    that had a storage when first noted), which skips the check on the path run at every check."""
    if not readable and not has_values(t):  # uninitialized or meta: no storage to point at
        return 0
    try:
        return t.data_ptr()
    except Exception:  # a tensor subclass without storage
        return 0


def _fingerprint(t: torch.Tensor) -> _Fingerprint | None:
    if not has_values(t):  # uninitialized or meta: no values to read
        return None
    try:
        return _Fingerprint(t)
    except Exception:  # an exotic tensor: version and pointer only
        return None


@dataclasses.dataclass
class _Snapshot:
    ref: follow_.Ref
    version: int
    pointer: int
    first: _Fingerprint | None
    second: _Fingerprint | None = None
    #: ``follow.impl`` of the tensor when noted: a swap (``torch.utils.swap_tensors``, a ``module.to()`` with
    #: swap-on-conversion) changes it, and its version and storage with it, while nothing updated it.
    contents: int = 0


class ChangeEvidence:
    """Whether each suspected tensor changed since it was first noted, without a per-step sync.

    Example::

        >>> import torch
        >>> w = torch.zeros(3)
        >>> evidence = ChangeEvidence()
        >>> evidence.verdict(w)       # first look: noted
        'unknown'
        >>> w.data.add_(1.0)          # an EMA-style update through .data
        tensor([1., 1., 1.])
        >>> evidence.verdict(w)
        'changed'
    """

    def __init__(self) -> None:
        self._snapshots: dict[int, _Snapshot] = {}
        self._inventory: weakref.ReferenceType[Inventory] | None = None

    def follow_through(self, inventory: Inventory | None) -> None:
        """Follow the tensors noted from now on through the module or optimizer of ``inventory`` that
        holds them (never a weak reference to a tensor they hold: ``torch.utils.swap_tensors`` refuses
        one); the inventory is held weakly."""
        self._inventory = weakref.ref(inventory) if inventory is not None else None

    def follow(self, t: torch.Tensor) -> follow_.Ref:
        """``t`` followed through its holder in the inventory given to :meth:`follow_through`, else weakly."""
        inventory = self._inventory() if self._inventory is not None else None
        return inventory.follow(t) if inventory is not None else follow_.weakly(t)

    def __contains__(self, t: torch.Tensor) -> bool:
        s = self._snapshots.get(id(t))
        return s is not None and s.ref() is t

    def note(self, t: torch.Tensor) -> None:
        """Remember ``t`` as it is now (a no-op when it is already noted)."""
        if t not in self:
            self._snapshots[id(t)] = _Snapshot(self.follow(t), t._version, _pointer(t), _fingerprint(t),
                                               contents=follow_.impl(t))

    def verdict(self, t: torch.Tensor, *, final: bool = False) -> Verdict:
        """``changed`` / ``unchanged`` since :meth:`note` (noting it first), or ``unknown`` yet.

        The values are compared when neither the version nor the storage moved: the second
        fingerprint is taken at this call and read at the next one on CUDA (``final=True``
        waits for it instead: the run is over). A tensor swapped since it was noted is noted again
        (``unknown``): a swap replaces its version, storage and values' dtype with nothing trained.
        """
        s = self._snapshots.get(id(t))
        if s is None or s.ref() is not t or follow_.impl(t) != s.contents:  # (swapped since noted: no update)
            self._snapshots.pop(id(t), None)
            self.note(t)
            return "unknown"
        if t._version != s.version or _pointer(t, readable=s.pointer != 0) != s.pointer:
            return "changed"
        if s.first is None:
            return "unchanged"  # nothing more to compare: neither the version nor the storage moved
        if s.second is None:
            s.second = _fingerprint(t)
            if s.second is None:
                return "unchanged"
        if not (s.first.ready(final) and s.second.ready(final)):
            return "unknown"
        return "unchanged" if s.first.equals(s.second) else "changed"

    def forget(self, ids: Iterable[int]) -> None:
        for pid in ids:
            self._snapshots.pop(pid, None)

    def ids(self) -> list[int]:
        """The ids of the tensors noted."""
        return list(self._snapshots)


class HandUpdates:
    """The gradient rule's value evidence: is a tensor that gets gradients, and that no optimizer
    that steps holds, updated by hand?

    The first check that sees its gradient snapshots it (:class:`ChangeEvidence`) and says
    ``wait``; a later check says ``by_hand`` when the value changed in between (manual SGD, an
    inner loop, a trained perturbation: remembered for good), ``unchanged`` when it did not (the
    gradient is computed and never applied), ``wait`` while a CUDA fingerprint is on its way. The
    snapshot is taken at a check, never when the structure is read: a ``model.to()`` or a
    ``load_state_dict()`` before the first step is no update by hand. Tensors are followed through
    the module or optimizer that holds them (:meth:`follow_through`), else held weakly.

    Example::

        >>> import torch
        >>> w = torch.ones(3, requires_grad=True)
        >>> hand = HandUpdates()
        >>> hand.verdict(w)            # the first check that sees its gradient
        'wait'
        >>> with torch.no_grad():
        ...     w -= 0.1               # manual SGD between checks
        >>> hand.verdict(w)
        'by_hand'
    """

    def __init__(self) -> None:
        self._evidence = ChangeEvidence()
        self._by_hand: dict[int, follow_.Ref] = {}

    def follow_through(self, inventory: Inventory | None) -> None:
        """See :meth:`ChangeEvidence.follow_through`."""
        self._evidence.follow_through(inventory)

    def follow(self, t: torch.Tensor) -> follow_.Ref:
        """See :meth:`ChangeEvidence.follow`."""
        return self._evidence.follow(t)

    def by_hand(self, t: torch.Tensor) -> bool:
        """Whether ``t`` was seen updated by hand."""
        ref = self._by_hand.get(id(t))
        return ref is not None and ref() is t

    def saw(self, t: torch.Tensor) -> bool:
        """Whether a check saw ``t``'s gradient (its value was noted, or seen changing)."""
        return t in self._evidence or self.by_hand(t)

    def verdict(self, t: torch.Tensor, *, final: bool = False) -> HandVerdict:
        """At a check that sees ``t``'s gradient (``final``: the run is over, no later check:
        what is not known to change is ``unchanged``)."""
        if self.by_hand(t):
            return "by_hand"
        if t not in self._evidence:
            self._evidence.note(t)
            return "unchanged" if final else "wait"
        seen = self._evidence.verdict(t, final=final)
        if seen == "changed":
            self._by_hand[id(t)] = self._evidence.follow(t)
            self._evidence.forget([id(t)])
            return "by_hand"
        return "wait" if seen == "unknown" and not final else "unchanged"

    def keep(self, alive: Iterable[int]) -> None:
        """Forget the noted values of every tensor whose id is not in ``alive`` (it left the model,
        or was not seen again), and the freed tensors seen updated by hand."""
        alive = set(alive)
        self._evidence.forget([pid for pid in self._evidence.ids() if pid not in alive])
        self._by_hand = {pid: ref for pid, ref in self._by_hand.items() if ref() is not None}


# -- layers dropped on purpose --------------------------------------------------------------------
def layers_of(module_name: str, modules: Mapping[str, nn.Module]) -> tuple[tuple[str, int], ...]:
    """Each ``(container, index)`` where ``module_name`` (or an ancestor) is an item of an ``nn.ModuleList``,
    the innermost first: x-transformers' ``layers.7.0.0`` is item 0 of the norms of ``layers.7``, item 0 of
    ``layers.7`` and item 7 of ``layers`` (the stack its ``layer_dropout`` skips)."""
    split = [path.rpartition(".") for path in (module_name, *ancestors(module_name))]
    return tuple((container, int(index)) for container, _, index in split
                 if container and index.isdigit() and isinstance(modules.get(container), nn.ModuleList))


def skipped_layers(candidates: Sequence[tuple[tuple[str, int], ...]],
                   counts: Mapping[tuple[str, int], int]) -> list[tuple[str, int] | None]:
    """For each missing tensor's :func:`layers_of`, the layer that was skipped: the innermost item whose
    siblings ran (a sibling ran when some of its ``counts`` tensors, by ``(container, index)``, got a
    gradient: fewer of them missed than it holds); None when no sibling ran in any of its containers."""
    missed = collections.Counter(layer for layers in candidates for layer in layers)
    ran: dict[str, set[int]] = {}
    for (container, index), total in counts.items():
        if missed[container, index] < total:
            ran.setdefault(container, set()).add(index)
    return [next((layer for layer in layers if ran.get(layer[0], set()) - {layer[1]}), None) for layers in candidates]


def declared_drop_rate(container: str, modules: Mapping[str, nn.Module]) -> float:
    """The largest drop rate declared on the container or an ancestor (or its ``config``); 0 if none."""
    rate = 0.0
    holder = modules.get(container)
    p = getattr(holder, "p", None)
    if "drop" in type(holder).__name__.lower() and isinstance(p, float) and 0 < p < 1:
        rate = p  # fairseq's LayerDropModuleList(p=...)
    for module in (modules.get(path) for path in ("", *ancestors(container), container)):
        for owner in (module, getattr(module, "config", None)):
            named = {n for n in _attribute_names(owner) if any(word in n.lower() for word in DROP_RATE_NAMES)}
            for name in (*DROP_RATE_ATTRIBUTES, *sorted(named - set(DROP_RATE_ATTRIBUTES))):
                rate = max([rate, *_rates(getattr(owner, name, None))])
    return rate


def _attribute_names(owner: Any) -> list[str]:
    """The names in ``owner``'s own ``__dict__`` (none when it has none, or runs code of its own to be read)."""
    if owner is None or not readable(owner):
        return []
    try:
        return [k for k in vars(owner) if isinstance(k, str)]
    except TypeError:
        return []


def _rates(value: Any) -> list[float]:
    """The drop rates an attribute holds: a number in (0, 1), or a tuple or list of them (one per layer)."""
    values = value if isinstance(value, (tuple, list)) and len(value) <= 1024 else (value,)
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1]


@dataclasses.dataclass
class _Container:
    size: int
    declared: float
    first_check: int
    skips: dict[int, int] = dataclasses.field(default_factory=dict)
    last_counted: int = -1
    counted_now: set[int] = dataclasses.field(default_factory=set)
    #: Whether some layer ran while others were skipped at an earlier check: a stack seen dropping layers.
    partly_skipped: bool = False


class SiblingSkips:
    """How often the layers of each ``nn.ModuleList`` are skipped, fed by the missing gradients.

    A layer counts as skipped at a check when its parameters missed a gradient there; the
    checks where every layer ran cost nothing (the count of observations is the number of
    checks times the number of layers).
    """

    def __init__(self) -> None:
        self._containers: dict[str, _Container] = {}

    def skipped(self, container: str, index: int, check: int, modules: Mapping[str, nn.Module]) -> None:
        """Layer ``index`` of ``container`` missed a gradient at check number ``check``."""
        c = self._containers.get(container)
        if c is None:
            size = len(modules[container]) if isinstance(modules.get(container), nn.ModuleList) else 1
            c = self._containers[container] = _Container(size, declared_drop_rate(container, modules), check)
        if c.last_counted != check:
            c.partly_skipped = c.partly_skipped or 0 < len(c.counted_now) < c.size
            c.last_counted, c.counted_now = check, set()
        if index not in c.counted_now:
            c.counted_now.add(index)
            c.skips[index] = c.skips.get(index, 0) + 1

    def all_skipped(self, container: str, check: int) -> bool:
        """Whether every layer of ``container`` was skipped at check ``check`` (no sibling ran), in a stack
        never seen dropping some layers only (a stack that drops layers at random may drop all at once)."""
        c = self._containers.get(container)
        return c is not None and c.last_counted == check and len(c.counted_now) >= c.size and not c.partly_skipped

    def chance(self, container: str, index: int, skipped_checks: int, check: int) -> float:
        """The chance that layer ``index`` is skipped at ``skipped_checks`` checks in a row by a random drop.

        The drop rate is the declared one or, when larger, the rate at which the siblings that
        did run at some check were skipped: a sibling skipped at every check is no evidence of
        a random drop (it may be unused too), so a stack with no declared rate and no sibling
        seen both running and skipped gives 0 (the layer is named at once).
        """
        c = self._containers.get(container)
        if c is None:
            return 0.0
        observed = max(1, check - c.first_check + 1)
        others = max(1, (c.size - 1) * observed)
        varying = sum(k for i, k in c.skips.items() if i != index and k < observed)
        rate = max(c.declared, varying / others)
        if rate <= 0.0:
            return 0.0
        return 1.0 if rate >= 1.0 else rate ** skipped_checks

    def declared(self, container: str) -> float:
        c = self._containers.get(container)
        return c.declared if c is not None else 0.0

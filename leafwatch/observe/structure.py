"""The structure cache: what the Monitor checks, rebuilt only when the parameter sets change.

Owns the :class:`~leafwatch.observe.inventory.Inventory` (names, aliases, optimizer sets, orphans), the
optimizers, the per-optimizer :class:`CheckList` of tensors read at each step, and the cheap
fingerprint that says when to rebuild: the Monitor's :class:`~leafwatch.observe.observer.Observer`
counts every module and parameter registered while it is open, and the optimizers' group sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from . import inventory, replaced
from . import sharding as distributed
from .observer import Observer

#: How often (in checks) the structure is re-read even when nothing signalled a change, to see
#: parameters frozen or unfrozen mid-run.
REBUILD_EVERY = 1000
#: How often (in checks) the parameters' requires_grad flags are compared with the last build, so
#: that a parameter unfrozen mid-run but left out of the optimizer is named within a few steps.
REQUIRES_GRAD_EVERY = 10


@dataclasses.dataclass
class CheckList:
    """The tensors checked when one optimizer (or, without optimizers, the model) steps."""

    params: list[torch.Tensor]
    names: tuple[str, ...]
    infos: list[inventory.ParamInfo | None]
    ids: frozenset[int]
    checks: int = 0
    added_at: dict[int, int] = dataclasses.field(default_factory=dict)

    def name_of(self, pid: int) -> str:
        return next((name for p, name in zip(self.params, self.names) if id(p) == pid), "")

    def checks_of(self, pid: int) -> int:
        """How many checks of this list the tensor ``pid`` has been part of."""
        return self.checks - self.added_at.get(pid, 0)


class StructureCache:
    """The model (or the roots ``leafwatch run`` found), the optimizers and what they hold.

    Args:
        model: The unwrapped model, or None.
        optimizers: The optimizers given (more may be added).
        roots: Named root modules (``leafwatch run``); used instead of ``model`` when given.
        observer: What the Monitor's global hooks saw: its registrations tell when to read again.
    """

    def __init__(self, model: nn.Module | None, optimizers: list[torch.optim.Optimizer],
                 roots: Mapping[str, nn.Module] | None, observer: Observer) -> None:
        self.model = model
        self.observer = observer
        self.optimizers = list(optimizers)  # its own list: added to only by add_optimizer()
        #: The registration mark when the optimizers were handed over (each was built before it).
        self.optimizers_mark: int | None = self.observer.built_mark(self.optimizers) if self.optimizers else None
        #: ``id(optimizer)`` -> its index in :attr:`optimizers` (each held here, so its id stays its own).
        self.index_of = {id(o): i for i, o in enumerate(self.optimizers)}
        self.roots = dict(roots) if roots is not None else None
        self.inventory: inventory.Inventory | None = None
        self.grad_view = distributed.PLAIN
        self.lists: dict[int | None, CheckList] = {}
        #: Names of tensors the model held before a change, while an optimizer still holds them.
        self.previous_names: dict[int, str] = {}
        #: The optimizers' old tensors paired with the parameters that replaced them (at the last build).
        self.stale = replaced.Replaced()
        #: Ids of the old tensors (reported as stale_param, never as missing_grad).
        self.stale_ids: frozenset[int] = frozenset()
        #: Ids of the model's parameters seen with requires_grad=False (at creation or a rebuild).
        self.seen_frozen: set[int] = set()
        self._fingerprint: Any = None
        self._built_at = 0
        self._flags_read_at = 0
        self._requires_grad_flags: tuple[bool, ...] = ()
        self._joined: tuple[tuple[tuple[str, ...], ...], tuple[str, ...]] = ((), ())
        self._unheld: tuple[inventory.Inventory | None, tuple[str, ...]] = (None, ())
        self._restored_checks: dict[int | None, int] = {}
        #: Tensors left out of the per-step checks (target networks updated by other means).
        self.left_out: set[int] = set()
        #: How many times the structure was read (for tests of the hot path).
        self.rebuilds = 0
        #: Object id -> the user's variable, when the front-end knows them (``leafwatch run``).
        self.variables: Callable[[], dict[int, str]] | None = None
        #: Asked at the periodic look (every :data:`REQUIRES_GRAD_EVERY` checks) whether a tensor a hook was
        #: put on has been swapped since (``torch.utils.swap_tensors``): then the structure is read again.
        self._swap_checks: list[Callable[[], bool]] = []

    # -- what is checked ---------------------------------------------------------------------
    @property
    def source(self) -> Any:
        """What the Inventory reads: the roots when ``leafwatch run`` named them, else the model."""
        return self.roots if self.roots is not None else self.model

    def has_model(self) -> bool:
        return self.model is not None or bool(self.roots)

    def named_params(self) -> list[tuple[torch.Tensor, str]]:
        inv = inventory.Inventory(self.source)
        return [(t, inv.params[k].name) for k, t in inv.tensors.items()]

    def optimizer_index(self, optimizer: torch.optim.Optimizer | None) -> int | None:
        return None if optimizer is None else self.index_of.get(id(optimizer))

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> bool:
        """Check ``optimizer`` too from now on; True when it was new (the next check rebuilds)."""
        if self.optimizer_index(optimizer) is not None:
            return False
        self.index_of[id(optimizer)] = len(self.optimizers)
        self.optimizers.append(optimizer)
        self.optimizers_mark = self.observer.built_mark(self.optimizers)  # the last one built
        self.invalidate()
        return True

    def set_roots(self, roots: Mapping[str, nn.Module], variables: Callable[[], dict[int, str]] | None = None) -> None:
        """Read these named root modules instead of the model from the next check on
        (``variables``: object id -> the user's code for it, when the front-end knows it)."""
        self.roots = dict(roots)
        if variables is not None:
            self.variables = variables
        self.invalidate()

    def leave_out(self, ids: set[int]) -> None:
        """Stop reading these tensors' gradients (from the next check on, which rebuilds)."""
        if ids - self.left_out:
            self.left_out |= ids
            self.invalidate()

    def watch_swaps(self, swapped: Callable[[], bool]) -> None:
        """Read the structure again when ``swapped()`` says so at the periodic look (a hook left on a
        swapped tensor is put on it again by what a new reading calls: never on a healthy step, whose
        check reads each ``.grad`` and nothing else of a tensor)."""
        self._swap_checks.append(swapped)

    def invalidate(self) -> None:
        """Rebuild at the next :meth:`refresh`."""
        self._fingerprint = None

    def joined_names(self, lists: list[CheckList]) -> tuple[str, ...]:
        """The names of several lists, one tuple kept (same identity) until the lists change."""
        if len(lists) == 1:
            return lists[0].names
        parts, joined = self._joined
        if len(parts) != len(lists) or any(a is not c.names for a, c in zip(parts, lists)):
            parts = tuple(c.names for c in lists)
            joined = tuple(n for part in parts for n in part)
            self._joined = (parts, joined)
        return joined

    def in_no_optimizer(self) -> tuple[str, ...]:
        """The names of the tensors that require grad and that no optimizer holds (the model's
        trainable tensors left out of every optimizer, and its orphans: plain attributes, tensors in
        Python lists and dicts), at the last reading of the structure; empty when no optimizer was
        given (then every trainable tensor is checked). The tensors found updated by other means
        (:attr:`left_out`: target networks) are not among them. Worked out once per reading, when
        first asked (by the sinks' event), and kept (same identity) until the structure is read
        again (:meth:`leave_out` makes it read again).
        """
        inv = self.inventory
        seen, names = self._unheld
        if inv is seen:
            return names
        if inv is not None and self.optimizers:
            held = inv.in_optimizer | self.left_out
            names = tuple([inv.params[k].name for k, t in inv.tensors.items() if t.requires_grad and k not in held]
                          + [o.name for o in inv.orphans() if id(o.tensor) not in held])
        else:
            names = ()
        self._unheld = (inv, names)
        return names

    def restore_checks(self, counts: Mapping[int | None, int]) -> None:
        """Check counts from a saved state, applied at the next rebuild."""
        self._restored_checks = dict(counts)
        self.invalidate()

    def stats(self) -> dict[str, int]:
        """Sizes of what is read per step, for tests of the hot path."""
        return {"checked": sum(len(c.params) for c in self.lists.values()), "check_lists": len(self.lists),
                "previous_names": len(self.previous_names)}

    def check_counts(self) -> dict[str, int]:
        return {str(k): c.checks for k, c in self.lists.items()}

    # -- rebuilding --------------------------------------------------------------------------
    def snapshot(self) -> inventory.Inventory | None:
        """Remember the names the model's tensors have now (at the Monitor's creation), so that a
        layer replaced before the first check is paired with its predecessor by name."""
        if not self.has_model():
            return None
        inv = inventory.Inventory(self.source)
        self.previous_names.update(inv.known_names())
        self.seen_frozen = {k for k, t in inv.tensors.items() if not t.requires_grad}
        return inv

    def fingerprint(self) -> list[Any]:
        """What is compared at every check to know whether to rebuild (flat, small, no tensor: one
        number per param group, never a pass over the parameters)."""
        fingerprint = [self.observer.generation]
        for opt in self.optimizers:
            fingerprint += [id(opt), *(len(group["params"]) for group in opt.param_groups), -1]
        return fingerprint

    def refresh(self, step: int) -> inventory.Inventory | None:
        """Rebuild when the structure changed (or is due a periodic look); the new inventory or None."""
        # Read at every check right after backward, when every line runs cold: the fingerprint is
        # compared in place (no list built, no call) and the flags are read only when due.
        seen = self._fingerprint
        unchanged = seen is not None and seen[0] == self.observer.generation and step - self._built_at < REBUILD_EVERY
        if unchanged:
            i = 1
            try:  # the fingerprint's order: id(optimizer), the length of each group's params, -1
                for opt in self.optimizers:
                    if seen[i] != id(opt):
                        unchanged = False
                        break
                    i += 1
                    for group in opt.param_groups:
                        if seen[i] != len(group["params"]):
                            unchanged = False
                            break
                        i += 1
                    if not unchanged or seen[i] != -1:
                        unchanged = False
                        break
                    i += 1
            except IndexError:  # more than was seen
                unchanged = False
            unchanged = unchanged and i == len(seen)
        if unchanged and (abs(step - self._flags_read_at) < REQUIRES_GRAD_EVERY or not self._requires_grad_changed(step)):
            return None
        self._fingerprint = self.fingerprint()
        return self.rebuild(step)

    def rebuild(self, step: int) -> inventory.Inventory:
        if self.inventory is not None:
            self.previous_names.update(self.inventory.known_names())
        inv = self.inventory = inventory.Inventory(self.source, self.optimizers)
        inv.variables = self.variables
        inv.optimizers_mark, inv.appeared, inv.built = self.optimizers_mark, self.observer.appeared, self.observer.built
        inv.built_by, inv.existing = self.observer.built_by, self.observer.built_optimizers
        # Old names matter only while an optimizer still holds the tensor.
        self.previous_names = {k: v for k, v in self.previous_names.items()
                               if k in inv.in_optimizer and k not in inv.tensors}
        # Parameters seen frozen: one trainable now but in no optimizer was unfrozen after it was built.
        self.seen_frozen = {k for k in self.seen_frozen if k in inv.tensors} | \
            {k for k, t in inv.tensors.items() if not t.requires_grad}
        self.stale = replaced.pair(inv, self.previous_names)
        self.stale_ids = frozenset(self.stale.old_ids())
        old_lists, self.lists = self.lists, {}
        view = self.grad_view = distributed.gradient_view(
            self.source, [(k, t, inv.params[k].name) for k, t in inv.tensors.items()])
        self.left_out &= set(inv.tensors) | set(inv.in_optimizer)
        skip = view.skip | self.left_out if self.left_out else view.skip
        if self.optimizers:
            for i, params in enumerate(inv.optimizer_params):
                params = [p for p in params if id(p) not in skip] if skip else params
                self.lists[i] = self._make_list(params, inv, old_lists.get(i))
        else:
            self.lists[None] = self._make_list(
                [t for k, t in inv.tensors.items() if t.requires_grad and k not in skip], inv,
                old_lists.get(None))
        for key, count in self._restored_checks.items():
            if key in self.lists:
                self.lists[key].checks = count
        self._restored_checks = {}
        self._fingerprint = self.fingerprint()
        self.rebuilds += 1
        self._built_at = self._flags_read_at = step
        self._requires_grad_flags = self._read_requires_grad()
        return inv

    def _read_requires_grad(self) -> tuple[bool, ...]:
        return tuple(t.requires_grad for t in self.inventory.tensors.values()) if self.inventory else ()

    def _requires_grad_changed(self, step: int) -> bool:
        """Every few checks (the caller tells when): was a parameter frozen or unfrozen since the last build?"""
        self._flags_read_at = step
        return self._read_requires_grad() != self._requires_grad_flags or any(swapped() for swapped in self._swap_checks)

    def _make_list(self, params: list[torch.Tensor], inv: inventory.Inventory, old: CheckList | None) -> CheckList:
        infos = [inv.params.get(id(p)) for p in params]
        # An old tensor is named by the parameter that replaced it (it is a stale_param finding).
        current = self.stale.names()
        names = tuple(info.name if info else current.get(id(p)) or self.previous_names.get(id(p))
                      or inventory.shape_text(p) for info, p in zip(infos, params))
        checks_done = old.checks if old is not None else 0
        added_at = {id(p): (old.added_at.get(id(p), checks_done) if old is not None else 0) for p in params}
        return CheckList(params, names, infos, frozenset(map(id, params)), checks_done, added_at)

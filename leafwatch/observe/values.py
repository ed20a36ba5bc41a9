"""Batched non-finite gradient check: a few fused ops per device, never one sync per tensor.

The gradients are grouped by device and dtype (one C++ call). A healthy step costs, per group:

- on CPU, where every op pays a fixed dispatch cost that dwarfs a small tensor's data, up to
  :data:`FEW_TENSORS` gradients, or any of at least :data:`NORM_NUMEL` elements, get their L2
  norm, all in one fused call that reads them in place; many smaller ones are concatenated by
  shape (one copy per shape, in chunks of bounded size) and reduced to one max-abs value per
  tensor. All of it is read on the host once.
  An L2 norm can overflow for a huge finite gradient or underflow to 0 for a tiny nonzero one, so
  each tensor it flags is looked at exactly before it is reported: a flag is never a false alarm.
  (Without the zero test, one ``aminmax`` per buffer and per large gradient; only when something
  is not finite is each tensor of the failing group checked on its own, to name it.)
- on CUDA, one fused ``torch._foreach_norm(ord=inf)`` over the group and one ``isfinite``; the
  per-tensor mask is copied with ``non_blocking=True`` into pinned memory behind an event and
  read at a later check, once the event says it is done: no host-device sync. The max-abs norm
  is NaN for a NaN anywhere and Inf for an Inf anywhere, and unlike the L2 norm it cannot
  overflow for a large but finite low-precision gradient.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

#: Gradients with at most this many elements are flattened together on CPU (by :func:`_cpu_all_finite`).
SMALL_NUMEL = 1 << 16
#: Gradients with at least this many elements get their own norm in one fused call on CPU (by
#: :func:`_cpu_check`): under it the copy with the others of its shape is cheaper than a norm per tensor.
NORM_NUMEL = 1 << 10
#: Up to this many gradients of one CPU dtype group all get their own norm in that one call:
#: cheaper than the few more ops that group the small ones by shape.
FEW_TENSORS = 64
#: At most this many elements are copied into one buffer at a time (a flat one, or one shape's rows).
CHUNK_NUMEL = 1 << 22
_INF = float("inf")


@dataclasses.dataclass
class _Pending:
    step: int
    indices: list[int]
    host: torch.Tensor  # per tensor: 1 = not finite, 2 = exactly zero
    event: object


def _dense(grad: torch.Tensor) -> torch.Tensor:
    if type(grad) is not torch.Tensor:  # a plain tensor skips the attribute lookup
        to_local = getattr(grad, "to_local", None)
        if callable(to_local):  # a DTensor: each rank checks its own shard, with plain tensor ops
            grad = to_local()
    return grad._values() if grad.is_sparse else grad


def _plain(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], bool]:
    """Dense tensors to check (the list itself when every tensor is a plain dense one, the usual
    case), and whether any of them was sparse; one pass."""
    plain = torch.Tensor
    for t in tensors:
        if type(t) is not plain or t.is_sparse:
            return [_dense(t) for t in tensors], any(t.is_sparse for t in tensors)
    return tensors, False


def _is_finite(grad: torch.Tensor) -> bool:
    """One tensor, exactly (the slow path, used only to name what a batched check flagged)."""
    return bool(torch.isfinite(grad).all())


def _group(grads: list[torch.Tensor]) -> dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[int]]]:
    """``{(device, dtype): (tensors, their indices in grads)}``, floating and complex only."""
    try:
        grouped = torch._C._group_tensors_by_device_and_dtype([grads], True)
        out = {key: (lists[0], list(indices)) for key, (lists, indices) in grouped.items()}
    except (AttributeError, RuntimeError, TypeError):  # an older torch or an exotic tensor
        out = {}
        for i, g in enumerate(grads):
            tensors, indices = out.setdefault((g.device, g.dtype), ([], []))
            tensors.append(g)
            indices.append(i)
    return {key: value for key, value in out.items() if key[1].is_floating_point or key[1].is_complex}


def _flags(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Per tensor, from its max-abs norm (one fused op): 1 when not finite, 2 when exactly zero, else 0."""
    try:
        each = torch._foreach_norm(tensors, _INF)
    except (RuntimeError, TypeError):  # an exotic tensor subclass: one norm each
        each = [torch.linalg.vector_norm(t, _INF) for t in tensors]
    norms = torch.stack(each)
    return (~torch.isfinite(norms)).to(torch.uint8) + (norms == 0).to(torch.uint8) * 2


def _extremes(t: torch.Tensor) -> torch.Tensor:
    """The smallest and largest value of a non-empty CPU tensor: both finite iff every value is
    (NaN propagates through min and max; unlike a sum or a norm, neither can overflow)."""
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    return torch.stack(torch.aminmax(t))


#: How many shape plans a checker keeps (one per set of small-tensor sizes it met).
PLANS_KEPT = 4


@dataclasses.dataclass(frozen=True)
class _ShapePlan:
    """Small tensors grouped by shape: per group, their positions, their size and whether they are
    0-dim (stacked, not concatenated); ``order``: the positions in the order the values come out."""

    groups: tuple[tuple[tuple[int, ...], int, bool], ...]
    order: tuple[int, ...]


def _shape_plan(tensors: list[torch.Tensor], numels: list[int]) -> _ShapePlan:
    by_shape: dict[torch.Size, list[int]] = {}
    for i, t in enumerate(tensors):
        by_shape.setdefault(t.shape, []).append(i)
    groups = []
    for shape, positions in by_shape.items():
        n = numels[positions[0]]
        per_copy = max(1, CHUNK_NUMEL // n)  # at most CHUNK_NUMEL elements copied at a time
        groups.extend((tuple(positions[s:s + per_copy]), n, not shape) for s in range(0, len(positions), per_copy))
    return _ShapePlan(tuple(groups), tuple(i for g in groups for i in g[0]))


def _run_plan(tensors: list[torch.Tensor], plan: _ShapePlan) -> torch.Tensor:
    parts = []
    for positions, n, scalar in plan.groups:
        members = [tensors[i] for i in positions]
        block = torch.stack(members) if scalar else torch.cat(members)  # a copy: one row per tensor
        parts.append(torch.linalg.vector_norm(block.view(len(positions), n), _INF, dim=1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _max_abs_by_shape(tensors: list[torch.Tensor], numels: list[int],
                      plans: dict[tuple[object, ...], _ShapePlan]) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The max-abs value of each small tensor (exact: NaN propagates, nothing overflows, 0 only for
    an all-zero tensor), and their positions in the order the values come.

    The tensors of one shape are concatenated in one copy (no view per tensor: flattening 1,000
    small tensors one view each costs about 1 ms on CPU, their concatenation by shape a tenth of
    it) and reduced per row. The grouping is worked out once per set of sizes (``plans``, keyed by
    the dtype and every tensor's number of elements, read anyway): with each tensor's size known,
    each tensor is one row of its group's concatenation whatever its shape; a concatenation that
    fails (a tensor reshaped to the same size) groups them again.
    """
    key = (tensors[0].dtype, tuple(numels))
    plan = plans.get(key)
    if plan is not None:
        try:
            return _run_plan(tensors, plan), plan.order
        except RuntimeError:  # a tensor reshaped, its size unchanged: grouped again below
            pass
    if len(plans) >= PLANS_KEPT:
        plans.clear()
    plan = plans[key] = _shape_plan(tensors, numels)
    return _run_plan(tensors, plan), plan.order


def _l2_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of each tensor, in one fused call, accumulated in float32 at least."""
    wide = torch.float32 if tensors[0].dtype in (torch.float16, torch.bfloat16) else None
    try:
        norms = torch._foreach_norm(tensors, 2, dtype=wide) if wide is not None else torch._foreach_norm(tensors, 2)
    except (RuntimeError, TypeError):  # an older torch without the dtype, or an exotic tensor subclass
        norms = [torch.linalg.vector_norm(t, 2, dtype=wide) for t in tensors]
    return torch.stack(norms)


def _cpu_norms(tensors: list[torch.Tensor], plans: dict[tuple[object, ...], _ShapePlan] | None = None,
               ) -> tuple[torch.Tensor | None, list[int], int]:
    """A norm of each tensor of one real CPU dtype group, their indices, and how many of them (the
    first ones) are L2 norms (the module docstring says which; empty tensors are left out).

    Right after backward every distinct torch op runs cold (tens of µs each), so the check makes
    as few as it can. An L2 norm is also 0 for an empty tensor: :func:`_cpu_check` confirms what
    it flags; ``plans`` keeps the grouping of :func:`_max_abs_by_shape` from one call to the next.
    """
    if len(tensors) <= FEW_TENSORS:
        return _l2_norms(tensors), list(range(len(tensors))), len(tensors)
    large: list[torch.Tensor] = []
    index: list[int] = []
    small: list[torch.Tensor] = []
    small_index: list[int] = []
    numels: list[int] = []
    for j, t in enumerate(tensors):
        n = t.numel()
        if n >= NORM_NUMEL:
            large.append(t)
            index.append(j)
        elif n:
            small.append(t)
            small_index.append(j)
            numels.append(n)
    norms = [_l2_norms(large)] if large else []
    if small:
        values, order = _max_abs_by_shape(small, numels, {} if plans is None else plans)
        norms.append(values)
        index.extend(small_index[i] for i in order)
    if not norms:
        return None, [], 0
    return (norms[0] if len(norms) == 1 else torch.cat(norms)), index, len(large)


def _cpu_check(tensors: list[torch.Tensor], plans: dict[tuple[object, ...], _ShapePlan] | None = None,
               ) -> tuple[list[int], list[int]]:
    """The indices of the non-finite tensors and of the exactly-zero ones, with one host read
    (and one exact look at each tensor an L2 norm flagged, so that nothing is a false alarm)."""
    norms, index, inexact = _cpu_norms(tensors, plans)
    if norms is None:
        return [], []
    bad, zero = [], []
    finite = math.isfinite
    for j, value in enumerate(norms.tolist()):  # the one host read; the flags in Python (no more ops)
        if value and finite(value):
            continue
        t = tensors[index[j]]
        if not finite(value):
            if j >= inexact or not _is_finite(t):  # not an overflow of a huge finite tensor
                bad.append(index[j])
        elif j >= inexact or (t.numel() and not bool(t.any())):  # not an underflow, nor empty
            zero.append(index[j])
    return sorted(bad), zero  # (in the order of the tensors given)


def _cpu_all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every tensor of one CPU dtype group is finite, with one read on the host."""
    parts: list[torch.Tensor] = []
    chunk: list[torch.Tensor] = []
    chunk_numel = 0
    for t in tensors:
        n = t.numel()
        if n > SMALL_NUMEL:
            parts.append(_extremes(t))
        elif n:
            if chunk_numel + n > CHUNK_NUMEL:
                parts.append(_extremes(torch._utils._flatten_dense_tensors(chunk)))
                chunk, chunk_numel = [], 0
            chunk.append(t)
            chunk_numel += n
    if chunk:
        parts.append(_extremes(torch._utils._flatten_dense_tensors(chunk)))
    return not parts or bool(torch.isfinite(parts[0] if len(parts) == 1 else torch.cat(parts)).all())


class ValueChecker:
    """Finds non-finite gradients; results for CUDA tensors arrive at a later call."""

    def __init__(self, track_zeros: bool = False) -> None:
        self._pending: list[_Pending] = []
        #: Whether exactly-zero gradients are collected too.
        self.track_zeros = track_zeros
        #: step -> indices of exactly-zero gradients, for the completed steps (the caller pops them).
        self.zeros: dict[int, set[int]] = {}
        #: How the small CPU gradients were grouped by shape, per set of sizes (plain ints, no tensor).
        self._plans: dict[tuple[object, ...], _ShapePlan] = {}

    def check(self, grads: Sequence[torch.Tensor | None], step: int) -> tuple[list[int], list[tuple[int, int]]]:
        """Launch a check of ``grads``; return the steps whose results are in, and ``(step, index)``
        for every non-finite gradient among them.

        Indices refer to the ``grads`` sequence of the step they were launched at; callers map
        them with the names of that step. The exactly-zero gradients of the same steps are
        collected in :attr:`zeros` (the same reductions, no extra host read).
        """
        completed, ready = self._collect()
        present = [g for g in grads if g is not None]
        where = None if len(present) == len(grads) else [i for i, g in enumerate(grads) if g is not None]
        checked_now = False
        zeros_now: list[int] = []
        deferred: dict[torch.device, tuple[list[torch.Tensor], list[int]]] = {}
        for (device, dtype), (tensors, indices) in _group(present).items():
            # A sparse gradient's zeros are rows it does not touch: never "carries nothing".
            tensors, sparse = _plain(tensors)
            want_zeros = self.track_zeros and not sparse and not dtype.is_complex
            if where is not None:
                indices = [where[j] for j in indices]
            if device.type == "cuda":
                masks, all_indices = deferred.setdefault(device, ([], []))
                flags = _flags(tensors)
                masks.append(flags if want_zeros else flags & 1)
                all_indices.extend(indices)
                continue
            checked_now = True
            if device.type == "cpu":
                if want_zeros:
                    bad, zero = _cpu_check(tensors, self._plans)
                    zeros_now.extend(indices[j] for j in zero)
                    ready.extend((step, indices[j]) for j in bad)
                elif not _cpu_all_finite(tensors):
                    # Something is not finite: name it, one tensor at a time.
                    ready.extend((step, i) for t, i in zip(tensors, indices) if not _is_finite(t))
            else:  # another accelerator: the flags, read at once
                flags = _flags(tensors).cpu().tolist()
                ready.extend((step, indices[j]) for j, f in enumerate(flags) if f & 1)
                if want_zeros:
                    zeros_now.extend(indices[j] for j, f in enumerate(flags) if f & 2)
        for device, (masks, indices) in deferred.items():
            flags = masks[0] if len(masks) == 1 else torch.cat(masks)
            host = torch.empty(flags.shape, dtype=torch.uint8, pin_memory=True)
            host.copy_(flags, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self._pending.append(_Pending(step, indices, host, event))
        if checked_now and self.track_zeros:
            self.zeros.setdefault(step, set()).update(zeros_now)
        if checked_now and not any(p.step == step for p in self._pending):
            completed.append(step)
        return completed, ready

    def _collect(self) -> tuple[list[int], list[tuple[int, int]]]:
        ready: list[tuple[int, int]] = []
        still: list[_Pending] = []
        done: set[int] = set()
        for pending in self._pending:
            if pending.event.query():  # type: ignore[attr-defined]
                done.add(pending.step)
                flagged = pending.host.nonzero().flatten().tolist()
                flags = pending.host[flagged].tolist() if flagged else []
                ready.extend((pending.step, pending.indices[j]) for j, f in zip(flagged, flags) if f & 1)
                if self.track_zeros:
                    self.zeros.setdefault(pending.step, set()).update(
                        pending.indices[j] for j, f in zip(flagged, flags) if f & 2)
            else:
                still.append(pending)
        self._pending = still
        return sorted(done - {p.step for p in still}), ready

    def flush(self) -> tuple[list[int], list[tuple[int, int]]]:
        """Wait for every pending CUDA result (at the end of a run) and return them."""
        for pending in self._pending:
            pending.event.synchronize()  # type: ignore[attr-defined]
        return self._collect()

    def pending_steps(self) -> set[int]:
        """The steps whose CUDA results are still on their way."""
        return {p.step for p in self._pending}


class NamedValueCheck:
    """The batched check over named tensors: each flagged gradient comes back with its name.

    Keeps the names and tensors of a step only while its results are on their way (CUDA).
    """

    def __init__(self, track_zeros: bool = False) -> None:
        self.checker = ValueChecker(track_zeros)
        self._launched: dict[int, tuple[tuple[str, ...], list[torch.Tensor], list[int]]] = {}
        self._zeros: list[tuple[int, list[str], set[str]]] = []

    def check(self, names: tuple[str, ...], params: list[torch.Tensor], grads: Sequence[torch.Tensor | None],
              step: int) -> tuple[list[int], list[tuple[int, str, torch.Tensor]]]:
        """Launch a check of ``grads`` (of ``params``, named ``names``); the steps whose results
        are in, and ``(step, name, tensor)`` for each non-finite gradient among them."""
        present = [i for i, g in enumerate(grads) if g is not None] if self.checker.track_zeros else []
        self._launched[step] = (names, params, present)
        completed, bad = self.checker.check(grads, step)
        return completed, self._named(bad)

    def stats(self) -> dict[str, int]:
        """The checks in flight, and how many steps' names are kept (while their CUDA results are on their way)."""
        return {"value_checks_in_flight": len(self.checker.pending_steps()), "value_names_kept": len(self._launched)}

    def flush(self) -> tuple[list[int], list[tuple[int, str, torch.Tensor]]]:
        completed, bad = self.checker.flush()
        return completed, self._named(bad)

    def take_zeros(self) -> list[tuple[int, list[str], set[str]]]:
        """``(step, names with a gradient, names whose gradient was exactly zero)`` per completed
        value check since the last call (only with ``track_zeros``)."""
        out, self._zeros = self._zeros, []
        return out

    def _named(self, bad: list[tuple[int, int]]) -> list[tuple[int, str, torch.Tensor]]:
        out = []
        for step, index in bad:
            names, params, _ = self._launched.get(step, ((), [], []))
            if index < len(names):
                out.append((step, names[index], params[index]))
        in_flight = self.checker.pending_steps()
        for step in sorted(s for s in self.checker.zeros if s not in in_flight):
            zero = self.checker.zeros.pop(step)
            if step in self._launched:
                names, _, present = self._launched[step]
                self._zeros.append((step, [names[i] for i in present], {names[i] for i in zero}))
        for s in [s for s in self._launched if s not in in_flight]:
            del self._launched[s]
        return out


def nonfinite(tensors: Sequence[torch.Tensor | None], step: int) -> list[tuple[int, int]]:
    """``(step, index)`` of each non-finite tensor, waiting for CUDA results (for the end of a run)."""
    checker = ValueChecker()
    _, bad = checker.check([t.detach() if t is not None else None for t in tensors], step)
    return bad + checker.flush()[1]

"""Batched non-finite gradient check: one fused norm per device, never one sync per tensor.

NaN and Inf both show in the L2 norm, so one ``torch._foreach_norm`` over the gradients of a
device, stacked into one vector, tells which tensors hold a non-finite value. On CPU the answer
is read at once. On CUDA it is copied with ``non_blocking=True`` into pinned memory behind an
event and read at a later check, once the event says it is done: no host-device sync.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch


@dataclasses.dataclass
class _Pending:
    step: int
    indices: list[int]
    host: torch.Tensor
    event: object


def _dense(grad: torch.Tensor) -> torch.Tensor:
    to_local = getattr(grad, "to_local", None)
    if callable(to_local):  # a DTensor: each rank checks its own shard, with plain tensor ops
        grad = to_local()
    return grad._values() if grad.is_sparse else grad


def _bad_mask(grads: list[torch.Tensor]) -> torch.Tensor:
    try:
        norms = torch._foreach_norm(grads)
    except (RuntimeError, TypeError):  # an exotic tensor subclass: fall back to one norm each
        norms = [torch.linalg.vector_norm(g) for g in grads]
    return ~torch.isfinite(torch.stack([n.float().reshape(()) for n in norms]))


def _confirm(grad: torch.Tensor) -> bool:
    """The L2 norm of a huge but finite low-precision grad can overflow: check the values."""
    return not bool(torch.isfinite(_dense(grad)).all())


class ValueChecker:
    """Finds non-finite gradients; results for CUDA tensors arrive at a later call."""

    def __init__(self) -> None:
        self._pending: list[_Pending] = []

    def check(
        self, grads: Sequence[torch.Tensor | None], step: int
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Launch a check of ``grads``; return the steps whose results are in, and ``(step, index)``
        for every non-finite gradient among them.

        Indices refer to the ``grads`` sequence of the step they were launched at; callers map
        them with the names of that step.
        """
        completed, ready = self._collect()
        cpu_done = False
        by_device: dict[torch.device, list[int]] = {}
        for i, g in enumerate(grads):
            if g is not None and (g.is_floating_point() or g.is_complex()):
                by_device.setdefault(g.device, []).append(i)
        for device, indices in by_device.items():
            dense = [_dense(grads[i]) for i in indices]
            bad = _bad_mask(dense)
            if device.type == "cuda":
                host = torch.empty(bad.shape, dtype=torch.bool, pin_memory=True)
                host.copy_(bad, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                self._pending.append(_Pending(step, indices, host, event))
            else:
                cpu_done = True
                for j in bad.nonzero().flatten().tolist():
                    if _confirm(grads[indices[j]]):
                        ready.append((step, indices[j]))
        if cpu_done and not any(p.step == step for p in self._pending):
            completed.append(step)
        return completed, ready

    def _collect(self) -> tuple[list[int], list[tuple[int, int]]]:
        ready: list[tuple[int, int]] = []
        still: list[_Pending] = []
        done: set[int] = set()
        for pending in self._pending:
            if pending.event.query():  # type: ignore[attr-defined]
                done.add(pending.step)
                for j in pending.host.nonzero().flatten().tolist():
                    ready.append((pending.step, pending.indices[j]))
            else:
                still.append(pending)
        self._pending = still
        return sorted(done - {p.step for p in still}), ready

    def flush(self) -> tuple[list[int], list[tuple[int, int]]]:
        """Wait for every pending CUDA result (at the end of a run) and return them."""
        for pending in self._pending:
            pending.event.synchronize()  # type: ignore[attr-defined]
        return self._collect()

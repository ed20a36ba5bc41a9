"""The diagnostic hooks of one check: where they sit, and when a forward is instrumented.

At creation forward hooks go on every module (and arrival hooks on every trainable tensor), so
that the first step's missing gradients are fully explained; the first forward runs the cut
recorder. After each check the hooks are kept only on the modules (and their ancestors) owning
a tensor that misses its gradient, and arrival hooks only on the tensors that miss or whose
gradient was cleared; that is worked out again only when one of those changes, and the next
forward is instrumented again only after a new miss or a new structure.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from . import crashes, structure, tracing
from .loop import ArrivalHooks, StepSentinels


class Diagnostics:
    """The tracer (forward hooks, cut recorder) and the arming of the loop watch's arrival hooks.

    Args:
        structure_: The structure cache (the modules, the tensors, the check lists).
        arrivals, sentinels: The loop hooks (the arrival hooks follow the misses and the cleared gradients).
        diagnose: Whether any hook is armed at all.
        warn: Warns once per internal failure.
    """

    def __init__(self, structure_: structure.StructureCache, arrivals: ArrivalHooks, sentinels: StepSentinels,
                 diagnose: bool, warn: Callable[..., Any]) -> None:
        self.structure = structure_
        self.arrivals, self.sentinels = arrivals, sentinels
        self.diagnose, self.warn = diagnose, warn
        self.tracer = tracing.Tracer(on_error=warn)
        self.tracer.on_forward = self._forward_begins
        self._retargeted: tuple[int, int, object] | None = None

    def arm(self, snapshot: Any) -> None:
        """At creation: hooks on every module and every trainable tensor (never raises)."""
        if not self.diagnose or snapshot is None:
            return
        try:
            # A compiled model runs no cut recorder: a torch-function mode forces a recompile.
            cache = self.structure
            roots = cache.roots.values() if cache.roots is not None else [cache.model]
            self.tracer.compiled = any(type(m).__name__ == "OptimizedModule" for m in roots)
            self.tracer.arm(snapshot.modules)
            self.arrivals.arm(snapshot.tensors.values(), snapshot.follow)
        except Exception as error:  # never stop training for a diagnostic
            self.warn("arming the diagnostic hooks", error)

    def retarget(self, changes: int, missing: Iterable[int], cleared: Sequence[int],
                 settled: tuple[int, Collection[int]]) -> None:
        """After a check: the hooks follow the tensors that miss now (ids; ``changes`` counts that set's
        changes) and the gradients found cleared, worked out again only when one of them or the
        structure changes (handed over: observe/ reads no detector's state). ``settled``: (a count of its
        changes, the misses whose finding is counted without being worked out again): the forward hooks
        leave their modules (torch's global forward hooks cost every module call while one is armed);
        the arrival hooks stay on them (a miss the loop starts clearing is still told)."""
        cache, tracer = self.structure, self.tracer
        if self.arrivals.handles:
            self.arrivals.rearm_swapped()  # (a miss's hook a swap left on the old contents: on it again)
        retarget = (changes, cache.rebuilds, tuple(cleared), settled[0])
        if self.diagnose and cache.inventory is not None and retarget != self._retargeted:
            instrument = not isinstance(self._retargeted, tuple) or retarget[:2] != self._retargeted[:2]
            self._retargeted = retarget
            listed = set().union(*(clist.ids for clist in cache.lists.values()))  # (no closure over `cache`:
            missing_ids = list(filter(listed.__contains__, missing))  # a cell at every check)
            traced = [pid for pid in missing_ids if pid not in settled[1]] if settled[1] else missing_ids
            tracer.retarget(tracing.modules_owning(traced, cache.inventory), instrument=instrument)
            tensors = cache.inventory.tensors
            self.arrivals.retarget({pid: tensors[pid] for pid in (*missing_ids, *cleared) if pid in tensors},
                                   cache.inventory.follow)

    def _forward_begins(self) -> None:
        """A forward under the recorder begins (the first step's, one after a new miss): the arrival hooks
        of the tensors swapped since they were hooked are put on them again, so that this step's backward
        is seen (a ``model.to(torch.float64)`` with swap-on-conversion between the Monitor and the step)."""
        if self.arrivals.handles:
            self.arrivals.rearm_swapped()

    def crash_context(self) -> crashes.Context:
        """What the crash door reads of this Monitor: its model (or roots) and what the tracer saw of the
        last forward (the modules that ran with grad mode off, the cuts)."""
        cache = self.structure
        roots = tuple(cache.roots.values()) if cache.roots is not None else (cache.model,) if cache.model is not None else ()
        return crashes.Context(roots, tracer=self.tracer)

    def close(self) -> None:
        """Remove every diagnostic hook (the loop watch's sentinels too)."""
        self.tracer.disarm()
        self.tracer.zero_ops.clear()
        self.tracer.switched_on.clear()
        self.arrivals.disarm()
        self.sentinels.close()

    def stats(self) -> dict[str, int]:
        records = self.tracer.records
        return {
            "diagnostic_hooks": len(self.tracer.handles),
            "diagnostic_records": len(records),
            "diagnostic_inputs_kept": sum(len(r.detached_inputs) for r in records.values()),
            "diagnostic_max_calls": max((r.calls for r in records.values()), default=0),
            "cut_sites": len(self.tracer.cuts),
            "arrival_hooks": len(self.arrivals.handles),
        }

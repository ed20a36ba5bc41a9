"""``Monitor``: the checks across steps, with history, patience and diagnostic hooks.

Per optimizer step the Monitor does only what can change per step: one pass over a
precomputed list reading ``p.grad``. Names, ownership and the structural checks are rebuilt
only when the parameter sets change (a cheap fingerprint), and causes are worked out only for
the few tensors that miss a gradient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import checks, graph, inventory, tracing, watching
from .events import CheckEvent
from .findings import Finding, Report
from .integrations import distributed as _distributed
from .options import WarnOnce, apply_ignore, validate_bool, validate_ignore, validate_int, warn_unmatched_ignore
from .values import ValueChecker

#: How often (in checks) the structure is re-read even when nothing signalled a change, to see
#: parameters frozen or unfrozen mid-run.
REBUILD_EVERY = 1000
#: How often (in checks) the parameters' requires_grad flags are compared with the last build, so
#: that a parameter unfrozen mid-run but left out of the optimizer is named within a few steps.
REQUIRES_GRAD_EVERY = 10
#: The NaN/Inf check runs every this many checks: on a model of 1,000 small tensors one batched
#: check costs about 10% of a CPU training step (benchmarks/bench.py), so 20 keeps it near 0.5%.
DEFAULT_VALUE_CHECK_EVERY = 20
#: An intermittent tensor is reported again (a warning) once it goes this many checks in a row
#: without a gradient, and at least twice its longest gap before: it stopped training.
STALLED_AFTER = 100
_STRUCTURAL_KINDS = frozenset({"not_in_optimizer", "frozen_in_optimizer", "stale_param",
                               "orphan_tensor", "device_mismatch", "non_leaf"})


@dataclasses.dataclass
class _CheckList:
    """The tensors checked when one optimizer (or, without optimizers, the model) steps."""

    params: list[torch.Tensor]
    names: tuple[str, ...]
    infos: list[inventory.ParamInfo | None]
    ids: frozenset[int]
    checks: int = 0
    added_at: dict[int, int] = dataclasses.field(default_factory=dict)


class Monitor:
    """Checks every optimizer step and keeps each finding's history.

    Create it before the first forward pass: until its first :meth:`check` it arms forward hooks
    on every module so that the first step's missing gradients are fully explained. Afterwards
    hooks stay only on modules that missed a gradient.

    Args:
        model: The model (DDP and ``torch.compile`` wrappers are unwrapped).
        optimizers: One optimizer or a sequence; without them every trainable parameter is checked.
        tensors: Extra tensors to check, name -> tensor (they are ``watch()``-ed until ``close()``).
        patience: Consecutive checks a trainable parameter may go without a gradient before
            ``missing_grad`` is reported.
        ignore: Glob patterns on names (``{"head.*": "why"}`` or ``["head.*"]``); matching findings
            are reported as ``ignored`` with the reason.
        check_values_every_n_steps: Run the batched NaN/Inf check every N checks (0 turns it off).
        writer: A ``SummaryWriter`` to log each check to TensorBoard.
        strict: Raise :class:`LeafwatchError` at the first check with an open error finding.
        diagnose: Arm the diagnostic forward hooks (on by default).
        sinks: Extra callables taking a :class:`CheckEvent`.
        distributed: Merge the findings of every rank after each check (rank zero runs the
            sinks, every rank gets the merged report and raises in strict mode). None: when
            ``torch.distributed`` is initialized with more than one process.

    Example::

        >>> import torch, leafwatch
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> with leafwatch.Monitor(model, opt) as monitor:
        ...     model(torch.ones(4, 2)).sum().backward()
        ...     report = monitor.check()
        >>> report.findings
        []
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        *,
        tensors: Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | None = None,
        patience: int = 1,
        ignore: Mapping[str, str] | Sequence[str] | None = None,
        check_values_every_n_steps: int = DEFAULT_VALUE_CHECK_EVERY,
        writer: Any = None,
        strict: bool = False,
        diagnose: bool = True,
        sinks: Sequence[Callable[[CheckEvent], Any]] = (),
        distributed: bool | None = None,
        _roots: Mapping[str, nn.Module] | None = None,
    ) -> None:
        self.model = inventory.normalize_model(model)
        self.optimizers = inventory.normalize_optimizers(optimizers)
        self.patience = validate_int(patience, "patience", 1)
        self.check_values_every_n_steps = validate_int(check_values_every_n_steps, "check_values_every_n_steps", 0)
        self.ignore = validate_ignore(ignore)
        validate_bool(strict, "strict")
        validate_bool(diagnose, "diagnose")
        if distributed is not None and not isinstance(distributed, bool):
            raise TypeError(f"`distributed` must be a bool or None, got {type(distributed).__name__}: {distributed!r}")
        self.strict = strict
        self.diagnose = diagnose
        self._roots = dict(_roots) if _roots is not None else None
        self._own_watches = []
        for name, t in inventory.normalize_tensors(tensors).items():
            watching.watch(t, name=name)
            self._own_watches.append(name)
        self._sinks: list[Callable[[CheckEvent], Any]] = list(sinks)
        if writer is not None:
            from .integrations.tensorboard import TensorBoardSink

            self._sinks.append(TensorBoardSink(writer))
        self.step = 0
        self._warn = WarnOnce()
        self._records: dict[tuple[str, str], Finding] = {}
        self._report = Report(step=0)
        self._dirty = self._stale = True
        self._stale = True
        self._in_check = False
        self._handles: list[Any] = []
        self._inventory: inventory.Inventory | None = None
        self._fingerprint: Any = None
        self._built_at = 0
        self._flags_read_at = 0
        self._requires_grad_flags: tuple[bool, ...] = ()
        self._lists: dict[int | None, _CheckList] = {}
        self._streak: dict[int, int] = {}
        self._misses: dict[int, int] = {}
        self._longest_streak: dict[int, int] = {}
        self._watch_counts: dict[str, tuple[watching.WatchEntry, int]] = {}
        self._watch_scan = True  # whether an open watched finding may need resolving
        self._joined: tuple[tuple[tuple[str, ...], ...], tuple[str, ...]] = ((), ())
        self._values = ValueChecker()
        self._value_names: dict[int, tuple[tuple[str, ...], list[torch.Tensor | None]]] = {}
        self._previous_names: dict[int, str] = {}
        self._restored_misses: dict[str, int] = {}
        self._restored_checks: dict[int | None, int] = {}
        self._tracer = tracing.Tracer(on_error=self._warn)
        self._traced_optimizers: set[int | None] = set()
        self._closed = False
        self._grad_view = _distributed.PLAIN
        self._gatherer = _distributed.make_gatherer(
            self._model_arg(), self._named_params, distributed, ignore=self.ignore)
        if self.diagnose and self._has_model():
            try:
                self._tracer.arm(self._all_modules())
            except Exception as error:  # never stop training for a diagnostic
                self._warn("arming the diagnostic hooks", error)

    # -- public ------------------------------------------------------------------------------
    def check(self, optimizer: torch.optim.Optimizer | None = None, *, step: int | None = None,
              loss: torch.Tensor | None = None) -> Report:
        """Check after ``backward()`` and before ``optimizer.step()``; returns the current report.

        Args:
            optimizer: The optimizer about to step: only its parameters are checked for a
                gradient (alternating GAN optimizers). None checks every optimizer's parameters.
            step: The step number to record (defaults to a count of checks).
            loss: The loss, if at hand: explains missing gradients by walking its graph.

        Raises:
            LeafwatchError: in strict mode, when an error finding is open.
            TypeError: an argument of the wrong type.
        """
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"`optimizer` must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}: {optimizer!r:.80}")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise TypeError(f"`step` must be an int or None, got {type(step).__name__}: {step!r:.80}")
        if loss is not None and not isinstance(loss, torch.Tensor):
            raise TypeError(f"`loss` must be a torch.Tensor or None, got {type(loss).__name__}: {loss!r:.80}")
        if self._in_check or self._closed:
            return self._report
        self._in_check = True
        try:
            try:
                event: CheckEvent | None = self._check(optimizer, step, loss)
            except Exception as error:
                self._warn("Monitor.check", error)
                event = None
            if self._gatherer is not None:
                # Every rank takes part, even after a local failure, so that no rank waits forever.
                event = self._gather(event, optimizer, step)
            if event is None:
                return self._report
            if self._gatherer is None or self._gatherer.runs_sinks:
                # Still inside the guard: a sink that calls check() gets the current report back.
                self._emit(event)
        finally:
            self._in_check = False
        if self.strict:
            event.report.raise_for_findings("error")
        return event.report

    def scan(self) -> Report:
        """Read the structure now, before any gradient exists, and return the report.

        Finds what needs no backward pass (left out of the optimizer, frozen in it, stale,
        orphan tensors, device mismatches, watched non-leaves) at the current step; gradient
        checks wait for :meth:`check`. The diagnostic hooks stay armed.
        """
        if self._closed:
            return self._report
        try:
            self._fingerprint = self._current_fingerprint()
            self._rebuild()
            entries = watching.entries()
            # No gradient can have arrived yet: only what is wrong already (a watched non-leaf).
            for f in checks.watched_findings(entries, self.step, {e.name: True for e in entries}, self._inventory):
                self._upsert(f)
            self._report = self._build_report()
            self._stale = False
        except Exception as error:
            self._warn("Monitor.scan", error)
        return self._report

    def attach(self) -> Monitor:
        """Check automatically before each ``optimizer.step()`` of the optimizers given.

        Returns:
            self, so that ``monitor = Monitor(model, opt).attach()`` reads naturally.
        """
        if not self.optimizers:
            raise ValueError("`optimizers` must be given to attach(): got none")
        for opt in self.optimizers:
            self._handles.append(opt.register_step_pre_hook(self._step_pre_hook))
        return self

    def _step_pre_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.check(optimizer)

    @property
    def report(self) -> Report:
        """The report of the last check (merged across ranks when distributed)."""
        if self._gatherer is not None and self._gatherer.report is not None:
            return self._gatherer.report
        return self._report

    @property
    def history(self) -> dict[tuple[str, str], Finding]:
        """Every finding seen so far by ``(kind, name)``, with first/last step and status."""
        return dict(self._records)

    def close(self) -> Report:
        """Remove every hook leafwatch installed, flush pending value checks, close sinks."""
        if self._closed:
            return self._report
        self._closed = True
        try:
            self._record_values(*self._values.flush())
            if self._dirty:
                self._report = self._build_report()
        except Exception as error:
            self._warn("Monitor.close", error)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._gatherer is not None:
            self._gatherer.close()
        self._tracer.disarm()
        for name in self._own_watches:
            watching.unwatch(name)
        for sink in self._sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                try:
                    close(self.report)
                except Exception as error:
                    self._warn(f"closing {type(sink).__name__}", error)
        return self.report

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """Plain data: the step, every finding's history and the per-name miss counts."""
        names = self._inventory.known_names() if self._inventory else {}
        return {
            "step": self.step,
            "records": [f.to_dict() for f in self._records.values()],
            "misses": {names.get(k, ""): v for k, v in self._misses.items() if k in names},
            "checks": {str(k): c.checks for k, c in self._lists.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping):
            raise TypeError(f"`state` must be a mapping from state_dict(), got {type(state).__name__}")
        step = state.get("step", 0)
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"`state['step']` must be an int, got {type(step).__name__}: {step!r:.80}")
        records = {}
        for i, data in enumerate(state.get("records", ())):
            try:
                f = Finding.from_dict(data)
            except (TypeError, AttributeError) as error:
                raise ValueError(f"`state['records'][{i}]` is not a finding from state_dict(), got {data!r:.80}") from error
            records[f.key] = f
        misses = state.get("misses", {})
        if not isinstance(misses, Mapping):
            raise ValueError(f"`state['misses']` must be a mapping name -> count, got {type(misses).__name__}: {misses!r:.80}")
        # Only a state that is whole replaces the current one.
        checks_done = state.get("checks", {})
        if not isinstance(checks_done, Mapping):
            raise ValueError(f"`state['checks']` must be a mapping optimizer -> count, got {type(checks_done).__name__}: {checks_done!r:.80}")
        self.step, self._records, self._restored_misses = step, records, dict(misses)
        self._restored_checks = {int(k) if k != "None" else None: int(v) for k, v in checks_done.items()}
        self._fingerprint = None
        self._dirty = self._stale = True
        self._report = self._build_report()

    # -- structure ---------------------------------------------------------------------------
    def _has_model(self) -> bool:
        return self.model is not None or bool(self._roots)

    def _model_arg(self) -> Any:
        return self._roots if self._roots is not None else self.model

    def _all_modules(self) -> dict[str, nn.Module]:
        return inventory.Inventory(self._model_arg()).modules

    def _current_fingerprint(self) -> Any:
        # Read at every check, right after backward, when Python code runs cold: one flat list,
        # one number per param group and never a pass over the parameters.
        fingerprint = [inventory.structure_generation()]
        for opt in self.optimizers:
            fingerprint.append(id(opt))
            for group in opt.param_groups:
                fingerprint.append(len(group["params"]))
            fingerprint.append(-1)
        return fingerprint

    def _rebuild(self) -> None:
        old = self._inventory
        if old is not None:
            self._previous_names.update(old.known_names())
        inv = self._inventory = inventory.Inventory(self._model_arg(), self.optimizers)
        # Old names matter only while an optimizer still holds the tensor.
        self._previous_names = {k: v for k, v in self._previous_names.items()
                                if k in inv.in_optimizer and k not in inv.tensors}
        old_lists = self._lists
        self._lists = {}
        view = self._grad_view = _distributed.gradient_view(
            self._model_arg(), [(k, t, inv.params[k].name) for k, t in inv.tensors.items()], self.step)
        if self.optimizers:
            for i, params in enumerate(inv.optimizer_params):
                params = [p for p in params if id(p) not in view.skip] if view.skip else params
                self._lists[i] = self._make_list(params, inv, old_lists.get(i))
        else:
            self._lists[None] = self._make_list(
                [t for k, t in inv.tensors.items() if t.requires_grad and k not in view.skip], inv, old_lists.get(None))
        for key, count in self._restored_checks.items():
            if key in self._lists:
                self._lists[key].checks = count
        self._restored_checks = {}
        if self._restored_misses:
            for k, info in inv.params.items():
                if info.name in self._restored_misses:
                    self._misses[k] = self._restored_misses[info.name]
                    record = self._records.get(("missing_grad", info.name))
                    if record is not None and record.status == "open":
                        # Still missing when saved: a gradient after the resume ends it as usual.
                        self._streak[k] = self.patience
            self._restored_misses = {}
        structural = checks.structural(inv, step=self.step, previous_names=self._previous_names)
        self._replace_structural(structural)
        if view.finding is not None and view.finding.key not in self._records:
            self._upsert(view.finding)
        self._check_ignore_patterns(inv)
        self._built_at = self._flags_read_at = self.step
        self._requires_grad_flags = self._read_requires_grad()

    def _read_requires_grad(self) -> tuple[bool, ...]:
        return tuple(t.requires_grad for t in self._inventory.tensors.values()) if self._inventory else ()

    def _requires_grad_changed(self) -> bool:
        """Every few checks: was a parameter frozen or unfrozen since the last build?"""
        if abs(self.step - self._flags_read_at) < REQUIRES_GRAD_EVERY:
            return False
        self._flags_read_at = self.step
        return self._read_requires_grad() != self._requires_grad_flags

    def _make_list(self, params: list[torch.Tensor], inv: inventory.Inventory,
                   old: _CheckList | None) -> _CheckList:
        infos = [inv.params.get(id(p)) for p in params]
        # A tensor the model no longer holds keeps the name it had (it is a stale_param finding).
        names = tuple(info.name if info else self._previous_names.get(id(p), f"tensor of shape {tuple(p.shape)}")
                      for info, p in zip(infos, params))
        checks_done = old.checks if old is not None else 0
        added_at = {id(p): (old.added_at.get(id(p), checks_done) if old is not None else 0) for p in params}
        return _CheckList(params, names, infos, frozenset(map(id, params)), checks_done, added_at)

    def _replace_structural(self, found: list[Finding]) -> None:
        new = {f.key: f for f in found}
        for key, old in list(self._records.items()):
            if old.kind in _STRUCTURAL_KINDS and key not in new and old.status == "open":
                self._records[key] = old.replace(status="resolved", last_step=self.step)
                self._dirty = self._stale = True
        for key, f in new.items():
            self._upsert(f)

    def _check_ignore_patterns(self, inv: inventory.Inventory) -> None:
        if not self.ignore or getattr(self, "_ignore_checked", False):
            return
        self._ignore_checked = True
        warn_unmatched_ignore(self.ignore, inv.all_names() | set(watching.watched()), stacklevel=6)

    # -- the check ---------------------------------------------------------------------------
    def _upsert(self, f: Finding) -> None:
        self._stale = True
        old = self._records.get(f.key)
        if old is None:
            self._records[f.key] = f
            self._dirty = self._stale = True
            return
        status = f.status
        updated = f.replace(
            first_step=old.first_step if old.first_step is not None else f.first_step,
            steps_seen=old.steps_seen + 1,
            status=status,
        )
        # An intermittent finding's message counts the steps: that count alone is no change worth
        # logging again (it would rewrite the whole report every other step of a routed model).
        counted = old.status == updated.status == "intermittent"
        if (old.status, old.cause, old.severity) != (updated.status, updated.cause, updated.severity) \
                or (old.message != updated.message and not counted):
            self._dirty = self._stale = True
        self._records[f.key] = updated

    def _list_for(self, optimizer: torch.optim.Optimizer | None) -> list[_CheckList]:
        if optimizer is None:
            return list(self._lists.values())
        for i, opt in enumerate(self.optimizers):
            if opt is optimizer:
                return [self._lists[i]]
        # An optimizer the Monitor was not given: adopt it.
        self.optimizers.append(optimizer)
        self._rebuild()
        self._fingerprint = self._current_fingerprint()
        return [self._lists[len(self.optimizers) - 1]]

    def _check(self, optimizer: torch.optim.Optimizer | None, step: int | None,
               loss: torch.Tensor | None) -> CheckEvent:
        self.step = step if step is not None else self.step + 1
        fingerprint = self._current_fingerprint()
        if fingerprint != self._fingerprint or self.step - self._built_at >= REBUILD_EVERY \
                or self._requires_grad_changed():
            self._fingerprint = fingerprint
            self._rebuild()
        lists = self._list_for(optimizer)
        reachable = graph.reachable_leaf_ids(loss) if loss is not None else None
        all_missing: list[int] = []
        offset = 0
        for clist in lists:
            # The hot path: one read of each p.grad.
            missing = [i for i, p in enumerate(clist.params) if p.grad is None]
            clist.checks += 1
            if missing or self._streak:
                self._update_missing(clist, missing, reachable)
            if missing:
                all_missing.extend(i + offset for i in missing)
            offset += len(clist.params)
        self._check_watched()
        if self.check_values_every_n_steps and (self.step == 1 or self.step % self.check_values_every_n_steps == 0):
            try:
                self._check_values(lists)
            except Exception as error:  # the gradient checks above still count
                self._warn("the NaN/Inf gradient check", error)
        if self._tracer.handles or self._streak:
            self._retarget_tracer()
        # With several optimizers checked one at a time, one forward pass can serve all their
        # checks: forget what the hooks saw only once every optimizer has been checked.
        # An optimizer checked again before the others starts a new round, so what the hooks saw
        # never piles up over steps (a loop that checks only one of its optimizers).
        index = self._optimizer_index(optimizer)
        if index is None or index in self._traced_optimizers \
                or len(self._traced_optimizers) + 1 >= len(self.optimizers):
            self._tracer.reset()
            self._traced_optimizers.clear()
        else:
            self._traced_optimizers.add(index)
        if self._stale:
            self._report = self._build_report()
            self._stale = False
        else:
            self._report.step = self.step
        names = lists[0].names if len(lists) == 1 else self._joined_names(lists)
        total = len(names)
        coverage = None if total == 0 else 1.0 - len(all_missing) / total
        changed, self._dirty = self._dirty, False
        return CheckEvent(self.step, self._optimizer_index(optimizer), self._report, changed,
                          names, all_missing, coverage)

    def _joined_names(self, lists: list[_CheckList]) -> tuple[str, ...]:
        """The names of several lists, one tuple kept (same identity) until the lists change."""
        parts, joined = self._joined
        if len(parts) != len(lists) or any(a is not c.names for a, c in zip(parts, lists)):
            parts = tuple(c.names for c in lists)
            joined = tuple(n for part in parts for n in part)
            self._joined = (parts, joined)
        return joined

    def _optimizer_index(self, optimizer: torch.optim.Optimizer | None) -> int | None:
        if optimizer is None:
            return None
        return next((i for i, o in enumerate(self.optimizers) if o is optimizer), None)

    def _update_missing(self, clist: _CheckList, missing: list[int], reachable: set[int] | None) -> None:
        now: set[int] = set()
        # Watched tensors are reported under their watch name, replaced ones as stale_param.
        watched = watching.entries() if watching.any_watched() else ()
        skip = {id(e.tensor()) for e in watched} | self._previous_names.keys()
        for i in missing:
            p = clist.params[i]
            if not p.requires_grad or id(p) in skip:
                continue
            pid = id(p)
            now.add(pid)
            streak = self._streak[pid] = self._streak.get(pid, 0) + 1
            misses = self._misses[pid] = self._misses.get(pid, 0) + 1
            if streak < self.patience:
                continue
            name, info = clist.names[i], clist.infos[i]
            if info is None and self._is_open(("stale_param", name)):
                continue  # the replaced tensor: its stale_param finding already says it will not train
            checks_of_p = clist.checks - clist.added_at.get(pid, 0)
            key = ("missing_grad", name)
            old = self._records.get(key)
            explanation = None
            if info is not None:
                explanation = tracing.explain_missing(
                    name, info.module, info.attribute, self._tracer.records, self._tracer.armed_since_reset)
            if old is not None and explanation is None and old.details.get("reason") not in (None, "unknown", "pending"):
                self._upsert(self._mark_stalled(
                    old.replace(step=self.step, last_step=self.step,
                                status="open" if old.status != "intermittent" else "intermittent",
                                details={**old.details, "checks": checks_of_p, "steps_without_grad": misses}),
                    pid, streak, checks_of_p, misses))
                continue
            f = checks.missing_grad(
                name, p, step=self.step, explanation=explanation, info=info,
                reachable=None if reachable is None else pid in reachable,
                checks=checks_of_p, misses=misses)
            if explanation is None and reachable is None and self.diagnose and info is not None:
                f = f.replace(
                    cause=f"being traced: leafwatch armed forward hooks on `{info.module or 'the model'}` "
                    "and will say why at the next check.",
                    details={**f.details, "reason": "pending"})
            if misses < checks_of_p:
                f = checks.intermittent(f, checks_of_p, misses, self.step)
            elif old is not None and old.status == "intermittent":
                f = f.replace(status="intermittent", severity="info")
            self._upsert(self._mark_stalled(f, pid, streak, checks_of_p, misses))
        for pid in [k for k in self._streak if k in clist.ids and k not in now]:
            self._longest_streak[pid] = max(self._longest_streak.get(pid, 0), self._streak.pop(pid))
            name = self._name_of(clist, pid)
            key = ("missing_grad", name)
            old = self._records.get(key)
            if old is not None and old.status == "open":
                checks_of_p = clist.checks - clist.added_at.get(pid, 0)
                self._records[key] = checks.intermittent(old, checks_of_p, self._misses.get(pid, 0), self.step)
                self._dirty = self._stale = True

    def _mark_stalled(self, f: Finding, pid: int, streak: int, checks_of_p: int, misses: int) -> Finding:
        """An intermittent tensor without a gradient for long: open again, as a warning."""
        limit = max(self.patience, STALLED_AFTER, 2 * self._longest_streak.get(pid, 0))
        if misses >= checks_of_p or streak < limit:
            return f
        return f.replace(
            status="open", severity="warning",
            message=f"`{f.name}` got gradients before, but none in {limit} or more checks in a row: "
            "it stopped training.",
            details={**f.details, "stalled_for": streak})

    def _is_open(self, key: tuple[str, str]) -> bool:
        found = self._records.get(key)
        return found is not None and found.status == "open"

    @staticmethod
    def _name_of(clist: _CheckList, pid: int) -> str:
        for p, name in zip(clist.params, clist.names):
            if id(p) == pid:
                return name
        return ""

    def _retarget_tracer(self) -> None:
        """Keep hooks only on the modules (and their ancestors) owning a parameter that misses."""
        if not self.diagnose or self._inventory is None:
            return
        wanted: dict[str, nn.Module] = {}
        # Only the few tensors that miss a gradient: no pass over every parameter.
        lists = self._lists.values()
        for pid in self._streak:
            info = self._inventory.params.get(pid)
            if info is None or not any(pid in clist.ids for clist in lists):
                continue
            parts = info.module.split(".") if info.module else []
            for depth in range(len(parts) + 1):
                name = ".".join(parts[:depth])
                module = self._inventory.modules.get(name)
                if module is not None:
                    wanted[name] = module
        armed = self._tracer.armed
        self._tracer.disarm(armed - set(wanted))
        self._tracer.arm({k: v for k, v in wanted.items() if k not in armed})

    def _check_watched(self) -> None:
        # Right after backward every distinct piece of Python code runs cold (tens of µs): with
        # nothing watched, don't even take the registry's lock.
        entries = watching.entries() if watching.any_watched() else []
        if not (entries or self._watch_scan or self._dirty):
            return  # nothing watched and no watched finding open: nothing to do at all
        current: set[tuple[str, str]] = set()
        counts: dict[str, tuple[watching.WatchEntry, int]] = {}
        if entries:
            got = {}
            for e in entries:
                seen = self._watch_counts.get(e.name)
                # A name watched again (the next step's activation) is a new entry that counts from 0.
                last = seen[1] if seen is not None and seen[0] is e else 0
                t = e.tensor()
                got[e.name] = e.grads_seen > last or (
                    e.is_leaf and e.grads_seen == 0 and t is not None and t.grad is not None)
                counts[e.name] = (e, e.grads_seen)
            for f in checks.watched_findings(entries, self.step, got, self._inventory):
                current.add(f.key)
                self._upsert(f)
        self._watch_counts = counts  # only the live entries: bounded by what is watched now
        # A watched finding that did not recur is resolved (a gradient arrived, or the tensor is gone).
        # Looked for only while one can be open (see the top): not every step over every record.
        self._watch_scan = bool(current)
        for key, f in list(self._records.items()):
            if f.status == "open" and f.details.get("source") == "watch" and key not in current:
                self._records[key] = f.replace(status="resolved", last_step=self.step)
                self._dirty = self._stale = True

    def _check_values(self, lists: list[_CheckList]) -> None:
        names = tuple(n for c in lists for n in c.names)
        params = [p for c in lists for p in c.params]
        grads = [p.grad for p in params]
        if self._grad_view.local_grads:
            grads = [_distributed.local_tensor(g) for g in grads]
        self._value_names[self.step] = (names, params)
        completed, bad = self._values.check(grads, self.step)
        self._record_values(completed, bad)
        # Keep the names of steps whose CUDA results are still on their way, and no others.
        pending = {p.step for p in self._values._pending}
        for s in [s for s in self._value_names if s not in pending]:
            del self._value_names[s]

    def _record_values(self, completed: list[int], bad: list[tuple[int, int]]) -> None:
        flagged: set[str] = set()
        for step, index in bad:
            names, params = self._value_names.get(step, ((), []))
            if index < len(names):
                flagged.add(names[index])
                self._upsert(checks.nonfinite_grad(names[index], params[index], step))
        if not completed:
            return
        latest = max(completed)
        for key, f in list(self._records.items()):
            if f.kind == "nonfinite_grad" and f.status == "open" and f.name not in flagged \
                    and (f.last_step or 0) < latest:
                self._records[key] = f.replace(status="resolved", last_step=latest)
                self._dirty = self._stale = True

    def _build_report(self) -> Report:
        return Report(apply_ignore(list(self._records.values()), self.ignore), step=self.step)

    # -- distributed -------------------------------------------------------------------------
    def _named_params(self) -> list[tuple[torch.Tensor, str]]:
        if not self._has_model():
            return []
        inv = inventory.Inventory(self._model_arg())
        return [(t, inv.params[k].name) for k, t in inv.tensors.items()]

    def _gather(self, event: CheckEvent | None, optimizer: torch.optim.Optimizer | None,
                step: int | None) -> CheckEvent | None:
        assert self._gatherer is not None
        local = event.report if event is not None else self._report
        merged = self._gatherer.gather(local, self.step, self._warn, self._grad_view.strategy)
        if merged is None:
            return event if event is None else dataclasses.replace(event, report=self._gatherer.alone(event.report))
        changed = self._gatherer.changed
        if event is None:
            return CheckEvent(self.step, self._optimizer_index(optimizer), merged, changed, (), [], None)
        return dataclasses.replace(event, report=merged, changed=changed)

    def _emit(self, event: CheckEvent) -> None:
        for sink in self._sinks:
            try:
                sink(event)
            except Exception as error:
                self._warn(f"the {type(sink).__name__} sink", error)

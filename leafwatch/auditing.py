"""``audit()``: the standalone check, a pure function of the current state.

Call it after ``backward()`` and before ``optimizer.step()``. It has no history and installs no
hook: it sees the end state, so it says plainly when the cause of a missing gradient is unknown
(pass ``loss=`` to have the loss graph walked, or use a :class:`~leafwatch.Monitor`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import warnings
import weakref

import torch
from torch import nn

from . import checks, graph, inventory, outside, replaced, structure, watching
from .findings import Finding, LeafwatchInternalWarning, Report
from .options import apply_ignore, got, validate_ignore, warn_unmatched_ignore
from .values import ValueChecker


def audit(
    model: nn.Module | None = None,
    optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    *,
    tensors: Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | None = None,
    loss: torch.Tensor | None = None,
    ignore: Mapping[str, str] | Sequence[str] | None = None,
    check_values: bool = True,
    step: int | None = None,
) -> Report:
    """Name every tensor that will not train, with the cause and the fix.

    Args:
        model: The model; DDP, ``torch.compile`` and Lightning Fabric wrappers are unwrapped.
        optimizers: One optimizer or a sequence (wrappers such as accelerate's
            ``AcceleratedOptimizer`` are unwrapped). With them, parameters left out of every
            optimizer are reported, and the optimizers' tensors are checked for a gradient.
        tensors: More tensors to check, name -> tensor (or a sequence).
        loss: The loss, to walk its graph and tell unreachable parameters from the rest.
        ignore: Glob patterns on names (``{"head.*": "why"}``); matches are reported as ignored.
        check_values: Run the batched NaN/Inf check on the gradients.
        step: A step number to put on the findings.

    Returns:
        A :class:`~leafwatch.Report`; ``bool(report)`` is true when something is open.

    Raises:
        TypeError: an argument of the wrong type (the message names it and what was received).
        ValueError: nothing to check (no model, optimizer, tensor or watched tensor).

    Example::

        >>> import torch, leafwatch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        >>> opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> sorted(f.name for f in leafwatch.audit(model, opt))
        ['1.bias', '1.weight']
    """
    model = inventory.normalize_model(model)
    opts = inventory.normalize_optimizers(optimizers)
    named = inventory.normalize_tensors(tensors)
    ignore_map = validate_ignore(ignore)
    if loss is not None and not isinstance(loss, torch.Tensor):
        raise TypeError(f"`loss` must be a torch.Tensor or None, got {got(loss)}")
    if not isinstance(check_values, bool):
        raise TypeError(f"`check_values` must be a bool, got {type(check_values).__name__}: {check_values!r}")

    entries = watching.entries()
    if model is None and not opts and not named and not entries:
        raise ValueError("audit() has nothing to check: pass `model`, `optimizers` or `tensors` "
                         "(or watch() a tensor first), got none of them")
    inv = inventory.Inventory(model, opts)
    warn_unmatched_ignore(ignore_map, inv.all_names() | set(named) | {e.name for e in entries})
    replaced_now = replaced.pair(inv)
    findings: list[Finding] = checks.structural(inv, step=step, stale=replaced_now)
    stale = replaced_now.old_ids()
    reachable = graph.reachable_leaf_ids(loss) if loss is not None else None

    if opts:
        checked = [(inv.name(p) or f"optimizers[{i}] {inventory.shape_text(p)}", p)
                   for i, ps in enumerate(inv.optimizer_params) for p in ps]
    else:
        checked = [(info.name, t) for info, t in inv.trainable()]
    watched_ids = {id(e.tensor()) for e in entries}
    # A parameter also watched or passed in ``tensors`` is reported once, under the name given.
    named_ids = watched_ids | {id(t) for t in named.values()}
    trainable = [(name, p) for name, p in checked
                 if p.requires_grad and p.is_leaf and id(p) not in stale and id(p) not in named_ids]
    missing = [(name, p) for name, p in trainable if p.grad is None]
    if len(missing) > 1 and len(missing) == len(trainable) and reachable is None:
        # Not one finding per parameter with an unknown cause: one, that says what it means.
        findings.append(checks.no_grad_at_all([name for name, _ in missing], step=step))
        missing = []
    for name, p in missing:
        info = inv.params.get(id(p))
        findings.append(checks.missing_grad(
            name, p, step=step, explanation=None, info=info,
            reachable=None if reachable is None else id(p) in reachable))

    got_grad = {}
    for e in entries:
        t = e.tensor()
        # A leaf's end state is its .grad (as for parameters); a non-leaf's is whether any gradient
        # flowed through it (an activation lives for one step).
        got_grad[e.name] = (t is not None and t.grad is not None) if e.is_leaf else e.grads_seen > 0
    findings += checks.watched_findings(entries, step, got_grad, inv)
    # A tensor both watched and passed in ``tensors`` is reported once, under its watch name.
    findings += checks.tensor_findings(
        {n: t for n, t in named.items() if id(t) not in watched_ids}, step, inv, watched=entries)

    # Trainable tensors outside the model: watched leaves, ``tensors=`` and the loss's persistent leaves.
    # Judged only by a call that names optimizers (then against every optimizer known in the
    # process too): what unrelated live optimizers hold must not change what audit() says.
    judges = [*opts, *(o for o in structure.known_optimizers() if all(o is not p for p in opts))] if opts else []
    own_ids, all_ids = outside.optimizer_ids(opts), outside.optimizer_ids(judges)
    if judges:
        findings += outside.watched_in_no_optimizer(
            entries, step, model_ids=set(inv.tensors), in_optimizer=lambda e: id(e.tensor()) in all_ids)
    if opts:
        own = [watching.WatchEntry(n, weakref.ref(t), True, True, "audit(tensors=)", t.is_leaf)
               for n, t in named.items() if id(t) not in watched_ids]
        findings += outside.watched_in_no_optimizer(
            own, step, model_ids=set(inv.tensors), in_optimizer=lambda e: id(e.tensor()) in own_ids)
    if loss is not None and judges:
        # audit() walks the loss's graph at every call anyway (``reachable``): so does this.
        findings += outside.AUDITS.observe(loss, step, new_miss=True, exclude=lambda: outside.judged_elsewhere(
            inv, judges, entries) | {id(t) for t in named.values()})

    if check_values:
        grads = [p.grad for _, p in checked]
        values = ValueChecker()
        try:
            _, bad = values.check(grads, step or 0)
            bad += values.flush()[1]
        except Exception as error:  # an exotic gradient type: report the rest, never stop training
            warnings.warn(
                f"leafwatch: internal failure in the NaN/Inf gradient check ({type(error).__name__}: {error}); "
                "audit() reports everything else.",
                LeafwatchInternalWarning,
                stacklevel=2,
            )
            bad = []
        findings += [checks.nonfinite_grad(checked[i][0], checked[i][1], step or 0) for _, i in bad]
    return Report(apply_ignore(findings, ignore_map), step=step)

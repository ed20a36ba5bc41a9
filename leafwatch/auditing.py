"""``audit()``: the standalone check, a pure function of the current state.

Call it after ``backward()`` and before ``optimizer.step()``. It has no history and installs no
hook: it sees the end state, so it says plainly when the cause of a missing gradient is unknown
(pass ``loss=`` to have the loss graph walked, or use a :class:`~leafwatch.Monitor`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
import torch
from torch import nn

from .observe import inventory
from . import watching
from .report.findings import Report
from .monitor import Monitor
from .options import got, validate_bool, validate_ignore


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
        >>> [(f.name, f.names) for f in leafwatch.audit(model, opt)]
        [('1', ('1.bias', '1.weight'))]
    """
    model, opts, named, ignore_map = _arguments(model, optimizers, tensors, loss, ignore, check_values)
    # The one check pipeline, run once: a fresh Monitor carries nothing from one call to the next.
    # Local to this process: one rank's audit() call must never wait for the other ranks.
    monitor = _OneCheck(model, opts, tensors=named, ignore=ignore_map, diagnose=False,
                        verbose=False, check_values_every_n_steps=1 if check_values else 0,
                        distributed=False, loss_given=loss is not None)
    try:
        monitor.check(loss=loss, step=step if step is not None else 1)
    finally:
        report = monitor.close()
    found = report.tensors()
    if step is None:  # one check with no history: no step to say "since"
        found = [f.replace(step=None, first_step=None, last_step=None) for f in found]
    return Report(found, step=step, nothing_to_check=report.nothing_to_check)


def _arguments(model: Any, optimizers: Any, tensors: Any, loss: Any, ignore: Any, check_values: Any
               ) -> tuple[nn.Module | None, list[torch.optim.Optimizer], dict[str, torch.Tensor], Mapping[str, str]]:
    """audit()'s arguments checked and normalized (a TypeError/ValueError naming the argument)."""
    model = inventory.normalize_model(model, call="audit")
    opts = inventory.normalize_optimizers(optimizers)
    named = inventory.normalize_tensors(tensors)
    ignore_map = validate_ignore(ignore)
    if loss is not None and not isinstance(loss, torch.Tensor):
        raise TypeError(f"`loss` must be a torch.Tensor or None, got {got(loss)}")
    validate_bool(check_values, "check_values")
    if model is None and not opts and not named and not watching.any_watched():
        raise ValueError("audit() has nothing to check: pass `model`, `optimizers` or `tensors` "
                         "(or watch() a tensor first), got none of them")
    return model, opts, named, ignore_map


class _OneCheck(Monitor):
    """The Monitor that one audit() call runs once; its internal failures say what audit() does."""

    _goes_on = "audit() reports everything else (the report has an `incomplete` finding)."
    _observes = False  # no global hook: nothing an audit() call sees changes a later verdict

    def __init__(self, *args: Any, loss_given: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not loss_given:  # (with the loss, its graph names the cause of each miss)
            self._checker.closing += self._checker.one_look

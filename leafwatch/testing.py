"""``assert_trains``: a unit-test assertion that every tensor of a model trains in a few steps.

The user's own training step runs a few times under a :class:`~leafwatch.Monitor` that checks
each optimizer step; the test fails, with the findings table, when an error finding is still open
at the end of the run. Judged from the whole run: a layer skipped at one step and trained at
another is intermittent, not an error, and a suspicion still waiting for evidence is decided.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .report.findings import Report
from .options import LeafwatchAssertionError, validate_int
from .report.format import located, shown, tensor_count
from .monitor import Monitor


def assert_trains(model: nn.Module, optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
                  step: Callable[[], Any], steps: int = 2, *, ignore: Mapping[str, str] | Sequence[str] | None = None,
                  patience: int = 1) -> Report:
    """Run ``step()`` ``steps`` times and fail when a tensor of ``model`` does not train.

    ``step`` is one training step of your own: forward, loss, ``backward()``,
    ``optimizer.step()`` (and ``zero_grad()``). Each optimizer step is checked just before it
    runs, or just after it for an optimizer stepped with a closure (LBFGS), exactly as
    ``Monitor.attach()`` does, and the NaN/Inf check runs at every step. The verdict is the
    Monitor's report at the end of the run.

    Args:
        model: The model whose tensors must train (DDP and ``torch.compile`` wrappers are unwrapped).
        optimizer: The optimizer ``step()`` steps, or a sequence of them (a GAN's two).
        step: Called with no argument ``steps`` times; its return value is not used.
        steps: How many times to call ``step``.
        ignore: Glob patterns on names (``{"teacher.*": "why"}`` or ``["teacher.*"]``); matching
            findings are reported as ignored and do not fail.
        patience: Consecutive checks a parameter may go without a gradient before ``missing_grad``.

    Returns:
        The final :class:`~leafwatch.Report` (no error open; warnings and info may be in it).

    Raises:
        LeafwatchAssertionError: an error finding is open at the end of the run (the message is
            the findings table), or an optimizer never stepped. It is both a
            :class:`~leafwatch.LeafwatchError` and an ``AssertionError``.
        TypeError: ``model``, ``optimizer``, ``step`` or ``steps`` of the wrong type.
        ValueError: ``steps`` below 1, an empty ``optimizer`` sequence, a bad ``ignore`` or ``patience``.

    Example::

        >>> import torch, leafwatch
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> def train_step():
        ...     opt.zero_grad()
        ...     model(torch.ones(8, 4)).square().mean().backward()
        ...     opt.step()
        >>> leafwatch.assert_trains(model, opt, train_step).findings
        []
    """
    optimizers, steps = _validated(model, optimizer, step, steps)
    monitor = Monitor(model, optimizers, ignore=ignore, patience=patience, check_values_every_n_steps=1,
                      verbose=False)  # the failure carries the table
    report, stepped = _run(monitor, optimizers, step, steps)
    _fail_on_idle_optimizers(report, optimizers, stepped, steps)
    _fail_on_errors(report, steps)
    return report


def _validated(model: Any, optimizer: Any, step: Any, steps: Any) -> tuple[list[torch.optim.Optimizer], int]:
    """The optimizers as a list and ``steps`` as an int; TypeError/ValueError on bad arguments."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}: {model!r:.80}")
    if isinstance(optimizer, torch.optim.Optimizer):
        optimizer = [optimizer]
    elif isinstance(optimizer, (str, bytes)) or not isinstance(optimizer, Sequence):
        raise TypeError("`optimizer` must be a torch.optim.Optimizer or a sequence of them, "
                        f"got {type(optimizer).__name__}: {optimizer!r:.80}")
    elif not optimizer:
        raise ValueError("`optimizer` must name at least one optimizer, got an empty sequence")
    for i, opt in enumerate(optimizer):
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"`optimizer[{i}]` must be a torch.optim.Optimizer, got {type(opt).__name__}: {opt!r:.80}")
    if not callable(step):
        raise TypeError(f"`step` must be a callable that runs one training step, got {type(step).__name__}: {step!r:.80}")
    return list(optimizer), validate_int(steps, "steps", 1)


def _run(monitor: Monitor, optimizers: list[torch.optim.Optimizer], step: Callable[[], Any],
         steps: int) -> tuple[Report, list[int]]:
    """Calls ``step()`` ``steps`` times under ``monitor``; the closing report and each optimizer's step count."""
    stepped = [0] * len(optimizers)

    def counted(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        stepped[next(i for i, o in enumerate(optimizers) if o is opt)] += 1

    handles = [opt.register_step_post_hook(counted) for opt in optimizers]
    try:
        monitor.attach()  # checks before each step, after it for a closure (LBFGS)
        for _ in range(steps):
            step()
    finally:
        for handle in handles:
            handle.remove()
        report = monitor.close()
    return report, stepped


def _calls(steps: int) -> str:
    return f"{steps} call{'s' if steps != 1 else ''} of step()"


def _fail_on_idle_optimizers(report: Report, optimizers: list[torch.optim.Optimizer], stepped: list[int],
                             steps: int) -> None:
    """An optimizer that never stepped trained nothing, whatever the findings say."""
    idle = [i for i, count in enumerate(stepped) if count == 0]
    if idle:
        names = ", ".join(f"optimizer {i} ({type(optimizers[i]).__name__}, "
                          f"{sum(len(g['params']) for g in optimizers[i].param_groups)} tensors)" for i in idle)
        raise LeafwatchAssertionError(
            f"leafwatch.assert_trains: {names} never stepped in {_calls(steps)}, so nothing it holds trained: "
            "call optimizer.step() in step(), or raise `steps` if it steps less often.", report=report)


def _fail_on_errors(report: Report, steps: int) -> None:
    failing = report.at_least("error")
    if failing:
        raise LeafwatchAssertionError(
            f"leafwatch.assert_trains: {len(failing)} error finding(s) open after {_calls(steps)}: "
            f"{', '.join(f'{f.kind} {shown(f)}{tensor_count(f)}{located(f)}' for f in failing)}\n{report}", report=report)

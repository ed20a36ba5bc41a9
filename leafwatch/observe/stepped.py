"""What ``one of the variables needed for gradient computation has been modified by an inplace operation`` shows
when an optimizer's ``step()`` is the in-place operation: the step changed, in place, parameters that a graph
built before it saved, and that graph's ``backward()`` came after the step (a GAN calling ``opt_D.step()`` before
``G_loss.backward()``, pytorch/pytorch#39141).

Said only where the objects and the source agree: the tensor torch names (its shape and version, read from the
message) is a parameter the failing graph reached and an optimizer of the user's holds; that optimizer's
``.step()`` stands between the statement that computed the loss and its ``backward()``. Any other in-place error (an
``nn.ReLU(inplace=True)``, ``x += 1`` on an activation) shows none of it, and gets nothing from here. No words:
``detectors/stepped.py`` says.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Mapping
from types import FrameType
from typing import Any

import torch

from . import graph
from .source import Source, Span, assigns, backward_receiver, holding, last_assignment, on_line, reads

#: ``[torch.FloatTensor [16, 1]], which is output 0 of AsStrided, is at version 2; expected version 1``.
_TENSOR = re.compile(r"\[\S+ \[([\d, ]*)\]\](?:, which is output \d+ of \w+,)? is at version (\d+); expected version (\d+)")


@dataclasses.dataclass(frozen=True)
class SteppedBeforeBackward:
    """``loss`` (assigned at ``loss_at``) was computed before ``optimizer.step()`` (``step_at``, of class ``cls``)
    changed in place the parameters of ``module`` its graph saved; its ``backward()`` at ``place`` came after.
    ``recompute``: the statements that compute it again from those parameters, as written (one new forward),
    to put before the backward (``before``: that statement's span)."""

    place: str
    loss: str
    loss_at: str
    optimizer: str
    cls: str
    step_at: str
    module: str | None
    recompute: str
    recompute_at: tuple[str, ...]
    before: Span | None


def modified(message: str, roots: list[torch.Tensor], leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """The leaves the failing graph reached that match the tensor torch names in ``message``: its version now, and
    its shape (or the shape of its transpose: a ``Linear``'s weight is saved as ``weight.t()``)."""
    found = _TENSOR.search(message)
    if found is None or not roots:
        return []
    shape = tuple(int(n) for n in found.group(1).split(",") if n.strip())
    version = int(found.group(2))
    return [t for t in leaves if t._version == version and (tuple(t.shape) == shape or tuple(t.shape)[::-1] == shape)]


def _step_of(body: list[ast.stmt], start: int, end: int, names: set[str]) -> tuple[int, str] | None:
    """The statement of ``body`` between ``start`` and ``end`` that calls ``X.step()`` for an ``X`` of ``names``."""
    for i in range(start + 1, end):
        call = body[i].value if isinstance(body[i], ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "step" \
                and isinstance(call.func.value, ast.Name) and call.func.value.id in names:
            return i, call.func.value.id
    return None


def _depends(value: Any, stepped: set[int]) -> bool:
    """Whether ``value`` (a tensor, or a tuple of them) was computed from one of the ``stepped`` leaves."""
    tensors = [value] if isinstance(value, torch.Tensor) else [v for v in value if isinstance(v, torch.Tensor)] \
        if isinstance(value, (tuple, list)) else []
    return any(t.grad_fn is not None and any(id(leaf) in stepped for leaf in graph.leaves_of(t.grad_fn, limit=5_000)[0])
               for t in tensors)


def _recompute(body: list[ast.stmt], made: int, until: int, local: Mapping[str, Any], stepped: set[int]) -> list[ast.stmt]:
    """The statements up to ``made`` (the loss's) that computed, from the stepped parameters, what the loss's
    statement reads, each the last to assign its names before ``until``; empty when one of them is not."""
    wanted, out = reads(body[made]), [body[made]]
    for k in range(made - 1, -1, -1):
        names = assigns(body[k]) & wanted
        if not names or not any(_depends(local.get(n), stepped) for n in names):
            continue
        if any(n in assigns(s) for s in body[k + 1:until] for n in assigns(body[k])):
            return []
        out.append(body[k])
        wanted |= reads(body[k])
    return sorted(out, key=lambda s: s.lineno)


def read(frame: FrameType, line: int, root: torch.Tensor, stepped: list[torch.Tensor], source: Source,
         optimizers: Mapping[int, tuple[str, torch.optim.Optimizer]], module_of: Any) -> SteppedBeforeBackward | None:
    """The optimizer step that changed ``stepped`` between the loss's statement and its ``backward()`` at ``line``
    of ``frame`` (the statement of the user's frame that raised)."""
    scope = source.scope(frame)
    held = holding(scope, line) if scope is not None else None
    holders = {optimizers[id(t)][0]: optimizers[id(t)][1] for t in stepped if id(t) in optimizers}
    if held is None or not holders:
        return None
    body, index = held
    loss = next((r for r in map(backward_receiver, on_line(body, index)) if r is not None), None)
    made = last_assignment(body, index, loss) if loss else None
    if made is None or frame.f_locals.get(loss) is not root:
        return None
    step = _step_of(body, made, index, set(holders))
    if step is None:
        return None
    path = frame.f_code.co_filename
    ids = {id(t) for t in stepped}
    again = _recompute(body, made, index, frame.f_locals, ids)
    lines = source.lines(path)
    text = "".join("".join(lines[s.lineno - 1:s.end_lineno]) for s in again)
    optimizer = holders[step[1]]
    return SteppedBeforeBackward(f"{path}:{line}", loss, f"{path}:{body[made].lineno}", step[1], type(optimizer).__name__,
                                 f"{path}:{body[step[0]].lineno}", module_of(stepped), text,
                                 tuple(f"{path}:{s.lineno}" for s in again),
                                 source.span(path, body[index]) if again else None)

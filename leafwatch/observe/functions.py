"""Custom ``torch.autograd.Function`` forwards: which one a module ran inside, and what it was given.

torch runs a Function's forward with autograd off and sends gradients back only through its
backward, to the tensors given to ``Function.apply``: a module that runs inside that forward and
whose parameters are no input of ``apply`` gets no gradient (torchdiffeq's ``OdeintAdjointMethod``
integrating a module that calls a network it does not register). ``Function.apply`` is a Python
classmethod for every Function (old style ``forward(ctx, ...)`` and new style ``setup_context``):
its frame holds ``cls`` and ``args``, and its caller is the line that applied the Function. A forward
may switch grad on again (``torch.enable_grad()``) and detach what it returns: the graph built there
ends inside it all the same. This is read only by the diagnostic hooks (armed until the first check,
then on the modules that miss): when a module runs with grad off, and at the first call of one that
runs with grad on.
"""

from __future__ import annotations

import dataclasses
import os
from types import FrameType

import torch
from torch import nn

from . import frames
from .cuts import Place, place_of_call

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_APPLY_CODE = torch.autograd.Function.apply.__func__.__code__  # type: ignore[attr-defined]
#: Frames walked up from a hook to find ``Function.apply``.
MAX_FRAMES = 64


@dataclasses.dataclass(frozen=True)
class FunctionCall:
    """The custom Function a module ran inside: its class and Python module, the line that applied it
    (``place``; ``called_from``: the user's line that reached it when ``place`` is a library's), the
    ids of the tensors given to ``apply``, and the user's module among its module arguments (the
    module a library collects the parameters from: torchdiffeq's integrated ``func``)."""

    name: str
    module: str
    place: Place
    called_from: Place | None
    inputs: frozenset[int]
    holder: str | None

    @property
    def checkpoint(self) -> bool:
        """torch's reentrant checkpoint, explained as such by its own cause."""
        return self.name.endswith("CheckpointFunction")


def in_backward() -> bool:
    """Whether a backward pass runs now: a module called then is re-run for it (an adjoint's
    re-evaluation, a checkpoint's recomputation), not what the step's forward did."""
    try:
        return torch._C._current_graph_task_id() != -1
    except Exception:  # a torch without the helper: every call counts, as before
        return False


def _user_class(module: nn.Module) -> bool:
    """Whether ``module``'s class is the user's: its ``forward`` is written outside installed code and leafwatch."""
    code = getattr(getattr(type(module), "forward", None), "__code__", None)
    path = os.path.abspath(code.co_filename) if code is not None and not code.co_filename.startswith("<") else ""
    return bool(path) and not path.startswith(frames.installed_dirs()) and not path.startswith(frames.PACKAGE_DIR) \
        and not path.startswith(_TORCH_DIR)


def function_call(frame: FrameType | None) -> FunctionCall | None:
    """The innermost custom Function whose forward runs at ``frame`` (None when none does)."""
    frame = frames.running(frame, MAX_FRAMES, _APPLY_CODE)
    if frame is None:
        return None
    cls, args = frame.f_locals.get("cls"), frame.f_locals.get("args", ())
    where = place_of_call(frame)  # the line that applied the Function (torch's own frame is skipped)
    if cls is None or where is None:
        return None
    # (the last module argument that holds a module of the user's class: its first such module)
    holder = next((type(m).__qualname__ for a in reversed(args) if isinstance(a, nn.Module)
                   for m in a.modules() if _user_class(m)), None)
    return FunctionCall(getattr(cls, "__qualname__", str(cls)), getattr(cls, "__module__", "") or "", *where,
                        frozenset(id(a) for a in args if isinstance(a, torch.Tensor)), holder)

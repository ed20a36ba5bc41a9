"""What the swap tests share: a model that swaps a weight while it is built, every way torch swaps a
parameter in place of itself, and a probe of what leafwatch may have left on the model.

``torch.utils.swap_tensors`` refuses a tensor that has a weak reference, and torch swaps a parameter
with it on every path below (with ``torch.__future__.set_swap_module_params_on_conversion(True)``):

- ``to``: ``module.to(torch.float64)`` and back to ``float32``;
- ``half``: ``module.half()`` and back with ``.float()``;
- ``assign``: ``module.load_state_dict(state, assign=True)``;
- ``swap_tensors``: ``torch.utils.swap_tensors(p, new)`` called by library code on each trainable parameter;
- while the model is built: :class:`FrozenQuantLinear` is torchtune's ``FrozenNF4Linear``
  (``torchtune/modules/low_precision/nf4_linear.py``): its ``__init__`` freezes the weight and swaps it for
  a quantized one; a bfloat16 copy stands in for torchao's NF4 tensor.

This module is imported by ``scripts/swaps.py`` (run plainly and under ``leafwatch run``) and by the
tests in process; a model pickled by either loads wherever this module can be imported.
"""

from __future__ import annotations

import contextlib
import copy
import io
import pickle
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

SWAPS = ("to", "half", "assign", "swap_tensors")
#: What leafwatch names on :class:`Net` with ``buggy=True`` (its optimizer from :func:`optimizer_for`).
BUGGY_FINDINGS = {("missing_grad", "aux"), ("not_in_optimizer", "scale")}


@contextlib.contextmanager
def swapping_on_conversion() -> Iterator[None]:
    """``torch.__future__.set_swap_module_params_on_conversion(True)`` for the block, as it was after."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


class FrozenQuantLinear(nn.Linear):
    """torchtune's ``FrozenNF4Linear``: a frozen weight swapped for its quantized copy while it is built."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(in_dim, out_dim, bias=False)
        self.weight.requires_grad_(False)
        quantized = self.weight.detach().to(torch.bfloat16)
        # re-register self.weight as the quantized weight, so that it shows up in .parameters and state_dict
        torch.utils.swap_tensors(self.weight, torch.nn.Parameter(quantized, requires_grad=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight.to(x.dtype))


class Net(nn.Module):
    """A quantized frozen base, a trainable head, a learnable ``scale`` and a buffer; with ``buggy``, a
    head ``aux`` that forward never calls (``missing_grad``: the diagnostic hooks stay armed on it)."""

    def __init__(self, buggy: bool = False) -> None:
        super().__init__()
        self.base = FrozenQuantLinear(4, 8)
        self.fc = nn.Linear(8, 1)
        self.scale = nn.Parameter(torch.ones(1))
        self.register_buffer("shift", torch.full((1,), 0.5))
        if buggy:
            self.aux = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.base(x))) * self.scale + self.shift


def optimizer_for(model: nn.Module, buggy: bool = False, prefix: str = "") -> torch.optim.Optimizer:
    """SGD over the trainable parameters; with ``buggy``, ``scale`` left out of it."""
    return torch.optim.SGD([p for n, p in model.named_parameters() if p.requires_grad
                            and not (buggy and n == f"{prefix}scale")], lr=0.05)


def swap(model: nn.Module, kind: str) -> None:
    """Swap every parameter of ``model`` in place of itself, the way ``kind`` names."""
    if kind == "to":
        model.to(torch.float64)
        model.to(torch.float32)
    elif kind == "half":
        model.half()
        model.float()
    elif kind == "assign":
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    elif kind == "swap_tensors":
        for p in [p for p in model.parameters() if p.requires_grad]:
            torch.utils.swap_tensors(p, nn.Parameter(p.detach().clone()))
    else:
        raise ValueError(f"`kind` must be one of {SWAPS}, got {kind!r}")


def batches(steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(steps)]


def probe(model: nn.Module) -> dict[str, Any]:
    """What a run may have left on ``model``: weak references to its tensors, what ``torch.save``,
    ``pickle`` and ``copy.deepcopy`` make of it, and the hooks its deep copy carries."""
    tensors = [*model.parameters(), *model.buffers()]
    saved = io.BytesIO()
    torch.save(model, saved)
    pickled = pickle.dumps(model)
    twin = copy.deepcopy(model)
    module_hooks = sorted(n for n, m in twin.named_modules() if m._forward_hooks or m._forward_pre_hooks
                          or m._backward_hooks)
    tensor_hooks = sorted(n for n, t in [*twin.named_parameters(), *twin.named_buffers()]
                          if t._backward_hooks or getattr(t, "_post_accumulate_grad_hooks", None))
    loaded = torch.load(io.BytesIO(saved.getvalue()), weights_only=False)
    return {"weakrefs": sum(len(weakref.getweakrefs(t)) for t in tensors),
            "saved_equal": all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values())),
            "pickled_equal": all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                                    pickle.loads(pickled).state_dict().values())),
            "copy_module_hooks": module_hooks, "copy_tensor_hooks": tensor_hooks}


#: What :func:`probe` says of a model nothing was left on.
UNTOUCHED = {"weakrefs": 0, "saved_equal": True, "pickled_equal": True, "copy_module_hooks": [], "copy_tensor_hooks": []}

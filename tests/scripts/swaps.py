"""A plain script that swaps its model's parameters every way torch does, before the first step and
between steps (``tests/_swaps.py``: ``module.to()``/``.half()``/``.float()`` with swap-on-conversion,
``load_state_dict(..., assign=True)``, ``torch.utils.swap_tensors``, a layer that swaps its weight while it
is built), prints its losses and, after the first step (while a miss found there is diagnosed) and at its
end, what ``tests/_swaps.py``'s probe finds on the model (weak references, ``torch.save``, ``pickle``,
``copy.deepcopy``).

Arguments: --buggy (an unused head and a parameter left out of the optimizer), --save PATH (the model
pickled with ``torch.save`` after the first step).
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared _swaps module
import _swaps  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--buggy", action="store_true")
parser.add_argument("--save", default=None)
args = parser.parse_args()

torch.__future__.set_swap_module_params_on_conversion(True)
torch.manual_seed(0)
model = _swaps.Net(buggy=args.buggy)
optimizer = _swaps.optimizer_for(model, args.buggy)
for kind in _swaps.SWAPS:  # before the first step
    _swaps.swap(model, kind)
for step, (x, y) in enumerate(_swaps.batches(6)):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item()!r}")
    if step < len(_swaps.SWAPS):  # between steps
        _swaps.swap(model, _swaps.SWAPS[step])
    if step == 0:
        print("probe", json.dumps(_swaps.probe(model)))
        print(f"global forward hooks: {len(torch.nn.modules.module._global_forward_hooks)}", file=sys.stderr)
        if args.save:
            torch.save(model, args.save)
print("end", json.dumps(_swaps.probe(model)))

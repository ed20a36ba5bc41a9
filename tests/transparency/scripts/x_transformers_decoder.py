"""x-transformers: an autoregressive decoder with stochastic depth (``Decoder(layer_dropout=...)``),
trained as x-transformers' ``examples/enwik8_simple/train.py`` trains one: ``TransformerWrapper``
inside ``AutoregressiveWrapper`` (the wrapper computes the next-token loss), gradient accumulation,
``clip_grad_norm_``, Adam. Random bytes stand in for enwik8; the checkpoint is the ``state_dict``.
Layer dropout draws from Python's ``random``: seeded too.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from _transparency import arguments, attach_monitor, close_monitor, print_loss
from x_transformers import AutoregressiveWrapper, Decoder, TransformerWrapper

SEQ_LEN, GRADIENT_ACCUMULATE_EVERY, STEPS = 32, 2, 30


def make_model() -> AutoregressiveWrapper:
    return AutoregressiveWrapper(TransformerWrapper(
        num_tokens=256, max_seq_len=SEQ_LEN, attn_layers=Decoder(dim=32, depth=4, heads=2, layer_dropout=0.3)))


def load(out: Path) -> dict:
    model = make_model()
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    return model.state_dict()


if __name__ == "__main__":
    out, args = arguments(load)
    random.seed(0)
    torch.manual_seed(0)
    model = make_model()
    optim = torch.optim.Adam(model.parameters(), lr=1e-4)
    monitor = attach_monitor(model, optim, out)
    data = torch.randint(0, 256, (64, SEQ_LEN))
    for step in range(1, STEPS + 1):
        model.train()
        for __ in range(GRADIENT_ACCUMULATE_EVERY):
            loss = model(data[torch.randint(0, 64, (4,))])
            (loss / GRADIENT_ACCUMULATE_EVERY).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optim.step()
        optim.zero_grad()
        print_loss(step, loss)
    close_monitor(monitor)
    torch.save(model.state_dict(), out / "model.pt")

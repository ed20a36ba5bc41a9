"""torchtune: LoRA (``lora_llama2``) or, with ``qlora``, QLoRA (NF4 base weights) fine-tuning of a tiny Llama 2.

As torchtune's ``recipes/lora_finetune_single_device.py`` does it: the model built from its
builder under the recipe's dtype, only the adapters made trainable (``set_trainable_params``), the
base weights loaded with ``strict=False`` and validated, an AdamW over ``model.parameters()``, the
labels shifted by one, and a checkpoint of the adapter weights and of the merged model. The base
weights are a plain ``llama2`` built from the same config (no download).
"""

from __future__ import annotations

from pathlib import Path

import torch
from _transparency import arguments, attach_monitor, close_monitor, print_loss
from torchtune import training
from torchtune.models.llama2 import llama2, lora_llama2
from torchtune.modules.peft import (get_adapter_params, get_adapter_state_dict, get_merged_lora_ckpt,
                                    set_trainable_params, validate_missing_and_unexpected_for_lora)

CONFIG = dict(vocab_size=128, num_layers=2, num_heads=4, num_kv_heads=4, embed_dim=128, max_seq_len=64)
LORA = dict(lora_attn_modules=["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True, lora_rank=8, lora_alpha=16)
IGNORE_INDEX = -100
STEPS = 4


def load(out: Path) -> dict:
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    model = llama2(**CONFIG)  # the merged weights load into the plain model
    model.load_state_dict({k: v.float() for k, v in checkpoint["model"].items()})
    return {"adapter": checkpoint["adapter"], "model": model.state_dict()}



if __name__ == "__main__":
    out, args = arguments(load)
    qlora = args == ["qlora"]
    dtype = torch.bfloat16 if qlora else torch.float32
    training.set_seed(seed=0)
    base_model_state_dict = llama2(**CONFIG).state_dict()
    with training.set_default_dtype(dtype):
        model = lora_llama2(**LORA, **CONFIG, quantize_base=qlora)
    set_trainable_params(model, get_adapter_params(model))
    base_missing, base_unexpected = model.load_state_dict(base_model_state_dict, strict=False)
    validate_missing_and_unexpected_for_lora(
        lora_attn_modules=LORA["lora_attn_modules"], apply_lora_to_mlp=True, apply_lora_to_output=False,
        base_missing=base_missing, base_unexpected=base_unexpected)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    monitor = attach_monitor(model, optimizer, out)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX)
    tokens = torch.randint(0, CONFIG["vocab_size"], (4, 24))
    ignore_labels = torch.full((tokens.shape[0], 1), IGNORE_INDEX)
    for step in range(1, STEPS + 1):
        logits = model(tokens)
        labels = torch.hstack((tokens[..., 1:], ignore_labels)).reshape(-1)
        loss = loss_fn(logits.reshape(-1, logits.size(-1)).float(), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print_loss(step, loss)
    close_monitor(monitor)
    state_dict = {k: v.cpu() for k, v in model.state_dict().items()}
    torch.save({"adapter": get_adapter_state_dict(state_dict),
                "model": get_merged_lora_ckpt(state_dict, rank=LORA["lora_rank"], alpha=LORA["lora_alpha"])},
               out / "checkpoint.pt")


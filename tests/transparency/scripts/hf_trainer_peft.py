"""Hugging Face ``Trainer`` + peft: LoRA on a tiny Llama built from its config (no download), as
peft's docs fine-tune a causal LM: ``LoraConfig`` on the attention projections, ``get_peft_model``,
``Trainer`` with ``TrainingArguments``, then ``trainer.save_model()`` (the adapter) and the base
model's ``save_pretrained``; loaded back with ``PeftModel.from_pretrained``. The door is leafwatch's
``LeafWatchCallback``. Losses are printed from ``training_step`` (the Trainer's own log rounds them).
"""

from __future__ import annotations

from pathlib import Path

import torch
from _transparency import arguments, door, logdir, print_loss
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

STEPS = 6
CONFIG = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64)


class PrintingTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        print_loss(self.state.global_step + 1, loss)
        return loss


def load(out: Path) -> dict:
    base = LlamaForCausalLM.from_pretrained(str(out / "base"))
    return PeftModel.from_pretrained(base, str(out / "adapter")).state_dict()


if __name__ == "__main__":
    out, args = arguments(load)
    set_seed(0)
    base = LlamaForCausalLM(CONFIG)
    base.save_pretrained(str(out / "base"))
    lora_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.05,
                             bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, lora_config)
    input_ids = torch.randint(0, CONFIG.vocab_size, (16, 12))
    train = [{"input_ids": ids, "labels": ids} for ids in input_ids]
    callbacks = []
    if door() == "transformers":
        from leafwatch.transformers import LeafWatchCallback

        callbacks.append(LeafWatchCallback())
    training_args = TrainingArguments(str(logdir(out)), max_steps=STEPS, per_device_train_batch_size=4,
                                      learning_rate=1e-3, use_cpu=True, report_to="none", save_strategy="no",
                                      logging_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = PrintingTrainer(model=model, args=training_args, train_dataset=train, callbacks=callbacks)
    trainer.train()
    trainer.save_model(str(out / "adapter"))

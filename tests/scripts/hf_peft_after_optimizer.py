"""A Hugging Face Trainer given an optimizer built before `peft.get_peft_model`: the adapter (8 LoRA
matrices and the classifier copy of `modules_to_save`, 10 tensors) is in no optimizer and never trains.
Argument: the output folder. Six steps, fewer than `leafwatch run`'s 25-check wait."""
import sys

import torch
import peft
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

VOCAB = 99


class Sentences(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "attention_mask": torch.ones(8, dtype=torch.long), "labels": torch.tensor(i % 2)}


config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
base = BertForSequenceClassification(config)
opt = torch.optim.AdamW(base.parameters(), lr=1e-3)  # built before the adapter exists
model = peft.get_peft_model(base, peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"],
                                                  modules_to_save=["classifier"]))
args = TrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to="none", save_strategy="no", max_steps=6,
                         per_device_train_batch_size=4, logging_strategy="no", disable_tqdm=True, seed=0)
Trainer(model=model, args=args, train_dataset=Sentences(), optimizers=(opt, None)).train()
print("done")

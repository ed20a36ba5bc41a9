"""Hugging Face Trainer DDP runs (CPU, gloo, 2 processes) with the LeafWatchCallback.

Usage: ``python hf_ddp.py SCENARIOS OUT_DIR`` on each rank, with the environment torchrun gives
its workers (RANK, WORLD_SIZE, MASTER_ADDR/PORT...), where ``SCENARIOS`` is one scenario or
several, comma-separated: their Trainers run one after the other in the same two processes and
process group. Each rank writes ``OUT_DIR/SCENARIO/rank{N}.json``: the callback's report, the
leafwatch warnings it saw, and the error that stopped ``train``. A scenario whose ``train``
fails (``strict``) must come last, where the ranks stop anyway.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings

import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from leafwatch import LeafwatchWarning
from leafwatch.transformers import LeafWatchCallback


def config() -> BertConfig:
    return BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=37)


class UnusedHead(BertForSequenceClassification):
    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.unused_head = nn.Linear(config.hidden_size, config.num_labels)


class RankBranch(BertForSequenceClassification):
    """An auxiliary head that only rank 1 runs: a per-rank branch."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.aux_head = nn.Linear(config.hidden_size, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                **kwargs: object) -> object:
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        if int(os.environ["RANK"]) == 1:
            out.loss = out.loss + self.aux_head(self.bert.embeddings.word_embeddings(input_ids).mean(1)).pow(2).mean()
        return out


class Sentences(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 99, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "attention_mask": torch.ones(8, dtype=torch.long), "labels": torch.tensor(i % 2)}


def run(scenario: str, out_dir: str, rank: int) -> None:
    """One scenario's ``train``; writes its result."""
    out = os.path.join(out_dir, scenario)
    torch.manual_seed(0)
    models = {"unused": UnusedHead, "strict": UnusedHead, "branch": RankBranch}
    model = models.get(scenario, BertForSequenceClassification)(config())
    callback = LeafWatchCallback(strict=scenario == "strict")
    args = TrainingArguments(output_dir=os.path.join(out, "run"), use_cpu=True, ddp_backend="gloo",
                             report_to="none", save_strategy="no", max_steps=2, per_device_train_batch_size=4,
                             logging_strategy="no", disable_tqdm=True, seed=0)
    error = error_type = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            Trainer(model=model, args=args, train_dataset=Sentences(), callbacks=[callback]).train()
        except Exception as e:  # the scenario's outcome, written for the test
            error, error_type = f"{e}\n{traceback.format_exc()}", type(e).__name__
    result = {
        "report": callback.report.to_dict(),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, LeafwatchWarning)],
        "error": error,
        "error_type": error_type,
        "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    scenarios, out_dir = sys.argv[1].split(","), sys.argv[2]
    for scenario in scenarios[:-1]:
        if scenario == "strict":
            raise ValueError("scenario 'strict' stops `train` with an error: it must come last")
    rank = int(os.environ["RANK"])
    for scenario in scenarios:
        run(scenario, out_dir, rank)


if __name__ == "__main__":
    main()

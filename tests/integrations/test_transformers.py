"""The Hugging Face Trainer callback with real Trainers on tiny random-config models.

BERT for sequence classification, GPT-2 with tied embeddings and a LoRA model (peft), built in
code (no download), trained a few steps on CPU with ``report_to="none"``: the unused layer is
named with its cause, clean runs stay quiet, the records under ``output_dir`` are read back by
``leafwatch report``, and the history survives ``resume_from_checkpoint``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import _warm
import pytest
import torch
from _launch import rank_results
from _requirements import require_module
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

# Every test here runs a real Hugging Face Trainer: without transformers and accelerate the file
# skips (locally) or fails (in CI).
require_module("transformers")
require_module("accelerate")
from accelerate import Accelerator  # noqa: E402
from accelerate.optimizer import AcceleratedOptimizer  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertModel,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
)

from leafwatch import LeafwatchError, LeafwatchWarning  # noqa: E402
from leafwatch.detectors import fixes  # noqa: E402
from leafwatch.integrations.transformers import LOG_SUBDIR, gradient_strategy  # noqa: E402
from leafwatch.transformers import LeafWatchCallback  # noqa: E402

VOCAB = 99
REPO = Path(__file__).resolve().parents[2]
DDP_SCRIPT = Path(__file__).resolve().parents[1] / "dist_scripts" / "hf_ddp.py"
DDP_TIMEOUT_S = 240


def bert_config() -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=37)


def tiny_bert() -> BertForSequenceClassification:
    return BertForSequenceClassification(bert_config())


class BertWithUnusedHead(BertForSequenceClassification):
    """A second head that forward() never calls: it will not train."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.unused_head = nn.Linear(config.hidden_size, config.num_labels)


class BertWithAlternatingHead(BertForSequenceClassification):
    """An auxiliary head used on every second forward pass (every second micro-batch)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.aux_head = nn.Linear(config.hidden_size, 1)
        self.forward_calls = 0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                **kwargs: Any) -> Any:
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        self.forward_calls += 1
        if self.forward_calls % 2 == 0:
            embedded = self.bert.embeddings.word_embeddings(input_ids).mean(dim=1)
            out.loss = out.loss + self.aux_head(embedded).pow(2).mean()
        return out


def tiny_gpt2() -> GPT2LMHeadModel:
    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=16,
                        bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    return GPT2LMHeadModel(config)


def tiny_lora() -> nn.Module:
    peft = require_module("peft")

    return peft.get_peft_model(tiny_bert(), peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"]))


class Sentences(torch.utils.data.Dataset):
    """Random token ids, fixed per index: classification labels, or the ids as LM labels."""

    def __init__(self, n: int = 8, length: int = 8, lm: bool = False) -> None:
        self.n, self.length, self.lm = n, length, lm

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (self.length,), generator=torch.Generator().manual_seed(i))
        if self.lm:
            return {"input_ids": ids, "labels": ids.clone()}
        return {"input_ids": ids, "attention_mask": torch.ones(self.length, dtype=torch.long),
                "labels": torch.tensor(i % 2)}


def train(model: nn.Module, out: Path, callback: LeafWatchCallback, *, data: Sentences | None = None,
          optimizers: Any = (None, None), resume: bool | None = None, **overrides: Any) -> Trainer:
    arguments: dict[str, Any] = dict(
        output_dir=str(out), use_cpu=True, report_to="none", save_strategy="no", max_steps=3,
        per_device_train_batch_size=4, logging_strategy="no", disable_tqdm=True, seed=0,
    )
    arguments.update(overrides)
    trainer = Trainer(model=model, args=TrainingArguments(**arguments), train_dataset=data or Sentences(),
                      callbacks=[callback], optimizers=optimizers)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def assert_no_hooks(model: nn.Module) -> None:
    for name, module in model.named_modules():
        assert not module._forward_hooks and not module._forward_pre_hooks, f"hooks left on {name!r}"


# -- what it finds --------------------------------------------------------------------------------
@pytest.mark.parametrize(("bf16",), [(False,), (True,)])
def test_unused_layer_named_with_its_cause(tmp_path: Path, bf16: bool) -> None:
    callback = LeafWatchCallback()
    model = BertWithUnusedHead(bert_config())
    with pytest.warns(LeafwatchWarning, match=r"ERROR missing_grad `unused_head` \(2 tensors: unused_head\.\{bias,weight\}\) at step 1\. Fix \(advice\): call `unused_head`"):
        train(model, tmp_path, callback, bf16=bf16)
    report = callback.report
    assert report.step == 3
    assert report.names("missing_grad") == {"unused_head.weight", "unused_head.bias"}
    weight = next(f for f in report.tensors() if f.key == ("missing_grad", "unused_head.weight"))
    assert (weight.severity, weight.status, weight.first_step) == ("error", "open", 1)
    assert "module `unused_head` never ran" in weight.cause
    assert "call `unused_head` in forward()" in weight.fix
    assert callback.monitor is None
    assert_no_hooks(model)


def test_a_layer_left_out_of_the_users_own_optimizer_is_given_to_that_optimizer(tmp_path: Path) -> None:
    model = tiny_bert()
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if not n.startswith("classifier")], lr=0.01)
    callback = LeafWatchCallback(verbose=False)
    train(model, tmp_path, callback, optimizers=(opt, None))
    report = callback.report
    assert report.names("not_in_optimizer") == {"classifier.weight", "classifier.bias"}
    assert [f.name for f in report.by_kind("not_in_optimizer")] == ["classifier"]  # one layer left out: one mistake
    for f in report.by_kind("not_in_optimizer"):
        # the optimizer the user passed in `optimizers=`, by its variable (not the callback that holds it),
        # and the layer left out as a whole, as the user assigned it
        assert ("add it to `opt`, the optimizer you pass in the Trainer's `optimizers=`, before training: "
                '`opt.add_param_group({"params": model.classifier.parameters()})`') in f.fix
        assert "AdamW" not in f.fix


def test_clean_bert_run_is_quiet(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    callback = LeafWatchCallback()
    train(tiny_bert(), tmp_path, callback)
    assert callback.report.step == 3
    assert callback.report.findings == []
    assert not [w for w in recwarn if issubclass(w.category, LeafwatchWarning)]


# -- modules a Trainer's compute_loss trains beyond the model ----------------------------------------
class SoftmaxLoss(nn.Module):
    """sentence-transformers' ``losses.SoftmaxLoss``, rebuilt: the model and a classifier on its
    pooled output; the Trainer keeps it as ``self.loss`` and calls it in ``compute_loss``."""

    def __init__(self, model: nn.Module, dim: int, num_labels: int) -> None:
        super().__init__()
        self.model = model
        self.classifier = nn.Linear(dim, num_labels)
        self.loss_fct = nn.CrossEntropyLoss()

    def forward(self, features: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        pooled = self.model(input_ids=features["input_ids"], attention_mask=features["attention_mask"]).pooler_output
        return self.loss_fct(self.classifier(pooled), labels)


class LossTrainer(Trainer):
    """As ``SentenceTransformerTrainer``: the loss module is the Trainer's ``loss``."""

    def __init__(self, *args: Any, loss: nn.Module, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loss = loss

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:
        labels = inputs.pop("labels")
        return self.loss(inputs, labels)


class HeadTrainer(Trainer):
    """A Trainer subclass whose ``compute_loss`` puts a head of its own on the model's output."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head = nn.Linear(32, 2)

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:
        labels = inputs.pop("labels")
        pooled = model(**inputs).pooler_output
        return nn.functional.cross_entropy(self.head(pooled), labels)


class DistillTrainer(Trainer):
    """Distillation: a teacher the Trainer holds, run under ``no_grad`` (its tensors still require grad)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.teacher = BertModel(bert_config())

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:
        inputs.pop("labels")
        with torch.no_grad():
            target = self.teacher(**inputs).pooler_output
        return nn.functional.mse_loss(model(**inputs).pooler_output, target)


def _trainer(cls: type, model: nn.Module, out: Path, callback: LeafWatchCallback, opt: Any, **kwargs: Any) -> Trainer:
    args = TrainingArguments(output_dir=str(out), use_cpu=True, report_to="none", save_strategy="no", max_steps=3,
                             per_device_train_batch_size=4, logging_strategy="no", disable_tqdm=True, seed=0,
                             remove_unused_columns=False)
    return cls(model=model, args=args, train_dataset=Sentences(), callbacks=[callback], optimizers=(opt, None),
               **kwargs)


def test_a_classifier_the_loss_module_owns_left_out_is_named_by_the_trainers_path_and_its_fix_pastes(
        tmp_path: Path) -> None:
    model = BertModel(bert_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the loss module's classifier left out
    callback = LeafWatchCallback(verbose=False)
    trainer = _trainer(LossTrainer, model, tmp_path, callback, opt, loss=SoftmaxLoss(model, 32, 2))
    classifier = trainer.loss.classifier.weight.detach().clone()
    trainer.train()
    assert torch.equal(trainer.loss.classifier.weight, classifier)  # checked from the tensor: it never changed
    (f,) = callback.report.open
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "trainer.loss.classifier", "error")
    assert callback.report.names("not_in_optimizer") == {"trainer.loss.classifier.weight", "trainer.loss.classifier.bias"}
    assert "was left out when the optimizer's parameter list was built" in f.cause
    (code,) = [c for c in fixes.code_spans(f.fix) if "add_param_group" in c]
    assert code == 'opt.add_param_group({"params": trainer.loss.classifier.parameters()})'
    exec(code, {"opt": opt, "trainer": trainer})  # pasted where the user holds `opt` and `trainer`
    trainer.train()
    assert callback.report.open == [] and not torch.equal(trainer.loss.classifier.weight, classifier)
    assert_no_hooks(model)


def test_a_head_the_trainer_subclass_owns_outside_every_optimizer_is_a_warning_naming_both_fixes(tmp_path: Path) -> None:
    model = BertModel(bert_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    callback = LeafWatchCallback(verbose=False)
    trainer = _trainer(HeadTrainer, model, tmp_path, callback, opt)
    trainer.train()
    (f,) = callback.report.open
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "trainer.head", "warning")
    assert (f.reason.name, f.remedy.applicability) == ("root_outside", "code")
    assert f.cause.startswith("no optimizer holds `trainer.head` (none of its tensors): its optimizer was forgotten")
    add, freeze = [c for c in fixes.code_spans(f.fix) if "add_param_group" in c or "requires_grad_" in c]
    assert (add, freeze) == ('opt.add_param_group({"params": trainer.head.parameters()})',
                             "trainer.head.requires_grad_(False)")
    exec(add, {"opt": opt, "trainer": trainer})  # the first fix, pasted where the user holds them
    trainer.train()
    assert callback.report.open == []


def test_a_teacher_the_trainer_holds_run_under_no_grad_is_quiet(tmp_path: Path) -> None:
    model = BertModel(bert_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    callback = LeafWatchCallback(verbose=False)
    trainer = _trainer(DistillTrainer, model, tmp_path, callback, opt)
    trainer.train()
    assert callback.report.step == 3
    assert callback.report.findings == []


def test_gpt2_tied_embeddings_not_reported(tmp_path: Path) -> None:
    model = tiny_gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    callback = LeafWatchCallback(verbose=False)
    train(model, tmp_path, callback, data=Sentences(lm=True))
    assert callback.report.step == 3
    assert callback.report.findings == []


def test_leafwatch_run_names_an_adapter_added_after_the_optimizer_in_a_run_shorter_than_the_wait(tmp_path: Path) -> None:
    """`opt` built before `peft.get_peft_model`: the 8 LoRA matrices and the `modules_to_save`
    classifier copy get gradients, are in no optimizer and never change. Six steps, fewer than
    the 25 checks `leafwatch run` waits for a late optimizer: named at the end of the run, though
    the Trainer cleared their gradients after the last step."""
    peft = require_module("peft")
    from leafwatch.report.reader import read_reports

    script = REPO / "tests" / "scripts" / "hf_peft_after_optimizer.py"
    result = _warm.run([sys.executable, "-m", "leafwatch", "run", "--logdir", str(tmp_path / "logs"), str(script),
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.endswith("done\n"), result.stderr
    (run,) = read_reports(str(tmp_path / "logs"))
    adapter = {f"base_model.model.bert.encoder.layer.{i}.attention.self.{m}.{ab}.default.weight"
               for i in (0, 1) for m in ("query", "value") for ab in ("lora_A", "lora_B")}
    adapter |= {"base_model.model.classifier.modules_to_save.default.weight",
                "base_model.model.classifier.modules_to_save.default.bias"}
    assert run.report.names("not_in_optimizer") == adapter
    (left_out,) = run.report.by_kind("not_in_optimizer")
    assert (left_out.severity, left_out.status) == ("error", "open")
    # The frozen base in `opt`: one piece of information, named by the optimizer holding it.
    (frozen,) = run.report.by_kind("frozen_in_optimizer")
    assert (frozen.name, frozen.severity, frozen.details["tensors"]) == ("opt", "info", 41)
    # The fix gives the adapter's trainable tensors only (the frozen base is in `opt` already).
    code = 'opt.add_param_group({"params": [p for p in model.base_model.parameters() if p.requires_grad]})'
    assert f"`{code}`" in left_out.fix
    base = tiny_bert()
    opt = torch.optim.AdamW(base.parameters(), lr=1e-3)
    model = peft.get_peft_model(base, peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"],
                                                      modules_to_save=["classifier"]))
    exec(code, {"opt": opt, "model": model})  # pastes where the script holds `opt` and `model`
    assert len(opt.param_groups[-1]["params"]) == 10


@pytest.mark.parametrize(("checkpointing",), [({},), ({"gradient_checkpointing": True,
                                                     "gradient_checkpointing_kwargs": {"use_reentrant": True}},)])
def test_lora_frozen_base_is_quiet(tmp_path: Path, checkpointing: dict[str, Any]) -> None:
    # Reentrant activation checkpointing runs the layers under no_grad first: still nothing to find.
    model = tiny_lora()
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("query.base_layer.weight" in n for n in frozen) and any("lora_A" in n for n in trainable)
    callback = LeafWatchCallback(verbose=False)
    train(model, tmp_path, callback, **checkpointing)
    assert callback.report.step == 3
    assert callback.report.findings == []


def test_gradient_accumulation_checks_the_accumulated_gradients(tmp_path: Path) -> None:
    # The auxiliary head is used on every second micro-batch: accumulated over two, it trains.
    callback = LeafWatchCallback(verbose=False)
    model = BertWithAlternatingHead(bert_config())
    train(model, tmp_path, callback, gradient_accumulation_steps=2, per_device_train_batch_size=2)
    assert model.forward_calls == 6
    assert callback.report.step == 3
    assert callback.report.findings == []


def test_without_accumulation_the_alternating_head_is_intermittent(tmp_path: Path) -> None:
    callback = LeafWatchCallback(verbose=False)
    train(BertWithAlternatingHead(bert_config()), tmp_path, callback, max_steps=4,
          per_device_train_batch_size=2)
    findings = callback.report.tensors("missing_grad")
    assert {f.name for f in findings} == {"aux_head.weight", "aux_head.bias"}
    assert {f.status for f in findings} == {"intermittent"}
    assert not callback.report  # nothing open: it trains on every second step


class BertWithEvalOnlyHead(BertWithUnusedHead):
    """The second head runs in evaluation only: in training it is dead."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                **kwargs: Any) -> Any:
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        if not self.training:
            out.logits = out.logits + self.unused_head(self.bert.embeddings.word_embeddings(input_ids).mean(dim=1))
        return out


def test_evaluation_between_steps_does_not_explain_away_a_dead_head(tmp_path: Path) -> None:
    callback = LeafWatchCallback(verbose=False)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no",
                             max_steps=3, per_device_train_batch_size=4, logging_strategy="no", disable_tqdm=True,
                             eval_strategy="steps", eval_steps=1)
    Trainer(model=BertWithEvalOnlyHead(bert_config()), args=args, train_dataset=Sentences(),
            eval_dataset=Sentences(4), callbacks=[callback]).train()
    weight = next(f for f in callback.report.tensors() if f.key == ("missing_grad", "unused_head.weight"))
    assert (weight.severity, weight.status, weight.first_step, weight.last_step) == ("error", "open", 1, 3)
    assert "never ran" in weight.cause


def test_strict_stops_training_at_the_first_step(tmp_path: Path) -> None:
    callback = LeafWatchCallback(strict=True, verbose=False)
    model = BertWithUnusedHead(bert_config())
    with pytest.raises(LeafwatchError, match=r"missing_grad\s+unused_head \(since") as raised:
        train(model, tmp_path, callback)
    assert raised.value.report.step == 1
    assert callback.monitor is None
    assert_no_hooks(model)


def test_strict_reports_at_train_begin_and_raises_at_the_first_check(tmp_path: Path) -> None:
    model = tiny_bert()
    plain = torch.ones(1)  # requires_grad=False: SGD will never update it, an error the scan sees
    optimizer = torch.optim.SGD([*model.parameters(), plain], lr=0.01)
    forwards = []
    counting = model.register_forward_hook(lambda *_: forwards.append(1))
    callback = LeafWatchCallback(strict=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(LeafwatchError, match="frozen_in_optimizer") as raised:
            train(model, tmp_path, callback, optimizers=(optimizer, None))
    counting.remove()
    at_start = [str(w.message) for w in caught if issubclass(w.category, LeafwatchWarning)]
    assert any("frozen_in_optimizer" in line and "at start" in line for line in at_start)
    # Not raised by the train-begin scan: after one real step, from the first check.
    assert len(forwards) == 1
    assert raised.value.report.step == 1
    assert raised.value.report.by_kind("frozen_in_optimizer")[0].first_step == 0
    assert callback.monitor is None
    assert_no_hooks(model)


# -- what it writes -------------------------------------------------------------------------------
def test_records_under_output_dir_whatever_report_to(tmp_path: Path) -> None:
    train(BertWithUnusedHead(bert_config()), tmp_path, LeafWatchCallback(verbose=False))
    acc = EventAccumulator(str(tmp_path / LOG_SUBDIR), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert "leafwatch/report" in acc.Tags()["tensors"]
    record = json.loads(acc.Tensors("leafwatch/report")[-1].tensor_proto.string_val[0])
    assert {m["name"] for f in record["findings"] for m in f["members"]} == {"unused_head.weight", "unused_head.bias"}
    assert [e.value for e in acc.Scalars("leafwatch/open/missing_grad")][-1] == 1  # one mistake: the unused head


def test_leafwatch_report_on_the_output_dir_exits_1_naming_the_layer(tmp_path: Path) -> None:
    train(BertWithUnusedHead(bert_config()), tmp_path / "buggy", LeafWatchCallback(verbose=False))
    train(tiny_bert(), tmp_path / "clean", LeafWatchCallback(verbose=False))
    buggy = _warm.run([sys.executable, "-m", "leafwatch", "report", str(tmp_path / "buggy")],
                      capture_output=True, text=True, timeout=120)
    assert buggy.returncode == 1, buggy.stderr
    assert "unused_head.{bias,weight}" in buggy.stdout and "never ran" in buggy.stdout
    clean = _warm.run([sys.executable, "-m", "leafwatch", "report", str(tmp_path / "clean")],
                      capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no findings" in clean.stdout


# -- resume ---------------------------------------------------------------------------------------
def test_resume_from_checkpoint_keeps_the_history(tmp_path: Path) -> None:
    first = LeafWatchCallback(verbose=False)
    train(BertWithUnusedHead(bert_config()), tmp_path, first, max_steps=2, save_strategy="steps", save_steps=2)
    assert {f.first_step for f in first.report.by_kind("missing_grad")} == {1}
    saved = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert "LeafWatchCallback" in saved["stateful_callbacks"]

    second = LeafWatchCallback(verbose=False)
    train(BertWithUnusedHead(bert_config()), tmp_path, second, max_steps=4, resume=True)
    report = second.report
    assert report.step == 4
    weight = next(f for f in report.tensors() if f.key == ("missing_grad", "unused_head.weight"))
    assert (weight.first_step, weight.last_step) == (1, 4)
    assert weight.steps_seen == 4  # steps 1-2 before the resume, 3-4 after

    # A train() that does not resume starts a fresh history.
    third = LeafWatchCallback(verbose=False)
    train(BertWithUnusedHead(bert_config()), tmp_path / "fresh", third, max_steps=1)
    assert next(f for f in third.report.tensors() if f.name == "unused_head.weight").steps_seen == 1


def test_resume_with_restore_callback_states_keeps_the_history(tmp_path: Path) -> None:
    train(BertWithUnusedHead(bert_config()), tmp_path, LeafWatchCallback(verbose=False, patience=2),
          max_steps=2, save_strategy="steps", save_steps=2)
    trainer = train(BertWithUnusedHead(bert_config()), tmp_path, LeafWatchCallback(verbose=False, patience=2),
                    max_steps=3, resume=True, restore_callback_states_from_checkpoint=True)
    # transformers replaced the callback by a new one built from the saved options.
    restored = [c for c in trainer.callback_handler.callbacks if isinstance(c, LeafWatchCallback)]
    assert len(restored) == 1 and restored[0].patience == 2
    weight = next(f for f in restored[0].report.tensors() if f.key == ("missing_grad", "unused_head.weight"))
    assert (weight.first_step, weight.last_step, weight.steps_seen) == (2, 3, 2)


# -- gradients it cannot read ---------------------------------------------------------------------
class MasterCopySGD(torch.optim.Optimizer):
    """SGD on fp32 master copies: reads the model's gradients, steps the copies, writes back."""

    def __init__(self, params: list[nn.Parameter], lr: float = 0.1) -> None:
        self.model_params = list(params)
        masters = [p.detach().clone().float().requires_grad_(True) for p in self.model_params]
        super().__init__(masters, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for master, param in zip(group["params"], self.model_params):
                if param.grad is not None:
                    master.add_(param.grad.float(), alpha=-group["lr"])
                    param.copy_(master)


def test_master_copy_optimizer_one_info_finding_not_a_flood(tmp_path: Path) -> None:
    model = BertWithUnusedHead(bert_config())
    optimizer = MasterCopySGD([p for p in model.parameters() if p.requires_grad])
    callback = LeafWatchCallback(verbose=False)
    train(model, tmp_path, callback, optimizers=(optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)))
    findings = callback.report.findings
    assert len(findings) == 1
    f = findings[0]
    assert (f.kind, f.severity, f.status) == ("missing_grad", "info", "ignored")
    assert f.details["strategy"] == "Master copies" and "copies of the parameters" in f.cause
    assert not callback.report  # nothing open


def test_gradient_strategy_unwraps_accelerate_optimizer() -> None:
    # An AcceleratedOptimizer needs accelerate's state, as a script that builds an Accelerator has it (the
    # suite's Trainers built one before: run alone, the test stopped in accelerate's constructor)
    Accelerator(cpu=True)
    model = tiny_bert()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert gradient_strategy(model, AcceleratedOptimizer(sgd, device_placement=False)) == (None, sgd)
    copies = MasterCopySGD(list(model.parameters()))
    assert gradient_strategy(model, AcceleratedOptimizer(copies, device_placement=False)) == ("master_copies", None)
    assert gradient_strategy(model, None) == (None, None)


# -- options --------------------------------------------------------------------------------------
def test_ignore_marks_the_layer_ignored(tmp_path: Path) -> None:
    callback = LeafWatchCallback(verbose=False, ignore={"unused_head.*": "a head kept for later"})
    train(BertWithUnusedHead(bert_config()), tmp_path, callback, max_steps=1)
    assert not callback.report
    assert {f.status for f in callback.report.findings} == {"ignored"}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"patience": 0}, ValueError, "patience"),
        ({"strict": "yes"}, TypeError, "strict"),
        ({"verbose": 1}, TypeError, "verbose"),
        ({"check_values_every_n_steps": -1}, ValueError, "check_values_every_n_steps"),
        ({"log_dir": 3}, TypeError, "log_dir"),
        ({"ignore": 5}, TypeError, "ignore"),
    ],
)
def test_bad_options_name_the_argument(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        LeafWatchCallback(**kwargs)


# -- the Trainer's DDP (CPU, gloo, 2 processes) ---------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DDPRuns:
    """The DDP scenarios, run in one 2-process launch (process start, imports and rendezvous paid
    once), started as torchrun starts its workers; a hang fails each test through the timeout."""

    def __init__(self, scenarios: list[str], out: Path) -> None:
        self.out = out
        port = _free_port()
        procs = []
        for rank in (0, 1):
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            if os.path.exists("/sys/class/net/lo"):
                env["GLOO_SOCKET_IFNAME"] = "lo"
            procs.append(subprocess.Popen([sys.executable, str(DDP_SCRIPT), ",".join(scenarios), str(out)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = []
        self.hung = False
        try:
            for proc in procs:
                logs.append(proc.communicate(timeout=DDP_TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            self.hung = True
            for proc in procs:
                proc.kill()
                proc.communicate()
        self.log = "".join(logs)

    def __call__(self, scenario: str) -> dict[int, dict[str, Any]]:
        """What each rank wrote for ``scenario``."""
        if self.hung:
            pytest.fail(f"the 2-process Trainer hung (no exit within {DDP_TIMEOUT_S} s)")
        return rank_results(self.out, scenario, self.log)


#: The DDP scenarios, in one launch; ``strict`` stops ``train`` with an error, so it comes last.
DDP_SCENARIOS = ["branch", "unused", "strict"]


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> DDPRuns:
    return DDPRuns(DDP_SCENARIOS, tmp_path_factory.mktemp("ddp"))


#: The DDP tests read one launch: under pytest-xdist (``--dist loadgroup``) they share a worker.
in_ddp_launch = pytest.mark.xdist_group("transformers_ddp")


@pytest.mark.slow
@in_ddp_launch
def test_ddp_unused_layer_merged_and_written_by_the_main_process_only(ddp: DDPRuns) -> None:
    results = ddp("unused")
    for rank in (0, 1):
        assert results[rank]["world_size"] == 2 and results[rank]["error"] is None
        f = next(m for f in results[rank]["report"]["findings"] for m in f["members"] if m["name"] == "unused_head.weight")
        assert (f["kind"], f["severity"], f["ranks"], f["first_step"]) == ("missing_grad", "error", [0, 1], 1)
        assert "no gradient on any rank" in f["cause"]
    assert any("`unused_head` (2 tensors: unused_head.{bias,weight})" in w for w in results[0]["warnings"])
    assert results[1]["warnings"] == []
    events = [name for name in os.listdir(ddp.out / "unused" / "run" / LOG_SUBDIR) if name.startswith("events.out")]
    assert len(events) == 1  # one writer: the main process


@pytest.mark.slow
@in_ddp_launch
def test_ddp_rank_dependent_branch_named_with_the_rank_that_skipped(ddp: DDPRuns) -> None:
    # The Trainer's DDP fills rank 0's gradient of the head (find_unused_parameters=True, its
    # default for a PreTrainedModel): only watching which parameters each rank used tells.
    results = ddp("branch")
    for rank in (0, 1):
        assert results[rank]["error"] is None
        f = next(m for f in results[rank]["report"]["findings"] for m in f["members"] if m["name"] == "aux_head.weight")
        assert (f["kind"], f["severity"], f["status"], f["ranks"]) == ("missing_grad", "info", "intermittent", [0])
        assert "rank 0 only" in f["message"] and "per-rank branching" in f["message"]


@pytest.mark.slow
@in_ddp_launch
def test_ddp_strict_raises_on_every_rank_at_the_same_step(ddp: DDPRuns) -> None:
    results = ddp("strict")
    for rank in (0, 1):
        assert results[rank]["error_type"] == "LeafwatchError"
        assert "unused_head.{bias,weight}" in results[rank]["error"] and "on rank(s) 0, 1" in results[rank]["error"]
        assert results[rank]["report"]["step"] == 1


def test_declared_deepspeed_skips_the_gradient_check_with_one_info_finding() -> None:
    import leafwatch
    from leafwatch.integrations import distributed

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    unused = nn.Linear(4, 4)
    model.add_module("unused", unused)
    distributed.declare_gradients(model, "deepspeed")
    try:
        with leafwatch.Monitor(model) as monitor:
            model[1](model[0](torch.ones(2, 4))).sum().backward()
            report = monitor.check()
    finally:
        distributed.declare_gradients(model, None)
    assert len(report.findings) == 1
    f = report.findings[0]
    assert (f.kind, f.name, f.severity, f.status) == ("missing_grad", "DeepSpeed gradients", "info", "ignored")
    assert "partitioned buffers" in f.cause
    with leafwatch.Monitor(model) as monitor:  # withdrawn: the unused layer is named again
        model[1](model[0](torch.ones(2, 4))).sum().backward()
        assert monitor.check().names("missing_grad") == {"unused.weight", "unused.bias"}


def test_declare_ddp_bad_input() -> None:
    from leafwatch.integrations import distributed

    with pytest.raises(TypeError, match="model"):
        distributed.declare_ddp("model", True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="find_unused_parameters"):
        distributed.declare_ddp(nn.Linear(1, 1), "yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "strategy", "error", "match"),
    [(object(), "deepspeed", TypeError, "model"), (nn.Linear(1, 1), "zero2", ValueError, "strategy")],
)
def test_declare_gradients_bad_input(model: Any, strategy: str, error: type[Exception], match: str) -> None:
    from leafwatch.integrations import distributed

    with pytest.raises(error, match=match):
        distributed.declare_gradients(model, strategy)


def test_load_state_dict_carries_the_history_into_the_next_train(tmp_path: Path) -> None:
    first = LeafWatchCallback(verbose=False)
    train(BertWithUnusedHead(bert_config()), tmp_path / "a", first, max_steps=2)
    saved = json.loads(json.dumps(first.state_dict()))  # plain, JSON-ready data
    second = LeafWatchCallback(verbose=False)
    second.load_state_dict(saved)
    assert second.report.names("missing_grad") == {"unused_head.weight", "unused_head.bias"}
    train(BertWithUnusedHead(bert_config()), tmp_path / "b", second, max_steps=1)
    weight = next(f for f in second.report.tensors() if f.key == ("missing_grad", "unused_head.weight"))
    assert weight.steps_seen == 3 and weight.first_step == 1
    with pytest.raises(TypeError, match="state_dict"):
        second.load_state_dict([1, 2])

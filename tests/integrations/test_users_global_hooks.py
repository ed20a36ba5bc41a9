"""A training run with the user's own global torch hooks runs under leafwatch as it runs without it.

torch iterates its global optimizer hook dict while it calls the hooks in it: a hook added or
removed there during a step breaks the user's step (``OrderedDict mutated during iteration``).
These tests run scripts and trainers that register their own global optimizer step pre- and
post-hooks (a gradient-norm logger) or run under torch's ``MemTracker`` (which registers the same
kind), under ``leafwatch run``, ``Monitor.attach()``, the Lightning callback and the Hugging Face
callback: each run ends as it does without leafwatch, the user's hooks see every step, and the
planted bug (a head never called) is still named.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import _warm
import pytest
import torch
from _requirements import require_module
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

import leafwatch
from leafwatch.observe import hooks

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "user_global_hooks.py"
KINDS = ("hooks", "memtracker")


def _global_optimizer_hooks() -> tuple[int, int]:
    import torch.optim.optimizer as optimizer

    return len(optimizer._global_optimizer_pre_hooks), len(optimizer._global_optimizer_post_hooks)


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return _warm.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=240)


@pytest.mark.parametrize("kind", KINDS)
def test_leafwatch_run_leaves_a_script_with_its_own_global_optimizer_hooks_running(kind: str) -> None:
    flags = ["--memtracker"] if kind == "memtracker" else []
    plain = _run(str(SCRIPT), *flags)
    assert plain.returncode == 0, plain.stderr
    watched = _run("-m", "leafwatch", "run", str(SCRIPT), *flags)
    assert "mutated during iteration" not in watched.stderr, watched.stderr
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout == plain.stdout  # the user's hooks saw every step: "logged 5 grad norms, 5 steps"
    assert "ERROR missing_grad `aux_head`" in watched.stderr
    assert "module `aux_head` never ran" in watched.stderr
    assert "LeafwatchInternalWarning" not in watched.stderr


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head, self.aux_head = nn.Linear(4, 8), nn.Linear(8, 1), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).relu())


class UsersHooks:
    """The user's own global optimizer hooks (``hooks``: a pre- and a post-hook that note each
    call) or a ``MemTracker`` (``memtracker``), entered around a training loop."""

    def __init__(self, kind: str, *track: object) -> None:
        self.kind, self.seen, self._track = kind, [], track
        self._exit = contextlib.ExitStack()
        self.tracker: object | None = None

    def __enter__(self) -> UsersHooks:
        if self.kind == "hooks":
            for handle in (register_optimizer_step_pre_hook(lambda o, a, k: self.seen.append("pre")),
                           register_optimizer_step_post_hook(lambda o, a, k: self.seen.append("post"))):
                self._exit.callback(handle.remove)
        else:
            from torch.distributed._tools.mem_tracker import MemTracker

            self.tracker = MemTracker()
            self.tracker.track_external(*self._track)
            self._exit.enter_context(self.tracker)
        return self

    def step_begins(self) -> None:
        """MemTracker tracks one iteration at a time: the loop resets it at each step."""
        if self.tracker is not None:
            self.tracker.reset_mod_stats()

    def __exit__(self, *exc: object) -> None:
        self._exit.close()


def _train(model: nn.Module, opt: torch.optim.Optimizer, users: UsersHooks, steps: int = 4) -> None:
    for _ in range(steps):
        users.step_begins()
        loss = model(torch.randn(16, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("kind", KINDS)
def test_monitor_attach_leaves_the_users_global_optimizer_hooks_running(kind: str) -> None:
    before = _global_optimizer_hooks()
    model = _Head()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with UsersHooks(kind, model, opt) as users:
        monitor = leafwatch.Monitor(model, opt, verbose=False).attach()
        _train(model, opt, users)
        report = monitor.close()
    (finding,) = report.findings
    assert (finding.kind, finding.name, finding.names) == ("missing_grad", "aux_head",
                                                           ("aux_head.bias", "aux_head.weight"))
    assert "never ran" in finding.cause
    if kind == "hooks":
        assert users.seen == ["pre", "post"] * 4
    assert _global_optimizer_hooks() == before


def test_a_monitor_closed_by_its_own_check_leaves_torchs_hook_dicts_after_the_step() -> None:
    """A sink that closes the Monitor at the check that finds an error (the check runs inside
    torch's loop over the step pre-hooks, before the user's hook on that optimizer): the step runs
    through, the user's hooks see it, and leafwatch's dispatchers leave torch's dicts at the next
    safe moment (a forward)."""
    before = _global_optimizer_hooks()
    model = _Head()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with UsersHooks("hooks") as users:
        monitor = leafwatch.Monitor(model, opt, verbose=False, sinks=[lambda event: event.report and monitor.close()])
        monitor.attach()
        later = opt.register_step_pre_hook(lambda o, a, k: users.seen.append("later"))  # iterated after ours
        try:
            _train(model, opt, users, steps=2)
        finally:
            later.remove()
        assert users.seen == ["pre", "later", "post"] * 2
        assert monitor.report.names("missing_grad") == {"aux_head.weight", "aux_head.bias"}
        model(torch.randn(1, 4))  # the next safe moment: no optimizer hook dict is iterated in a forward
    assert _global_optimizer_hooks() == before


def test_a_dispatcher_whose_last_subscriber_leaves_during_its_dispatch_stays_until_the_dispatch_ends() -> None:
    seen: list[bool] = []
    dispatcher = hooks.OPTIMIZER_STEP_POST
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def leave(o: object, a: object, k: object) -> None:
        subscription.remove()
        seen.append(dispatcher.registered)  # still in torch's dict: torch is iterating it

    subscription = dispatcher.subscribe(leave)
    users = register_optimizer_step_post_hook(lambda o, a, k: seen.append(True))  # after ours: iterated next
    try:
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    finally:
        users.remove()
    assert seen == [True, True]
    model(torch.ones(1, 2))
    assert dispatcher.registered == bool(len(dispatcher))


@pytest.mark.parametrize("kind", KINDS)
def test_the_lightning_callback_leaves_the_users_global_optimizer_hooks_running(kind: str, tmp_path: Path) -> None:
    pl = require_module("pytorch_lightning")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _Head()

        def training_step(self, batch, batch_idx):
            users.step_begins()
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Module()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
    callback = leafwatch.LeafWatch(verbose=False)
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, callbacks=[callback],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    with UsersHooks(kind, module) as users:
        trainer.fit(module, data)
    assert trainer.global_step == 3
    assert callback.report.names("missing_grad") == {"net.aux_head.weight", "net.aux_head.bias"}
    if kind == "hooks":
        assert users.seen == ["pre", "post"] * 3


def test_the_hugging_face_callback_leaves_the_users_global_optimizer_hooks_running(tmp_path: Path) -> None:
    require_module("transformers")
    require_module("accelerate")
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from leafwatch.transformers import LeafWatchCallback

    class WithUnusedHead(BertForSequenceClassification):
        def __init__(self, config: BertConfig) -> None:
            super().__init__(config)
            self.unused_head = nn.Linear(config.hidden_size, config.num_labels)

    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37)
    rows = [{"input_ids": torch.randint(0, 99, (8,)), "attention_mask": torch.ones(8, dtype=torch.long),
             "labels": torch.tensor(i % 2)} for i in range(8)]
    callback = LeafWatchCallback(verbose=False)
    arguments = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no",
                                  max_steps=3, per_device_train_batch_size=4, logging_strategy="no")
    with UsersHooks("hooks") as users:
        Trainer(model=WithUnusedHead(config), args=arguments, train_dataset=rows, callbacks=[callback]).train()
    assert users.seen == ["pre", "post"] * 3
    assert callback.report.names("missing_grad") == {"unused_head.weight", "unused_head.bias"}

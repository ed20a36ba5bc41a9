"""Tensor swaps, pickling and copies work while leafwatch watches, at every door.

torch swaps a parameter in place of itself (``torch.utils.swap_tensors``: the same Python object, new
contents) on ``module.to()``/``.half()``/``.float()`` with ``torch.__future__.set_swap_module_params_on_conversion(True)``,
on ``load_state_dict(..., assign=True)`` with it, and where a library calls it (torchtune's ``FrozenNF4Linear``
while it is built); it refuses a tensor that has a weak reference. Ultralytics saves checkpoints by
pickling whole modules, and EMA models are deep copies. Each door (``leafwatch run``, ``Monitor.attach()``,
the Lightning callback, the Hugging Face callback) runs the same training plainly and under leafwatch:
the losses are bitwise the same, every swap works before the first step and between steps, leafwatch
names the same findings by the same names afterwards, and while a miss is diagnosed (the diagnostic
hooks armed) no parameter or buffer has a weak reference, ``torch.save``, ``pickle`` and ``copy.deepcopy``
of the model work, and the copy carries no hook. The model code is ``tests/_swaps.py``.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import _swaps
import _warm
import pytest
import torch
from _requirements import require_module
from torch import nn

import leafwatch
from leafwatch.observe.structure import REQUIRES_GRAD_EVERY

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
SCRIPT = TESTS / "scripts" / "swaps.py"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONHASHSEED"] = "0"
    return env


def _run(*command: str) -> subprocess.CompletedProcess:
    result = _warm.run([sys.executable, *command], capture_output=True, text=True, env=_env(), cwd=REPO,
                       timeout=240)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _open(report: leafwatch.Report) -> set[tuple[str, str]]:
    return {(f.kind, f.name) for f in report.open}


def _no_weak_references(model: nn.Module) -> int:
    return sum(len(weakref.getweakrefs(t)) for t in [*model.parameters(), *model.buffers()])


# -- leafwatch run ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def script_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``tests/scripts/swaps.py`` plainly and under ``leafwatch run``, buggy and clean."""
    folder = tmp_path_factory.mktemp("swaps")
    saved = folder / "model.pt"
    return {"saved": saved,
            "plain buggy": _run(str(SCRIPT), "--buggy"),
            "run buggy": _run("-m", "leafwatch", "run", str(SCRIPT), "--buggy", "--save", str(saved)),
            "plain clean": _run(str(SCRIPT)),
            "run clean": _run("-m", "leafwatch", "run", str(SCRIPT))}


@pytest.mark.xdist_group("swap_script_runs")
@pytest.mark.parametrize("variant", ["buggy", "clean"])
def test_every_swap_works_under_leafwatch_run_with_the_same_losses(script_runs: dict[str, Any], variant: str) -> None:
    plain, watched = script_runs[f"plain {variant}"], script_runs[f"run {variant}"]
    losses = [line for line in plain.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 6
    assert watched.stdout == plain.stdout  # every loss bitwise, and what the probes found on the model


@pytest.mark.xdist_group("swap_script_runs")
def test_leafwatch_run_names_the_same_findings_after_the_swaps(script_runs: dict[str, Any]) -> None:
    buggy, clean = script_runs["run buggy"].stderr, script_runs["run clean"].stderr
    for kind, name in _swaps.BUGGY_FINDINGS:
        assert f"{kind:19} {name} (since step 1" in buggy, buggy
    assert "leafwatch: 2 open of 2 finding(s) at step 6" in buggy
    assert "module `aux` never ran" in buggy
    assert "leafwatch: no findings at step 6" in clean, clean


@pytest.mark.xdist_group("swap_script_runs")
def test_leafwatch_run_leaves_no_weak_reference_and_the_model_pickles_while_a_miss_is_diagnosed(
        script_runs: dict[str, Any]) -> None:
    buggy = script_runs["run buggy"]
    probes = [json.loads(line.split(" ", 1)[1]) for line in buggy.stdout.splitlines() if line.startswith(("probe", "end"))]
    assert probes == [_swaps.UNTOUCHED, _swaps.UNTOUCHED]
    # The first probe ran while the miss of `aux` was diagnosed: the tracer's global forward hook was
    # registered then (on the healthy clean run, none), and nothing of it was on the model.
    armed = re.search(r"global forward hooks: (\d+)", buggy.stderr)
    assert armed is not None and int(armed[1]) > 0, buggy.stderr
    assert "global forward hooks: 0" in script_runs["run clean"].stderr
    assert "global forward hooks: 0" in script_runs["plain buggy"].stderr


@pytest.mark.xdist_group("swap_script_runs")
def test_a_model_saved_under_leafwatch_run_loads_where_leafwatch_is_never_imported(script_runs: dict[str, Any]) -> None:
    load = ("import sys, torch; sys.path.insert(0, sys.argv[2]); model = torch.load(sys.argv[1], weights_only=False); "
            "assert 'leafwatch' not in sys.modules, 'leafwatch imported'; "
            "assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()); "
            "print(type(model).__name__, tuple(model(torch.ones(2, 4)).shape))")
    result = _warm.run([sys.executable, "-c", load, str(script_runs["saved"]), str(TESTS)], capture_output=True,
                       text=True, cwd=REPO, timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Net (2, 1)\n"


# -- Monitor(...).attach() -----------------------------------------------------------------------------
def _train_attached(kind: str, buggy: bool, watched: bool) -> dict[str, Any]:
    """Five steps of :class:`_swaps.Net`, swapped with ``kind`` before the first step and after the first
    and third; with ``watched``, under an attached Monitor (probed after the first step, once the Monitor
    found the miss of a buggy model: its hooks follow it until its finding is settled)."""
    out: dict[str, Any] = {"losses": [], "probes": []}
    with _swaps.swapping_on_conversion():
        torch.manual_seed(0)
        model = _swaps.Net(buggy)
        optimizer = _swaps.optimizer_for(model, buggy)
        monitor = leafwatch.Monitor(model, optimizer, verbose=False).attach() if watched else None
        _swaps.swap(model, kind)
        for step, (x, y) in enumerate(_swaps.batches(5)):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            out["losses"].append(loss.item())
            if step in (0, 2):
                _swaps.swap(model, kind)
            if step == 0 and monitor is not None:
                out["armed"] = monitor.stats()["diagnostic_hooks"]
                out["probes"].append(_swaps.probe(model))
        if monitor is not None:
            out["probes"].append(_swaps.probe(model))
            monitor.close()
            out["found"] = _open(monitor.report)
            out["after close"] = _no_weak_references(model)
    return out


@pytest.mark.parametrize("kind", _swaps.SWAPS)
@pytest.mark.parametrize("buggy", [True, False])
def test_every_swap_works_under_an_attached_monitor(kind: str, buggy: bool) -> None:
    plain, watched = _train_attached(kind, buggy, watched=False), _train_attached(kind, buggy, watched=True)
    assert watched["losses"] == plain["losses"]
    assert watched["found"] == (_swaps.BUGGY_FINDINGS if buggy else set())
    assert watched["probes"] == [_swaps.UNTOUCHED, _swaps.UNTOUCHED]
    # Probed while the miss was diagnosed (hooks armed on `aux` and the root), or on a healthy step (none).
    assert (watched["armed"] > 0) is buggy
    assert watched["after close"] == 0


def test_a_swap_between_monitor_and_first_step_leaves_the_first_step_explained() -> None:
    """The arrival hooks armed at the Monitor's creation sit on what a swap before the first forward took
    out: they are put on the swapped parameters again, and the gradients the loop clears before the step
    are named as cleared (not as missing), at the first check and after a swap between steps."""
    with _swaps.swapping_on_conversion():
        model = _swaps.Net()
        optimizer = _swaps.optimizer_for(model)
        monitor = leafwatch.Monitor(model, optimizer, verbose=False).attach()
        model.to(torch.float64)
        for step, (x, y) in enumerate(_swaps.batches(3)):
            nn.functional.mse_loss(model(x.double()), y.double()).backward()
            optimizer.zero_grad(set_to_none=True)  # cleared before the step: nothing trains
            optimizer.step()
            if step == 0:
                _swaps.swap(model, "swap_tensors")
                first = _open(monitor.report)
        monitor.close()
    assert first == {("grad_cleared", "optimizers[0]")}
    assert _open(monitor.report) == {("grad_cleared", "optimizers[0]")}
    assert monitor.report.names("missing_grad", status=None) == set()


def test_what_a_swap_takes_out_of_a_diagnosed_parameter_is_freed() -> None:
    """The contents a swap takes out of a parameter (into the tensor it was swapped with) are not kept
    alive by leafwatch, even while its arrival and forward hooks are armed (a miss diagnosed)."""
    with _swaps.swapping_on_conversion():
        model = _swaps.Net(buggy=True)
        optimizer = _swaps.optimizer_for(model, buggy=True)
        monitor = leafwatch.Monitor(model, optimizer, verbose=False).attach()
        for x, y in _swaps.batches(1):
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        assert monitor.stats()["diagnostic_hooks"] > 0 and monitor.stats()["arrival_hooks"] > 0
        taken_out = []
        for p in (model.aux.weight, model.fc.weight):
            other = nn.Parameter(p.detach().clone())
            torch.utils.swap_tensors(p, other)
            taken_out.append(weakref.ref(other))
            del other
        gc.collect()
        assert [ref() for ref in taken_out] == [None, None]
        monitor.close()


# -- the Lightning callback ---------------------------------------------------------------------------
try:  # (at module level, so that `torch.save` and `pickle` find the class; without Lightning its tests skip)
    import pytorch_lightning as pl
except ImportError:  # pragma: no cover
    pl = None

if pl is not None:
    class Swapping(pl.LightningModule):
        """`_swaps.Net`, swapped every way before the first step and one way after each of the first steps."""

        def __init__(self, buggy: bool) -> None:
            super().__init__()
            self.buggy = buggy
            self.net = _swaps.Net(buggy)
            self.losses: list[float] = []
            self.probes: list[dict[str, Any]] = []
            self.armed: list[bool] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return _swaps.optimizer_for(self, self.buggy, prefix="net.")

        def on_train_start(self) -> None:
            for kind in _swaps.SWAPS:
                _swaps.swap(self.net, kind)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx < len(_swaps.SWAPS):
                _swaps.swap(self.net, _swaps.SWAPS[batch_idx])
            if batch_idx == 0:
                self.armed.append(bool(torch.nn.modules.module._global_forward_hooks))
                self.probes.append(_swaps.probe(self))


def _fit(tmp_path: Path, buggy: bool, watched: bool) -> tuple[Any, Any]:
    require_module("pytorch_lightning")
    from leafwatch import LeafWatch

    callback = LeafWatch(verbose=False) if watched else None
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*map(torch.cat, zip(*_swaps.batches(6)))),
                                       batch_size=8)
    with _swaps.swapping_on_conversion():
        torch.manual_seed(0)
        module = Swapping(buggy)
        trainer = pl.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, callbacks=[callback] if callback else [],
                             enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                             limit_val_batches=0)
        trainer.fit(module, data)
        module.probes.append(_swaps.probe(module))
    return module, callback


@pytest.mark.parametrize("buggy", [True, False])
def test_every_swap_works_under_the_lightning_callback(tmp_path: Path, buggy: bool) -> None:
    plain, _ = _fit(tmp_path / "plain", buggy, watched=False)
    watched, callback = _fit(tmp_path / "watched", buggy, watched=True)
    assert len(plain.losses) == 6 and watched.losses == plain.losses
    expected = {(kind, f"net.{name}") for kind, name in _swaps.BUGGY_FINDINGS} if buggy else set()
    assert _open(callback.report) == expected
    assert watched.probes == [_swaps.UNTOUCHED, _swaps.UNTOUCHED]
    assert watched.armed == [buggy]  # probed while the miss was diagnosed (the healthy run: nothing armed)


# -- the Hugging Face callback --------------------------------------------------------------------------
def _hf_train(tmp_path: Path, watched: bool) -> tuple[Any, Any, Any]:
    require_module("transformers")
    require_module("accelerate")
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

    from leafwatch.transformers import LeafWatchCallback

    class Recording(Trainer):
        losses: list[float] = []

        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            loss = super().training_step(*args, **kwargs)
            self.losses.append(loss.item())
            return loss

    class Swaps(TrainerCallback):
        """Every swap before the first step (the Monitor is built by then), one after each of the first steps."""

        def __init__(self, model: nn.Module) -> None:
            self.model, self.probes, self.armed = model, [], []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 0:
                for kind in _swaps.SWAPS:
                    _swaps.swap(self.model, kind)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step <= len(_swaps.SWAPS):
                _swaps.swap(self.model, _swaps.SWAPS[state.global_step - 1])
            if state.global_step == 1:
                self.armed.append(bool(torch.nn.modules.module._global_forward_hooks))
                self.probes.append(_swaps.probe(self.model))

    with _swaps.swapping_on_conversion():
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                                         num_attention_heads=2, intermediate_size=37))
        model.unused_head = nn.Linear(32, 2)  # a head forward() never calls: it will not train
        optimizer = torch.optim.AdamW([p for n, p in model.named_parameters() if n != "classifier.bias"], lr=1e-3)
        swaps = Swaps(model)
        callback = LeafWatchCallback(verbose=False) if watched else None
        trainer = Recording(model=model, args=TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", max_steps=6,
            per_device_train_batch_size=4, logging_strategy="no", disable_tqdm=True, seed=0),
            train_dataset=_sentences(), callbacks=[c for c in (callback, swaps) if c is not None],
            optimizers=(optimizer, None))
        trainer.losses = []
        trainer.train()
        swaps.probes.append(_swaps.probe(model))
    return trainer, swaps, callback


def _sentences() -> torch.utils.data.Dataset:
    class Sentences(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 24

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 99, (8,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "attention_mask": torch.ones(8, dtype=torch.long), "labels": torch.tensor(i % 2)}

    return Sentences()


def test_every_swap_works_under_the_hugging_face_callback(tmp_path: Path) -> None:
    plain, _, _ = _hf_train(tmp_path / "plain", watched=False)
    watched, swaps, callback = _hf_train(tmp_path / "watched", watched=True)
    assert len(plain.losses) == 6 and watched.losses == plain.losses
    assert _open(callback.report) == {("missing_grad", "unused_head"), ("not_in_optimizer", "classifier.bias")}
    assert swaps.probes == [_swaps.UNTOUCHED, _swaps.UNTOUCHED]
    assert swaps.armed == [True]  # probed while the miss of `unused_head` was diagnosed


def _hooks_fired(watched: bool, before_swap: bool = False, steps: int = 14) -> dict[str, int]:
    """How often the hooks the user registers on `scale` and `fc.bias` right after a swap (after the first
    step) fire in the steps that follow; with ``before_swap``, the user hooked every parameter before the
    swap too (torch then keeps the hooks of both times with the swapped-out contents: none fires)."""
    with _swaps.swapping_on_conversion():
        torch.manual_seed(0)
        model = _swaps.Net()
        optimizer = _swaps.optimizer_for(model)
        early = dict.fromkeys([f"{name} before" for name, p in model.named_parameters() if p.requires_grad], 0)
        counts = {**dict.fromkeys(["scale hook", "scale post-accumulate", "fc.bias hook", "fc.bias post-accumulate"], 0),
                  **(early if before_swap else {})}

        def count(key: str) -> Any:
            return lambda *args: counts.__setitem__(key, counts[key] + 1)

        if before_swap:
            for name, p in model.named_parameters():
                if p.requires_grad:
                    p.register_hook(count(f"{name} before"))
        monitor = leafwatch.Monitor(model, optimizer, verbose=False).attach() if watched else None
        for step, (x, y) in enumerate(_swaps.batches(steps)):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            if step == 0:
                model.to(torch.float64)
                model.to(torch.float32)
                for name in ("scale", "fc.bias"):
                    model.get_parameter(name).register_hook(count(f"{name} hook"))
                    model.get_parameter(name).register_post_accumulate_grad_hook(count(f"{name} post-accumulate"))
        if monitor is not None:
            monitor.close()
    return counts


def test_a_hook_the_user_puts_on_a_parameter_after_a_swap_fires_as_without_leafwatch() -> None:
    """leafwatch's arrival hooks leave every parameter after the first check, and the hook dicts they
    emptied go with them: a dict torch leaves with a swapped tensor's old contents is never one leafwatch
    made, so a hook the user registers after the swap fires, as it does without leafwatch. The one hook
    leafwatch keeps for the whole run, the skipped-step sentinel on the first tensor of each optimizer
    (`scale` here), is found on swapped contents at the next periodic look (every `REQUIRES_GRAD_EVERY`
    checks: a healthy check reads nothing of a tensor but its `.grad`): put on the new contents again, and
    the dict leafwatch made for it, which now holds the user's hook, wired to them, so that hook fires from
    then on."""
    plain, watched = _hooks_fired(watched=False), _hooks_fired(watched=True)
    assert plain == dict.fromkeys(plain, 13)
    assert {k: v for k, v in watched.items() if k != "scale hook"} == {k: v for k, v in plain.items() if k != "scale hook"}
    assert plain["scale hook"] - REQUIRES_GRAD_EVERY <= watched["scale hook"] < plain["scale hook"]


def test_hooks_the_user_put_on_parameters_before_a_swap_stay_as_torch_leaves_them() -> None:
    """torch keeps a tensor's hook dict with the contents a swap takes out: hooks registered before the swap,
    and hooks added to that dict after it, never fire again. A hook dict the user made is never leafwatch's
    to wire again, so the run is the same hook for hook as without leafwatch (the sentinel goes on a tensor
    whose dict leafwatch makes, where there is one, and sits in the user's dict only where there is none)."""
    plain, watched = _hooks_fired(watched=False, before_swap=True), _hooks_fired(watched=True, before_swap=True)
    assert plain["scale hook"] == plain["fc.bias hook"] == 0 and plain["scale before"] == 1  # torch's own behaviour
    assert watched == plain


def test_a_watched_tensor_is_held_weakly_and_cannot_be_swapped_until_it_is_unwatched() -> None:
    """The one tensor leafwatch holds by a weak reference is one no module or optimizer it reads holds:
    `watch()` is told the tensor alone. torch refuses to swap it while it is watched (loudly: never a
    hook silently left behind), and swaps it once it is unwatched."""
    temperature = torch.ones(1, requires_grad=True)
    leafwatch.watch(temperature, "temperature")
    with pytest.raises(RuntimeError, match="weakref"):
        torch.utils.swap_tensors(temperature, torch.full((1,), 2.0, requires_grad=True))
    assert leafwatch.unwatch(temperature)
    torch.utils.swap_tensors(temperature, torch.full((1,), 2.0, requires_grad=True))
    assert temperature.item() == 2.0

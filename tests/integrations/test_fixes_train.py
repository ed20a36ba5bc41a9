"""Each code fix of #54 leaves as a patch that trains the tensor: a script re-created from a public report is
run under ``leafwatch run --diff``, the patch is applied with ``git apply`` in a copy of its folder, the
patched script runs again under ``leafwatch run``, and the tensor the finding named trains there: an optimizer
that stepped holds it, it gets a gradient, and its value changes (torch's global optimizer step hooks, as a
user's would be: ``_fix_runs``). The patched runs share one process (``_fix_runs.runs_of``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import _warm
import pytest
from _fix_runs import SCRIPTS, runs_of

from leafwatch.report.reader import read_reports

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.xdist_group("fixes_train")  # the patched runs are shared by the tests of this module


class Case:
    """A script (``folder``/``script``, a folder of ``tests/scripts/`` or the script alone), the findings its
    patch fixes (``(kind, name)``), the expressions whose tensors must train once it is applied, what stays
    open after it (findings no code fix mends), the lines the patch must hold, and the statements the patched
    script holds once each, in this order (``order``)."""

    def __init__(self, script: str, fixed: set[tuple[str, str]], trains: list[str], *, folder: str | None = None,
                 known: set[tuple[str, str]] | None = None, lines: tuple[str, ...] = (),
                 order: tuple[str, ...] = ()) -> None:
        self.script, self.fixed, self.trains, self.folder = script, fixed, trains, folder
        self.known, self.lines, self.order = known or set(), lines, order


CASES = {
    # item 5: a plain tensor given to the optimizer (Kendall's learned loss weights written as `torch.zeros(1)`)
    "plain_log_vars": Case("plain_log_vars.py", {("frozen_in_optimizer", "the tensor of shape (1,) at index 4")},
                           ["log_var_seg"], lines=("+log_var_seg = torch.zeros(1).requires_grad_()",),
                           known={("frozen_in_optimizer", "optimizer")}),  # the stem frozen on purpose: an info
    # item 2: a buffer registered with requires_grad=True
    "vq_scale_buffer": Case("vq_scale_buffer.py", {("not_in_optimizer", "codebook.scale")}, ["codebook.scale"],
                            lines=('+        self.register_parameter("scale", nn.Parameter(torch.ones(1)))',)),
    # item 2: a buffer the user's forward switches on, in a module of a subfolder
    "calibrated": Case("train.py", {("not_in_optimizer", "2.temperature")}, ["model[2].temperature"],
                       folder="calibrated",
                       lines=("--- a/nets/heads.py",
                              '+        self.register_parameter("temperature", nn.Parameter(torch.ones(1) * 1.5))')),
    # item 4: one module listed twice, a sibling of its type left out (line/open-universe#5's typo, in a GAN)
    "gan_two_discriminators": Case("gan_two_discriminators.py", {("not_in_optimizer", "d2")}, ["d2"], lines=(
        "-opt_d = torch.optim.Adam(list(d1.parameters()) + list(d1.parameters()), lr=2e-4, betas=(0.5, 0.999))",
        "+opt_d = torch.optim.Adam(list(d1.parameters()) + list(d2.parameters()), lr=2e-4, betas=(0.5, 0.999))")),
    # item 4, in a LightningModule's configure_optimizers (the statement that builds the list, over three lines)
    "universe_gan_lightning": Case("universe_gan_lightning.py", {("not_in_optimizer", "loss_mpd")}, ["model.loss_mpd"],
                                   lines=("-            self.loss_mrd.parameters()",
                                          "+            self.loss_mpd.parameters()")),
    # item 1: a `with torch.no_grad():` block in a forward (pranoyr/cnn-lstm#6's CNN-LSTM)
    "cnn_lstm_no_grad": Case("cnn_lstm_no_grad.py", {("missing_grad", "cnn")}, ["model.cnn"],
                             lines=("-            with torch.no_grad():", "-                x = self.cnn(x_3d[:, t, :, :, :])",
                                    "+            x = self.cnn(x_3d[:, t, :, :, :])")),
    # item 1: a `@torch.no_grad()` method the forward calls
    "encode_no_grad_method": Case("encode_no_grad_method.py", {("missing_grad", "proj")}, ["model.proj"],
                                  lines=("-    @torch.no_grad()",)),
    # item 1: a `.detach()` in a forward, and a `.data` in a custom layer's forward
    "detach_in_forward": Case("detach_in_forward.py", {("missing_grad", "encoder"), ("missing_grad", "head.weight")},
                              ["model.encoder", "model.head.weight"],
                              lines=("+        features = torch.tanh(self.encoder(x))",
                                     "+        return x @ self.weight + self.bias")),
    # item 1: a NumPy round trip with a torch twin (kevinzakka/recurrent-visual-attention#4's glimpse location)
    "numpy_clip_forward": Case("numpy_clip_forward.py", {("missing_grad", "loc")}, ["model.loc"],
                               lines=("+        l_t = torch.clamp(l_t, -1.0, 1.0)",)),
    # item 3: the head replaced after the optimizer and its scheduler (the transfer-learning tutorial's lines, reordered
    # as reports show them): both statements move below the change, once each; no old tensor stays in the optimizer
    "head_replaced": Case("head_replaced_after_optimizer.py", {("stale_param", "optimizers[0]")},
                          ["model.fc", "model.features"], order=(
                              "model.fc = nn.Linear(num_ftrs, 2)\n",
                              "optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)\n",
                              "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.1)\n")),
    # item 3: the head replaced inside the stage loop: the optimizer and its scheduler built again right after it, in
    # its block (as often as the change runs)
    "head_grown_per_stage": Case("head_grown_per_stage.py", {("stale_param", "optimizers[0]")}, ["model[2]", "model[0]"],
                                 lines=("+        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)",
                                        "+        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, "
                                        "T_max=10)")),
    # item 3: LoRA adapters wrapped around layers the optimizer holds, in a loop: the optimizer's statement moves below
    # the loop (never into the adapter's __init__, nor into the loop), so it holds each base layer once and the adapters
    "lora_after_optimizer": Case("lora_after_optimizer.py", {("not_in_optimizer", "0"), ("not_in_optimizer", "2")},
                                 ["model[0].lora_A", "model[0].lora_B", "model[0].base", "model[2]"],
                                 order=("    model[i] = LoRALinear(model[i])\n",
                                        "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)\n")),
    # item 3: the head replaced by a helper function called after the optimizer: the optimizer moves below the call,
    # never into the helper
    "head_replaced_by_a_helper": Case("head_replaced_by_a_helper.py", {("stale_param", "optimizers[0]")},
                                      ["model.fc", "model.body"],
                                      order=("    net.fc = nn.Linear(net.fc.in_features, classes)\n", "reshape_head(model, 3)\n",
                                             "optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n")),
    # item 3: load_state_dict(assign=True) after the optimizer
    "assign_after_optimizer": Case("assign_after_optimizer.py", {("stale_param", "optimizers[0]")}, ["model"],
                                   order=("model.load_state_dict(torch.load(pretrained), assign=True)\n",
                                          "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)\n")),
    # item 3: a deep copy per fold (no registration seen: the model's variable assigned again), one optimizer before
    "fold_copies": Case("fold_copies.py", {("stale_param", "optimizers[0]")}, ["model"],
                        lines=("+    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",)),
    # item 3: a resumed run (the optimizer's state loaded before the change): the state is kept, the new head only is
    # added; the old head stays in it as an info, never open
    "resumed_head_replaced": Case("resumed_head_replaced.py", {("stale_param", "optimizers[1]")}, ["model[2]", "model[0]"],
                                  lines=('+optimizer.add_param_group({"params": [model[2].bias, model[2].weight]})',),
                                  known={("stale_param", "optimizers[1]")}),  # the old head left in it: an info
}
#: Item 6: the crashes of tests/scripts/ (#53's, each re-created from a public report its docstring names) whose
#: finding has a placed code fix. Each crashes under ``leafwatch run --logdir logs``, ``leafwatch report logs --diff``
#: patches the crash finding its record holds (the one flow), and the patched script runs past the crash.
CRASHES = {
    "hidden_state": Case("crash_hidden_state.py", {("non_leaf", "h_state")}, ["rnn"],
                         lines=("+    h_state = None if h_state is None else h_state.detach()",)),
    "lstm_hidden_tuple": Case("crash_lstm_hidden_tuple.py", {("non_leaf", "hidden")}, ["model"],
                              lines=("+    hidden = repackage_hidden(hidden)",)),
    "rnn_hidden_state": Case("crash_rnn_hidden_state.py", {("non_leaf", "hidden")}, ["rnn", "head"],
                             lines=("+    hidden = hidden.detach()",)),
    "lstm_hidden_attribute": Case("crash_lstm_hidden_attribute.py", {("non_leaf", "model.hidden")}, ["model"],
                                  lines=("+    model.hidden = tuple(t.detach() for t in model.hidden)",)),
    "std_before_loop": Case("crash_std_before_loop.py", {("non_leaf", "std")}, ["log_std", "policy"],
                            lines=("+    std = log_std.exp()",)),
    "scale_beside_a_detached_state": Case("crash_scale_beside_a_detached_state.py", {("non_leaf", "scale")},
                                          ["log_scale", "rnn", "head"], lines=("+    scale = log_scale.exp()",)),
    # the cached prototypes of a cosine classifier, in a module of a subfolder
    "prototypes": Case("train.py", {("non_leaf", "model.prototypes")}, ["model.emb.weight", "model.encoder"],
                       folder="prototypes", lines=("--- a/models/classifier.py", "+    @property",
                                                   "+        return F.normalize(self.emb.weight, dim=1)")),
    "fake_in_two_losses": Case("crash_gan_fake_reused.py", {("non_leaf", "fake")}, ["netG", "netD"],
                               lines=("+    output = netD(fake.detach()).view(-1)",)),
    "step_before_backward": Case("gan_crash.py", {("missing_grad", "G_loss")}, ["G", "D"],
                                 lines=("+    G_loss = bce(D_fake, torch.ones_like(D_fake))",)),
    "used_up_iterator": Case("crash_empty_parameter_list.py", {("not_in_optimizer", "params")}, ["model[2]"],
                             lines=("+params = list(filter(lambda p: p.requires_grad, model.parameters()))",)),
    "frozen_head": Case("crash_frozen_head.py", {("missing_grad", "model")}, ["model.fc"],
                        lines=("+model.fc.requires_grad_(True)",)),
    "all_frozen": Case("crash_all_frozen.py", {("missing_grad", "model")}, ["model"],
                       lines=("+model.requires_grad_(True)",)),
    "no_grad_helper": Case("crash_no_grad_helper.py", {("missing_grad", "loss")}, ["model"], lines=("-@torch.no_grad()",)),
    "init_routine": Case("crash_init_routine.py", {("non_leaf", "m.weight")}, ["model"], lines=("+@torch.no_grad()",)),
    "two_non_leaves": Case("crash_two_non_leaves.py", {("non_leaf", "{W1,W2}")}, ["W1", "W2", "b1", "b2"],
                           lines=("+W1 = (torch.randn(784, 128) * 0.01).requires_grad_()",
                                  "+W2 = (torch.randn(128, 10) * 0.01).requires_grad_()")),
    "scale_in_init": Case("crash_second_backward.py", {("non_leaf", "model.scale")}, ["model.scale", "model.body"],
                          lines=("+        self.scale = nn.Parameter(torch.randn(4) * 0.02)",)),
    # a LightningModule whose training_step returns its loss detached
    "lightning_detach": Case("crash_lightning_detach.py", {("missing_grad", "the loss `Regressor.training_step` returns")},
                             ["model.layer"], lines=('+        return {"loss": loss, "log": {"train_loss": loss.detach()}}',)),
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONHASHSEED"] = "0"
    return env


def _leafwatch(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return _warm.run([sys.executable, "-m", "leafwatch", *args], capture_output=True, text=True, env=_env(), cwd=cwd,
                     timeout=300)


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


def _project(case: Case, into: Path) -> Path:
    """The case's folder (or its script alone) copied into ``into`` as a committed git work tree."""
    if case.folder is not None:
        shutil.copytree(SCRIPTS / case.folder, into, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        into.mkdir(parents=True)
        shutil.copy(SCRIPTS / case.script, into / case.script)
    assert _git(into, "init", "-q", ".").returncode == 0
    assert _git(into, "add", "-A").returncode == 0 and _git(into, "commit", "-qm", "start").returncode == 0
    return into


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """For each case: the run's stderr and exit code, the patch, ``git apply``'s exit code, and the patched
    script's run (``runs_of``: its open findings and whether each tensor trained)."""
    out: dict[str, dict[str, Any]] = {}
    spec = []
    for key, case in [*CASES.items(), *CRASHES.items()]:
        folder = _project(case, tmp_path_factory.mktemp(key) / "project")
        if key in CASES:
            out[key] = {"first": _leafwatch(folder, "run", "--logdir", "logs", "--diff", "fix.diff", case.script)}
        else:  # a crashed run, then the patch of its record
            out[key] = {"first": _leafwatch(folder, "run", "--logdir", "logs", case.script),
                        "report": _leafwatch(folder, "report", "logs", "--diff")}
            (folder / "fix.diff").write_text(out[key]["report"].stdout)
        diff = (folder / "fix.diff").read_text()
        applied = _git(folder, "apply", "fix.diff")
        (run,) = read_reports(str(folder / "logs"))
        coded = {(str(f.kind), f.name) for f in run.report.open if f.remedy.applicability == "code" and f.remedy.edit}
        out[key].update({"diff": diff, "applied": applied, "script": str(folder / case.script), "coded": coded})
        spec.append({"script": str(folder / case.script), "trains": case.trains})
    after = runs_of(spec, tmp_path_factory.mktemp("after") / "runs.json")
    for key in out:
        out[key]["after"] = after[out[key]["script"]]
    return out


@pytest.mark.parametrize("key", sorted(CASES))
def test_each_patch_applies_and_the_tensor_it_names_trains(patched: dict[str, dict[str, Any]], key: str) -> None:
    case, found = CASES[key], patched[key]
    first = found["first"]
    assert first.returncode == 0 and "LeafwatchInternalWarning" not in first.stderr, first.stderr
    assert "not in the patch" not in first.stderr, first.stderr  # each fixed finding's code is in it
    assert found["coded"] == case.fixed, found["coded"]  # the findings of the case, each with a placed code fix
    diff = found["diff"]
    assert all(line in diff.splitlines() for line in case.lines), diff
    assert found["applied"].returncode == 0, (diff, found["applied"].stderr)
    text = Path(found["script"]).read_text()
    assert [text.count(statement) for statement in case.order] == [1] * len(case.order), text
    assert [text.index(statement) for statement in case.order] == sorted(text.index(st) for st in case.order), text
    after = found["after"]
    assert after["code"] == 0 and "Traceback" not in after["stderr"], after["stderr"]
    assert {(f["kind"], f["name"]) for f in after["open"]} == case.known, after["open"]
    for expr in case.trains:
        assert after["trains"][expr] == {"stepped": True, "grad": True, "changed": True}, (expr, after["trains"])


@pytest.mark.parametrize("key", sorted(CRASHES))
def test_a_crash_findings_patch_from_the_record_runs_past_the_crash_and_trains_the_tensor(
        patched: dict[str, dict[str, Any]], key: str) -> None:
    """Item 6: ``leafwatch run --logdir logs`` crashes, ``leafwatch report logs --diff`` patches the crash finding its
    record holds, ``git apply`` applies it, and the patched script runs to its end with the tensor training."""
    case, found = CRASHES[key], patched[key]
    first, report = found["first"], found["report"]
    assert first.returncode == 1 and "Traceback (most recent call last):" in first.stderr, first.stderr
    assert "LeafwatchInternalWarning" not in first.stderr + report.stderr, first.stderr + report.stderr
    assert report.returncode == 0 and report.stderr == "", report.stderr  # every open finding's code is in the patch
    assert found["coded"] == case.fixed, found["coded"]  # the crash finding, in the record, with a placed code fix
    diff = found["diff"]
    assert diff.startswith("--- a/") and all(line in diff.splitlines() for line in case.lines), diff
    assert found["applied"].returncode == 0, (diff, found["applied"].stderr)
    after = found["after"]
    assert after["code"] == 0 and "Traceback" not in after["stderr"], after["stderr"]
    assert after["crash"] == [] and after["open"] == [], (after["crash"], after["open"])
    for expr in case.trains:
        assert after["trains"][expr] == {"stepped": True, "grad": True, "changed": True}, (expr, after["trains"])


def test_the_optimizer_built_after_the_change_is_said_in_words_with_its_scheduler(
        patched: dict[str, dict[str, Any]]) -> None:
    """Item 3's words: the statement moved (with the scheduler built on it) or built again in the change's block."""
    moved = patched["head_replaced"]["first"].stderr
    assert ("ERROR stale_param `optimizers[0]` (2 tensors: fc.{bias,weight}) at step 1. Fix (code): build `optimizer` "
            "after the last change to the model, so that it holds the new parameters and none of the old ones: move its "
            "statement and the statement of the LR scheduler built on it (`scheduler`) right below the change at "
            "head_replaced_after_optimizer.py:26: `optimizer = torch.optim.SGD(model.parameters(), lr=0.01, "
            "momentum=0.9); scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.1)` (the same "
            "class, groups and settings)") in moved, moved
    again = patched["head_grown_per_stage"]["first"].stderr
    assert ("build it and the LR scheduler built on it (`scheduler`) again right after the change at "
            "head_grown_per_stage.py:14, in that block: `optimizer = torch.optim.Adam(model.parameters(), lr=1e-3); "
            "scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)`") in again, again
    for key in ("head_replaced", "head_grown_per_stage", "lora_after_optimizer", "assign_after_optimizer", "fold_copies",
                "head_replaced_by_a_helper"):
        assert "add_param_group" not in patched[key]["diff"], patched[key]["diff"]  # a rebuild, no old tensor kept
    lora = patched["lora_after_optimizer"]["diff"]
    added = [line for line in lora.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added == ["+optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)"], lora  # not in __init__ nor the loop


def test_parameters_frozen_on_purpose_stay_an_info_with_advice_only(patched: dict[str, dict[str, Any]]) -> None:
    stderr = patched["plain_log_vars"]["first"].stderr
    assert ("leafwatch: INFO frozen_in_optimizer `optimizer` (2 tensors: 0.{bias,weight}) at step 1. Fix (advice): "
            "nothing, if freezing is intended") in stderr, stderr
    assert ("ERROR frozen_in_optimizer the tensor of shape (1,) at index 4 at step 1. Fix (code): create it with "
            "`requires_grad=True`: `log_var_seg = torch.zeros(1).requires_grad_()`") in stderr, stderr
    assert "requires_grad_(False)" in Path(patched["plain_log_vars"]["script"]).read_text()  # the patch leaves it


def test_a_detach_that_feeds_numpy_gets_advice_naming_the_numpy_op_and_no_patch(tmp_path: Path) -> None:
    """`np.interp` has no torch twin: the fix names it, never says to remove the `.detach()` (`.numpy()` would
    raise), and the patch is empty."""
    folder = _project(Case("numpy_interp_forward.py", set(), []), tmp_path / "project")
    result = _warm.run([sys.executable, "-m", "leafwatch", "run", "--diff", "fix.diff", "numpy_interp_forward.py"],
                       capture_output=True, text=True, env=_env(), cwd=folder, timeout=300)
    assert result.returncode == 0, result.stderr
    assert ("ERROR missing_grad `score` (2 tensors: score.{bias,weight}), cut by `.detach()` at "
            "numpy_interp_forward.py:20, at step 1. Fix (advice): keep the values a tensor at numpy_interp_forward.py:20: "
            "torch has no op leafwatch knows for `np.interp`") in result.stderr, result.stderr
    assert "remove the `.detach()`" not in result.stderr
    assert "not in the patch: missing_grad score: its fix is advice, not code" in result.stderr
    assert (folder / "fix.diff").read_text() == ""


TWO_LEFT_OUT = '''import warnings

import torch
from torch import nn

warnings.simplefilter("ignore", UserWarning)
torch.manual_seed(0)
d1, d2, critic = nn.Linear(4, 1), nn.Linear(4, 1), nn.Bilinear(4, 4, 1)
frozen = nn.Linear(4, 1).requires_grad_(False)  # frozen on purpose, and in no optimizer
opt = torch.optim.SGD(list(d1.parameters()) + list(d1.parameters()), lr=0.1)
for step in range(4):
    x = torch.randn(8, 4)
    loss = (d1(x) + d2(x) + critic(x, x) + frozen(x)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")
'''


def test_only_the_left_out_sibling_of_the_duplicates_type_is_said_to_be_meant(tmp_path: Path) -> None:
    """`d1` listed twice, `d2` (its type) and `critic` (another) left out: the correction names `d2`; `critic` keeps
    its advice and its `add_param_group`; the module frozen on purpose is no finding."""
    (tmp_path / "train.py").write_text(TWO_LEFT_OUT)
    result = _warm.run([sys.executable, "-m", "leafwatch", "run", "--logdir", "logs", "train.py"], capture_output=True,
                       text=True, env=_env(), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    (run,) = read_reports(str(tmp_path / "logs"))
    reasons = {(f.name.split(".")[0], f.reason.name, f.remedy.code) for f in run.report.open}
    assert reasons == {
        ("d2", "listed_twice", "opt = torch.optim.SGD(list(d1.parameters()) + list(d2.parameters()), lr=0.1)"),
        ("critic", "root_outside", 'opt.add_param_group({"params": critic.parameters()})')}, reasons

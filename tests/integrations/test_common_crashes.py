"""Every common leaf crash explained (#53): the crashes users report, re-created in tests/scripts/ as the public
reports write them (each script's docstring names its source), run under ``leafwatch run``. The note names the
variable by the user's own name and states the true cause; its code fix, applied to a copy of the script (the
edit leafwatch placed), makes the rerun go past the crash and train the tensor: a stepping optimizer holds it, it
gets a gradient and changes. An in-place error no optimizer step caused gets no note. The same notes come from an
open Monitor's excepthook and from the Lightning callback, on the very exception.

The scripts run twice in all, each time in one process (``_fix_runs.runs_of``): once as they are, once fixed."""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _fix_runs import SCRIPTS, code_edits, fixed_copy, key_of, runs_of
from _requirements import require_module
from torch import nn

import leafwatch
from leafwatch.observe import excepthook
from leafwatch.report.findings import Finding

pytestmark = pytest.mark.xdist_group("common_crashes")  # the runs are shared by the tests of this module


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A crash script: torch's message, the finding that explains it (kind, name, reason), what its note says, and
    what trains once its fix is applied (and what must stay frozen)."""

    script: str
    error: str
    finding: tuple[str, str, str]
    note: tuple[str, ...]
    trains: tuple[str, ...]
    argv: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    never: tuple[str, ...] = ()


FREED = "RuntimeError: Trying to backward through the graph a second time"
NO_GRAPH = "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn"
PATTERNS = {
    "hidden state": Pattern("crash_hidden_state.py", FREED, ("non_leaf", "h_state", "carried_state"), (
        "leafwatch: `h_state` carries the autograd graph of the previous iteration into this one: `prediction, h_state "
        "= rnn(x, h_state)` at crash_hidden_state.py:32 makes it from its own value of the iteration before, never "
        "detached, so the backward() at crash_hidden_state.py:35 goes back into the earlier iteration's graph",
        "leafwatch: fix (code): cut its history at the top of the loop, keeping its value: `h_state = None if h_state "
        "is None else h_state.detach()` as the loop's first statement"), ("rnn",)),
    "hidden tuple": Pattern("crash_lstm_hidden_tuple.py", FREED, ("non_leaf", "hidden", "carried_state"), (
        "leafwatch: `hidden` carries the autograd graph of the previous iteration",
        "`output, hidden = model(data, hidden)` at crash_lstm_hidden_tuple.py:45",
        "leafwatch: fix (code): cut its history at the top of the loop, keeping its value: `hidden = "
        "repackage_hidden(hidden)`"), ("model",)),
    "hidden tensor": Pattern("crash_rnn_hidden_state.py", FREED, ("non_leaf", "hidden", "carried_state"), (
        "`out, hidden = rnn(torch.randn(2, 5, 4), hidden)` at crash_rnn_hidden_state.py:14",
        "leafwatch: fix (code): cut its history at the top of the loop, keeping its value: `hidden = hidden.detach()`"),
        ("rnn", "head")),
    "hidden attribute": Pattern("crash_lstm_hidden_attribute.py", FREED, ("non_leaf", "model.hidden", "carried_state"), (
        "leafwatch: `model.hidden` carries the autograd graph of the previous iteration into this one: `lstm_out, "
        "self.hidden = self.lstm(embeds.view(len(sentence), 1, -1), self.hidden)` at crash_lstm_hidden_attribute.py:26",
        "leafwatch: fix (code): cut its history at the top of the loop, keeping its value: `model.hidden = "
        "tuple(t.detach() for t in model.hidden)`"), ("model",)),
    "value beside a detached state": Pattern(
        "crash_scale_beside_a_detached_state.py", FREED, ("non_leaf", "scale", "computed_once"), (
            "leafwatch: `scale` (made at crash_scale_beside_a_detached_state.py:13 from `log_scale`) is computed once",
            "repeat `scale = log_scale.exp()` at the top of the loop"), ("log_scale", "rnn", "head"),
        never=("`h`", "`running`")),
    "value before the loop": Pattern("crash_std_before_loop.py", FREED, ("non_leaf", "std", "computed_once"), (
        "leafwatch: `std` (made at crash_std_before_loop.py:13 from `log_std`) is computed once, before the loop, and "
        "used at every step",
        "leafwatch: fix (code): compute it inside the step: repeat `std = log_std.exp()` at the top of the loop",
        "never make it an `nn.Parameter` (or a `.detach()`ed copy): `log_std` would stop training"),
        ("log_std", "policy"), never=("nn.Parameter(",)),
    "value in __init__": Pattern("crash_prototypes_in_init.py", FREED, ("non_leaf", "model.prototypes", "computed_once"), (
        "leafwatch: `model.prototypes` (made at crash_prototypes_in_init.py:19 from `model.emb.weight`) is computed "
        "once, in `__init__`",
        "make `prototypes` a property of `CosineClassifier` that returns `F.normalize(self.emb.weight, dim=1)`",
        "`model.emb.weight` would stop training"), ("model.emb.weight", "model.encoder"), never=("nn.Parameter(",)),
    "two losses": Pattern("crash_gan_fake_reused.py", FREED, ("non_leaf", "fake", "freed_by_earlier_backward"), (
        "leafwatch: `fake` (made at crash_gan_fake_reused.py:26) is used by two losses: `errD_fake.backward()` at "
        "crash_gan_fake_reused.py:30 freed its graph, and the backward() at crash_gan_fake_reused.py:37 goes through "
        "it again.",
        "use `fake.detach()` where it feeds `errD_fake`: `output = netD(fake.detach()).view(-1)`"), ("netG", "netD")),
    "step before backward": Pattern(
        "gan_crash.py", "RuntimeError: one of the variables needed for gradient computation has been modified by an "
        "inplace operation", ("missing_grad", "G_loss", "stepped_before_backward"), (
            "leafwatch: `opt_D.step()` at gan_crash.py:38 changed in place the parameters of `D` that the graph of "
            "`G_loss` (computed at gan_crash.py:36) saved, before the backward() of `G_loss` at gan_crash.py:39",
            "leafwatch: fix (code): compute `G_loss` again after the step, with a new forward: repeat the statements at "
            "gan_crash.py:27 and gan_crash.py:36 right before its backward() at gan_crash.py:39; or call its backward() "
            "before `opt_D.step()`"), ("G", "D")),
    "used-up iterator": Pattern(
        "crash_empty_parameter_list.py", "ValueError: optimizer got an empty parameter list",
        ("not_in_optimizer", "params", "exhausted_iterator"), (
            "leafwatch: `params` (made at crash_empty_parameter_list.py:12) is a one-shot `filter` iterator, used up by "
            "`print(f\"training {sum(p.numel() for p in params)} parameters\")` at crash_empty_parameter_list.py:13 "
            "before `Adam` at crash_empty_parameter_list.py:14 got it",
            "leafwatch: fix (code): make it a list where it is made: `params = list(filter(lambda p: p.requires_grad, "
            "model.parameters()))`"), ("model[2]",), frozen=("model[0]",)),
    "frozen head": Pattern("crash_frozen_head.py", NO_GRAPH, ("missing_grad", "model", "all_frozen"), (
        "`optimizer` was given the parameters of `model.fc`, frozen too.",
        "leafwatch: fix (code): unfreeze what `optimizer` trains, before the forward pass: "
        "`model.fc.requires_grad_(True)`"), ("model.fc",), frozen=("model.features",),
        never=("`model.requires_grad_(True)`",)),
    "unfrozen by an attribute": Pattern("crash_frozen_head.py", NO_GRAPH, ("missing_grad", "model", "all_frozen"), (
        "`model.fc.requires_grad = True` at crash_frozen_head.py:32 sets a plain attribute of the module, which "
        "PyTorch ignores: its parameters keep `requires_grad=False`.",
        "leafwatch: fix (code): unfreeze its parameters with the module's method: `model.fc.requires_grad_(True)`"),
        ("model.fc",), argv=("--attribute",), frozen=("model.features",), never=("`model.requires_grad_(True)`",)),
    "no_grad helper": Pattern("crash_no_grad_helper.py", NO_GRAPH, ("missing_grad", "loss", "grad_off_function"), (
        "it was computed through `predict` (called at crash_no_grad_helper.py:25), which `@torch.no_grad()` at "
        "crash_no_grad_helper.py:15 runs with grad mode off.",
        "leafwatch: fix (code): remove `@torch.no_grad()` from `predict` (at crash_no_grad_helper.py:15)"),
        ("model",), never=("no_grad()` block", "`the model`")),
    "init routine": Pattern(
        "crash_init_routine.py", "RuntimeError: a leaf Variable that requires grad is being used in an in-place "
        "operation.", ("non_leaf", "m.weight", "in_place_on_leaf"), (
            "torch refuses the in-place `.mul_()` at crash_init_routine.py:14",
            "`init_weights` changes a leaf in place again: `m.bias += 0.01` at crash_init_routine.py:15 would be "
            "refused next.",
            "leafwatch: fix (code): run `init_weights` without autograd, as an initialisation: decorate it with "
            "`@torch.no_grad()`"), ("model",)),
    "two non-leaves": Pattern(
        "crash_two_non_leaves.py", "ValueError: can't optimize a non-leaf Tensor",
        ("non_leaf", "{W1,W2}", "optimized_non_leaf"), (
            "leafwatch: `W1` (assigned at crash_two_non_leaves.py:8) and `W2` (assigned at crash_two_non_leaves.py:10) "
            "are not leaf tensors, so `SGD` at crash_two_non_leaves.py:12 cannot optimize them",
            "leafwatch: fix (code): make each a leaf where it is made: `W1 = (torch.randn(784, 128) * 0.01)"
            ".requires_grad_()`; `W2 = (torch.randn(128, 10) * 0.01).requires_grad_()`"), ("W1", "W2", "b1", "b2")),
    "every parameter frozen": Pattern("crash_all_frozen.py", NO_GRAPH, ("missing_grad", "model", "all_frozen"), (
        "leafwatch: fix (code): unfreeze what should train before the forward pass: `model.requires_grad_(True)`",),
        ("model",)),
    "detached training_step": Pattern("crash_lightning_detach.py", NO_GRAPH, ("missing_grad", "the loss `Regressor.training_step` returns", "detached_loss"), (
        "leafwatch: `Regressor.training_step` returns its loss as `loss.detach()` at crash_lightning_detach.py:22",
        "leafwatch: fix (code): return the loss itself, not `loss.detach()`: `return {\"loss\": loss, \"log\": "
        "{\"train_loss\": loss.detach()}}`"), ("model.layer",)),
}
#: Crashes that show none of the mistakes above: in-place errors no optimizer step caused, an iterator empty from the
#: start (nothing used it up); torch's message, and no note.
UNNOTED = {"relu": ("crash_inplace_activation.py",), "add": ("crash_inplace_activation.py", "add"),
           "empty filter": ("crash_empty_filter.py",)}
UNNOTED_ERRORS = {"relu": "RuntimeError: one of the variables needed", "add": "RuntimeError: one of the variables needed",
                  "empty filter": "ValueError: optimizer got an empty parameter list"}


def _key(pattern: Pattern) -> str:
    return key_of(SCRIPTS / pattern.script, pattern.argv)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each script run once as it is, and once more with its crash's code fixes applied to a copy."""
    require_module("pytorch_lightning")
    folder = tmp_path_factory.mktemp("common_crashes")
    before = runs_of([{"script": str(SCRIPTS / p.script), "argv": list(p.argv)} for p in PATTERNS.values()]
                     + [{"script": str(SCRIPTS / args[0]), "argv": list(args[1:])} for args in UNNOTED.values()],
                     folder / "before.json")
    spec, copies = [], {}
    for name, pattern in PATTERNS.items():
        script = SCRIPTS / pattern.script
        copy = fixed_copy(script, code_edits(before[_key(pattern)]["crash"], script), folder / name.replace(" ", "_"))
        copies[name] = copy
        spec.append({"script": str(copy), "argv": list(pattern.argv), "trains": [*pattern.trains, *pattern.frozen]})
    after = runs_of(spec, folder / "after.json")
    return {"before": before, "after": {name: after[key_of(copies[name], p.argv)] for name, p in PATTERNS.items()},
            "copies": copies}


def _note_after(stderr: str, error: str) -> list[str]:
    """The lines of leafwatch's note right after the exception's line: its message, cause and fix."""
    lines = stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(error))
    note = []
    for line in lines[at + 1:]:
        if not line.startswith("leafwatch: ") or line.startswith(("leafwatch: the script raised", "leafwatch: summary")):
            break
        note.append(line)
        if line.startswith("leafwatch: fix"):
            break
    return note


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_leafwatch_run_notes_the_users_variable_the_true_cause_and_a_fix(runs: dict[str, Any], name: str) -> None:
    pattern = PATTERNS[name]
    run = runs["before"][_key(pattern)]
    assert run["code"] == 1 and "Traceback (most recent call last):\n" in run["stderr"], run["stderr"]
    (finding,) = {(f["kind"], f["name"], f["reason"]): f for f in run["crash"]}.values()  # (two doors, one finding)
    assert (finding["kind"], finding["name"], finding["reason"]) == pattern.finding
    note = _note_after(run["stderr"], pattern.error)
    text = "\n".join(note)
    assert [line.split(":")[1].strip() for line in note[1:]] == ["cause", "fix (code)"], text  # message, cause, fix
    for part in pattern.note:
        assert part in text, (part, text)
    for wrong in pattern.never:
        assert wrong not in text and wrong not in finding["remedy"]["code"], (wrong, text)
    assert finding["remedy"]["applicability"] == "code" and finding["remedy"]["edit"] is not None  # a placed fix


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_each_crash_finding_renders_from_its_json_arguments_alone(runs: dict[str, Any], name: str) -> None:
    """The words and the placed fix come from the finding's plain arguments (read back from JSON), as a record would
    hold them: no file is read and no object is needed to say them again."""
    for f in runs["before"][_key(PATTERNS[name])]["crash"]:
        read = Finding.from_dict(f)  # its reason (and each member's) from its `reason` and `args` alone
        assert f["args"] and type(read.reason).__name__ != "Written", f
        words = read.words
        assert (words.message, words.cause, words.fix, words.remedy.to_dict()) == (
            f["message"], f["cause"], f["fix"], f["remedy"])


def test_two_non_leaves_are_one_mistake_naming_each_tensor(runs: dict[str, Any]) -> None:
    (finding,) = runs["before"][_key(PATTERNS["two non-leaves"])]["crash"]
    assert [m["name"] for m in finding["members"]] == ["W1", "W2"]
    assert finding["remedy"]["edit"]["start"] == 8 and finding["remedy"]["edit"]["end"] == 10  # one edit, both lines


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_the_fix_applied_to_a_copy_runs_past_the_crash_and_trains_the_tensor(runs: dict[str, Any], name: str) -> None:
    pattern, after = PATTERNS[name], runs["after"][name]
    copy = runs["copies"][name]
    assert after["code"] == 0 and "Traceback" not in after["stderr"], (copy.read_text(), after["stderr"])
    assert after["crash"] == [] and after["open"] == [], (copy.read_text(), after["open"])
    trained = {"stepped": True, "grad": True, "changed": True}
    assert {expr: after["trains"][expr] for expr in pattern.trains} == {expr: trained for expr in pattern.trains}
    untouched = {"stepped": False, "grad": False, "changed": False}
    assert {expr: after["trains"][expr] for expr in pattern.frozen} == {expr: untouched for expr in pattern.frozen}


@pytest.mark.parametrize("case", sorted(UNNOTED))
def test_a_crash_that_shows_none_of_these_mistakes_gets_no_note(runs: dict[str, Any], case: str) -> None:
    run = runs["before"][key_of(SCRIPTS / UNNOTED[case][0], UNNOTED[case][1:])]
    lines = run["stderr"].splitlines()
    error = next(i for i, line in enumerate(lines) if line.startswith(UNNOTED_ERRORS[case]))
    assert run["code"] == 1 and run["crash"] == []
    assert lines[error + 1].startswith(("leafwatch: the script raised", "leafwatch: summary")), run["stderr"]


# -- in-process: an open Monitor's excepthook, the Lightning callback --------------------------------------
def _hidden_state() -> None:
    rnn, head = nn.GRU(4, 8, batch_first=True), nn.Linear(8, 1)
    optimizer = torch.optim.SGD([*rnn.parameters(), *head.parameters()], lr=0.1)
    h = torch.zeros(1, 2, 8)
    for _ in range(3):
        out, h = rnn(torch.randn(2, 5, 4), h)
        loss = head(out).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _sigma_before_the_loop() -> None:
    mean = nn.Linear(3, 1)
    log_sigma = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([*mean.parameters(), log_sigma], lr=1e-2)
    sigma = F.softplus(log_sigma)
    for _ in range(3):
        x, y = torch.randn(16, 3), torch.randn(16, 1)
        loss = -torch.distributions.Normal(mean(x), sigma).log_prob(y).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _step_before_backward() -> None:
    G, D = nn.Linear(2, 3), nn.Linear(3, 1)
    opt_D = torch.optim.SGD(D.parameters(), lr=0.1)
    fake = G(torch.randn(4, 2))
    d_loss = D(fake.detach()).mean()
    g_loss = -D(fake).mean()
    d_loss.backward()
    opt_D.step()
    g_loss.backward()


def _used_up() -> None:
    model = nn.Linear(3, 1)
    trainable = (p for p in model.parameters() if p.requires_grad)
    count = len(list(trainable))
    torch.optim.SGD(trainable, lr=0.1 * count)


@torch.no_grad()
def _evaluate(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _helper_in_the_training_step() -> None:
    model = nn.Linear(3, 1)
    loss = _evaluate(model, torch.randn(4, 3)).pow(2).mean()
    loss.backward()


def _init_routine() -> None:
    def init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            m.weight.normal_(0, 0.02)
            m.bias.zero_()

    nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)).apply(init)


def _fake_in_two_losses() -> None:
    G, D = nn.Linear(2, 3), nn.Linear(3, 1)
    opt_G, opt_D = torch.optim.SGD(G.parameters(), lr=0.1), torch.optim.SGD(D.parameters(), lr=0.1)
    fake = G(torch.randn(4, 2))
    d_loss = D(fake).mean()
    d_loss.backward()
    opt_D.step()
    g_loss = -D(fake).mean()
    g_loss.backward()
    opt_G.step()


def _two_non_leaves() -> None:
    w1 = torch.randn(3, 3, requires_grad=True).double()
    w2 = torch.randn(3, 1, requires_grad=True).double()
    torch.optim.Adam([w1, w2])


IN_PROCESS = {
    "two losses": (_fake_in_two_losses, ("non_leaf", "fake", "freed_by_earlier_backward"),
                   "`d_loss = D(fake.detach()).mean()`"),
    "two non-leaves": (_two_non_leaves, ("non_leaf", "w1", "optimized_non_leaf"),
                       "`w1 = torch.randn(3, 3).double().requires_grad_()`; `w2 = torch.randn(3, 1).double().requires_grad_()`"),
    "hidden state": (_hidden_state, ("non_leaf", "h", "carried_state"), "`h = h.detach()`"),
    "value before the loop": (_sigma_before_the_loop, ("non_leaf", "sigma", "computed_once"),
                              "repeat `sigma = F.softplus(log_sigma)` at the top of the loop"),
    "step before backward": (_step_before_backward, ("missing_grad", "g_loss", "stepped_before_backward"),
                             "`opt_D.step()` at test_common_crashes.py:"),
    "used-up iterator": (_used_up, ("not_in_optimizer", "trainable", "exhausted_iterator"),
                         "`trainable = list((p for p in model.parameters() if p.requires_grad))`"),
    "no_grad helper": (_helper_in_the_training_step, ("missing_grad", "loss", "grad_off_function"),
                       "remove `@torch.no_grad()` from `_evaluate`"),
    "init routine": (_init_routine, ("non_leaf", "m.weight", "in_place_on_leaf"), "`m.bias.zero_()` at test_common_crashes.py:"),
}


@pytest.fixture
def _own_excepthook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(excepthook, "HOOK", excepthook.ExceptHook())


@pytest.mark.usefixtures("_own_excepthook")
@pytest.mark.parametrize("case", sorted(IN_PROCESS))
def test_an_open_monitors_excepthook_notes_the_very_exception(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    function, finding, part = IN_PROCESS[case]
    with leafwatch.Monitor():
        with pytest.raises(Exception) as caught:
            function()
        error = caught.value
        kind, message, tb = type(error), str(error), error.__traceback__
        sys.excepthook(kind, error, tb)
    assert type(error) is kind and str(error) == message and error.__traceback__ is tb
    (note,) = error.__notes__
    assert note.splitlines()[0].startswith(f"leafwatch: `{finding[1]}`") or f"`{finding[1]}`" in note.splitlines()[0], note
    assert part in note and "leafwatch: fix (code): " in note, note
    assert note in capsys.readouterr().err


def test_the_lightning_callback_names_the_detach_that_training_step_returns() -> None:
    pl = require_module("pytorch_lightning")

    class Detached(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch).pow(2).mean()
            self.log("loss", loss.detach())
            return loss.detach()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = pl.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, callbacks=[leafwatch.LeafWatch()],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)
        with pytest.raises(RuntimeError) as caught:
            trainer.fit(Detached(), torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4))
    (note,) = caught.value.__notes__
    assert str(caught.value) == "element 0 of tensors does not require grad and does not have a grad_fn"
    assert note.startswith("leafwatch: `Detached.training_step` returns its loss as `loss.detach()` at "
                           "test_common_crashes.py:"), note
    assert "leafwatch: fix (code): return the loss itself, not `loss.detach()`: `return loss`" in note


def test_a_loss_computed_under_a_no_grad_block_is_still_said_to_be_so(capsys: pytest.CaptureFixture[str]) -> None:
    """Where no decorated function was called, the hooks' account stands (a ``with torch.no_grad():`` block)."""
    model = nn.Linear(3, 1)
    with leafwatch.Monitor(model):
        with torch.no_grad():
            loss = model(torch.randn(4, 3)).pow(2).mean()
        with pytest.raises(RuntimeError) as caught:
            loss.backward()
        sys.excepthook(RuntimeError, caught.value, caught.value.__traceback__)
    (note,) = caught.value.__notes__
    assert "leafwatch's hooks saw `model` run with grad mode off" in note and "decorat" not in note

"""Crash explanations (#46 item 1): where PyTorch raises because of a leaf mistake, leafwatch adds to
that very exception the tensor by the user's name, what made it so (the op, the user's line) and the
fix, as a note (PEP 678) that the traceback shows right after torch's message; every other exception
is left as it is. The doors: ``leafwatch run``, the excepthook while a Monitor is open or a tensor
watched, the Lightning callback (``on_exception``)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import _warm
import pytest
import torch
from _requirements import require_module
from _tracebacks import PACKAGE, is_leafwatch_module, leafwatch_lines
from torch import nn

import leafwatch
from leafwatch.detectors import crashes as crash_detector
from leafwatch.integrations import runner
from leafwatch.observe import crashes, excepthook
from leafwatch.sinks import notes

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

#: Each crash script: the last line of PyTorch's traceback, and what leafwatch's note says right after it.
CASES = {
    "crash_optimize_non_leaf.py": ("ValueError: can't optimize a non-leaf Tensor", [
        "leafwatch: `w` (assigned at crash_optimize_non_leaf.py:6) is not a leaf tensor, so `Adam` at "
        "crash_optimize_non_leaf.py:7 cannot optimize it",
        "leafwatch: cause: `w` is the result of a dtype conversion (`.to(torch.float64)`) made after "
        "`requires_grad=True` (autograd op `ToCopyBackward0`), so it is not a leaf: backward() puts the gradient "
        "into an unnamed temporary leaf",
        "leafwatch: fix (code): convert first, then ask for grad (or pass `dtype=torch.float64` when creating it): "
        "`w = torch.randn(4, 4).to(torch.float64).requires_grad_()`"]),
    "crash_second_backward.py": ("RuntimeError: Trying to backward through the graph a second time", [
        "leafwatch: `model.scale` (made at crash_second_backward.py:13) is a non-leaf tensor kept from one step to "
        "the next: an earlier backward() freed the graph that made it, and the backward() at "
        "crash_second_backward.py:24 goes through that graph again.",
        "leafwatch: cause: `model.scale` is the result of arithmetic on a leaf",
        "(autograd op `MulBackward0`)",
        "leafwatch: fix (code): register it where it is assigned: `self.scale = nn.Parameter(torch.randn(4) * 0.02)`"]),
    "crash_all_frozen.py": ("RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn", [
        "leafwatch: every parameter of `model` is frozen, so `loss` has no autograd graph and the backward() at "
        "crash_all_frozen.py:12 has nothing to differentiate: nothing trains.",
        "leafwatch: cause: none of the 4 parameter tensors of `model` requires grad",
        "leafwatch: fix (code): unfreeze what should train before the forward pass: `model.requires_grad_(True)` "
        "(`optimizer` was given every parameter of it)"]),
    "crash_inplace_parameter.py": (
        "RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.", [
            "leafwatch: `w` is an `nn.Parameter`, a leaf: torch refuses the in-place `.normal_()` at "
            "crash_inplace_parameter.py:8 with grad mode on",
            "leafwatch: cause: `.normal_()` changes `w` in place while autograd records",
            "leafwatch: fix (code): initialise it with `torch.nn.init`, which runs under `torch.no_grad()`: "
            "`nn.init.normal_(w)` (or `with torch.no_grad(): w.normal_()`)"]),
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _python(*args: str) -> subprocess.CompletedProcess:
    result = _warm.run([sys.executable, *args], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=240)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr  # leafwatch's own failure fails the test
    return result


def _note_after(stderr: str, error_line: str) -> list[str]:
    """The lines right after the exception's line (its message), up to the next line not of the note."""
    lines = stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(error_line))
    note = []
    for line in lines[at + 1:]:
        if not line.startswith("leafwatch: ") or line.startswith(("leafwatch: the script raised", "leafwatch: summary")):
            break
        note.append(line)
    return note


def _assert_note(note: list[str], expected: list[str]) -> None:
    text = "\n".join(note)
    assert note and note[0].startswith(("leafwatch: `", "leafwatch: every", "leafwatch: the tensor")), text
    assert any(line.startswith("leafwatch: cause: ") for line in note), text
    assert note[-1].startswith(("leafwatch: fix (code): ", "leafwatch: fix (advice): ")), text
    for part in expected:
        assert part in text, (part, text)


def test_leafwatchs_own_frames_are_judged_by_their_module_not_by_a_word_in_the_path(tmp_path: Path) -> None:
    """A clone of the repository is a folder named ``leafwatch``: its scripts' frames are not leafwatch's."""
    clone = tmp_path / "leafwatch"
    traceback = (f'Traceback (most recent call last):\n  File "{clone / "tests" / "scripts" / "t.py"}", line 3, in <module>\n'
                 f'  File "{PACKAGE / "monitor.py"}", line 9, in check\n  File "<frozen runpy>", line 1, in _run\n'
                 "ValueError: no\nleafwatch: cause: it\n")
    assert leafwatch_lines(traceback) == [str(PACKAGE / "monitor.py"), "leafwatch: cause: it"]
    assert is_leafwatch_module(os.path.relpath(PACKAGE / "report" / "patch.py")) and not is_leafwatch_module(
        str(clone / "leafwatch_notes.py"))


# -- leafwatch run ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", sorted(CASES))
def test_leafwatch_run_prints_pytorchs_traceback_then_the_note_and_exits_1(script: str) -> None:
    error_line, expected = CASES[script]
    plain = _python(str(SCRIPTS / script))
    run = _python("-m", "leafwatch", "run", str(SCRIPTS / script))
    assert plain.returncode == run.returncode == 1
    assert leafwatch_lines(plain.stderr, REPO) == [] and error_line in plain.stderr.splitlines()[-1]
    # PyTorch's traceback as the interpreter prints it, then leafwatch's note, then the summary.
    assert run.stderr.startswith(plain.stderr.rstrip("\n") + "\nleafwatch: "), run.stderr
    _assert_note(_note_after(run.stderr, error_line), expected)


def test_a_run_that_crashed_before_any_optimizer_step_summarises_the_structure_of_the_modules_that_ran() -> None:
    run = _python("-m", "leafwatch", "run", str(SCRIPTS / "crash_second_backward.py"))
    assert "nothing was checked" not in run.stderr
    summary = run.stderr[run.stderr.index("leafwatch: the script raised"):]
    assert summary.startswith("leafwatch: the script raised before any optimizer stepped: no gradient was checked, "
                              "only the structure of the modules that ran\nleafwatch: 2 open of 2 finding(s) at start\n")
    assert "ERROR   orphan_tensor       scale (since start)" in summary
    # The crash finding goes through the same flow: the closing table lists it too, in the words of its note.
    assert "ERROR   non_leaf            model.scale (since start)" in summary
    assert "`model.scale` (made at crash_second_backward.py:13) is a non-leaf tensor kept from one step" in summary
    assert "module attribute `scale` is a non-leaf tensor" in summary


def test_a_run_that_crashed_before_any_module_ran_says_so() -> None:
    run = _python("-m", "leafwatch", "run", str(SCRIPTS / "crash_optimize_non_leaf.py"))
    assert run.stderr.rstrip("\n").endswith(
        "leafwatch: the script raised before any optimizer stepped or any module ran: nothing was checked.")


@pytest.mark.parametrize("arguments", [("crash_unrelated.py",), ("crash_unrelated.py", "key")])
def test_leafwatch_run_adds_no_note_where_no_leaf_mistake_is_seen(arguments: tuple[str, ...]) -> None:
    """A shape mismatch, a KeyError: the traceback is the interpreter's, and the summary follows it at once.
    (An in-place error no optimizer step caused gets none either: test_common_crashes.py.)"""
    plain = _python(str(SCRIPTS / arguments[0]), *arguments[1:])
    run = _python("-m", "leafwatch", "run", str(SCRIPTS / arguments[0]), *arguments[1:])
    assert plain.returncode == run.returncode == 1
    # (the frames of torch's module call differ: leafwatch run's global module hook takes its other path)
    error_line = plain.stderr.splitlines()[-1]
    lines = run.stderr.splitlines()
    after = lines[lines.index(error_line) + 1]
    assert run.stderr.startswith("Traceback (most recent call last):\n")
    assert after.startswith(("leafwatch: summary", "leafwatch: the script raised")), run.stderr


def test_on_python_310_leafwatch_run_prints_the_note_right_after_the_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(notes, "ATTACHES", False)  # as on 3.10: an exception carries no note
    assert runner.run(str(SCRIPTS / "crash_optimize_non_leaf.py")) == 1
    err = capsys.readouterr().err
    error_line, expected = CASES["crash_optimize_non_leaf.py"]
    assert err.index("Traceback (most recent call last)") < err.index(error_line)
    _assert_note(_note_after(err, error_line), expected)


# -- in-process: the excepthook while a Monitor is open ---------------------------------------------------
def _optimize_non_leaf() -> None:
    w = torch.randn(4, 4, requires_grad=True).to(torch.float64)
    torch.optim.Adam([w])


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.scale = torch.randn(4, requires_grad=True) * 0.02

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale


def _second_backward() -> None:
    model = _Scaled()
    for _ in range(2):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()


def _all_frozen() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)).requires_grad_(False)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()


def _in_place() -> None:
    w = nn.Parameter(torch.empty(4, 4))
    w.uniform_(-0.1, 0.1)


IN_PROCESS = {
    "optimize": (_optimize_non_leaf, ValueError, [
        "leafwatch: `w` (assigned at test_crash_notes.py:", "cannot optimize it", "`ToCopyBackward0`",
        "`w = torch.randn(4, 4).to(torch.float64).requires_grad_()`"]),
    "second": (_second_backward, RuntimeError, [
        "leafwatch: `model.scale` (made at test_crash_notes.py:", "is a non-leaf tensor kept from one step to the next",
        "`MulBackward0`", "`self.scale = nn.Parameter(torch.randn(4) * 0.02)`"]),
    "frozen": (_all_frozen, RuntimeError, [
        "leafwatch: every parameter of `model` is frozen, so `loss` has no autograd graph",
        "`model.requires_grad_(True)`"]),
    "inplace": (_in_place, RuntimeError, [
        "leafwatch: `w` is an `nn.Parameter`, a leaf: torch refuses the in-place `.uniform_()`",
        "`nn.init.uniform_(w, -0.1, 0.1)`", "`with torch.no_grad(): w.uniform_(-0.1, 0.1)`"]),
}


@pytest.fixture(autouse=True)
def _own_excepthook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from Python's own excepthook and a door no earlier test holds (a Monitor it never
    closed, the hook ``torch.distributed.init_process_group`` wraps around the one there and leaves)."""
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(excepthook, "HOOK", excepthook.ExceptHook())


def _raised(case) -> BaseException:
    with pytest.raises(Exception) as caught:
        case()
    return caught.value


@pytest.mark.parametrize("case", sorted(IN_PROCESS))
def test_with_a_monitor_open_the_excepthook_adds_the_note_to_the_very_exception(
        case: str, capsys: pytest.CaptureFixture[str]) -> None:
    function, kind, expected = IN_PROCESS[case]
    with leafwatch.Monitor():  # open, on no model: what it reads is the exception's traceback
        error = _raised(function)
        message, tb = str(error), error.__traceback__
        assert not hasattr(error, "__notes__")
        sys.excepthook(type(error), error, tb)
    err = capsys.readouterr().err
    assert type(error) is kind and str(error) == message and error.__traceback__ is tb
    (note,) = error.__notes__  # one finding, one note: its message, cause and fix
    _assert_note(note.splitlines(), expected)
    last = err.index(f"{kind.__name__}: {message}")
    assert err.index("Traceback (most recent call last)") < last and err[last:].splitlines()[1:4] == note.splitlines()


@pytest.mark.parametrize(("case", "watch"), [("optimize", False), ("second", False), ("frozen", False),
                                             ("inplace", False), ("inplace", True)])
def test_an_uncaught_crash_under_a_monitor_or_a_watch_prints_the_note_after_the_traceback(case: str, watch: bool) -> None:
    result = _python(str(SCRIPTS / "crash_under_monitor.py"), case, *(["--watch"] if watch else []))
    assert result.returncode == 1 and result.stdout == ""
    error_line = result.stderr.splitlines()[-4]
    assert error_line.startswith(("ValueError: ", "RuntimeError: ")), result.stderr
    _assert_note(_note_after(result.stderr, error_line), [UNDER_MONITOR[case]])


#: What the note of each case of crash_under_monitor.py starts with.
UNDER_MONITOR = {
    "optimize": "leafwatch: `w` (assigned at crash_under_monitor.py:36) is not a leaf tensor, so `Adam` at "
                "crash_under_monitor.py:37 cannot optimize it",
    "second": "leafwatch: `model.scale` (made at crash_under_monitor.py:23) is a non-leaf tensor kept from one step",
    "frozen": "leafwatch: every parameter of `model` is frozen, so `loss` has no autograd graph and the backward() at "
              "crash_under_monitor.py:45",
    "inplace": "leafwatch: `w` is an `nn.Parameter`, a leaf: torch refuses the in-place `.normal_()` at "
               "crash_under_monitor.py:48",
}


def test_the_excepthook_adds_no_note_to_an_unrelated_exception_nor_to_an_in_place_error_of_an_activation(
        capsys: pytest.CaptureFixture[str]) -> None:
    head = nn.Linear(4, 4)

    def shapes() -> None:
        nn.Linear(4, 2)(torch.randn(8, 3))

    def relu_in_place() -> None:  # dreamgonfly/GAN-tutorial#1: no optimizer step is the in-place operation
        nn.ReLU(inplace=True)(torch.sigmoid(head(torch.randn(8, 4)))).sum().backward()

    with leafwatch.Monitor(head):
        assert excepthook.HOOK.installed  # the door is open: what it says of each exception is nothing
        errors = [_raised(shapes), _raised(lambda: {}["momentum"]), _raised(relu_in_place)]
        for error in errors:
            sys.excepthook(type(error), error, error.__traceback__)
    assert isinstance(errors[1], KeyError) and "modified by an inplace operation" in str(errors[2])
    assert [getattr(e, "__notes__", None) for e in errors] == [None, None, None]
    assert leafwatch_lines(capsys.readouterr().err) == []


def test_the_excepthook_is_chained_while_a_monitor_or_a_watch_lives_and_put_back_after_the_last(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(excepthook.HOOK) == 0 and not excepthook.HOOK.installed
    seen: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, error, tb: seen.append(error))
    users = 0
    before = sys.excepthook
    first, second = leafwatch.Monitor(nn.Linear(2, 1)), leafwatch.Monitor(nn.Linear(2, 1))
    assert excepthook.HOOK.installed and len(excepthook.HOOK) == users + 2
    first.close()
    assert excepthook.HOOK.installed
    error = _raised(_optimize_non_leaf)
    sys.excepthook(type(error), error, error.__traceback__)
    assert seen == [error] and len(error.__notes__) == 1  # the hook before leafwatch's got it, noted
    second.close()
    assert sys.excepthook is before and len(excepthook.HOOK) == users
    t = leafwatch.watch(torch.ones(2, requires_grad=True), name="t")
    assert excepthook.HOOK.installed
    leafwatch.unwatch(t)
    assert sys.excepthook is before
    assert leafwatch.audit(nn.Linear(2, 1)) is not None and sys.excepthook is before  # audit() installs nothing


def test_a_hook_installed_in_front_of_leafwatchs_keeps_it_in_the_chain_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``torch.distributed.init_process_group`` wraps the excepthook there and never takes its wrapper
    out: leafwatch's stays behind it, and a later Monitor neither chains it twice nor loops."""
    first = leafwatch.Monitor()
    inner = sys.excepthook

    def wrapper(kind, error, tb):
        print("wrapped", file=sys.stderr)
        inner(kind, error, tb)

    monkeypatch.setattr(sys, "excepthook", wrapper)
    first.close()
    assert sys.excepthook is wrapper and excepthook.HOOK.installed  # still called by the wrapper
    with leafwatch.Monitor():
        assert sys.excepthook is wrapper
        error = _raised(_in_place)
        sys.excepthook(type(error), error, error.__traceback__)
    err = capsys.readouterr().err
    assert len(error.__notes__) == 1
    assert err.count("wrapped") == 1 and err.count("Traceback (most recent call last)") == 1
    assert err.count("leafwatch: `w` is an `nn.Parameter`") == 1


def test_on_python_310_the_excepthook_prints_the_note_after_the_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(notes, "ATTACHES", False)
    with leafwatch.Monitor():
        error = _raised(_in_place)
        sys.excepthook(type(error), error, error.__traceback__)
    err = capsys.readouterr().err
    assert not hasattr(error, "__notes__")
    assert err.index("RuntimeError: a leaf Variable") < err.index("leafwatch: `w` is an `nn.Parameter`")


def test_a_failure_while_explaining_is_an_internal_warning_and_the_exception_stays_as_it_was(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("cannot read this traceback")

    monkeypatch.setattr(crashes, "read", broken)
    with leafwatch.Monitor():
        error = _raised(_optimize_non_leaf)
        message, tb = str(error), error.__traceback__
        with pytest.warns(leafwatch.LeafwatchInternalWarning, match="explaining the exception.*cannot read"):
            sys.excepthook(type(error), error, tb)
    assert type(error) is ValueError and str(error) == message and error.__traceback__ is tb
    assert not hasattr(error, "__notes__")
    assert "ValueError: can't optimize a non-leaf Tensor" in capsys.readouterr().err


def test_a_loss_computed_under_no_grad_is_named_with_what_the_monitors_hooks_saw(
        capsys: pytest.CaptureFixture[str]) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    with leafwatch.Monitor(model):
        with torch.no_grad():
            loss = model(torch.randn(8, 4)).pow(2).mean()
        error = _raised(loss.backward)
        sys.excepthook(type(error), error, error.__traceback__)
    (note,) = error.__notes__
    assert note.splitlines()[0].startswith("leafwatch: `loss` has no autograd graph (no `grad_fn`, "
                                           "`requires_grad=False`), so the backward() at test_crash_notes.py:")
    assert "while `model` has parameters that require grad" in note
    assert "leafwatch: cause: leafwatch's hooks saw `model` run with grad mode off only since the last check" in note
    with torch.inference_mode():
        inferred = model(torch.randn(8, 4)).sum()
    error = _raised(inferred.backward)
    notes.add(error, crash_detector.explain(error))
    assert "it was computed under `torch.inference_mode()`" in error.__notes__[0]
    unseen = torch.tensor(model(torch.randn(8, 4)).sum().item())  # no Monitor: where is not known
    error = _raised(unseen.backward)
    notes.add(error, crash_detector.explain(error))
    assert "leafwatch: cause: leafwatch did not see where the graph was lost" in error.__notes__[0]


def test_the_ipython_door_adds_the_note_to_a_cells_exception() -> None:
    pytest.importorskip("IPython")
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()
    with leafwatch.Monitor(nn.Linear(2, 1)):
        assert shell.custom_exceptions == (Exception,)
        result = shell.run_cell("import torch\nw = torch.randn(4, requires_grad=True).double()\ntorch.optim.SGD([w], lr=0.1)")
    assert shell.custom_exceptions == ()
    assert any(n.startswith("leafwatch: `w`") for n in result.error_in_exec.__notes__)


# -- Lightning -----------------------------------------------------------------------------------------------
def _lightning_fit(model, **kwargs) -> BaseException:
    pl = require_module("pytorch_lightning")
    data = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)
    trainer = pl.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, callbacks=[leafwatch.LeafWatch()],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)
        with pytest.raises(RuntimeError) as caught:
            trainer.fit(model, data)
    return caught.value


def _lightning_modules():
    pl = require_module("pytorch_lightning")

    class NoGraph(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            with torch.no_grad():
                out = self.layer(batch)
            return out.pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Scaled(NoGraph):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.randn(4, requires_grad=True) * 0.02

        def training_step(self, batch, batch_idx):
            return self.layer(batch * self.scale).pow(2).mean()

    return NoGraph, Scaled


def test_the_lightning_callback_notes_the_exception_lightning_raises_again_for_a_loss_without_graph() -> None:
    no_graph, _ = _lightning_modules()
    model = no_graph()
    error = _lightning_fit(model)
    assert str(error) == "element 0 of tensors does not require grad and does not have a grad_fn"
    (note,) = error.__notes__
    assert note.startswith("leafwatch: the tensor backward() was called on has no autograd graph")
    assert "while `model` has parameters that require grad" in note
    assert "leafwatch's hooks saw `model.layer` run with grad mode off only" in note
    assert note.splitlines()[-1].startswith("leafwatch: fix (advice): run the forward of `model.layer` with grad mode on")


def test_the_lightning_callback_notes_a_non_leaf_attribute_that_the_second_accumulated_backward_goes_through() -> None:
    _, scaled = _lightning_modules()
    model = scaled()
    error = _lightning_fit(model, accumulate_grad_batches=2)
    assert str(error).startswith("Trying to backward through the graph a second time")
    (note,) = error.__notes__
    assert note.startswith("leafwatch: `model.scale` (made at test_crash_notes.py:")
    assert "`self.scale = nn.Parameter(torch.randn(4, requires_grad=True) * 0.02)`" not in note
    assert "leafwatch: fix (code): register it where it is assigned: `self.scale = nn.Parameter(torch.randn(4) * 0.02)`" \
        in note

"""``leafwatch run`` and ``leafwatch report`` on real plain-PyTorch scripts, in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _warm
import pytest
import torch
from _requirements import require_module
from _tracebacks import leafwatch_frames
from torch import nn

from leafwatch.integrations import runner
from leafwatch.detectors import fixes
from leafwatch.report.reader import read_reports

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BUGGY_FINDINGS = {
    ("missing_grad", "aux_head.weight"),
    ("missing_grad", "aux_head.bias"),
    ("orphan_tensor", "blocks[0].weight"),
    ("orphan_tensor", "blocks[0].bias"),
    ("orphan_tensor", "blocks[1].weight"),
    ("orphan_tensor", "blocks[1].bias"),
    ("orphan_tensor", "scale"),
}
#: The same, one per mistake: the unused head, the plain-list container, the rewrapped attribute.
BUGGY_MISTAKES = {("missing_grad", "aux_head"), ("orphan_tensor", "blocks"), ("orphan_tensor", "scale")}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONHASHSEED"] = "0"
    return env


def _leafwatch(command: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = _warm.run([sys.executable, "-m", "leafwatch", command, *args], capture_output=True, text=True,
                       env=_env(), cwd=cwd or REPO, timeout=240)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr  # leafwatch's own failure fails the test
    return result


def _python(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = _warm.run([sys.executable, *args], capture_output=True, text=True, env=_env(),
                       cwd=cwd or REPO, timeout=240)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The buggy script and the GAN script run once each, into nested folders of one logdir."""
    logdir = tmp_path_factory.mktemp("logs")
    buggy = _leafwatch("run", "--logdir", str(logdir / "exp" / "buggy"), str(SCRIPTS / "buggy.py"), "--exit-code", "5")
    gan = _leafwatch("run", "--logdir", str(logdir / "exp" / "gan"), str(SCRIPTS / "gan.py"))
    return {"logdir": logdir, "buggy": buggy, "gan": gan}


def _json_findings(data: dict, run: str) -> set[tuple[str, str]]:
    """(kind, tensor) of every open tensor of the run's open mistakes."""
    (found,) = [r for r in data["runs"] if r["run"] == run]
    return {(f["kind"], m["name"]) for f in found["findings"] if f["status"] == "open" for m in f["members"]}


@pytest.mark.xdist_group("run_cli_runs")  # shares the module-scoped `runs` under pytest-xdist
def test_run_names_each_bug_on_stderr_and_exits_with_the_scripts_code(runs):
    result = runs["buggy"]
    assert result.returncode == 5, result.stderr
    assert result.stdout == "done 4 steps\n"
    for kind, name in BUGGY_MISTAKES:
        # Printed once when it appears, and once more in the summary table.
        assert result.stderr.count(f"ERROR {kind} `{name}`") == 1, (kind, name, result.stderr)
        assert f"{kind:19} {name} (since step" in result.stderr
    assert "module `aux_head` never ran" in result.stderr
    assert "kept in a plain Python list" in result.stderr
    assert "dtype conversion (`.to(torch.float64)`)" in result.stderr
    assert "leafwatch: summary after 4 optimizer steps" in result.stderr
    assert "not_in_optimizer" not in result.stderr


@pytest.mark.xdist_group("run_cli_runs")  # shares the module-scoped `runs` under pytest-xdist
def test_run_says_each_new_finding_in_one_short_line_and_keeps_causes_for_the_summary(runs):
    before, summary = runs["buggy"].stderr.split("leafwatch: summary after 4 optimizer steps")
    lines = [line for line in before.splitlines() if line.startswith("leafwatch: ")]
    assert len(lines) == len(BUGGY_MISTAKES)  # one line per mistake, nothing in between
    assert "leafwatch: ERROR missing_grad `aux_head` (2 tensors: aux_head.{bias,weight}) at step 1. " \
        "Fix (advice): call `aux_head` in forward()" in before
    assert "leafwatch: ERROR orphan_tensor `blocks` (4 tensors: {blocks[0],blocks[1]}.{bias,weight}) at step 1. " \
        "Fix (code): register the container where it is assigned: `self.blocks = nn.ModuleList([nn.Linear(4, 4), " \
        "nn.Linear(4, 4)])`" in before
    assert "cause" not in before and "never ran" not in before
    assert "cause: module `aux_head` never ran" in summary


def test_strict_stops_at_the_first_error_and_exits_non_zero():
    result = _leafwatch("run", "--strict", str(SCRIPTS / "buggy.py"))
    assert result.returncode == runner.STRICT_EXIT_CODE != 0
    assert "done" not in result.stdout  # stopped before the end of the loop
    assert "leafwatch: --strict stopped the script at optimizer step 1: ERROR missing_grad `aux_head`." in result.stderr
    assert "ERROR   orphan_tensor       scale" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.xdist_group("run_cli_runs")  # shares the module-scoped `runs` under pytest-xdist
def test_report_reads_the_same_findings_back_and_exits_1(runs):
    result = _leafwatch("report", str(runs["logdir"]))
    assert result.returncode == 1, result.stderr
    assert "run: exp/buggy" in result.stdout and "run: exp/gan" in result.stdout
    buggy_part = result.stdout.split("run: exp/gan")[0] if result.stdout.index("run: exp/buggy") == 0 else result.stdout.split("run: exp/buggy")[1]
    for kind, name in BUGGY_MISTAKES:
        assert f"ERROR   {kind:19} {name} (since step 1)" in buggy_part
    assert "module `aux_head` never ran" in buggy_part


@pytest.mark.xdist_group("run_cli_runs")  # shares the module-scoped `runs` under pytest-xdist
def test_report_json_holds_the_findings_of_every_nested_run(runs):
    result = _leafwatch("report", str(runs["logdir"]), "--json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert sorted(r["run"] for r in data["runs"]) == ["exp/buggy", "exp/gan"]
    assert _json_findings(data, "exp/buggy") == BUGGY_FINDINGS
    assert _json_findings(data, "exp/gan") == set()
    (buggy,) = [r for r in data["runs"] if r["run"] == "exp/buggy"]
    assert buggy["counts"]["orphan_tensor"] == 2 and buggy["counts"]["missing_grad"] == 1  # open mistakes


@pytest.mark.xdist_group("run_cli_runs")  # shares the module-scoped `runs` under pytest-xdist
@pytest.mark.parametrize(("fail_on", "code"), [("never", 0), ("warning", 1)])
def test_report_fail_on_sets_the_exit_code(runs, fail_on, code):
    result = _leafwatch("report", str(runs["logdir"] / "exp" / "buggy"), "--fail-on", fail_on)
    assert result.returncode == code
    assert "orphan_tensor       scale" in result.stdout


@pytest.mark.xdist_group("run_cli_runs")  # shares the module-scoped `runs` under pytest-xdist
def test_report_of_a_clean_run_exits_0(runs):
    result = _leafwatch("report", str(runs["logdir"] / "exp" / "gan"))
    assert result.returncode == 0
    assert result.stdout.startswith("run: gan\nleafwatch: no findings")  # the folder's name, not "."


def test_report_without_leafwatch_data_exits_2(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("no events here")
    result = _leafwatch("report", str(tmp_path))
    assert result.returncode == 2
    assert "no leafwatch data under" in result.stderr and result.stdout == ""
    missing = _leafwatch("report", str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.splitlines() == [f"leafwatch report: `LOGDIR` {str(tmp_path / 'nope')!r} does not exist"]


def test_report_of_a_file_says_it_is_a_file_and_exits_2(tmp_path, monkeypatch):
    (tmp_path / "afile.txt").write_text("not a folder")
    result = _leafwatch("report", "afile.txt", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == ["leafwatch report: `LOGDIR` 'afile.txt' is a file, not a folder"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="^`logdir` 'afile.txt' is a file, not a folder$"):
        read_reports("afile.txt")


def test_report_ignores_event_files_written_by_others(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path / "plain")) as writer:
        writer.add_scalar("loss", 1.0, 1)
    assert read_reports(str(tmp_path)) == []
    assert _leafwatch("report", str(tmp_path)).returncode == 2


@pytest.mark.xdist_group("run_cli_runs")  # shares the module-scoped `runs` under pytest-xdist
def test_gan_with_alternating_optimizers_gives_no_false_alarm(runs):
    result = runs["gan"]
    assert result.returncode == 0, result.stderr
    assert result.stdout == "gan done\n"
    assert "leafwatch: summary after 8 optimizer steps\nleafwatch: no findings" in result.stderr
    assert "not_in_optimizer" not in result.stderr
    (gan,) = [r for r in read_reports(str(runs["logdir"])) if r.run == "exp/gan"]
    assert gan.report.findings == []
    assert gan.report.step == 8


def test_a_run_of_one_step_is_decided_at_its_end():
    # The only step is checked, its forward traced from the first module call: the three mistakes
    # and the cause of the unused head, as in a longer run.
    result = _leafwatch("run", str(SCRIPTS / "buggy.py"), "--steps", "1")
    assert result.returncode == 0, result.stderr
    summary = result.stderr.split("leafwatch: summary after 1 optimizer step\n", 1)[1]
    assert summary.startswith("leafwatch: 3 open of 3 finding(s) at step 1")  # three mistakes, seven tensors
    for kind, name in BUGGY_MISTAKES:
        assert f"ERROR   {kind:19} {name} (since step 1)" in summary
    assert "cause: module `aux_head` never ran in this step's forward (the root module ran, but did not call it)." in summary


def test_clean_script_gives_no_findings_and_identical_stdout():
    plain = _python(str(SCRIPTS / "clean.py"), "4")
    watched = _leafwatch("run", str(SCRIPTS / "clean.py"), "4")
    assert plain.returncode == watched.returncode == 0
    assert watched.stdout.encode() == plain.stdout.encode()
    assert plain.stdout.count("loss") == 4
    assert "leafwatch: summary after 4 optimizer steps\nleafwatch: no findings at step 4" in watched.stderr
    assert "ERROR" not in watched.stderr and "WARNING" not in watched.stderr


@pytest.mark.parametrize(("args", "code"), [((), 3), (("7",), 7)])
def test_the_scripts_exit_code_is_passed_through(args, code):
    result = _leafwatch("run", str(SCRIPTS / "exits.py"), *args)
    assert result.returncode == code


def test_an_exception_in_the_script_exits_1_with_its_traceback():
    result = _leafwatch("run", str(SCRIPTS / "raises.py"))
    assert result.returncode == 1
    assert "Traceback (most recent call last):" in result.stderr
    assert 'raises.py", line 7, in diverge' in result.stderr
    assert result.stderr.rstrip().splitlines()[-3] == "ValueError: loss diverged: nan"
    assert leafwatch_frames(result.stderr, REPO) == [] and "runpy" not in result.stderr  # no runner frame


def test_the_script_sees_its_argv_name_and_folder():
    script = SCRIPTS / "show_argv.py"
    plain = json.loads(_python(str(script), "a", "--b", "c", "--strict").stdout)
    result = _leafwatch("run", str(script), "a", "--b", "c", "--strict")
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen == plain
    assert seen["argv"] == [str(script), "a", "--b", "c", "--strict"]
    assert seen["name"] == "__main__" and seen["path0"] == str(SCRIPTS) and seen["helper"] == 42
    assert "no optimizer stepped, nothing was checked" in result.stderr


def test_module_form_runs_a_module_as_main_with_its_arguments():
    result = _leafwatch("run", "--patience", "1", "-m", "helper_module", "x", "--strict", cwd=SCRIPTS)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "module argv ['x', '--strict']\n"
    # The ModuleDict never runs a forward of its own: it is found in the training loop's frame.
    assert "ERROR missing_grad `unused` (2 tensors: unused.{bias,weight}) at step 1" in result.stderr
    assert "module `unused` never ran" in result.stderr
    assert "tensor of shape" not in result.stderr
    # Neither the container nor the unused layer (no gradient) says the script calls `.forward()`.
    assert "module(x)" not in result.stderr


def test_closure_optimizers_are_checked_after_their_step():
    result = _leafwatch("run", str(SCRIPTS / "lbfgs.py"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "lbfgs done\n"
    assert [line.split("`")[1] for line in result.stderr.splitlines() if line.startswith("leafwatch: ERROR")] == ["1"]
    assert "`1` (2 tensors: 1.{bias,weight})" in result.stderr
    assert "module `1` never ran" in result.stderr
    assert "`0.weight`" not in result.stderr


def test_ignore_marks_findings_ignored_with_the_reason(tmp_path):
    result = _leafwatch("run", "--logdir", str(tmp_path), "--ignore", "aux_head.*=kept for fine-tuning",
                        "--ignore", "blocks*", str(SCRIPTS / "buggy.py"))
    assert result.returncode == 0
    assert "ERROR missing_grad `aux_head`" not in result.stderr
    # Shown as ignored, with the reason given on the command line (not "ERROR ... [ignored]").
    assert "  IGNORED missing_grad        aux_head (since step 1)\n" in result.stderr
    assert "      ignored: kept for fine-tuning (pattern 'aux_head.*')\n" in result.stderr
    assert "      ignored: ignored on the command line (pattern 'blocks*')\n" in result.stderr
    assert "[ignored]" not in result.stderr
    (run,) = read_reports(str(tmp_path))
    statuses = {f.name: (f.status, f.details.get("ignored_because")) for f in run.report.tensors()}
    assert statuses["aux_head.weight"] == ("ignored", "kept for fine-tuning")
    assert statuses["blocks[1].bias"] == ("ignored", "ignored on the command line")
    assert statuses["scale"] == ("open", None)


@pytest.mark.parametrize(
    ("args", "message"),
    [((), "give a script to run"), (("missing_script.py",), "can't open file"), (("-m",), "-m needs a module name")],
)
def test_run_without_a_target_exits_2(args, message):
    result = _leafwatch("run", *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_parse_ignore_reads_pattern_and_reason():
    assert runner.parse_ignore(["a.*=why = so", "b"]) == {"a.*": "why = so", "b": "ignored on the command line"}
    with pytest.raises(ValueError, match="non-empty pattern, got '=why'"):
        runner.parse_ignore(["=why"])


# -- in process: the roots, the naming and the hooks' lifetime ----------------------------------
class _Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 3)
        self.unused = nn.Linear(2, 3)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class _Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _global_module_hooks() -> int:
    module_mod = torch.nn.modules.module
    return len(module_mod._global_forward_pre_hooks) + len(module_mod._global_forward_hooks)


def test_several_roots_get_class_name_prefixes_and_hooks_go_once_stable():
    """The discovery's global forward pre-hook goes once the roots are stable; the diagnostic tracer's
    global forward hook stays while the miss of `unused` is diagnosed, and goes at the close."""
    module_mod = torch.nn.modules.module
    before, pre_before = _global_module_hooks(), len(module_mod._global_forward_pre_hooks)
    session = runner.Session(stream=open(os.devnull, "w"))
    session.install()
    generator, critic, teacher = _Generator(), _Critic(), _Critic()
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(critic.parameters(), lr=0.1)
    loss_fn = nn.MSELoss()
    try:
        assert session.module_hooks_armed and _global_module_hooks() == before + 1
        for _ in range(4):
            fake = generator(torch.randn(4, 2))
            with torch.no_grad():
                teacher(fake)  # runs every step, but no optimizer holds it: not judged
            opt_c.zero_grad()
            loss_fn(critic(fake.detach()), torch.zeros(4, 1)).backward()
            opt_c.step()
            opt_g.zero_grad()
            critic(fake).sum().backward()
            opt_g.step()
        assert not session.module_hooks_armed and len(module_mod._global_forward_pre_hooks) == pre_before
        assert _global_module_hooks() == before + 1  # the tracer's, diagnosing `unused`
        assert set(session.roots) == {"_Generator", "_Critic"}
        assert session.roots["_Critic"] is critic
    finally:
        report = session.close()
        session.stream.close()
    assert _global_module_hooks() == before
    assert {(f.kind, m.name) for f in report.open for m in f.members} == {
        ("missing_grad", "_Generator.unused.weight"), ("missing_grad", "_Generator.unused.bias")}
    assert [f.name for f in report.open] == ["_Generator.unused"]  # one unused layer: one mistake
    assert report.names("not_in_optimizer") == set()


def test_an_optimizer_with_parameters_of_no_known_module_rearms_the_hooks():
    session = runner.Session(stream=open(os.devnull, "w"))
    session.install()
    model = nn.Linear(2, 2)
    late = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for _ in range(4):
            opt.zero_grad()
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
        assert not session.module_hooks_armed
        opt2 = torch.optim.SGD(late.parameters(), lr=0.1)
        opt2.zero_grad()
        late(torch.ones(1, 2)).sum().backward()
        opt2.step()  # new parameters that no known module owns: watch modules again
        assert session.module_hooks_armed
        for _ in range(3):
            opt2.zero_grad()
            opt.zero_grad()
            (late(model(torch.ones(1, 2)))).sum().backward()
            opt.step()
            opt2.step()
        assert not session.module_hooks_armed
        assert set(session.roots) == {"Linear", "Linear_1"}
    finally:
        report = session.close()
        session.stream.close()
    assert report.open == []


class _LeftOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.aux, self.unused = nn.Linear(2, 1), nn.Linear(2, 1), nn.Linear(2, 1)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


@pytest.mark.parametrize("steps", [1, 5])
def test_a_run_of_one_step_is_decided_by_the_pipeline_as_a_longer_one(steps):
    # `scale` gets gradients in no optimizer (an error), `unused` gets none in no optimizer (the
    # gradient rule: quiet), `aux` is in the optimizer and never runs; ignore= is the history's.
    session = runner.Session(stream=open(os.devnull, "w"), ignore={"aux.*": "kept"})
    session.install()
    model = _LeftOut()
    opt = torch.optim.SGD([*model.lin.parameters(), *model.aux.parameters()], lr=0.1)
    try:
        for _ in range(steps):
            opt.zero_grad()
            model(torch.ones(4, 2)).sum().backward()
            opt.step()
    finally:
        report = session.close()
        session.stream.close()
    assert session.monitor is not None and session.monitor.history  # the Monitor's history holds them
    assert {(f.kind, f.name, f.status) for f in report.tensors()} == {
        ("not_in_optimizer", "scale", "open"), ("missing_grad", "aux.weight", "ignored"),
        ("missing_grad", "aux.bias", "ignored")}
    (scale,) = report.tensors("not_in_optimizer")
    assert scale.severity == "error" and "never changes" in scale.message
    # Every run is checked from its first step: decided at the end by the late decision, which keeps why.
    assert (scale.reason.name, scale.reason.observed) == ("no_optimizer_stepped", "left_out")
    if steps == 1:
        (aux, _) = report.tensors("missing_grad")
        assert aux.cause == "module `aux` never ran in this step's forward (the root module ran, but did not call it)."
        assert aux.details["ignored_because"] == "kept"


def test_run_names_module_level_tensors_trained_outside_the_model():
    result = _leafwatch("run", str(SCRIPTS / "outside_tensors.py"))
    assert result.returncode == 0, result.stderr
    assert "ERROR not_in_optimizer `temperature`" in result.stderr
    assert "gets gradients but is in no optimizer" in result.stderr
    assert "ERROR non_leaf `shift`" in result.stderr
    assert "dtype conversion" in result.stderr
    for name in ("out", "loss", "model"):
        assert f"`{name}`" not in result.stderr, "an output or a loss kept at module level is no finding"
    assert "runs inside a function" not in result.stderr


def test_run_says_where_it_cannot_see_tensors():
    result = _leafwatch("run", str(SCRIPTS / "loop_in_function.py"))
    assert result.returncode == 0, result.stderr
    assert "the training loop runs inside a function" in result.stderr
    assert "leafwatch.watch(t)" in result.stderr


def test_run_names_parameters_of_modules_called_through_forward():
    result = _leafwatch("run", str(SCRIPTS / "forward_forward.py"))
    assert result.returncode == 0, result.stderr
    assert "ERROR missing_grad `Layer_1.bias`" in result.stderr
    assert "called through `.forward()` directly" in result.stderr
    assert "call the module itself" in result.stderr
    assert "weight" not in {line.split("`")[1].split(".")[-1] for line in result.stderr.splitlines()
                            if line.startswith("leafwatch: ERROR")}
    assert "the script calls `.forward()` directly, where module hooks cannot see" in result.stderr
    assert "being traced" not in result.stderr.split("summary after")[1]


@pytest.mark.parametrize(("script", "called_directly"), [
    ("forward_called_directly.py", True),  # `model.forward(x)`: its tensors get gradients, its hooks never fire
    ("parameters_outside_modules.py", False),  # `model(x)`, the tensors in a store outside the module
    ("pyro_regression.py", False),  # the same with Pyro: `pyro.param` tensors, a PyroModule run by SVI
])
def test_run_says_the_script_calls_forward_directly_only_when_it_saw_it(script: str, called_directly: bool):
    if script.startswith("pyro"):
        require_module("pyro")
    result = _leafwatch("run", str(SCRIPTS / script))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert "leafwatch: no findings at step" in result.stderr
    assert ("the script calls `.forward()` directly, where module hooks cannot see" in result.stderr) is called_directly
    assert ("module(x)" in result.stderr) is called_directly


# -- exit codes: the table and the exit code agree -------------------------------------------------
def test_strict_exits_1_for_an_error_decided_at_the_end_of_a_short_run(tmp_path):
    result = _leafwatch("run", "--strict", "--logdir", str(tmp_path), str(SCRIPTS / "left_out.py"))
    assert result.returncode == runner.STRICT_EXIT_CODE == 1, result.stderr
    assert result.stdout == "done 10 steps\n"  # the error was decided when the run ended
    live, summary = result.stderr.split("leafwatch: summary after 10 optimizer steps")
    # the script's own optimizer (`optimizer`, an SGD) and model variable, read while the script ran
    assert live == "leafwatch: ERROR not_in_optimizer `scale` seen at step 1, decided at step 10. Fix (code): add it " \
        "to `optimizer` (your `SGD`, its groups as they are): `optimizer.add_param_group({\"params\": " \
        "[model.scale]})`; the new group takes `optimizer`'s defaults (lr, weight decay, ...), an `\"lr\"` key " \
        "in the dict sets its own; or freeze it with `requires_grad_(False)`; if that is intended, silence it: " \
        "`ignore=[\"scale\"]`\n"
    assert "ERROR   not_in_optimizer    scale (since step 1, decided at step 10)" in result.stderr
    assert "leafwatch: --strict: the run ended with 1 open error(s) (first: not_in_optimizer `scale`): exit 1." \
        in result.stderr
    report = _leafwatch("report", str(tmp_path))
    assert report.returncode == 1
    assert "ERROR   not_in_optimizer    scale (since step 1, decided at step 10)" in report.stdout


def test_without_strict_an_open_error_keeps_exit_code_0():
    result = _leafwatch("run", str(SCRIPTS / "left_out.py"))
    assert result.returncode == 0, result.stderr
    assert "ERROR   not_in_optimizer    scale (since step 1, decided at step 10)" in result.stderr
    assert "--strict" not in result.stderr


def test_strict_stops_the_script_when_the_grace_period_decides_an_error(tmp_path):
    # not_in_optimizer waits LATE_OPTIMIZER_CHECKS checks (an optimizer may step late), then is decided.
    result = _leafwatch("run", "--strict", "--logdir", str(tmp_path), str(SCRIPTS / "left_out.py"), "--steps", "60")
    decided = runner.LATE_OPTIMIZER_CHECKS + 1  # checks start at step 1
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""  # stopped before the end of the loop
    live, summary = result.stderr.split("leafwatch: summary after")
    assert f"leafwatch: ERROR not_in_optimizer `scale` seen at step 1, decided at step {decided}. Fix (code):" in live
    assert "WARNING" not in result.stderr
    assert f"--strict stopped the script at optimizer step {decided}: ERROR not_in_optimizer `scale`." in live
    assert f"ERROR   not_in_optimizer    scale (since step 1, decided at step {decided})" in summary
    assert f"no optimizer that stepped in {decided} checks holds it" in summary
    (run,) = read_reports(str(tmp_path))
    (f,) = run.report.findings
    assert (f.kind, f.name, f.severity, f.first_step, f.details["decided_step"]) == (
        "not_in_optimizer", "scale", "error", 1, decided)
    assert (f.reason.name, f.reason.observed) == ("no_optimizer_stepped", "left_out")
    assert "left out when the optimizer's parameter list was built" in f.cause


def test_the_scripts_own_non_zero_exit_code_comes_before_strict():
    result = _leafwatch("run", "--strict", str(SCRIPTS / "left_out.py"), "--exit-code", "3")
    assert result.returncode == 3, result.stderr
    assert "ERROR   not_in_optimizer    scale" in result.stderr


def test_an_unusable_logdir_exits_2_before_the_script_runs(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    logdir = blocker / "runs"
    result = _leafwatch("run", "--strict", "--logdir", str(logdir), str(SCRIPTS / "left_out.py"))
    assert result.returncode == runner.USAGE_EXIT_CODE == 2
    assert result.stdout == ""  # the script did not run
    assert result.stderr.splitlines() == [
        f"leafwatch run: `--logdir` {str(logdir)!r} cannot be created: {str(blocker)!r} is a file, not a folder"]


def test_a_logdir_that_is_a_file_exits_2_before_the_script_runs(tmp_path):
    (tmp_path / "afile.txt").write_text("not a folder")
    result = _leafwatch("run", "--logdir", "afile.txt", str(SCRIPTS / "left_out.py"), cwd=tmp_path)
    assert result.returncode == runner.USAGE_EXIT_CODE == 2
    assert result.stdout == ""  # the script did not run
    assert result.stderr.splitlines() == ["leafwatch run: `--logdir` 'afile.txt' is a file, not a folder"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_read_only_logdir_exits_2(tmp_path):
    logdir = tmp_path / "ro"
    logdir.mkdir()
    logdir.chmod(0o500)
    try:
        result = _leafwatch("run", "--logdir", str(logdir), str(SCRIPTS / "left_out.py"))
    finally:
        logdir.chmod(0o700)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"leafwatch run: `--logdir` {str(logdir)!r} is not writable (Permission denied)"]


def test_run_help_lists_the_exit_codes_in_order():
    result = _leafwatch("run", "--help")
    assert result.returncode == 0
    text = result.stdout
    order = [text.index(line) for line in ("the script's own non-zero exit code", "2   bad arguments",
                                           "1   --strict and an open error", "70  --strict and a part",
                                           "0   otherwise")]
    assert order == sorted(order)


def test_an_internal_failure_under_strict_exits_70_and_says_the_check_is_incomplete(monkeypatch, capsys):
    import leafwatch.monitor
    from leafwatch.options import LeafwatchInternalWarning

    def broken(self, *args, **kwargs):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(leafwatch.monitor.Monitor, "check", broken)
    with pytest.warns(LeafwatchInternalWarning, match="internal failure in the optimizer step hook"):
        code = runner.run(str(SCRIPTS / "clean.py"), ["3"], strict=True)
    assert code == runner.INCOMPLETE_EXIT_CODE == 70
    err = capsys.readouterr().err
    assert "leafwatch: incomplete: the optimizer step hook failed inside leafwatch" in err
    assert "--strict: the check is incomplete (the optimizer step hook failed): exit 70." in err
    with pytest.warns(LeafwatchInternalWarning):
        assert runner.run(str(SCRIPTS / "clean.py"), ["3"]) == 0  # without --strict: 0


@pytest.mark.parametrize(("script_code", "errors", "incomplete", "strict", "expected"), [
    (5, True, True, True, 5), (0, True, True, True, 1), (0, False, True, True, 70),
    (0, True, True, False, 0), (0, False, False, True, 0)])
def test_exit_code_precedence(script_code, errors, incomplete, strict, expected):
    from leafwatch import Finding, Report

    findings = [Finding("not_in_optimizer", "scale", "error", "never changes", first_step=2)] if errors else []
    assert runner.exit_code(script_code, Report(findings, step=9), strict=strict, incomplete=incomplete) == expected


# -- the end of the run decides what is left -------------------------------------------------------
def test_a_nan_at_step_three_of_six_is_named_at_step_three_and_strict_stops_there(tmp_path):
    result = _leafwatch("run", "--strict", "--logdir", str(tmp_path), str(SCRIPTS / "nan_at_step_three.py"))
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    # One NaN, one mistake: every tensor whose gradient holds it is listed.
    assert "leafwatch: ERROR nonfinite_grad `{bias,weight}` (2 tensors) at step 3. Fix (advice):" in result.stderr
    assert "--strict stopped the script at optimizer step 3: ERROR nonfinite_grad" in result.stderr
    assert "ERROR   nonfinite_grad      {bias,weight} (since step 3)" in result.stderr
    (run,) = read_reports(str(tmp_path))
    assert {(f.kind, f.name, f.first_step) for f in run.report.tensors() if f.is_open} == {
        ("nonfinite_grad", "weight", 3), ("nonfinite_grad", "bias", 3)}


def test_a_nan_at_step_three_of_six_without_strict_runs_to_the_end():
    result = _leafwatch("run", str(SCRIPTS / "nan_at_step_three.py"))
    assert result.returncode == 0 and result.stdout == "done\n"
    assert "ERROR   nonfinite_grad      {bias,weight} (since step 3)" in result.stderr


def test_an_optimizer_that_never_steps_is_named_at_the_end_when_its_network_is_a_separate_object(tmp_path):
    result = _leafwatch("run", "--strict", "--logdir", str(tmp_path), str(SCRIPTS / "gan_separate.py"))
    assert result.returncode == 1, result.stderr
    assert result.stdout == "gan done\n"  # a warning while it may still step: the script runs on
    live, summary = result.stderr.split("leafwatch: summary after 40 optimizer steps")
    # The generator is one mistake, named by the script's variable: its four tensors listed.
    assert "WARNING not_in_optimizer `generator` (4 tensors: generator.{0,2}.{bias,weight}) seen at step 1, " \
        "decided at step 26. Fix (code): call `opt_g.step()` after the backward pass" in live
    names = {"generator.0.weight", "generator.0.bias", "generator.2.weight", "generator.2.bias"}
    assert "ERROR   not_in_optimizer    generator (since step 1, decided at step 40)" in summary
    assert "each of `generator.{0,2}.{bias,weight}` is held only by an optimizer that never stepped in 40 checks" \
        in summary
    # The cause and the fix say the same thing: `opt_g` holds it and is never stepped.
    assert "cause: `opt_g` (an `Adam`) was created with it, but its `step()` is never called" in summary
    assert "fix (code): call `opt_g.step()` after the backward pass that computes its gradients" in summary
    assert "opt_d" not in summary
    # The critic trains, but for its last bias: `-critic(real).mean() + critic(fake).mean()` cancels
    # its gradient exactly, and the streak of zeros, read from step 1, is named.
    assert "WARNING dead_grad           critic.2.bias (since step 40)" in summary
    assert {line.split("`")[1] for line in result.stderr.splitlines() if "`critic." in line} == {"critic.2.bias"}
    (run,) = read_reports(str(tmp_path))
    assert run.report.names("not_in_optimizer") == names
    assert {(f.kind, f.severity) for f in run.report.open} == {("not_in_optimizer", "error"), ("dead_grad", "warning")}
    assert {(f.reason.name, f.remedy.applicability) for f in run.report.open if f.kind == "not_in_optimizer"} \
        == {("never_stepped", "code")}


def test_a_script_without_modules_gets_a_sentence_that_fits_it():
    result = _leafwatch("run", str(SCRIPTS / "no_module.py"))
    assert result.returncode == 0, result.stderr
    assert "leafwatch: no findings at step 5" in result.stderr
    assert "the script trains no `nn.Module`: its optimizers hold plain tensors" in result.stderr
    assert ".forward()" not in result.stderr and "inside a function" not in result.stderr


def test_a_plain_tensor_in_the_optimizer_without_a_gradient_is_named_by_its_variable():
    result = _leafwatch("run", "--strict", str(SCRIPTS / "no_module_unused.py"))
    assert result.returncode == 1, result.stderr
    assert "ERROR missing_grad `w` at step 1" in result.stderr
    assert "`b`" not in result.stderr


def test_a_module_level_loop_is_never_told_it_runs_inside_a_function():
    # The optimizers are kept in a dict: no module-level variable holds one.
    result = _leafwatch("run", "--strict", str(SCRIPTS / "actor_critic.py"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "actor-critic done\n"
    assert "leafwatch: no findings at step 60" in result.stderr
    assert "inside a function" not in result.stderr


# -- discovery: the gradient rule for modules no optimizer holds a tensor of ------------------------
def test_a_script_level_module_used_in_the_loss_and_in_no_optimizer_is_named(tmp_path):
    result = _leafwatch("run", "--strict", "--logdir", str(tmp_path), str(SCRIPTS / "calib_outside.py"))
    assert result.returncode == 0, result.stderr  # a warning: a forgotten optimizer, or a fixed network
    assert result.stdout == "done\n"
    fix = ('add it to `optimizer` (your `SGD`, its groups as they are): `optimizer.add_param_group({"params": '
           "calib.parameters()})`; the new group takes `optimizer`'s defaults (lr, weight decay, ...), an "
           '`"lr"` key in the dict sets its own; or, if it should stay fixed, `calib.requires_grad_(False)`')
    assert ("leafwatch: WARNING not_in_optimizer `calib` (2 tensors: calib.{bias,weight}) seen at step 1, "
            f"decided at step 26. Fix (code): {fix}") in result.stderr
    assert "each of `calib.{bias,weight}` gets gradients but no optimizer holds it, nor any tensor of `calib`" \
        in result.stderr
    (run,) = read_reports(str(tmp_path))
    assert {(f.kind, f.name, f.severity) for f in run.report.tensors() if f.is_open} == {
        ("not_in_optimizer", "calib.weight", "warning"), ("not_in_optimizer", "calib.bias", "warning")}
    assert {f.details["root"] for f in run.report.open} == {"calib"}


def test_a_twin_critic_left_out_of_its_optimizer_is_named_not_its_per_step_q_values():
    result = _leafwatch("run", "--strict", str(SCRIPTS / "td3_twin_left_out.py"))
    assert result.returncode == 0, result.stderr
    named = [line.split("`")[1] for line in result.stderr.splitlines() if line.startswith("leafwatch: WARNING")]
    assert named == ["critic2"]  # the twin critic, by its variable: one mistake
    assert "`critic2` (4 tensors: critic2.{0,2}.{bias,weight})" in result.stderr
    assert "`critic2.requires_grad_(False)`" in result.stderr
    assert "ERROR" not in result.stderr and "non_leaf" not in result.stderr
    for per_step in ("q1", "q2", "critic_loss", "actor_loss", "tq"):
        assert f"`{per_step}`" not in result.stderr


def test_a_module_updated_by_hand_is_no_finding():
    result = _leafwatch("run", "--strict", str(SCRIPTS / "updated_by_hand.py"))
    assert result.returncode == 0, result.stderr
    assert "leafwatch: no findings at step 40" in result.stderr


def test_a_network_recreated_after_its_optimizer_was_built_is_found_as_the_live_owner(tmp_path):
    result = _leafwatch("run", "--strict", "--logdir", str(tmp_path), str(SCRIPTS / "recreated_network.py"))
    assert result.returncode == 1, result.stderr
    names = {"0.weight", "0.bias", "2.weight", "2.bias"}
    # One stale optimizer, one mistake: the script's own `optimizer`, its statement moved below the line that
    # rebuilt the network (#54 item 3: no old tensor stays in it).
    assert ("leafwatch: ERROR stale_param `optimizers[0]` (4 tensors: {0,2}.{bias,weight}) at step 1. Fix (code): build "
            "`optimizer` after the last change to the model, so that it holds the new parameters and none of the old "
            "ones: move its statement right below the change at recreated_network.py:9: `optimizer = "
            "torch.optim.SGD(model.parameters(), lr=0.1)` (the same class, groups and settings)") in result.stderr
    assert "each of `{0,2}.{bias,weight}` was replaced after the optimizer was built" in result.stderr
    assert "tensor of shape" not in result.stderr and "missing_grad" not in result.stderr
    (run,) = read_reports(str(tmp_path))
    assert run.report.names("stale_param") == names


def test_a_model_converted_after_its_optimizer_was_built_is_an_error_for_every_new_tensor(tmp_path):
    """`model = to_hetero(model, metadata)` after the optimizer: the optimizer holds the old tensors of this
    very model, so every new tensor is an error of the stale optimizer (never the warning of a module no
    optimizer ever held), and the fix, run in the script's scope after the conversion, gives the optimizer the new
    model (its statement, moved there: #54 item 3)."""
    result = _leafwatch("run", "--logdir", str(tmp_path), str(SCRIPTS / "to_hetero_after_optimizer.py"))
    assert result.returncode == 0 and result.stdout == "trained\n", result.stderr
    (run,) = read_reports(str(tmp_path))
    (f,) = run.report.open
    assert (f.kind, f.name, f.severity) == ("stale_param", "optimizers[0]", "error")
    assert run.report.names("stale_param") == {f"conv{i}.{t}.{w}" for i in (1, 2) for w in ("weight", "bias")
                                               for t in ("paper__cites__paper", "author__writes__paper")}
    assert {(m.severity, m.reason.name) for m in f.members} == {("error", "module_replaced")}
    assert "no optimizer holds any of the new ones" in f.cause and "WARNING" not in result.stderr
    import runpy

    scope = runpy.run_path(str(SCRIPTS / "to_hetero_after_optimizer.py"))
    (code,) = [c for c in fixes.code_spans(f.fix) if c.startswith("optimizer = ")]
    assert code == "optimizer = torch.optim.Adam(model.parameters(), lr=0.01)"
    assert "move its statement right below the change at to_hetero_after_optimizer.py:37" in f.fix
    exec(code, scope)
    held = [id(p) for g in scope["optimizer"].param_groups for p in g["params"]]
    assert sorted(held) == sorted(id(p) for p in scope["model"].parameters())  # the new model's, and only those


# -- fixes that name the user's own objects --------------------------------------------------------
SKORCH_LIKE = '''"""skorch's NeuralNet, rebuilt: it keeps the module as `module_` and the optimizer as
`optimizer_`, and runs the training loop in its own `fit`."""
import torch


class NeuralNet:
    def __init__(self, module, lr=0.1):
        self.module, self.lr = module, lr

    def initialize(self):
        self.module_ = self.module()
        # the parameters the optimizer gets (skorch: `optimizer__params`), the head left out
        self.optimizer_ = torch.optim.SGD(self.module_.body.parameters(), lr=self.lr)

    def fit(self, X, y, epochs=4):
        self.initialize()
        for _ in range(epochs):
            for i in range(0, len(X), 4):
                self.optimizer_.zero_grad()
                loss = torch.nn.functional.mse_loss(self.module_(X[i:i + 4]), y[i:i + 4])
                loss.backward()
                self.optimizer_.step()
        return self
'''

SKORCH_SCRIPT = '''import torch
from torch import nn
from skorch_like import NeuralNet


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


net = NeuralNet(Model)
net.fit(torch.randn(16, 3), torch.randn(16, 1))
print("fit")
'''


def test_a_library_that_keeps_the_optimizer_is_named_by_the_users_path_never_by_its_self(tmp_path):
    """skorch keeps the optimizer as `net.optimizer_` and the module as `net.module_`: the fix names
    them so, never the library's own `self` nor its loop."""
    library = tmp_path / "site-packages"
    library.mkdir()
    (library / "skorch_like.py").write_text(SKORCH_LIKE)
    script = tmp_path / "train.py"
    script.write_text(SKORCH_SCRIPT)
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join((str(library), env["PYTHONPATH"]))
    result = _warm.run([sys.executable, "-m", "leafwatch", "run", "--logdir", str(tmp_path / "logs"), str(script)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert result.returncode == 0 and result.stdout == "fit\n", result.stderr
    (run,) = read_reports(str(tmp_path / "logs"))
    (f,) = run.report.open
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "head", "error")
    code = 'net.optimizer_.add_param_group({"params": net.module_.head.parameters()})'
    assert f"`{code}`" in f.fix
    assert "self." not in f.fix
    assert "runs inside a function" not in result.stderr  # the script calls fit at its module level
    # The fix runs where the script holds `net` (its optimizer, its module) and mends it.
    import importlib.util

    spec = importlib.util.spec_from_file_location("skorch_like", library / "skorch_like.py")
    skorch_like = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(skorch_like)
    scope: dict = {"NeuralNet": skorch_like.NeuralNet}
    exec(SKORCH_SCRIPT.replace("from skorch_like import NeuralNet\n", "").replace(
        "net.fit(torch.randn(16, 3), torch.randn(16, 1))", "net.initialize()"), scope)
    net = scope["net"]
    exec(code, {"net": net})
    assert {id(p) for g in net.optimizer_.param_groups for p in g["params"]} == {id(p) for p in net.module_.parameters()}


def test_a_lora_text_encoder_left_out_of_every_optimizer_is_an_error_its_intent_is_plain(tmp_path):
    """Only the adapter of `text_encoder` requires grad (someone chose what trains) and no optimizer
    holds any of its tensors: an error, the forgotten optimizer first; never the fixed-network
    reading of a module that requires grad as a whole (that stays a warning: the calib test)."""
    result = _leafwatch("run", "--logdir", str(tmp_path), str(SCRIPTS / "lora_text_encoder_left_out.py"))
    assert result.returncode == 0 and result.stdout == "trained\n", result.stderr
    (run,) = read_reports(str(tmp_path))
    (f,) = run.report.open
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "text_encoder", "error")
    assert run.report.names("not_in_optimizer") == {
        f"text_encoder.{i}.lora_{ab}.weight" for i in (0, 2) for ab in ("A", "B")}
    assert (f.reason.name, f.remedy.applicability) == ("chosen_outside", "code")
    assert "only some of its tensors require grad" in f.cause
    assert f.fix.startswith('add it to `optimizer` (your `AdamW`, its groups as they are): '
                            '`optimizer.add_param_group({"params": [p for p in text_encoder.parameters() '
                            'if p.requires_grad]})`')
    assert "requires_grad_(False)" not in f.fix
    # Pasted in the script's scope, it gives `optimizer` the adapter (and only the adapter).
    import runpy

    scope = runpy.run_path(str(SCRIPTS / "lora_text_encoder_left_out.py"))
    exec(next(c for c in fixes.code_spans(f.fix) if "add_param_group" in c), scope)
    added = scope["optimizer"].param_groups[-1]["params"]
    assert {id(p) for p in added} == {id(p) for p in scope["text_encoder"].parameters() if p.requires_grad}


def test_a_run_whose_script_never_steps_leaves_no_hook_on_the_modules_that_ran(tmp_path, capsys, monkeypatch):
    # The run's Monitor is built at the first forward and arms hooks there; with no optimizer step
    # no check ran, and closing the run still takes every hook off the script's modules.
    script = tmp_path / "forward_only.py"
    script.write_text("import torch\nfrom torch import nn\n"
                      "model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))\n"
                      "model(torch.randn(4, 2)).sum().backward()\n")
    scope: dict = {}
    real_run_path = runner.command.runpy.run_path
    monkeypatch.setattr(runner.command.runpy, "run_path", lambda path, run_name=None: scope.update(
        real_run_path(path, run_name=run_name)))
    assert runner.run(str(script)) == 0
    assert "leafwatch: no optimizer stepped, nothing was checked." in capsys.readouterr().err
    assert len(list(scope["model"].modules())) == 3
    for module in scope["model"].modules():
        assert not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks), module


def test_a_folder_without_main_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "my_folder").mkdir()
    run = _leafwatch("run", str(tmp_path / "my_folder"))
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [f"leafwatch run: can't find '__main__.py' in {str(tmp_path / 'my_folder')!r}: "
                                       "give a script of that folder, or add a __main__.py to run the folder"]


def test_run_m_of_a_package_without_main_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('the package must not be imported')\n")
    run = _leafwatch("run", "-m", "pkg", cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == ["leafwatch run: No module named pkg.__main__; 'pkg' is a package and cannot be "
                                       "directly executed (it has no __main__.py)"]

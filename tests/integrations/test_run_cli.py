"""``leafwatch run`` and ``leafwatch report`` on real plain-PyTorch scripts, in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from leafwatch.integrations import runner
from leafwatch.report_cli import read_reports

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


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONHASHSEED"] = "0"
    return env


def _leafwatch(command: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "leafwatch", command, *args], capture_output=True, text=True,
                            env=_env(), cwd=cwd or REPO, timeout=240)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr  # leafwatch's own failure fails the test
    return result


def _python(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(),
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
    (found,) = [r for r in data["runs"] if r["run"] == run]
    return {(f["kind"], f["name"]) for f in found["findings"] if f["status"] == "open"}


@pytest.mark.xdist_group("run_cli_runs")  # shares the module-scoped `runs` under pytest-xdist
def test_run_names_each_bug_on_stderr_and_exits_with_the_scripts_code(runs):
    result = runs["buggy"]
    assert result.returncode == 5, result.stderr
    assert result.stdout == "done 4 steps\n"
    for kind, name in BUGGY_FINDINGS:
        # Printed once when it appears, and once more in the summary table.
        assert result.stderr.count(f"ERROR {kind} `{name}` at step") == 1, (kind, name, result.stderr)
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
    assert len(lines) == len(BUGGY_FINDINGS)  # one line each, nothing in between
    assert "leafwatch: ERROR missing_grad `aux_head.weight` at step 2. Fix: call `aux_head` in forward()" in before
    assert "leafwatch: ERROR orphan_tensor `blocks[0].weight` at step 2. Fix: wrap the container: " \
        "`self.blocks = nn.ModuleList(...)`" in before
    assert "cause" not in before and "never ran" not in before
    assert "cause: module `aux_head` never ran" in summary


def test_strict_stops_at_the_first_error_and_exits_non_zero():
    result = _leafwatch("run", "--strict", str(SCRIPTS / "buggy.py"))
    assert result.returncode == runner.STRICT_EXIT_CODE != 0
    assert "done" not in result.stdout  # stopped before the end of the loop
    assert "leafwatch: --strict stopped the script at optimizer step 2: ERROR missing_grad `aux_head.bias`." in result.stderr
    assert "ERROR   orphan_tensor       scale" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.xdist_group("run_cli_runs")  # shares the module-scoped `runs` under pytest-xdist
def test_report_reads_the_same_findings_back_and_exits_1(runs):
    result = _leafwatch("report", str(runs["logdir"]))
    assert result.returncode == 1, result.stderr
    assert "run: exp/buggy" in result.stdout and "run: exp/gan" in result.stdout
    buggy_part = result.stdout.split("run: exp/gan")[0] if result.stdout.index("run: exp/buggy") == 0 else result.stdout.split("run: exp/buggy")[1]
    for kind, name in BUGGY_FINDINGS:
        assert f"ERROR   {kind:19} {name} (since step 2)" in buggy_part
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
    assert buggy["counts"]["orphan_tensor"] == 5 and buggy["counts"]["missing_grad"] == 2


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
    assert missing.returncode == 2
    assert "no such folder" in missing.stderr


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
    # The first check waits for an optimizer's second step; a run that ends before is still
    # decided: the structure at the end, and what the only step said about its own tensors.
    result = _leafwatch("run", str(SCRIPTS / "buggy.py"), "--steps", "1")
    assert result.returncode == 0, result.stderr
    summary = result.stderr.split("leafwatch: summary after 1 optimizer step\n", 1)[1]
    assert summary.startswith("leafwatch: 7 open of 7 finding(s) at step 1")
    for kind, name in BUGGY_FINDINGS:
        assert f"ERROR   {kind:19} {name} (since step 1)" in summary
    assert "cause: module `aux_head` never ran in a forward pass of this run (its optimizer stepped once)." in summary


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
    assert "runner.py" not in result.stderr and "runpy" not in result.stderr


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
    assert "ERROR missing_grad `unused.weight` at step 2" in result.stderr
    assert "module `unused` never ran" in result.stderr
    assert "tensor of shape" not in result.stderr


def test_closure_optimizers_are_checked_after_their_step():
    result = _leafwatch("run", str(SCRIPTS / "lbfgs.py"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "lbfgs done\n"
    assert {line.split("`")[1] for line in result.stderr.splitlines() if line.startswith("leafwatch: ERROR")} == {
        "1.weight", "1.bias"}
    assert "module `1` never ran" in result.stderr
    assert "`0.weight`" not in result.stderr


def test_ignore_marks_findings_ignored_with_the_reason(tmp_path):
    result = _leafwatch("run", "--logdir", str(tmp_path), "--ignore", "aux_head.*=kept for fine-tuning",
                        "--ignore", "blocks*", str(SCRIPTS / "buggy.py"))
    assert result.returncode == 0
    assert "ERROR missing_grad `aux_head.weight` at step" not in result.stderr
    # Shown as ignored, with the reason given on the command line (not "ERROR ... [ignored]").
    assert "  IGNORED missing_grad        aux_head.weight (since step 2)\n" in result.stderr
    assert "      ignored: kept for fine-tuning (pattern 'aux_head.*')\n" in result.stderr
    assert "      ignored: ignored on the command line (pattern 'blocks*')\n" in result.stderr
    assert "[ignored]" not in result.stderr
    (run,) = read_reports(str(tmp_path))
    statuses = {f.name: (f.status, f.details.get("ignored_because")) for f in run.report}
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
    before = _global_module_hooks()
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
        assert not session.module_hooks_armed and _global_module_hooks() == before
        assert set(session.roots) == {"_Generator", "_Critic"}
        assert session.roots["_Critic"] is critic
    finally:
        report = session.close()
        session.stream.close()
    assert _global_module_hooks() == before
    assert {(f.kind, f.name) for f in report.open} == {
        ("missing_grad", "_Generator.unused.weight"), ("missing_grad", "_Generator.unused.bias")}
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

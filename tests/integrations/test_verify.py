"""``--verify`` (#54 item 7): ``leafwatch report DIR --diff --verify`` and ``leafwatch run --diff FILE --verify``
apply the patch to a scratch copy of the run's folder, run the recorded ``leafwatch run`` command there again
(``--max-steps``: as many optimizer steps as the run made, at most ``--verify-steps``), and say per finding:
fixed, still open or undecided, and each new finding. Real scripts under ``leafwatch run --logdir``; each run
is shared by the tests that read it (module-scoped fixtures: their tests share an xdist worker, the others
spread)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import _warm
import pytest

from leafwatch.report import records
from leafwatch.report.reader import read_reports

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
FIXED_RUN = pytest.mark.xdist_group("verify_fixed")  # the tests of the module-scoped `fixed` run
UNDECIDED_RUN = pytest.mark.xdist_group("verify_undecided")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONHASHSEED"] = "0"
    return env


def _leafwatch(cwd: Path, *args: str):
    """``python -m leafwatch ARGS`` in ``cwd``; the scratch copies of a verification go beside ``cwd`` (its
    ``TMPDIR``), in the test's own temporary folder."""
    scratch = cwd.parent / f"{cwd.name}-scratch"
    scratch.mkdir(exist_ok=True)
    result = _warm.run([sys.executable, "-m", "leafwatch", *args], env={**_env(), "TMPDIR": str(scratch)}, cwd=cwd,
                       timeout=300)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr
    return result


def _project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _said(stderr: str, prefix: str = "leafwatch report: verify: ") -> list[str]:
    """The verification's lines, without their prefix."""
    return [line[len(prefix):] for line in stderr.splitlines() if line.startswith(prefix)]


def _snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file and folder under ``folder`` (links not followed) -> (the sha256 of a file's bytes, where a
    link points, or "folder"; its modification time in ns)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        mtime = os.lstat(path).st_mtime_ns
        if path.is_symlink():
            out[str(path.relative_to(folder))] = (f"-> {os.readlink(path)}", mtime)
        elif path.is_file():
            out[str(path.relative_to(folder))] = (hashlib.sha256(path.read_bytes()).hexdigest(), mtime)
        elif path.is_dir():
            out[str(path.relative_to(folder))] = ("folder", mtime)
    return out


def _records(folder: Path, tag: str) -> list[dict]:
    """The documents of every ``tag`` record in ``folder``'s event files, in order."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"tensors": 0})
    acc.Reload()
    if tag not in acc.Tags()["tensors"]:
        return []
    return [records.decode(t.tensor_proto.string_val[0]) for t in acc.Tensors(tag)]


def _rerun_folder(stderr: str) -> Path:
    """The scratch copy the verification names (``copied SOURCE to COPY and applied the patch there``)."""
    (line,) = [line for line in _said(stderr, "") if " verify: copied " in line]
    return Path(line.split(" to ", 1)[1].split(" and applied", 1)[0])


# -- a fixed finding: `leafwatch report DIR --diff --verify` -------------------------------------------------
FIXED = '''"""`scale` is left out of the optimizer; the script reads a data file and writes a checkpoint next to itself."""

import os

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.scale = nn.Parameter(torch.ones(1))
        self.register_buffer("table", torch.zeros(300_000))  # a checkpoint over 1 MiB

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


torch.manual_seed(0)
with open(os.path.join(HERE, "data.bin"), "rb") as data:
    inputs = torch.tensor(list(data.read(32)), dtype=torch.float32).reshape(8, 4) / 255
model = Net()
optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.1)  # `scale` is not given to it
for step in range(6):
    optimizer.zero_grad()
    model(inputs).pow(2).mean().backward()
    optimizer.step()
torch.save(model.state_dict(), os.path.join(HERE, "checkpoint.pt"))
print("saved")
'''


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = _project(tmp_path_factory.mktemp("fixed"), {"train.py": FIXED})
    old = 1_000_000_000  # (2001: long before the run)
    (folder / "data.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB the script only reads
    (folder / "checkpoint.pt").write_bytes(b"an earlier run's checkpoint" * 80_000)  # over 1 MiB, rewritten by the run
    for name in ("data.bin", "checkpoint.pt"):
        os.utime(folder / name, (old, old))
    run = _leafwatch(folder, "run", "--logdir", "runs", "train.py")
    assert run.returncode == 0 and "saved" in run.stdout, run.stderr
    diff = _leafwatch(folder, "report", "runs", "--diff")
    before = _snapshot(folder)
    (record_before,) = _records(folder / "runs", records.REPORT_TAG)[-1:]
    verify = _leafwatch(folder, "report", "runs", "--diff", "--verify")
    return {"folder": folder, "diff": diff, "before": before, "record_before": record_before, "verify": verify,
            "copy": _rerun_folder(verify.stderr)}


@FIXED_RUN
def test_a_fixed_finding_is_said_fixed_and_the_patch_proven_with_exit_0(fixed: dict) -> None:
    verify = fixed["verify"]
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout == fixed["diff"].stdout and verify.stdout.startswith("--- a/train.py\n")  # the diff, as --diff
    said = _said(verify.stderr)
    assert said[0] == f"copied {fixed['folder']} to {fixed['copy']} and applied the patch there"
    assert said[1] == "linked, not copied (read only: over 1 MiB, unchanged since the run started, or installed): data.bin"
    assert said[2].startswith(f"ran `leafwatch run --logdir {fixed['copy'] / 'runs'} --max-steps 6 train.py` there "
                              "(the run made 6 optimizer steps, the rerun makes at most 6): it made 6, exit 0; its output: ")
    assert said[3:] == ["fixed: not_in_optimizer scale", "the patch is proven: 1 fixed, nothing new"]


@FIXED_RUN
def test_nothing_the_rerun_writes_reaches_the_original_folder_or_logdir(fixed: dict) -> None:
    folder, copy = fixed["folder"], fixed["copy"]
    after = _snapshot(folder)
    added = set(after) - set(fixed["before"])
    # Every file the run left is as it was, byte for byte and modification time; the verification record is
    # the one file added, in an event file of its own beside the run's records (its folder's time changed).
    assert {k: v for k, v in after.items() if k not in added and k != "runs"} == \
        {k: v for k, v in fixed["before"].items() if k != "runs"}
    (record,) = added
    assert record.startswith("runs/events.out.tfevents.") and record.endswith(records.VERIFY_SUFFIX)
    assert _records(folder / "runs", records.REPORT_TAG)[-1] == fixed["record_before"]  # the run's record stays
    (run,) = read_reports(str(folder / "runs"))  # and `leafwatch report` reads it as before
    assert run.data == fixed["record_before"]
    # The copy: the patched script, the data it only reads linked, the checkpoint it rewrites copied and rewritten.
    assert 'optimizer.add_param_group({"params": [model.scale]})\n' in (copy / "train.py").read_text()
    assert (folder / "train.py").read_text() == FIXED
    assert (copy / "data.bin").is_symlink() and os.readlink(copy / "data.bin") == str(folder / "data.bin")
    assert not (copy / "checkpoint.pt").is_symlink()
    assert (copy / "checkpoint.pt").read_bytes() != (folder / "checkpoint.pt").read_bytes()  # `scale` trained there
    assert not list(copy.rglob("__pycache__"))


@FIXED_RUN
def test_the_rerun_record_says_how_it_ran_and_both_folders_mark_the_verified_hunk(fixed: dict) -> None:
    copy = fixed["copy"]
    (rerun,) = read_reports(str(copy / "runs"))
    assert rerun.data["command"]["cwd"] == str(copy) and rerun.data["command"]["options"]["max_steps"] == 6
    assert rerun.data["command"]["ended"] == {"exit_code": 0, "stopped_by": None, "step": 6}  # it ended by itself
    assert not rerun.report.open
    (hunk,) = fixed["record_before"]["patch"]["hunks"]
    for folder in (fixed["folder"] / "runs", copy / "runs"):
        (mark,) = _records(folder, records.VERIFY_TAG)
        assert mark["hunks"] == [{"kind": "not_in_optimizer", "name": "scale", "outcome": "fixed",
                                  "decided_step": 6, "diff": hunk["diff"]}]
        assert (mark["step"], mark["steps"], mark["exit_code"], mark["new"], mark["problems"]) == (6, 6, 0, [], [])


@pytest.fixture(scope="module")
def tab(fixed: dict, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A TensorBoard server on the verified run's log folder: its address and the run's name."""
    from _tensorboard_runs import get_json, tensorboard_server, wait_for

    with tensorboard_server(fixed["folder"] / "runs", tmp_path_factory.mktemp("tensorboard")) as url:
        wait_for(lambda: get_json(f"{url}/data/plugin/leafwatch/runs")["runs"], 120, "runs not loaded")
        (run,) = get_json(f"{url}/data/plugin/leafwatch/runs")["runs"]
        yield url, run["run"]


@FIXED_RUN
def test_the_tabs_findings_route_marks_the_verified_hunk(fixed: dict, tab: tuple[str, str]) -> None:
    from _tensorboard_runs import get_json

    url, run = tab
    (finding,) = get_json(f"{url}/data/plugin/leafwatch/findings?run={run}")["findings"]
    assert (finding["kind"], finding["name"]) == ("not_in_optimizer", "scale")
    assert finding["hunk"] == fixed["record_before"]["patch"]["hunks"][0]["diff"]
    assert finding["verified"] == {"outcome": "fixed", "decided_step": 6, "steps": 6, "of": 6, "new": 0}


_MARK = """(async () => {
  for (let i = 0; i < 300 && !document.querySelector("tr.finding .fix-snippet"); i++) await new Promise((r) => setTimeout(r, 100));
  const head = document.querySelector('tr.finding[data-name="scale"] .fix-snippet .snippet-head');
  const mark = head && head.querySelector(".verified");
  return mark && { text: mark.textContent, outcome: mark.dataset.outcome, title: mark.title,
                   fixed: mark.classList.contains("fixed"), place: head.querySelector(".place").textContent };
})()"""


@pytest.mark.slow
@FIXED_RUN
def test_the_tab_shows_the_verified_mark_on_the_hunk(tab: tuple[str, str], tmp_path: Path) -> None:
    from _browser import DevTools
    from _requirements import require_browser

    url, run = tab
    browser = DevTools(require_browser(), tmp_path / "profile")
    try:
        browser.open(f"{url}/data/plugin_entry.html?name=leafwatch&run={run}")
        mark = browser.evaluate(_MARK)
    finally:
        browser.close()
    assert mark == {"text": "verified: fixed", "outcome": "fixed", "fixed": True, "place": "patch",
                    "title": "the patched script, run again for 6 of the run's 6 optimizer steps, no longer has "
                             "this finding"}


# -- undecided, and the step limit: `leafwatch run --diff FILE --verify --verify-steps N` -----------------------
@pytest.fixture(scope="module")
def undecided(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = _project(tmp_path_factory.mktemp("undecided"), {"left_out.py": (SCRIPTS / "left_out.py").read_text()})
    run = _leafwatch(folder, "run", "--logdir", "runs", "--diff", "fix.diff", "--verify", "--verify-steps", "10",
                     "left_out.py", "--steps", "40")
    return {"folder": folder, "run": run, "copy": _rerun_folder(run.stderr)}


@UNDECIDED_RUN
def test_a_finding_decided_after_the_last_step_of_the_rerun_is_undecided_and_exits_1(undecided: dict) -> None:
    run, folder = undecided["run"], undecided["folder"]
    assert run.returncode == 1, run.stderr
    assert "done 40 steps" in run.stdout and "--- a/" not in run.stdout  # the script's own output, the diff in FILE
    assert (folder / "fix.diff").read_text().startswith("--- a/left_out.py\n")
    said = _said(run.stderr, "leafwatch run: verify: ")
    assert "(the run made 40 optimizer steps, the rerun makes at most 10): it made 10, exit 0" in said[1]
    assert said[2:] == ["undecided: not_in_optimizer scale (the run decided it at step 26; the rerun made 10)",
                        "not proven: 1 undecided, nothing new"]


@UNDECIDED_RUN
def test_leafwatch_stops_the_rerun_after_the_step_limit_and_its_record_says_so(undecided: dict) -> None:
    copy = undecided["copy"]
    (rerun,) = read_reports(str(copy / "runs"))
    assert rerun.data["command"]["ended"] == {"exit_code": None, "stopped_by": "--max-steps", "step": 10}
    assert rerun.data["step"] == 10
    log = (copy.parent / "rerun.log").read_text()
    assert "done 40 steps" not in log  # the script did not end by itself
    assert "leafwatch: --max-steps 10 stopped the script when it called optimizer step 11" in log
    assert "Traceback" not in log
    (mark,) = _records(undecided["folder"] / "runs", records.VERIFY_TAG)
    assert [(h["outcome"], h["decided_step"]) for h in mark["hunks"]] == [("undecided", 26)]
    assert (mark["rerun"]["stopped"], mark["limit"], mark["exit_code"]) == (True, 10, 1)



def test_run_diff_writes_the_patch_whatever_the_scripts_exit_code(tmp_path: Path) -> None:
    """The script's own exit code stays `leafwatch run`'s, and FILE still holds the patch of the run's findings."""
    folder = _project(tmp_path, {"left_out.py": (SCRIPTS / "left_out.py").read_text()})
    run = _leafwatch(folder, "run", "--diff", "fix.diff", "left_out.py", "--steps", "30", "--exit-code", "3")
    assert run.returncode == 3, run.stderr
    assert (folder / "fix.diff").read_text().startswith("--- a/left_out.py\n")
    assert "+optimizer.add_param_group({\"params\": [model.scale]})\n" in (folder / "fix.diff").read_text()


CLOSURE = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.LBFGS(model.parameters(), max_iter=2)
inputs = torch.randn(8, 4)


def closure():
    print(f"closure of step {step}")
    optimizer.zero_grad()
    loss = model(inputs).pow(2).mean()
    loss.backward()
    return loss


for step in range(1, 6):
    optimizer.step(closure)
    print(f"made step {step}")
print("done")
"""


def test_max_steps_stops_a_step_given_a_closure_before_it_runs(tmp_path: Path) -> None:
    """LBFGS (as Lightning) computes its gradients inside `step(closure)`, which leafwatch checks after the
    step: `--max-steps 2` still stops the script before step 3 runs its closure, and the run is no crash."""
    folder = _project(tmp_path, {"lbfgs.py": CLOSURE})
    run = _leafwatch(folder, "run", "--max-steps", "2", "lbfgs.py")
    assert run.returncode == 0, run.stderr
    said = run.stdout.splitlines()
    assert "made step 2" in said and "closure of step 2" in said
    assert "closure of step 3" not in said and "made step 3" not in said and "done" not in said
    assert "leafwatch: --max-steps 2 stopped the script when it called optimizer step 3" in run.stderr
    assert "Traceback" not in run.stderr

# -- a new finding; a finding still open; a patch that crashes the script ------------------------------------
def test_a_new_finding_of_the_patched_script_is_said_and_exits_1(tmp_path: Path) -> None:
    """buggy.py's `scale` fix keeps the user's `.to(torch.float64)`: the Parameter it registers is float64
    beside float32 ones, a warning the run did not have. Its unused `aux_head` has advice, not code."""
    folder = _project(tmp_path, {"buggy.py": (SCRIPTS / "buggy.py").read_text()})
    assert _leafwatch(folder, "run", "--logdir", "runs", "buggy.py").returncode == 0
    verify = _leafwatch(folder, "report", "runs", "--diff", "--verify")
    assert verify.returncode == 1, verify.stderr
    said = _said(verify.stderr)
    assert said[2:4] == ["fixed: orphan_tensor blocks", "fixed: orphan_tensor scale"]
    assert said[4].startswith("new: device_mismatch scale: ")
    assert said[5:] == ["not in the patch, still open: missing_grad aux_head", "not proven: 2 fixed, 1 new"]


STILL_OPEN = '''"""Fine-tunes a model saved whole (`torch.save(model)`): its `blocks` are a plain list, and the pickle keeps
them so, whatever its class says now."""

import os

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = [nn.Linear(4, 4), nn.Linear(4, 4)]  # a plain list: not registered
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


torch.manual_seed(0)
pretrained = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrained.pt")
if not os.path.exists(pretrained):
    torch.save(Net(), pretrained)  # the pretraining run
model = torch.load(pretrained, weights_only=False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
print("done")
'''


def test_a_finding_the_patch_does_not_fix_is_still_open_and_exits_1(tmp_path: Path) -> None:
    """The patch registers `blocks` in Net's `__init__`, which `torch.load` of a whole pickled model never runs."""
    folder = _project(tmp_path, {"train.py": STILL_OPEN})
    assert _leafwatch(folder, "run", "--logdir", "runs", "train.py").returncode == 0
    verify = _leafwatch(folder, "report", "runs", "--diff", "--verify")
    assert verify.returncode == 1, verify.stderr
    assert "+        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])\n" in verify.stdout
    assert _said(verify.stderr)[2:] == ["still open: orphan_tensor blocks", "not proven: 1 still open, nothing new"]


CRASHING = '''"""Heads built in __init__ and built again by `reset_heads()`, each time in a plain list."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.heads = [nn.Linear(4, 1), nn.Linear(4, 1)]  # a plain list: not registered

    def reset_heads(self, tasks: int) -> None:
        self.heads = [nn.Linear(4, 1) for _ in range(tasks)]  # the same, once more

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.body(x)
        return sum(head(x) for head in self.heads)


torch.manual_seed(0)
model = Net()
model.reset_heads(3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
print("done")
'''


def test_a_patch_that_applies_and_leaves_the_script_crashing_is_not_proven(tmp_path: Path) -> None:
    """`nn.ModuleList` in `__init__` makes `reset_heads`'s plain list a TypeError: the rerun says it."""
    folder = _project(tmp_path, {"train.py": CRASHING})
    assert _leafwatch(folder, "run", "--logdir", "runs", "train.py").returncode == 0
    verify = _leafwatch(folder, "report", "runs", "--diff", "--verify")
    assert verify.returncode == 1, verify.stderr
    said = _said(verify.stderr)
    assert said[1].endswith(f"it made 0, exit 1; its output: {_rerun_folder(verify.stderr).parent / 'rerun.log'}")
    assert said[2:] == [
        "undecided: orphan_tensor heads (the run decided it at step 1; the rerun made 0)",
        "the patched script exited 1 where the run's exited 0: TypeError: cannot assign 'list' as child module "
        "'heads' (torch.nn.Module or None expected)",
        "not proven: 1 undecided, nothing new, 1 more problem"]


# -- refusals ---------------------------------------------------------------------------------------------------
MONITORED = '''import torch
from torch.utils.tensorboard import SummaryWriter

import leafwatch

model = torch.nn.Linear(4, 1)
scale = torch.nn.Parameter(torch.ones(1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
monitor = leafwatch.Monitor(model, optimizer, tensors={"scale": scale}, writer=SummaryWriter("runs")).attach()
for step in range(3):
    optimizer.zero_grad()
    (model(torch.randn(8, 4)) * scale).pow(2).mean().backward()
    optimizer.step()
monitor.close()
'''


def test_a_run_not_made_by_leafwatch_run_is_refused_with_one_line_and_exit_2(tmp_path: Path) -> None:
    folder = _project(tmp_path, {"train.py": MONITORED})
    made = _warm.run([sys.executable, "train.py"], env=_env(), cwd=folder, timeout=300)
    assert made.returncode == 0, made.stderr
    (run,) = read_reports(str(folder / "runs"))
    assert run.report.open and "command" not in run.data  # a Monitor's record: findings, no command
    before = _snapshot(folder)
    verify = _leafwatch(folder, "report", "runs", "--diff", "--verify")
    assert (verify.returncode, verify.stdout) == (2, "")
    assert verify.stderr == ("leafwatch report: --verify: run runs was not made by `leafwatch run` (a Monitor, a "
                             "callback or an earlier leafwatch wrote its record): there is no command to run again\n")
    assert _snapshot(folder) == before


@pytest.mark.parametrize(("args", "said"), [
    (["report", "runs", "--verify"], "leafwatch report: --verify goes with --diff (it proves the patch --diff prints)\n"),
    (["report", "runs", "--diff", "--verify-steps", "3"], "leafwatch report: --verify-steps goes with --verify\n"),
    (["run", "--verify", "train.py"],
     "leafwatch run: --verify proves the patch that --diff FILE writes: give --diff FILE too\n"),
    (["run", "--diff", "fix.diff", "--verify-steps", "3", "train.py"], "leafwatch run: --verify-steps goes with --verify\n"),
])
def test_verify_without_the_patch_it_proves_is_one_line_and_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / "train.py").write_text("print('ran')\n")
    result = _leafwatch(tmp_path, *args)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", said)

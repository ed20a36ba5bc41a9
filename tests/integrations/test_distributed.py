"""Distributed training: findings merged across ranks, DDP's unused parameters, sharded gradients.

The multi-process tests launch real 2-process jobs on CPU (gloo, bound to 127.0.0.1) with
the environment ``torch.distributed.run`` gives its workers (plain torch; the agent process
itself is left out to save a torch import) or a Lightning ``Trainer(strategy="ddp")``,
and read back what each rank wrote. A hang fails the test through the launch timeout.

Starting two processes, importing torch (and Lightning) and the gloo rendezvous cost far more
than a scenario's few steps, so the scenarios share launches: a module-scoped fixture starts
each launch once with its list of scenarios, which run one after the other in the same
processes, each writing its own result; each test reads its scenario's result.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _launch import rank_results
from _requirements import require_lightning_callback
from torch import nn

import leafwatch
from leafwatch.detectors import ranks, registry
from leafwatch.integrations import distributed
from leafwatch.options import WarnOnce
from leafwatch.report.findings import Finding, Report

SCRIPTS = Path(__file__).resolve().parents[1] / "dist_scripts"
REPO = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT_S = 120


@pytest.fixture
def lightning_callback() -> type:
    """Without PyTorch Lightning: skip locally, fail in CI; a broken callback import is an error."""
    return require_lightning_callback()


needs_callback = pytest.mark.usefixtures("lightning_callback")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(port: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore::DeprecationWarning")
    if os.path.exists("/sys/class/net/lo"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


#: A shared launch's results: the scenario's name -> what each rank wrote.
Results = Callable[[str], dict[int, dict]]


class Launch:
    """Processes started together, each running the same scenarios; read back once they exit."""

    def __init__(self, commands: list[list[str]], out: Path, ranks: list[int | None], timeout_s: float,
                 backend: str = "gloo") -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.timeout_s = out, timeout_s
        port = _free_port()
        self.procs = []
        for command, rank in zip(commands, ranks):
            env = _env(port)
            env["LEAFWATCH_TEST_BACKEND"] = backend
            if rank is not None:
                env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
            self.procs.append(subprocess.Popen(command, env=env, cwd=out, stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True, start_new_session=True))
        self.deadline = time.monotonic() + timeout_s
        self.hung = False
        self.log = ""

    def wait(self) -> Launch:
        """Wait for every process; those still running at the deadline (a hang) are killed."""
        logs = []
        for proc in self.procs:
            try:
                logs.append(proc.communicate(timeout=max(1.0, self.deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                self.hung = True
                logs.append("")
        if self.hung:
            for proc in self.procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()
        self.log = "\n".join(logs)
        return self

    def results(self, scenario: str) -> dict[int, dict]:
        """What each rank wrote for ``scenario``; a hang anywhere in the launch fails the test."""
        if self.hung:
            pytest.fail(f"the 2-process job hung (no exit within {self.timeout_s:.0f} s):\n{self.log[-3000:]}")
        return rank_results(self.out, scenario, self.log)


def _torchrun_launch(scenarios: list[str], out: Path, timeout_s: float = LAUNCH_TIMEOUT_S,
                     backend: str = "gloo") -> Launch:
    """The two ranks as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT), without its agent."""
    command = [sys.executable, str(SCRIPTS / "ddp_check.py"), ",".join(scenarios), str(out)]
    return Launch([command, command], out, [0, 1], timeout_s, backend)


def _torchrun(scenario: str, tmp_path: Path, steps: int = 3, backend: str = "gloo") -> dict[int, dict]:
    """One scenario in a launch of its own."""
    return _torchrun_launch([f"{scenario}:{steps}"], tmp_path, backend=backend).wait().results(scenario)


#: The plain-torch scenarios (with their steps), in two launches that start together. In the
#: first the scenarios that end in an error on every rank (DDP's, leafwatch's strict one) come
#: after those that train through, and the one that leaves the ranks out of step (a Monitor on
#: rank zero only) comes last; ``branch_strict`` ends with one rank gone, so it runs alone.
TORCHRUN_LAUNCHES = (
    ["clean:3", "frozen:2", "branch:3", "branch_once:3", "unused_fup:2", "fsdp2:2", "fsdp_orig:2", "fsdp_flat:2", "unused:3",
     "strict:3", "rank0_only:3"],
    ["branch_strict:2"],
)

#: The Lightning scenarios, in one launch: those whose ``fit`` ends in an error come last.
LIGHTNING_SCENARIOS = ["clean", "branch", "unused", "strict"]

#: The limit of a launch of several scenarios (one alone: :data:`LAUNCH_TIMEOUT_S`).
SHARED_LAUNCH_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> Results:
    """Each plain-torch scenario's results by name: ``torchrun("unused")[rank]``."""
    import torch.distributed.fsdp  # not imported by `import torch`

    launches = {}
    for scenarios in TORCHRUN_LAUNCHES:
        if not hasattr(torch.distributed.fsdp, "fully_shard"):
            scenarios = [s for s in scenarios if not s.startswith("fsdp2:")]
        out = tmp_path_factory.mktemp("torchrun")
        launches.update(dict.fromkeys(scenarios, _torchrun_launch(scenarios, out, SHARED_LAUNCH_TIMEOUT_S)))
    for launch in set(launches.values()):
        launch.wait()
    by_scenario = {s.partition(":")[0]: launch for s, launch in launches.items()}
    return lambda scenario: by_scenario[scenario].results(scenario)


@pytest.fixture(scope="module")
def lightning(tmp_path_factory: pytest.TempPathFactory) -> Results:
    """Each Lightning scenario's results by name (Lightning starts the second process itself)."""
    require_lightning_callback()
    out = tmp_path_factory.mktemp("lightning")
    command = [sys.executable, str(SCRIPTS / "lightning_ddp.py"), ",".join(LIGHTNING_SCENARIOS), str(out)]
    launch = Launch([command], out, [None], SHARED_LAUNCH_TIMEOUT_S).wait()

    def results(scenario: str) -> dict[int, dict]:
        results = launch.results(scenario)
        for rank in (0, 1):
            assert results[rank]["internal"] == [], f"leafwatch failed internally on rank {rank}"
        return results

    return results


#: Tests that read a shared launch run on one pytest-xdist worker (``--dist loadgroup``), which
#: starts it once.
def in_torchrun_launch(test):  # noqa: ANN001, ANN201 - a decorator: multi-process, so `slow` too
    return pytest.mark.slow(pytest.mark.xdist_group("distributed_torchrun")(test))


def in_lightning_launch(test):  # noqa: ANN001, ANN201
    return pytest.mark.slow(pytest.mark.xdist_group("distributed_lightning")(test))


def _findings(report: dict, kind: str | None = None) -> dict[str, dict]:
    """The per-tensor findings of a report (``Report.to_dict()``: each mistake lists its tensors)."""
    return {m["name"]: m for f in report["findings"] if kind is None or f["kind"] == kind
            for m in (f.get("members") or [f])}


# -- plain torch DDP, 2 processes -----------------------------------------------------------------
@in_torchrun_launch
def test_ddp_unused_layer_named_from_rank_zero_at_step_one(torchrun: Results) -> None:
    results = torchrun("unused")
    for rank in (0, 1):
        first = results[rank]["reports"][0]
        assert first["step"] == 1
        missing = _findings(first, "missing_grad")
        assert set(missing) == {"unused.weight", "unused.bias"}  # no `module.` prefix
        # Merged across ranks, then one finding per mistake: the unused layer.
        assert [(f["name"], f["ranks"]) for f in first["findings"]] == [("unused", [0, 1])]
        f = missing["unused.weight"]
        assert (f["severity"], f["status"], f["ranks"]) == ("error", "open", [0, 1])
        assert "no gradient on any rank" in f["cause"] and "never ran" in f["cause"]
        assert "find_unused_parameters=True" in f["fix"] and "remove the parameter" in f["fix"]
        # leafwatch named them at step 1; DDP's own error comes at step 2.
        assert len(results[rank]["reports"]) == 1
        assert "Expected to have finished reduction" in results[rank]["error"]
    # Logged once: only rank zero runs the sinks.
    assert results[0]["sink_events"] == [1]
    assert results[1]["sink_events"] == []


@in_torchrun_launch
def test_ddp_strict_raises_on_every_rank_without_hang(torchrun: Results) -> None:
    results = torchrun("strict")
    for rank in (0, 1):
        assert results[rank]["error_type"] == "LeafwatchError"
        assert results[rank]["reports"] == []
        message = results[rank]["error"]
        assert "unused.{bias,weight}" in message and "on rank(s) 0, 1" in message
        assert "find_unused_parameters=True" in message
        assert "Expected to have finished reduction in the prior" not in message


@in_torchrun_launch
def test_ddp_rank_dependent_branch_named_with_its_rank(torchrun: Results) -> None:
    results = torchrun("branch")
    for rank in (0, 1):
        assert results[rank]["error"] is None
        for report in results[rank]["reports"]:
            missing = _findings(report, "missing_grad")
            assert set(missing) == {"branch.weight", "branch.bias"}
            f = missing["branch.weight"]
            assert (f["severity"], f["status"], f["ranks"]) == ("info", "intermittent", [1])
            assert "rank 1 only" in f["message"] and "per-rank branching" in f["message"]
            assert "rank-dependent path" in f["cause"]
            assert "find_unused_parameters=True" in f["cause"]  # DDP filled .grad on rank 1
    # The finding set stays the same after step 1: one gather, then only the flag.
    assert results[0]["rounds"] == results[1]["rounds"] == 1


@in_torchrun_launch
def test_ddp_branching_seen_once_stays_in_the_merged_report_once_every_rank_runs_the_branch(torchrun: Results) -> None:
    # Rank 1 skips the branch at step 1 only. From step 2 no rank reports it (the finding came from
    # DDP's use record, not from a rank's history), but the merged report is a history of its own:
    # it keeps what was seen at step 1 rather than forgetting it (the change is exchanged at step 3).
    results = torchrun("branch_once")
    for rank in (0, 1):
        assert results[rank]["error"] is None
        for report in results[rank]["reports"]:
            f = _findings(report, "missing_grad")["branch.weight"]
            assert (f["status"], f["ranks"], f["reason"]) == ("intermittent", [1], "rank_branching")
            assert f["last_step"] == 1
    assert results[0]["rounds"] == results[1]["rounds"] == 2  # step 1, and the change of step 2


@in_torchrun_launch
def test_ddp_unused_layer_with_find_unused_parameters_is_still_dead(torchrun: Results) -> None:
    results = torchrun("unused_fup")
    for rank in (0, 1):
        assert results[rank]["error"] is None
        f = _findings(results[rank]["reports"][-1], "missing_grad")["unused.weight"]
        assert (f["severity"], f["status"], f["ranks"]) == ("error", "open", [0, 1])
        assert "no gradient on any rank" in f["cause"]


@in_torchrun_launch
def test_ddp_clean_model_reports_nothing(torchrun: Results) -> None:
    results = torchrun("clean")
    for rank in (0, 1):
        assert results[rank]["error"] is None
        assert [r["findings"] for r in results[rank]["reports"]] == [[], [], []]
        assert results[rank]["rounds"] == 1
        assert results[rank]["warnings"] == []


@in_torchrun_launch
def test_ddp_nothing_to_check_on_every_rank_is_said_by_the_merged_report(torchrun: Results) -> None:
    results = torchrun("frozen")
    for rank in (0, 1):
        assert results[rank]["error"] is None
        reports = results[rank]["reports"]
        assert [(r["findings"], r.get("nothing_to_check")) for r in reports] == [([], True), ([], True)]
        assert results[rank]["rounds"] == 1


@in_torchrun_launch
def test_ddp_rank_branch_without_find_unused_parameters_is_named_by_the_rank_that_skipped(
        torchrun: Results) -> None:
    # Rank 0 waits in DDP's backward for the branch's gradient and never reaches the check;
    # rank 1 gives up gathering after the (shortened) timeout and raises with its own findings.
    results = torchrun("branch_strict")
    assert results[1]["error_type"] == "LeafwatchError"
    assert "branch.{bias,weight}" in results[1]["error"] and "on rank(s) 1" in results[1]["error"]
    assert "never ran" in results[1]["error"]
    assert results[0]["error"] is not None  # DDP's own failure once rank 1 is gone: no hang
    assert results[0]["reports"] == []


@in_torchrun_launch
def test_ddp_monitor_on_rank_zero_only_stalls_once_then_trains_on(torchrun: Results) -> None:
    results = torchrun("rank0_only")
    for rank in (0, 1):
        assert results[rank]["error"] is None
    assert len(results[0]["reports"]) == 3 and results[0]["reports"][0]["findings"] == []
    assert results[1]["reports"] == []
    warned = [w for w in results[0]["warnings"] if "gathering findings across ranks" in w]
    assert len(warned) == 1 and "each rank must create its Monitor" in warned[0]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices for NCCL")
@pytest.mark.parametrize("scenario", ["unused", "strict", "branch", "clean"])
def test_ddp_on_nccl_gathers_over_a_gloo_side_group(tmp_path: Path, scenario: str) -> None:
    results = _torchrun(scenario, tmp_path, backend="nccl")
    for rank in (0, 1):
        first = results[rank]["reports"][0] if results[rank]["reports"] else None
        if scenario == "unused":
            assert _findings(first, "missing_grad")["unused.weight"]["ranks"] == [0, 1]
        elif scenario == "strict":
            assert results[rank]["error_type"] == "LeafwatchError"
        elif scenario == "branch":
            assert _findings(first, "missing_grad")["branch.weight"]["ranks"] == [1]
        else:
            assert [r["findings"] for r in results[rank]["reports"]] == [[], [], []]
        assert results[rank]["warnings"] == []


# -- sharded strategies, 2 processes --------------------------------------------------------------
@in_torchrun_launch
def test_fully_shard_reads_dtensor_grads_and_names_the_unused_layer(torchrun: Results) -> None:
    import torch.distributed.fsdp  # not imported by `import torch`: the test may run first in its worker

    if not hasattr(torch.distributed.fsdp, "fully_shard"):
        pytest.skip("this torch has no torch.distributed.fsdp.fully_shard")
    results = torchrun("fsdp2")
    for rank in (0, 1):
        assert results[rank]["error"] is None
        for report in results[rank]["reports"]:
            findings = _findings(report)
            assert set(findings) == {"unused.weight", "unused.bias"}
            f = findings["unused.weight"]
            assert (f["kind"], f["severity"], f["ranks"]) == ("missing_grad", "error", [0, 1])
            assert "DDP" not in f["cause"]
        # The NaN/Inf check at step 1 read the local shards: no internal failure.
        assert results[rank]["warnings"] == []


@in_torchrun_launch
@pytest.mark.parametrize(("scenario", "name", "words"), [
    ("fsdp_orig", "FSDP sharded parameters", "use_orig_params=True"),
    ("fsdp_flat", "FSDP flat parameters", "use_orig_params=False"),
])
def test_fsdp_skips_the_gradient_check_with_one_info_finding(torchrun: Results, scenario: str, name: str,
                                                             words: str) -> None:
    results = torchrun(scenario)
    for rank in (0, 1):
        assert results[rank]["error"] is None
        for report in results[rank]["reports"]:
            assert len(report["findings"]) == 1
            f = report["findings"][0]
            assert (f["kind"], f["name"], f["severity"], f["status"]) == ("missing_grad", name, "info", "ignored")
            assert words in f["message"] and "fully_shard" in f["fix"]
            assert f["reason"] == "sharded_gradients"


# -- Lightning DDP (CPU, gloo, 2 processes) -------------------------------------------------------
@needs_callback
@in_lightning_launch
def test_lightning_ddp_unused_layer_warned_once_from_rank_zero(lightning: Results) -> None:
    results = lightning("unused")
    assert any("`unused` (2 tensors: unused.{bias,weight})" in w for w in results[0]["warnings"])
    assert not any("unused" in w for w in results[1]["warnings"])
    for rank in (0, 1):
        f = _findings(results[rank]["report"], "missing_grad")["unused.weight"]
        assert (f["severity"], f["ranks"], f["first_step"]) == ("error", [0, 1], 1)
        assert "no gradient on any rank" in f["cause"]
        assert "ddp_find_unused_parameters_true" in f["fix"]


@needs_callback
@in_lightning_launch
def test_lightning_ddp_strict_raises_on_every_rank(lightning: Results) -> None:
    results = lightning("strict")
    for rank in (0, 1):
        assert results[rank]["error_type"] == "LeafwatchError"
        assert "unused.{bias,weight}" in results[rank]["error"]
        assert "on rank(s) 0, 1" in results[rank]["error"]


@needs_callback
@in_lightning_launch
def test_lightning_ddp_rank_dependent_branch(lightning: Results) -> None:
    results = lightning("branch")
    for rank in (0, 1):
        assert results[rank]["error"] is None
        f = _findings(results[rank]["report"], "missing_grad")["branch.weight"]
        assert (f["severity"], f["status"], f["ranks"]) == ("info", "intermittent", [1])
        assert "rank 1 only" in f["message"]


@needs_callback
@in_lightning_launch
def test_lightning_ddp_clean_model_reports_nothing(lightning: Results) -> None:
    results = lightning("clean")
    for rank in (0, 1):
        assert results[rank]["error"] is None
        assert results[rank]["report"]["findings"] == []
        assert results[rank]["warnings"] == []


# -- merging, in one process ----------------------------------------------------------------------
def _missing(name: str, status: str = "open") -> Finding:
    """A rank's finding as its gradient detector makes it: module `x` never ran (intermittent: at some steps)."""
    from leafwatch.detectors import gradients
    from leafwatch.detectors.causes import NeverRan
    from leafwatch.detectors.constructors import make

    f = make(NeverRan(module="x", call="x"), name, "error", step=1)
    if status == "intermittent":
        return gradients.intermittent(f, 4, 2, 1)
    return f.replace(status=status, severity="error" if status == "open" else "info")


def test_merge_missing_on_every_rank_is_a_dead_parameter() -> None:
    merged = distributed.merge([[_missing("x.weight")], [_missing("x.weight")]], step=1, ddp_unused=False)
    assert len(merged) == 1
    f = merged[0]
    assert (f.name, f.severity, f.status, f.ranks) == ("x.weight", "error", "open", (0, 1))
    assert "no gradient on any rank" in f.cause and "never ran" in f.cause
    assert "Expected to have finished reduction" in f.cause
    assert f.fix == distributed.DDP_FIX
    assert (f.reason.name, f.reason.observed) == ("no_grad_on_any_rank", "never_ran")


def test_merge_intermittent_on_every_rank_keeps_its_words() -> None:
    seen = _missing("x.weight", status="intermittent")
    f = distributed.merge([[seen], [seen]], step=1, ddp_unused=False)[0]
    assert (f.name, f.status, f.ranks, f.message, f.cause, f.fix) == ("x.weight", "intermittent", (0, 1), seen.message,
                                                                     seen.cause, seen.fix)
    assert "never ran" in f.cause
    assert (f.reason.name, f.details["ranks_without_grad"]) == ("intermittent", [0, 1])


def test_merge_missing_on_one_rank_is_per_rank_branching() -> None:
    merged = distributed.merge([[], [_missing("x.weight")]], step=3, ddp_unused=True)
    f = merged[0]
    assert (f.severity, f.status, f.ranks, f.step) == ("info", "intermittent", (1,), 3)
    assert "on rank 1 only" in f.message and "got one on rank 0" in f.message
    assert "rank-dependent path" in f.cause
    assert f.details["ranks_without_grad"] == [1]


def test_merge_per_rank_branching_without_find_unused_parameters_is_an_error() -> None:
    f = distributed.merge([[_missing("x.weight")], []], ddp_unused=False)[0]
    assert (f.severity, f.status, f.ranks) == ("error", "open", (0,))
    assert "hangs" in f.cause and "find_unused_parameters=True" in f.fix


def test_merge_keeps_other_kinds_with_their_ranks() -> None:
    orphan = Finding("orphan_tensor", "blocks[0].weight", "error", "in a plain list", status="open")
    resolved = _missing("y.weight", status="resolved")
    merged = {f.key: f for f in distributed.merge([[orphan, resolved], [orphan]])}
    assert merged[("orphan_tensor", "blocks[0].weight")].ranks == (0, 1)
    assert merged[("missing_grad", "y.weight")].status == "resolved"
    assert merged[("missing_grad", "y.weight")].ranks == (0,)


def test_merge_of_no_findings_is_empty() -> None:
    assert distributed.merge([[], []]) == []


# -- single process ---------------------------------------------------------------------------------
def test_a_rank_merge_that_raises_leaves_an_incomplete_finding_in_the_merged_report_and_is_tried_again(
        tmp_path: Path) -> None:
    # A real gloo group of one process: the Gatherer runs the registry's RANKS detectors through
    # a pipeline onto its merged history, so a merge that raises costs its verdicts only.
    calls = []

    def flaky(gathered: tuple, state: ranks.RankState, view: object) -> list:
        calls.append(gathered[0])
        if len(calls) == 1:
            raise RuntimeError("merge broke")
        return ranks.judge(gathered, state, view)

    (merging,) = [d for d in registry.DETECTORS if d.stage == registry.RANKS]
    detector = dataclasses.replace(merging, judge=flaky)
    torch.distributed.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        gatherer = distributed.Gatherer(nn.Linear(2, 1), detectors=[detector], warn=WarnOnce(), pipelined=False)
        with pytest.warns(leafwatch.LeafwatchInternalWarning, match="the merge of the ranks' findings"):
            first = gatherer.gather(Report([_missing("x.weight")], step=1), 1)
        assert first is not None and [(f.kind, f.name, f.status, f.reason.name) for f in first.findings] == [
            ("incomplete", "the merge of the ranks' findings", "open", "part_failed")]
        # The same findings again: the failed merge is tried again all the same, and runs through.
        second = gatherer.gather(Report([_missing("x.weight")], step=2), 2)
        assert second is not None and calls == [1, 2] and gatherer.rounds == 2
        found = {(f.kind, f.name): f for f in second.tensors()}
        assert found[("incomplete", "the merge of the ranks' findings")].status == "resolved"
        f = found[("missing_grad", "x.weight")]
        assert (f.status, f.ranks, f.reason.name) == ("open", (0,), "no_grad_on_any_rank")
        gatherer.gather(Report([_missing("x.weight")], step=3), 3)
        assert calls == [1, 2] and gatherer.rounds == 2  # nothing changed and nothing failed: no exchange
        gatherer.close()
    finally:
        torch.distributed.destroy_process_group()


def test_monitor_outside_a_process_group_does_not_gather() -> None:
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = leafwatch.Monitor(model, opt, distributed=True)
    assert any("not initialized" in str(w.message) for w in caught)
    assert not [str(w.message) for w in caught if issubclass(w.category, leafwatch.LeafwatchInternalWarning)]
    model(torch.ones(1, 2)).sum().backward()
    assert monitor.check().findings == []
    assert not monitor.is_distributed
    monitor.close()


def test_monitor_rejects_a_non_bool_distributed() -> None:
    with pytest.raises(TypeError, match="`distributed` must be a bool or None, got str: 'yes'"):
        leafwatch.Monitor(nn.Linear(2, 1), distributed="yes")


def test_gradient_view_of_a_plain_model_reads_every_grad() -> None:
    model = nn.Linear(2, 1)
    view = distributed.gradient_view(model, [(id(p), p, n) for n, p in model.named_parameters()])
    assert view == distributed.PLAIN
    assert ranks.sharded_finding(view, step=0) is None and not view.skip


def test_local_tensor_passes_plain_tensors_through() -> None:
    t = torch.ones(2)
    assert distributed.local_tensor(t) is t
    assert distributed.local_tensor(None) is None

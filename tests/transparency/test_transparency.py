"""The transparency suite: a green run means real training runs of real libraries still work under leafwatch.

Each scenario is a short training script of one library, written the way that library's docs and
examples write one (``scripts/``), with fixed seeds, synthetic data and models built from configs.
It runs three times, each in a fresh process: plainly, under ``leafwatch run``, and through the
library's own leafwatch door (a ``leafwatch.Monitor(...).attach()`` beside the optimizer, the
Lightning ``LeafWatch`` callback, the Hugging Face ``LeafWatchCallback``). For each leafwatch run:

- the same exit code as the plain run, and the same printed losses, bit for bit; no warning raised
  from leafwatch's own code (torch's warning on reading a non-leaf's ``.grad``, ...);
- its checkpoint, saved the library's way, loads in a fresh process that never imports leafwatch,
  with the same weights, bit for bit, as the plain run's;
- leafwatch made at least one check (its coverage records count the checked optimizer steps);
- no error or warning finding, neither in the final report nor said while the script ran (info is
  allowed: these scripts are correct).

Where a scenario fails today because of a known leafwatch bug, its check is marked
``xfail(strict=True)`` with the bug, so that it fails the suite as soon as the bug is fixed.

Not part of the README's test command: ``python -m pytest tests/transparency -n auto`` after
``pip install torch==2.13.0 -e ".[ecosystem]"`` and ``python tests/transparency/install.py``
(docs/testing.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import harness
import pytest
from _requirements import require
from harness import Run, Scenario


SCENARIOS = (
    Scenario("torchtune-lora", "torchtune_lora.py", requires="torchtune", torchao=True),
    Scenario("torchtune-qlora", "torchtune_lora.py", ("qlora",), requires="torchtune", torchao=True),
    Scenario("ultralytics", "ultralytics_yolo.py", requires="ultralytics"),
    Scenario("opacus", "opacus_dp_sgd.py", requires="opacus"),
    Scenario("higher", "higher_maml.py", requires="higher", steps=30),
    Scenario("pytorch-metric-learning", "metric_learning_arcface.py", requires="pytorch_metric_learning", steps=30),
    Scenario("torchrl", "torchrl_sac.py", requires="torchrl", steps=30),
    Scenario("x-transformers", "x_transformers_decoder.py", requires="x_transformers", steps=30),
    Scenario("x-transformers-lightning", "x_transformers_lightning.py", door="lightning", requires="x_transformers",
             steps=30),
    Scenario("timm", "timm_resnet.py", requires="timm", steps=6),
    Scenario("transformers-peft", "hf_trainer_peft.py", door="transformers", requires="peft", steps=6),
    Scenario("lightning", "lightning_autoencoder.py", door="lightning", requires="lightning", steps=8),
    Scenario("diffusers", "diffusers_ddpm.py", requires="diffusers"),
    Scenario("torch-geometric", "pyg_gcn.py", requires="torch_geometric", steps=30),
)
#: The runs made so far in this process, by (scenario, variant): each script runs once per variant.
_RUNS: dict[tuple[str, str], Run] = {}


def _params(check: str) -> list[object]:
    """(scenario, variant) for each leafwatch run, one worker per scenario (its runs are shared),
    with the scenario's expected failure of ``check`` where it has one."""
    params = []
    for scenario in SCENARIOS:
        for variant in ("run", "door"):
            marks = [pytest.mark.xdist_group(f"transparency-{scenario.name}")]
            reason = scenario.xfail.get((variant, check))
            if reason is not None:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            params.append(pytest.param(scenario, variant, marks=marks, id=f"{scenario.name}-{variant}"))
    return params


@pytest.fixture(scope="session")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("transparency")


def _run(scenario: Scenario, variant: str, root: Path) -> Run:
    # Found, not imported: the scripts import the libraries, each in its own process.
    require(importlib.util.find_spec(scenario.requires) is not None,
            f'{scenario.requires} is not installed: pip install torch==2.13.0 -e ".[ecosystem]"')
    if scenario.torchao:
        require(harness.TORCHAO_TARGET.is_dir(), f"torchao 0.10.0 is not in {harness.TORCHAO_TARGET}: "
                "run tests/transparency/install.py")
    key = (scenario.name, variant)
    if key not in _RUNS:
        _RUNS[key] = harness.train(scenario, variant, root / scenario.name)
    return _RUNS[key]


def _plain(scenario: Scenario, root: Path) -> Run:
    """The plain run, which must itself succeed: the script is correct without leafwatch."""
    plain = _run(scenario, "plain", root)
    assert plain.returncode == 0, plain.tail()
    assert [int(step) for step, _ in plain.losses] == list(range(1, scenario.steps + 1)), plain.tail()
    return plain


@pytest.mark.parametrize(("scenario", "variant"), _params("losses"))
def test_the_same_exit_code_and_the_same_losses_bit_for_bit(scenario: Scenario, variant: str, root: Path) -> None:
    plain = _plain(scenario, root)
    run = _run(scenario, variant, root)
    assert run.returncode == plain.returncode, run.tail()
    assert run.losses == plain.losses, run.tail()
    assert "LeafwatchInternalWarning" not in run.stderr, run.tail()
    assert harness.warnings_from_leafwatch(run.stderr) == [], run.tail()


@pytest.mark.parametrize(("scenario", "variant"), _params("checkpoint"))
def test_the_checkpoint_loads_without_leafwatch_with_the_same_weights(scenario: Scenario, variant: str,
                                                                     root: Path) -> None:
    plain = _plain(scenario, root)
    run = _run(scenario, variant, root)
    loaded = harness.load(scenario, [plain, run], root / scenario.name)
    assert loaded.returncode == 0, f"{loaded.stdout[-3000:]}\n{loaded.stderr[-3000:]}"
    digests = loaded.digests
    assert set(digests) == {"plain", variant}, loaded.stdout
    assert digests[variant] == digests["plain"]


@pytest.mark.parametrize(("scenario", "variant"), _params("checks"))
def test_leafwatch_made_at_least_one_check(scenario: Scenario, variant: str, root: Path) -> None:
    _plain(scenario, root)
    run = _run(scenario, variant, root)
    groups = harness.coverage(run.logdir)
    checks = sum(group["checks"] for group in groups.values())
    assert checks >= 1, f"no checked optimizer step in {run.logdir}: {groups}\n{run.tail()}"
    assert all(group["names"] for group in groups.values() if group["checks"]), groups


@pytest.mark.parametrize(("scenario", "variant"), _params("findings"))
def test_no_error_or_warning_finding_on_correct_code(scenario: Scenario, variant: str, root: Path) -> None:
    _plain(scenario, root)
    run = _run(scenario, variant, root)
    said = [line for line in run.stderr.splitlines() if harness.LIVE_FINDING.search(line)]
    assert said == [], "\n".join(said)
    findings = harness.findings(run.logdir)
    wrong = [f"{f.severity} {f.kind} {f.name}: {f.message}" for f in findings if f.severity in ("error", "warning")]
    assert wrong == [], "\n".join(wrong)
    assert harness.has_report(run.logdir), f"no leafwatch report under {run.logdir}\n{run.tail()}"

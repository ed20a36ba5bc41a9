"""Runs one transparency scenario's training script plainly, under ``leafwatch run`` and through the
library's own leafwatch door, each in its own subprocess and folder, once per test session; loads
checkpoints in a process that never imports leafwatch; reads leafwatch's records back.

What each run is compared on (``test_transparency.py``): its exit code and its printed losses
(bitwise: ``float.hex``), the weights of its checkpoint as loaded by the library, the checks
leafwatch made (its coverage records) and the findings it reported (its report record and its
live lines on stderr).
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
#: Where ``install.py`` puts torchao 0.10.0 (torchtune's NF4 tensor), outside the environment that
#: imports peft: only the torchtune scenarios put it on ``PYTHONPATH``.
TORCHAO_TARGET = Path(sys.prefix) / "transparency-torchao"
#: The runs of a scenario: the script alone, under ``leafwatch run``, through the library's door.
VARIANTS = ("plain", "run", "door")
TIMEOUT_S = 300
#: Each subprocess's address space (``RLIMIT_AS``): a run that keeps what it should free fails with
#: a MemoryError here instead of taking the machine's memory.
MEMORY_LIMIT = 12 * 2**30
#: A printed loss, ``loss STEP HEX`` (anywhere on its line: a progress bar may print before it).
LOSS_LINE = re.compile(r"loss (\d+) ([-+]?0x[0-9a-f.]+p[-+]\d+|[-+]?inf|nan)$", re.MULTILINE)
LOADED_LINE = re.compile(r"^loaded (\S+) ([0-9a-f]{64})$", re.MULTILINE)
#: A finding said while the script runs: ``leafwatch: ERROR kind `name` ...`` (``leafwatch run``),
#: or the same words in a ``LeafwatchWarning`` (a Monitor, the callbacks).
LIVE_FINDING = re.compile(r"leafwatch: (ERROR|WARNING) \w+ `[^`]*`")
#: A warning's location line: ``path.py:LINE: SomeWarning: message``.
WARNING_LINE = re.compile(r"^(.+\.py):\d+: \w*Warning: .*$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One real training script of one library."""

    #: The test id.
    name: str
    #: The script under ``scripts/`` and its arguments after the output folder.
    script: str
    args: tuple[str, ...] = ()
    #: The library's own leafwatch door (``TRANSPARENCY_DOOR``): monitor, lightning or transformers.
    door: str = "monitor"
    #: The library's top-level module: without it installed, the scenario skips locally and fails in CI.
    requires: str = ""
    #: How many ``loss`` lines a run prints.
    steps: int = 4
    #: torchtune's: torchao 0.10.0 on ``PYTHONPATH``.
    torchao: bool = False
    #: ``(variant, check) -> reason`` of the expected failures (``xfail(strict=True)``).
    xfail: Mapping[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    #: How long one run may take before it is stopped (and fails).
    timeout_s: int = TIMEOUT_S


@dataclasses.dataclass
class Run:
    """What one run of a script left."""

    variant: str
    out: Path
    #: The exit code; None when the run was stopped at its timeout.
    returncode: int | None
    stdout: str
    stderr: str

    @property
    def losses(self) -> list[tuple[str, str]]:
        return LOSS_LINE.findall(self.stdout)

    @property
    def logdir(self) -> Path:
        return self.out / "records"

    def tail(self, chars: int = 4000) -> str:
        return f"--- {self.variant} stdout ---\n{self.stdout[-chars:]}\n--- {self.variant} stderr ---\n{self.stderr[-chars:]}"


def environment(scenario: Scenario, home: Path) -> dict[str, str]:
    """The environment of every subprocess: one thread (bitwise losses, two runs on two cores),
    nothing fetched from a hub, libraries' settings and caches kept under ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRANSPARENCY_"))}
    env.pop("PYTHONPATH", None)
    env.update({
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(home / "hf"),
        "YOLO_CONFIG_DIR": str(home / "ultralytics"), "YOLO_OFFLINE": "1", "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": str(home / "matplotlib"), "WANDB_MODE": "disabled", "TQDM_DISABLE": "1",
    })
    if scenario.torchao:
        env["PYTHONPATH"] = str(TORCHAO_TARGET)
    return env


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _run(command: list[str], cwd: Path, env: Mapping[str, str], timeout_s: int) -> tuple[int | None, str, str]:
    """Exit code (None when stopped at ``timeout_s``), stdout and stderr of one subprocess."""
    try:
        result = subprocess.run(command, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout_s,
                                preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired as error:
        return None, _text(error.stdout), f"{_text(error.stderr)}\n[stopped after {timeout_s} s]"
    return result.returncode, result.stdout, result.stderr


def train(scenario: Scenario, variant: str, root: Path) -> Run:
    """Runs the scenario's script once, in ``root/variant`` (its working folder and its OUT)."""
    out = root / variant
    out.mkdir(parents=True, exist_ok=True)
    env = environment(scenario, root)
    script = [str(SCRIPTS / scenario.script), str(out), *scenario.args]
    if variant == "plain":
        command = [sys.executable, *script]
    elif variant == "run":
        command = [sys.executable, "-m", "leafwatch", "run", "--logdir", str(out / "records"), *script]
    elif variant == "door":
        command = [sys.executable, *script]
        env["TRANSPARENCY_DOOR"] = scenario.door
    else:
        raise ValueError(f"`variant` must be one of {VARIANTS}, got {variant!r}")
    run = Run(variant, out, *_run(command, out, env, scenario.timeout_s))
    (root / f"{variant}.stdout.txt").write_text(run.stdout, encoding="utf-8")  # kept for reading after a failure
    (root / f"{variant}.stderr.txt").write_text(run.stderr, encoding="utf-8")
    return run


@dataclasses.dataclass
class Loaded:
    """What loading some runs' checkpoints in a fresh process printed."""

    returncode: int | None
    stdout: str
    stderr: str

    @property
    def digests(self) -> dict[str, str]:
        """The sha256 of each run's loaded weights, by variant."""
        return {Path(out).name: digest for out, digest in LOADED_LINE.findall(self.stdout)}


def load(scenario: Scenario, runs: list[Run], root: Path) -> Loaded:
    """Loads the runs' checkpoints in one fresh process that never imports leafwatch (the script's
    ``--load``, which exits 1 when leafwatch is in ``sys.modules`` at its end)."""
    env = environment(scenario, root)
    command = [sys.executable, str(SCRIPTS / scenario.script), "--load", *(str(run.out) for run in runs)]
    return Loaded(*_run(command, root, env, scenario.timeout_s))


def _event_files(logdir: Path) -> list[Path]:
    return sorted(p for p in logdir.rglob("*") if p.is_file() and "tfevents" in p.name)


def coverage(logdir: Path) -> dict[str, Any]:
    """The latest coverage record of each chunk under ``logdir``, merged: ``{group: {"names": [...],
    "checks": how many checks}}``."""
    from tensorboard.backend.event_processing import event_file_loader

    from leafwatch.report.records import decode, is_coverage_tag

    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for path in _event_files(logdir):
        for event in event_file_loader.EventFileLoader(str(path)).Load():
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if is_coverage_tag(value.tag) and value.HasField("tensor") and value.tensor.string_val:
                    record = decode(value.tensor.string_val[0])
                    if record is not None:
                        latest[(str(path.parent), value.tag)] = record
    groups: dict[str, Any] = {}
    for (folder, _), record in sorted(latest.items()):
        for group, data in record.get("groups", {}).items():
            merged = groups.setdefault(f"{folder}:{group}", {"names": set(), "checks": 0})
            merged["names"].update(data.get("names", []))
            merged["checks"] += sum(last - first + 1 for first, last in data.get("steps", []))
    return groups


def findings(logdir: Path) -> list[Any]:
    """Every finding of the latest report record of each run folder under ``logdir``."""
    from leafwatch.report.reader import read_reports

    if not logdir.is_dir():
        return []
    return [finding for run in read_reports(str(logdir)) for finding in run.report.findings]


def warnings_from_leafwatch(stderr: str) -> list[str]:
    """The warnings that leafwatch's own code made anything raise (torch reading a non-leaf's
    ``.grad``, ...): their location is a file of the leafwatch package. A finding's warning points at
    the user's line instead, and is not one of them."""
    import importlib.util

    spec = importlib.util.find_spec("leafwatch")
    if spec is None or not spec.submodule_search_locations:
        return []
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    return [match.group(0) for match in WARNING_LINE.finditer(stderr)
            if Path(match.group(1)).resolve().is_relative_to(package)]


def has_report(logdir: Path) -> bool:
    """Whether a leafwatch report record was written under ``logdir``."""
    from leafwatch.report.reader import read_reports

    return bool(read_reports(str(logdir))) if logdir.is_dir() else False

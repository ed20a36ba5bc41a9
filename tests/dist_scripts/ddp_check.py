"""Multi-process leafwatch runs, launched by tests/integrations/test_distributed.py.

Usage: ``python -m torch.distributed.run --nproc_per_node 2 ddp_check.py SCENARIOS OUT_DIR [STEPS]``
(or two processes with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as the tests do).
``SCENARIOS`` is one scenario or several, comma-separated, each with its own number of steps
after a colon (default ``STEPS``, else 3): ``unused,fsdp2:2``. The scenarios run one after the
other in the same two processes and process group (the process start, ``import torch`` and the
gloo rendezvous are paid once). Each rank writes ``OUT_DIR/SCENARIO/rank{N}.json`` when a
scenario ends: the report of each check, how many sink events the rank saw, and the error that
stopped it (if any). A scenario that leaves the ranks out of step (:data:`LAST_ONLY`) must come
last.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist
from torch import nn

import leafwatch
import leafwatch.detectors.gatherer


#: CPU with gloo; LEAFWATCH_TEST_BACKEND=nccl puts each rank on its own GPU.
DEVICE = torch.device("cpu")


class TwoLayers(nn.Module):
    """``layer`` is always used; ``unused`` never; ``branch`` only where ``use_branch`` says."""

    def __init__(self, use_branch: bool = True) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.branch = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)
        self.use_branch = use_branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x)
        if self.use_branch:
            y = self.branch(y)
        return y


class Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def build(scenario: str, rank: int) -> tuple[nn.Module, nn.Module, dict]:
    """The user's module, what is trained (a wrapper), and Monitor options."""
    def ddp(module: nn.Module, **kwargs: object) -> nn.Module:
        if DEVICE.type == "cuda":
            module.to(DEVICE)
            kwargs["device_ids"] = [DEVICE.index]
        return nn.parallel.DistributedDataParallel(module, **kwargs)

    if scenario == "unused":
        inner = TwoLayers()
        return inner, ddp(inner), {}
    if scenario == "strict":
        inner = TwoLayers()
        return inner, ddp(inner), {"strict": True}
    if scenario in ("branch", "branch_once"):  # branch_once: rank 1 skips it at the first step only
        inner = TwoLayers(use_branch=rank != 1)
        del inner.unused
        return inner, ddp(inner, find_unused_parameters=True), {}
    if scenario == "branch_strict":
        # find_unused_parameters=False: rank 0 waits in DDP's backward for the branch's gradient.
        inner = TwoLayers(use_branch=rank != 1)
        del inner.unused
        return inner, ddp(inner), {"strict": True}
    if scenario in ("clean", "rank0_only"):
        inner = Clean()
        return inner, ddp(inner), {}
    if scenario == "frozen":
        # Nothing requires grad (DDP refuses such a module: it is not wrapped).
        inner = Clean().requires_grad_(False)
        return inner, inner, {}
    if scenario == "unused_fup":
        inner = TwoLayers()
        return inner, ddp(inner, find_unused_parameters=True), {}
    if scenario.startswith("fsdp"):
        from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

        inner = TwoLayers()
        if scenario == "fsdp2":
            fully_shard(inner.layer)
            fully_shard(inner)
            return inner, inner, {}
        wrapped = FullyShardedDataParallel(inner, use_orig_params=scenario == "fsdp_orig",
                                           device_id=torch.device("cpu"))
        return inner, wrapped, {}
    raise ValueError(f"unknown scenario {scenario!r}")


#: The gather timeout leafwatch ships with, restored before each scenario.
DEFAULT_TIMEOUT_S = leafwatch.detectors.gatherer.DEFAULT_TIMEOUT_S

#: Scenarios after which the ranks are out of step: one rank gave up a collective (the gather of
#: ``rank0_only``, DDP's gradient all-reduce of ``branch_strict``) that the other never joined.
LAST_ONLY = ("branch_strict", "rank0_only")


def parse(scenarios: str, steps: int) -> list[tuple[str, int]]:
    """``"unused,fsdp2:2"`` -> ``[("unused", steps), ("fsdp2", 2)]``; an out-of-step scenario only last."""
    parsed = []
    for item in scenarios.split(","):
        name, _, count = item.partition(":")
        parsed.append((name, int(count) if count else steps))
    for name, _ in parsed[:-1]:
        if name in LAST_ONLY:
            raise ValueError(f"scenario {name!r} leaves the ranks out of step: it must come last")
    return parsed


def run(scenario: str, steps: int, rank: int, out_dir: str) -> None:
    """One scenario from a fresh seed and the default gather timeout; writes its result."""
    torch.manual_seed(rank)
    leafwatch.detectors.gatherer.DEFAULT_TIMEOUT_S = DEFAULT_TIMEOUT_S
    inner, trained, options = build(scenario, rank)
    events = []
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
    # The DDP wrapper is given to the Monitor for the DDP scenarios: names lose `module.`.
    model = trained if isinstance(trained, nn.parallel.DistributedDataParallel) else inner
    monitor = None
    if scenario == "branch_strict":
        leafwatch.detectors.gatherer.DEFAULT_TIMEOUT_S = 3.0
    if scenario == "rank0_only":
        # A Monitor on rank zero only: leafwatch must give up gathering, not hang.
        leafwatch.detectors.gatherer.DEFAULT_TIMEOUT_S = 3.0
    if scenario != "rank0_only" or rank == 0:
        # The frozen model is handed without its optimizer: nothing at all to check.
        given = None if scenario == "frozen" else optimizer
        monitor = leafwatch.Monitor(model, given, sinks=[lambda e: events.append(e.step)], **options)
    result: dict = {"rank": rank, "reports": [], "error": None, "error_type": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for step in range(steps):
                if scenario == "branch_once" and step == 1:
                    inner.use_branch = True
                optimizer.zero_grad()
                loss = trained(torch.randn(8, 4, device=DEVICE)).sum()
                if loss.requires_grad:  # not in the frozen scenario
                    loss.backward()
                if monitor is not None:
                    result["reports"].append(monitor.check(given).to_dict())
                optimizer.step()
        except Exception as error:
            result["error"] = str(error)
            result["error_type"] = type(error).__name__
            result["traceback"] = traceback.format_exc()
    result["warnings"] = [str(w.message) for w in caught if issubclass(w.category, leafwatch.LeafwatchWarning)]
    result["sink_events"] = events
    gatherer = monitor._gatherer if monitor is not None else None
    result["rounds"] = gatherer.rounds if gatherer is not None else None
    if monitor is not None:
        monitor.close()
    os.makedirs(os.path.join(out_dir, scenario), exist_ok=True)
    with open(os.path.join(out_dir, scenario, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    out_dir = sys.argv[2]
    scenarios = parse(sys.argv[1], int(sys.argv[3]) if len(sys.argv) > 3 else 3)
    global DEVICE
    if os.environ.get("LEAFWATCH_TEST_BACKEND") == "nccl":
        DEVICE = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(DEVICE)
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    for scenario, steps in scenarios:
        run(scenario, steps, rank, out_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

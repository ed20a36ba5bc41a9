"""Per-check cost of gathering findings across ranks (not a test; prints one JSON line).

Usage: ``python -m torch.distributed.run --nproc_per_node 2 measure_gather.py [CHECKS]``.
Times, on quiet steps (nothing changed), ``Monitor.check`` without ``distributed``, with it
waiting for the flag at each check ("sync"), and with the flag read one check later
("pipelined", the default), and the collective itself: an all-reduce of one int32 on gloo. A DDP training step (forward,
backward) of a small MLP runs between two timed checks, as in training.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import leafwatch


def timed(fn, n: int, between=None) -> list[float]:
    out = []
    for _ in range(n):
        if between is not None:
            between()
        dist.barrier()
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(*[nn.Linear(16, 16) for _ in range(8)]))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)

    def train_step() -> None:
        # The current ``model``/``opt`` (rebound below for the find_unused_parameters run).
        opt.zero_grad()
        model(x).sum().backward()

    train_step()
    results = {}
    for label, flag, pipelined in (("local", False, True), ("sync", True, False), ("pipelined", True, True)):
        monitor = leafwatch.Monitor(model, opt, distributed=flag, check_values_every_n_steps=0)
        if monitor._gatherer is not None:
            monitor._gatherer.pipelined = pipelined
        monitor.check(opt)  # the first check builds the inventory (and gathers once)
        times = timed(lambda: monitor.check(opt), n, train_step)
        results[f"check_{label}_us"] = statistics.median(times) * 1e6
        results[f"check_{label}_p90_us"] = sorted(times)[int(0.9 * n)] * 1e6
        if monitor._gatherer is not None:
            results[f"gather_rounds_{label}"] = monitor._gatherer.rounds
        monitor.close()
    # DDP(find_unused_parameters=True): one post-accumulate-grad hook per parameter tells which
    # parameters each rank used; it costs on the backward pass, timed here.
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(*[nn.Linear(16, 16) for _ in range(8)]), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for label, flag in (("local", False), ("distributed", True)):
        monitor = leafwatch.Monitor(model, opt, distributed=flag, check_values_every_n_steps=0)
        results[f"fup_backward_{label}_us"] = statistics.median(timed(train_step, n)) * 1e6
        results["fup_hooks"] = len(monitor._gatherer._handles) if monitor._gatherer is not None else 0
        monitor.close()
    group = dist.new_group(backend="gloo")
    flag = torch.zeros(1, dtype=torch.int32)
    times = timed(lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group), n)
    results["all_reduce_int32_us"] = statistics.median(times) * 1e6
    results["checks"] = n
    results["world_size"] = dist.get_world_size()
    if dist.get_rank() == 0:
        print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in results.items()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

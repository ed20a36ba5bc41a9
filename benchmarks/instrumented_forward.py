"""Cost of an instrumented forward: the diagnostic hooks and the cut recorder, against a plain forward.

leafwatch instruments a forward only from a Monitor's creation to its first check, and after a
new miss or a new structure until the next check (see docs/how-it-works.md): this measures what
one such forward costs on a small transformer-like model (``nn.TransformerEncoder``, 4 layers,
d_model 64, batch 8 x 32 tokens), with grad on and no backward.

Variants, run in interleaved rounds (a fresh shuffle each round, so a busy machine slows all
alike): the plain forward; the forward with leafwatch's diagnostic module hooks on every module
(what an instrumented step had before the recorder); the instrumented forward (those hooks and
the cut recorder, a ``TorchFunctionMode`` that sees every torch call); and the forward with the hooks
armed on the head and the root only (a miss diagnosed after the first check: the hooks are torch's
global module hooks, so every module's call pays for them while one is armed). Prints the median time per
forward of each over the rounds and its ratio to the plain forward in the same round (median, min, max).

Usage: python benchmarks/instrumented_forward.py [--rounds 15] [--forwards 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
from torch import nn

from leafwatch.observe import tracing


def make_model() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.Linear(16, 64), nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False),
                         nn.Linear(64, 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--forwards", type=int, default=20, help="forwards per variant per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = make_model()
    x = torch.randn(8, 32, 16)
    modules = dict(model.named_modules())
    tracer = tracing.Tracer()
    recorded: list[int] = []

    # A miss being diagnosed between instrumented forwards: the head and its ancestor armed, no recorder.
    head = {name: module for name, module in modules.items() if name in ("", "2")}

    def block(hooks: bool | str, recorder: bool) -> float:
        if hooks:
            tracer.arm(head if hooks == "head" else modules, instrument=recorder)
        start = time.perf_counter()
        for _ in range(args.forwards):
            tracer.ops_wanted = recorder
            model(x)
            if recorder:
                recorded.append(int(tracer.ops_traced))
            tracer.reset()
        spent = (time.perf_counter() - start) / args.forwards
        tracer.disarm()
        return spent

    variants = {"plain forward": (False, False), "module hooks only": (True, False),
                "instrumented (hooks + cut recorder)": (True, True), "hooks on the head only (a miss diagnosed)": ("head", False)}
    for hooks, recorder in variants.values():
        block(hooks, recorder)  # warm-up
    recorded.clear()
    rng = random.Random(args.seed)
    times: dict[str, list[float]] = {name: [] for name in variants}
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        order = list(variants)
        rng.shuffle(order)
        this_round = {name: block(*variants[name]) for name in order}
        for name, spent in this_round.items():
            times[name].append(spent)
            ratios[name].append(spent / this_round["plain forward"])
    assert recorded and all(recorded), "the recorder ran over every instrumented forward"
    result = {
        "model": "nn.TransformerEncoder, 4 layers, d_model 64, batch 8x32, grad on, no backward",
        "rounds": args.rounds, "forwards_per_round": args.forwards, "threads": args.threads,
        "torch": torch.__version__,
        "variants": {name: {"median_ms": round(1e3 * statistics.median(times[name]), 3),
                            "ratio_median": round(statistics.median(ratios[name]), 2),
                            "ratio_min": round(min(ratios[name]), 2), "ratio_max": round(max(ratios[name]), 2)}
                     for name in variants},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

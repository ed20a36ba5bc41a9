"""A script that registers torch's own global optimizer step hooks (a gradient-norm logger before
each step, a step counter after it), or runs its loop under torch's ``MemTracker`` (``--memtracker``),
which registers the same kind of hooks. Its ``aux_head`` is never called: leafwatch must still
name it, and the script must run exactly as under plain ``python``."""

import argparse

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--memtracker", action="store_true")
args = parser.parse_args()

grad_norms: list[float] = []
steps_done: list[int] = []


def log_grad_norm(optimizer, args_, kwargs):
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    grad_norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))


torch.manual_seed(0)
model = nn.ModuleDict({"body": nn.Linear(4, 8), "head": nn.Linear(8, 1), "aux_head": nn.Linear(8, 1)})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def train(tracker=None) -> None:
    for _ in range(args.steps):
        if tracker is not None:
            tracker.reset_mod_stats()  # MemTracker tracks one iteration at a time
        loss = model["head"](model["body"](torch.randn(16, 4)).relu()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if args.memtracker:
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        train(tracker)
    peak = sum(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())
    print(f"memtracker saw a peak: {peak > 0}")
else:
    pre = register_optimizer_step_pre_hook(log_grad_norm)
    post = register_optimizer_step_post_hook(lambda optimizer_, a, k: steps_done.append(1))
    train()
    pre.remove()
    post.remove()
    print(f"logged {len(grad_norms)} grad norms, {len(steps_done)} steps")

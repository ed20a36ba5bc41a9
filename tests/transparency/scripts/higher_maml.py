"""higher: MAML as higher's ``examples/maml-omniglot.py`` writes it, on synthetic few-shot tasks.

The inner loop adapts a functional copy of the network (``innerloop_ctx(net, inner_opt,
copy_initial_weights=False)``) with a differentiable optimizer; the query loss's backward reaches
the network's own parameters, which the meta-optimizer steps. The checkpoint is the network's
``state_dict``.
"""

from __future__ import annotations

from pathlib import Path

import higher
import torch
import torch.nn.functional as F
from _transparency import arguments, attach_monitor, close_monitor, print_loss
from torch import nn, optim

N_WAY, K_SPT, K_QRY, TASKS, DIM = 5, 2, 3, 4, 16
STEPS = 30


def make_net() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 32), nn.BatchNorm1d(32, momentum=1.0, affine=True), nn.ReLU(inplace=True),
                         nn.Linear(32, N_WAY))


def load(out: Path) -> dict:
    net = make_net()
    net.load_state_dict(torch.load(out / "maml.pt", weights_only=True))
    return net.state_dict()



if __name__ == "__main__":
    out, args = arguments(load)
    torch.manual_seed(0)
    net = make_net()
    meta_opt = optim.Adam(net.parameters(), lr=1e-3)
    monitor = attach_monitor(net, meta_opt, out)
    inner_opt = torch.optim.SGD(net.parameters(), lr=1e-1)
    n_inner_iter = 3
    for step in range(1, STEPS + 1):
        x_spt, y_spt = torch.randn(TASKS, N_WAY * K_SPT, DIM), torch.arange(N_WAY).repeat(TASKS, K_SPT)
        x_qry, y_qry = torch.randn(TASKS, N_WAY * K_QRY, DIM), torch.arange(N_WAY).repeat(TASKS, K_QRY)
        qry_losses = []
        meta_opt.zero_grad()
        for i in range(TASKS):
            with higher.innerloop_ctx(net, inner_opt, copy_initial_weights=False) as (fnet, diffopt):
                for _ in range(n_inner_iter):
                    spt_logits = fnet(x_spt[i])
                    spt_loss = F.cross_entropy(spt_logits, y_spt[i])
                    diffopt.step(spt_loss)
                qry_logits = fnet(x_qry[i])
                qry_loss = F.cross_entropy(qry_logits, y_qry[i])
                qry_losses.append(qry_loss.detach())
                qry_loss.backward()
        meta_opt.step()
        print_loss(step, sum(qry_losses) / TASKS)
    close_monitor(monitor)
    torch.save(net.state_dict(), out / "maml.pt")


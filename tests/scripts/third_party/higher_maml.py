"""higher's MAML as its ``examples/maml-omniglot.py`` writes it: a meta optimizer (Adam) over the network, an
inner SGD that ``higher.innerloop_ctx`` turns into a differentiable one, a few inner steps on each task's
support set (``diffopt.step(spt_loss)``), the query loss's backward inside the context, then ``meta_opt.step()``.

The example passes ``copy_initial_weights=False``: the fast weights start from the network's own parameters and
the meta-gradient reaches them. ``--copy``: higher's default, ``copy_initial_weights=True``: the fast weights
start from detached copies, backward stops there, and the network never trains. ``--own-monitor``: the script
keeps a Monitor of its own in a variable (``monitor``), attached as a user adds one."""

import sys

import higher
import torch
import torch.nn.functional as F
from torch import nn


def train(args: list[str], attach=None):
    """Three meta steps of two tasks each; ``attach(net, meta_opt)`` is called right after both are built."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    meta_opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    inner_opt = torch.optim.SGD(net.parameters(), lr=1e-1)
    attached = attach(net, meta_opt) if attach is not None else None
    if "--own-monitor" in args:
        import leafwatch

        monitor = leafwatch.Monitor(net, meta_opt, verbose=False).attach()
    x_spt, y_spt = torch.randn(2, 5, 4), torch.randint(0, 3, (2, 5))
    x_qry, y_qry = torch.randn(2, 5, 4), torch.randint(0, 3, (2, 5))
    for step in range(3):
        meta_opt.zero_grad()
        for i in range(2):
            with higher.innerloop_ctx(net, inner_opt, copy_initial_weights="--copy" in args) as (fnet, diffopt):
                for _ in range(2):
                    diffopt.step(F.cross_entropy(fnet(x_spt[i]), y_spt[i]))
                F.cross_entropy(fnet(x_qry[i]), y_qry[i]).backward()
        meta_opt.step()
    if "--own-monitor" in args:
        monitor.close()
    print("done")
    return attached


if __name__ == "__main__":
    train(sys.argv[1:])

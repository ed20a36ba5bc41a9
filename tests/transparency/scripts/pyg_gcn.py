"""PyTorch Geometric: the two-layer ``GCNConv`` node classifier of PyG's introduction
(``examples/gcn.py``), on a synthetic graph (``torch_geometric.data.Data`` with random features and
edges, a train mask), Adam with weight decay on the first layer only, as the example does. The
checkpoint is the ``state_dict``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from _transparency import arguments, attach_monitor, close_monitor, print_loss
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv
from torch_geometric.utils import to_undirected

NODES, FEATURES, CLASSES, STEPS = 60, 12, 3, 30


class GCN(torch.nn.Module):
    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels, cached=True, normalize=True)
        self.conv2 = GCNConv(hidden_channels, out_channels, cached=True, normalize=True)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


def load(out: Path) -> dict:
    model = GCN(FEATURES, 16, CLASSES)
    model.load_state_dict(torch.load(out / "gcn.pt", weights_only=True))
    return model.state_dict()


if __name__ == "__main__":
    out, args = arguments(load)
    torch.manual_seed(0)
    edge_index = to_undirected(torch.randint(0, NODES, (2, 240)), num_nodes=NODES)
    data = Data(x=torch.randn(NODES, FEATURES), edge_index=edge_index, y=torch.randint(0, CLASSES, (NODES,)),
                train_mask=torch.rand(NODES) < 0.6)
    model = GCN(FEATURES, 16, CLASSES)
    optimizer = torch.optim.Adam([dict(params=model.conv1.parameters(), weight_decay=5e-4),
                                  dict(params=model.conv2.parameters(), weight_decay=0)], lr=0.01)
    monitor = attach_monitor(model, optimizer, out)
    for step in range(1, STEPS + 1):
        model.train()
        optimizer.zero_grad()
        out_logits = model(data.x, data.edge_index)
        loss = F.cross_entropy(out_logits[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()
        print_loss(step, loss)
    close_monitor(monitor)
    torch.save(model.state_dict(), out / "gcn.pt")

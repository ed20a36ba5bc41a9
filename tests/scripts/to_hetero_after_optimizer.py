"""`model = to_hetero(model, data.metadata())` after the optimizer was built, as in PyG's examples:
the converted model's tensors are new, the optimizer still steps the original's."""

import copy

import torch
from torch import nn

torch.manual_seed(0)
EDGE_TYPES = ("paper__cites__paper", "author__writes__paper")


class GNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.conv2(self.conv1(x).relu())


class Hetero(nn.Module):
    """What `torch_geometric.nn.to_hetero` returns: a deep copy of each layer per edge type, summed."""

    def __init__(self, module, edge_types):
        super().__init__()
        for name, layer in module.named_children():
            setattr(self, name, nn.ModuleDict({t: copy.deepcopy(layer) for t in edge_types}))

    def forward(self, x):
        h = sum(layer(x) for layer in self.conv1.values()).relu()
        return sum(layer(h) for layer in self.conv2.values())


model = GNN()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
model = Hetero(model, EDGE_TYPES)  # the conversion, after the optimizer
for step in range(10):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
print("trained")

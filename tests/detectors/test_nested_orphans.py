"""Orphans in nested containers: dicts of dicts, lists of tuples, dataclass and namedtuple fields
are ``orphan_tensor`` with their access path, as plain lists and dicts are."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest
import torch
from torch import nn

import leafwatch


class RelationWeights(nn.Module):
    """A relational layer keeping one weight and bias per relation in a dict of dicts."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.w = {rel: {"w": nn.Parameter(torch.ones(3)), "b": nn.Parameter(torch.zeros(3))} for rel in ("cites", "writes")}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        return sum(x * p["w"] + p["b"] for p in self.w.values())


class PairsOfLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3, 1)
        self.stages = [(nn.Linear(3, 3), nn.Linear(3, 3))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for first, second in self.stages:
            x = second(first(x))
        return self.head(x)


@dataclasses.dataclass
class Gates:
    gain: torch.Tensor
    proj: nn.Module


class DataclassField(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.gates = Gates(torch.ones(3, requires_grad=True), nn.Linear(3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gates.proj(self.lin(x) * self.gates.gain)


class Scales(NamedTuple):
    low: torch.Tensor
    high: torch.Tensor


class NamedTupleField(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scales = Scales(nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scales.low * self.scales.high


@pytest.mark.parametrize(
    ("model_cls", "names", "containers", "fix_words"),
    [
        (RelationWeights, {"w['cites']['w']", "w['cites']['b']", "w['writes']['w']", "w['writes']['b']"},
         ["dict", "dict"], "`nn.ModuleDict` holding `nn.ParameterDict`"),
        (PairsOfLayers, {"stages[0][0].weight", "stages[0][0].bias", "stages[0][1].weight", "stages[0][1].bias"},
         ["list", "list"], "`nn.ModuleList` holding `nn.ModuleList`"),
        (DataclassField, {"gates.gain", "gates.proj.weight", "gates.proj.bias"}, ["dataclass"], "instead of a dataclass"),
        (NamedTupleField, {"scales.low", "scales.high"}, ["namedtuple"], "instead of a namedtuple"),
    ],
)
def test_nested_orphans_are_named_by_their_access_path(model_cls, names, containers, fix_words) -> None:
    model = model_cls()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        model(torch.randn(4, 3)).sum().backward()
        monitored = monitor.check()
    for report in (monitored, leafwatch.audit(model, opt)):
        assert report.names() == names
        for f in report:
            assert (f.kind, f.severity) == ("orphan_tensor", "error")
            assert f.details["containers"] == containers
            assert "not registered" in f.message and "never trains" in f.message
            assert "does not look into" in f.cause or "are not parameters of the module" in f.cause
            assert fix_words in f.fix


def test_registered_tensors_kept_in_nested_containers_too_are_no_orphans() -> None:
    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.gain = nn.Parameter(torch.ones(3))
            self.index = {"layers": [(self.a, self.gain)], "meta": Gates(self.gain, self.a)}

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x) * self.gain

    model = Both()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        model(torch.randn(4, 3)).sum().backward()
        assert monitor.check().findings == []
    assert leafwatch.audit(model, opt).findings == []


def test_a_tensor_the_user_puts_on_a_torch_module_is_an_orphan() -> None:
    """A LoRA factor written by hand onto an `nn.Linear` (a plain tensor attribute): torch's own modules keep
    no such tensor, so it is the user's would-be parameter, named by its path (a library's module, higher's
    patched copy, is not looked into: tests/integrations/test_third_party_libraries.py)."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    model[0].lora_a = torch.zeros(3, 2, requires_grad=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        model(torch.randn(4, 3)).sum().backward()
        monitored = monitor.check()
    for report in (monitored, leafwatch.audit(model, opt)):
        assert report.names() == {"0.lora_a"}
        assert [(f.kind, f.severity) for f in report] == [("orphan_tensor", "error")]

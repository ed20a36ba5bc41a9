"""What every detector's builders share: :func:`make` (a finding, its reason required), the texts
and names several voices use, and the reason a missing gradient was observed with.

Each builder lives in the detector that decides its reason (the registry names it); none here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..report.findings import Finding
from ..observe.inventory import describe_tensor

UNKNOWN_CAUSE = (
    "unknown: leafwatch saw only the end state (no gradient after backward). To learn why, create "
    "`leafwatch.Monitor(model, optimizer)` before the first forward pass, or pass `loss=` to audit()."
)


def make(kind: str, name: str, severity: str, message: str, cause: str, fix: str, *, reason: str,
         tensor: torch.Tensor | None = None, step: int | None = None,
         aliases: Iterable[str] = (), **details: Any) -> Finding:
    """A finding with its words. ``reason`` is required: each ``(kind, reason)`` has one builder,
    listed in :data:`leafwatch.detectors.registry.VOICES`."""
    described = describe_tensor(tensor) if tensor is not None else {}
    return Finding.new(kind, name, severity, message, cause, fix, step=step, aliases=aliases, reason=reason,
                       **described, **details)


#: The name of the one finding that says no trainable tensor has a gradient at all.
ALL_PARAMETERS = "<every trainable parameter>"


def observed(finding: Finding) -> str | None:
    """The reason a missing gradient was observed with, also under a later transition's reason."""
    return finding.details.get("observed", finding.details.get("reason"))


def silence_hint(name: str, module: str | None = None) -> str:
    """The ``ignore=`` pattern that silences a finding that is true but intended."""
    pattern = f"{module}.*" if module else name
    return f'if that is intended, silence it: `ignore=["{pattern}"]`'

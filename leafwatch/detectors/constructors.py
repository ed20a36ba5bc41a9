"""What every detector shares to make findings: :func:`make` (a finding of a reason), :func:`transition`
(a finding under a later reason that holds the earlier one), and the words several reasons use
(:func:`missing_words`, :func:`silence`).

Each reason class lives in the detector that decides it (the registry lists it); none here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..report.findings import Finding
from ..report.names import natural_key
from ..report.reasons import Reason, Transition
from ..report.words import ADVICE, Members, Remedy, Words
from ..observe.inventory import describe_tensor

UNKNOWN_CAUSE = (
    "unknown: leafwatch saw only the end state (no gradient after backward). To learn why, create "
    "`leafwatch.Monitor(model, optimizer)` before the first forward pass, or pass `loss=` to audit()."
)


def make(reason: Reason, name: str, severity: str, *, tensor: torch.Tensor | None = None, step: int | None = None,
         aliases: Iterable[str] = (), **details: Any) -> Finding:
    """A finding of ``reason`` (its kind the reason's) first seen at ``step``, with the shape, dtype and device
    of ``tensor``; ``details``: the history's bookkeeping."""
    described = describe_tensor(tensor) if tensor is not None else {}
    return Finding(reason.kind, name, severity, reason, step=step, first_step=step, last_step=step,  # type: ignore[arg-type]
                   aliases=tuple(aliases), details=details, **described)


#: The name of the one finding that says no trainable tensor has a gradient at all.
ALL_PARAMETERS = "<every trainable parameter>"


def silence(m: Members, limit: int = 8) -> str | None:
    """``if that is intended, silence it: `ignore=[...]` `` for the tensors of ``m``: for each, the
    module that holds all of its mistake (its cover), else its own module (its reason's ``module``), else
    its name; None for more than ``limit`` patterns."""
    patterns = sorted({f"{cover}.*" if cover else f"{r.module}.*" if getattr(r, "module", None) else name
                       for name, r, cover in zip(m.names, m.reasons, m.covers)}, key=natural_key)
    if len(patterns) > limit:
        return None
    return "if that is intended, silence it: `ignore=[" + ", ".join(f'"{p}"' for p in patterns) + "]`"


def missing_words(m: Members, cause: str, fix: str, remedy: Remedy = ADVICE, *, silenced: bool = False) -> Words:
    """The words of a ``missing_grad`` finding: its one message, ``cause`` and ``fix`` (with the
    ``ignore=`` pattern that silences it when ``silenced`` and the tensors' modules are known)."""
    hint = silence(m) if silenced and getattr(m.first, "module", None) is not None else None
    return Words(f"{m.who} requires grad but got no gradient: it does not train.", cause,
                 f"{fix}; {hint}" if hint else fix, remedy)


#: The transitions that only say how often a gradient came (their words keep the earlier reason's
#: cause and fix): a transition made of one of them takes that one's earlier reason, so that a tensor
#: that comes and goes for a whole run is never wrapped deeper than once.
RELABELS = frozenset({"intermittent", "stalled"})


def earlier_of(f: Finding) -> Reason:
    """The reason a transition of ``f`` comes from: ``f``'s own, or what a relabel of it came from."""
    return f.reason.earlier if f.reason.name in RELABELS and isinstance(f.reason, Transition) else f.reason


def transition(f: Finding, reason: type[Transition], details: dict[str, Any] | None = None, **fields: Any) -> Finding:
    """``f`` under a transition's ``reason`` made of ``fields`` and the reason ``f`` comes from (never its
    words); the history's bookkeeping of ``f`` is kept (what it waited for goes), ``details`` added."""
    kept = {k: v for k, v in f.details.items() if k != "pending"}
    return f.replace(reason=reason(earlier=earlier_of(f), **fields), details={**kept, **(details or {})})

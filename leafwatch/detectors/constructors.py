"""What every detector shares to make findings: :func:`make` (a finding of a reason, from its
arguments), :func:`transition` (a finding under a later reason that keeps the earlier one's
arguments), the reason a missing gradient was observed with, and the words several renderers use
(:func:`missing_words`, :func:`silence`).

Each renderer lives in the detector that decides its reason (the registry names it); none here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..report.findings import Finding
from ..report.names import natural_key
from ..report.words import ADVICE, Members, Remedy, Words
from ..observe.inventory import describe_tensor

UNKNOWN_CAUSE = (
    "unknown: leafwatch saw only the end state (no gradient after backward). To learn why, create "
    "`leafwatch.Monitor(model, optimizer)` before the first forward pass, or pass `loss=` to audit()."
)


def make(kind: str, name: str, severity: str, reason: str, args: Mapping[str, Any], *,
         tensor: torch.Tensor | None = None, step: int | None = None, aliases: Iterable[str] = (),
         **details: Any) -> Finding:
    """A finding of ``(kind, reason)`` whose words the renderer of that reason writes from ``args``
    (plain, JSON-able data; :mod:`leafwatch.report.words`); ``details``: the history's bookkeeping."""
    described = describe_tensor(tensor) if tensor is not None else {}
    return Finding.rendered(kind, name, severity, reason, args, step=step, aliases=aliases, **described, **details)


#: The name of the one finding that says no trainable tensor has a gradient at all.
ALL_PARAMETERS = "<every trainable parameter>"


def observed(finding: Finding) -> str | None:
    """The reason a missing gradient was observed with, also under a later transition's reason."""
    return finding.details.get("observed", finding.details.get("reason"))


def silence(m: Members, limit: int = 8) -> str | None:
    """``if that is intended, silence it: `ignore=[...]` `` for the tensors of ``m``: for each, the
    module that holds all of its mistake (its cover), else its own module (``args["module"]``), else
    its name; None for more than ``limit`` patterns."""
    patterns = sorted({f"{cover}.*" if cover else f"{a['module']}.*" if a.get("module") else name
                       for name, a, cover in zip(m.names, m.args, m.covers)}, key=natural_key)
    if len(patterns) > limit:
        return None
    return "if that is intended, silence it: `ignore=[" + ", ".join(f'"{p}"' for p in patterns) + "]`"


def missing_words(m: Members, cause: str, fix: str, remedy: Remedy = ADVICE, *, silenced: bool = False) -> Words:
    """The words of a ``missing_grad`` finding: its one message, ``cause`` and ``fix`` (with the
    ``ignore=`` pattern that silences it when ``silenced`` and the tensors' modules are known)."""
    hint = silence(m) if silenced and "module" in m.first else None
    return Words(f"{m.who} requires grad but got no gradient: it does not train.", cause,
                 f"{fix}; {hint}" if hint else fix, remedy)


def transition(f: Finding, reason: str, args: Mapping[str, Any], **details: Any) -> Finding:
    """``f`` under a transition's ``reason``: its renderer gets ``args`` and the earlier reason's
    arguments (``args["earlier"]``), never its words; the history's bookkeeping of ``f`` is kept."""
    earlier = f.args["earlier"] if f.reason in RELABELS else {"reason": f.reason, "args": dict(f.args)}
    kept = {k: v for k, v in f.details.items() if k not in ("reason", "applicability", "observed", "pending")}
    made = make(f.kind, f.name, f.severity, reason, {**args, "earlier": earlier}, step=f.step, aliases=f.aliases,
                shape=f.shape, dtype=f.dtype, device=f.device, **{**kept, **details}, observed=earlier["reason"])
    return made.replace(status=f.status, first_step=f.first_step, last_step=f.last_step, steps_seen=f.steps_seen,
                        ranks=f.ranks)


#: The transitions that only say how often a gradient came (their words keep the earlier reason's
#: cause and fix): a transition made of one of them takes that one's earlier reason, so that a tensor
#: that comes and goes for a whole run is never wrapped deeper than once.
RELABELS = frozenset({"intermittent", "stalled"})

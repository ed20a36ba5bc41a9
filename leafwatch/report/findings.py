"""Findings and reports: what leafwatch found, why, and the one-line fix.

A :class:`Finding` is plain data (strings and numbers only, never a tensor), so a report can be
kept, pickled, logged or sent across ranks without keeping anything of the user's alive.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import operator
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .format import report_markdown, report_text
from ..options import LeafwatchError, matching_pattern
from ..observe.names import ancestors, parent
from .names import compress_names, container, natural_key
from .reasons import Reason, Written, from_args
from .words import Members, Remedy, Words


class _WordEnum(str, enum.Enum):
    """A closed set of words that compare, print, format and serialise as the plain str."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)


class Kind(_WordEnum):
    """What is wrong with a tensor, in the order a report lists them."""

    NON_LEAF = "non_leaf"
    MISSING_GRAD = "missing_grad"
    GRAD_CLEARED = "grad_cleared"
    NOT_IN_OPTIMIZER = "not_in_optimizer"
    FROZEN_IN_OPTIMIZER = "frozen_in_optimizer"
    STALE_PARAM = "stale_param"
    ORPHAN_TENSOR = "orphan_tensor"
    NONFINITE_GRAD = "nonfinite_grad"
    DEAD_GRAD = "dead_grad"
    NO_UPDATE = "no_update"
    DEVICE_MISMATCH = "device_mismatch"
    INCOMPLETE = "incomplete"


class Severity(_WordEnum):
    """How sure leafwatch is that the tensor will not train, most severe first."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Status(_WordEnum):
    """Where a finding stands: ``open`` (an error or warning that holds now), ``intermittent``
    (sometimes no gradient: routing, LayerDrop), ``pending`` (a suspicion waiting for evidence;
    kept in the history, not in reports), ``resolved``, ``ignored`` (matched an ``ignore`` pattern)."""

    OPEN = "open"
    INTERMITTENT = "intermittent"
    PENDING = "pending"
    RESOLVED = "resolved"
    IGNORED = "ignored"


class Waiting(_WordEnum):
    """What a ``pending`` finding waits for (its ``details["pending"]``): the evidence that decides it."""

    #: A layer skipped while its siblings ran: a stochastic choice (LayerDrop) unless skipped every time.
    LAYERDROP = "layerdrop"
    #: No gradient reached it: does its value change between checks (an EMA or target network)?
    TARGET = "target"
    #: In no optimizer: does a gradient arrive, does an optimizer that steps late hold it?
    MEMBERSHIP = "membership"
    #: Read off the structure before any gradient existed: the first check decides.
    STRUCTURE = "structure"
    #: No gradient, and the forward hooks had not seen a whole step of its module yet: the next
    #: check says why (``leafwatch run`` meets a second model at its first forward).
    TRACE = "trace"


@dataclasses.dataclass(frozen=True)
class KindSpec:
    """What every finding of one kind shares: the one place a kind's rules live.

    Attributes:
        severity: The default severity (a detector may lower it with a reason: a frozen
            ``nn.Parameter`` in the optimizer is info, a plain tensor there an error).
        structural: Read off the structure (names, optimizer sets), not per step: a rebuild of
            the structure replaces every finding of the kind.
        waits: May be held ``pending`` when it is read before any gradient exists (the first
            check decides it).
        grouped_by: What makes one mistake of this kind (its tensors are one finding), when the
            detector does not name it in ``details["group"]``: ``"module"`` (the module that
            holds them), ``"container"`` (the plain-Python container on their attribute path:
            ``blocks`` of ``blocks[0].weight``), ``"all"`` (every tensor of the kind at once: one NaN loss, one
            ``zero_grad`` call) or ``"tensor"`` (each tensor is its own mistake).
    """

    severity: Severity
    structural: bool
    waits: bool
    grouped_by: str = "tensor"


#: One spec per kind. ``tests/core`` checks that every :class:`Kind` has one.
KIND_SPECS: Mapping[Kind, KindSpec] = {
    Kind.NON_LEAF: KindSpec(Severity.ERROR, True, False, "tensor"),
    Kind.MISSING_GRAD: KindSpec(Severity.ERROR, False, False, "module"),
    Kind.GRAD_CLEARED: KindSpec(Severity.ERROR, False, False, "module"),
    Kind.NOT_IN_OPTIMIZER: KindSpec(Severity.ERROR, True, True, "module"),
    Kind.FROZEN_IN_OPTIMIZER: KindSpec(Severity.ERROR, True, False, "all"),
    Kind.STALE_PARAM: KindSpec(Severity.ERROR, True, False, "tensor"),
    Kind.ORPHAN_TENSOR: KindSpec(Severity.ERROR, True, True, "container"),
    Kind.NONFINITE_GRAD: KindSpec(Severity.ERROR, False, False, "all"),
    Kind.DEAD_GRAD: KindSpec(Severity.WARNING, False, False, "module"),
    Kind.NO_UPDATE: KindSpec(Severity.WARNING, False, False, "tensor"),
    Kind.DEVICE_MISMATCH: KindSpec(Severity.WARNING, True, False, "module"),
    Kind.INCOMPLETE: KindSpec(Severity.WARNING, False, False, "tensor"),
}

#: Kinds read off the structure: a rebuild replaces them all.
STRUCTURAL_KINDS = frozenset(k for k, spec in KIND_SPECS.items() if spec.structural)

#: Kinds that may wait (``pending``) when read before any gradient exists.
WAITING_KINDS = frozenset(k for k, spec in KIND_SPECS.items() if spec.waits)

#: The stable kinds, in the order a report lists them.
KINDS = tuple(k.value for k in Kind)

#: Severities, most severe first.
SEVERITIES = tuple(s.value for s in Severity)

#: Statuses a finding can have.
STATUSES = tuple(s.value for s in Status)

_SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
_STATUS_RANK = {s: i for i, s in enumerate(STATUSES)}
_KIND_RANK = {k: i for i, k in enumerate(KINDS)}


def _word(enum_type: type[_WordEnum], value: Any) -> Any:
    """``value`` as a member of ``enum_type`` when it names one (else as given: a newer log's word)."""
    try:
        return enum_type(value)
    except ValueError:
        return value


def apply_ignore(findings: Iterable[Finding], ignore: Mapping[str, str]) -> list[Finding]:
    """Mark the findings whose name or alias matches an ``ignore`` pattern as ignored, with the reason."""
    if not ignore:
        return list(findings)
    out = []
    for f in findings:
        pattern = matching_pattern(ignore, (f.name, *f.aliases))
        if pattern is not None:
            f = f.replace(status=Status.IGNORED, details={**f.details, "ignored_because": ignore[pattern],
                                                           "pattern": pattern})
        out.append(f)
    return out


@dataclasses.dataclass(frozen=True)
class Finding:
    """One mistake: the tensors that will not train (or might not) for one reason, the cause
    and the fix.

    A :class:`Report` holds mistakes; each lists its tensors in ``members``, one finding per
    tensor (the per-tensor view: :meth:`Report.tensors`). A per-tensor finding has no members.
    A mistake of one tensor carries that tensor's name; a mistake of several the name of what
    they share (the module, the optimizer).

    A finding is data: its words (:attr:`message`, :attr:`cause`, :attr:`fix`, :attr:`remedy`) are
    rendered when they are read, by its reason, from the reason's fields (for a mistake, from its
    tensors' reasons together).

    Attributes:
        kind: One of :data:`KINDS`.
        name: The qualified name (``encoder.layers.0.weight``), the watch name, or the
            attribute path (``blocks[0].weight``).
        severity: ``"error"`` (it will not train), ``"warning"`` (it probably is a bug) or
            ``"info"``.
        reason: Why (:class:`~leafwatch.report.reasons.Reason`): its word (``reason.name``:
            ``never_ran``, ``left_out``), its fields, and the one renderer of the words. A string
            given here is a message written by hand (:class:`~leafwatch.report.reasons.Written`).
        step: The step of the check that produced it.
        status: ``"open"``, ``"intermittent"``, ``"resolved"`` or ``"ignored"``.
        first_step, last_step: When a :class:`~leafwatch.Monitor` first and last saw it.
        steps_seen: How many checks saw it.
        shape, dtype, device: Of the tensor concerned.
        aliases: Other names of the same tensor (tied weights).
        ranks: Distributed ranks where it was seen (empty when not distributed).
        details: The history's bookkeeping: plain data (strings, numbers, lists).
        members: The per-tensor findings of a mistake, in natural order (``experts.2`` before
            ``experts.10``); empty for a per-tensor finding.
    """

    kind: Kind
    name: str
    severity: Severity
    reason: Reason
    step: int | None = None
    status: Status = Status.OPEN
    first_step: int | None = None
    last_step: int | None = None
    steps_seen: int = 1
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    device: str | None = None
    aliases: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    members: tuple[Finding, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _word(Kind, self.kind))
        object.__setattr__(self, "severity", _word(Severity, self.severity))
        object.__setattr__(self, "status", _word(Status, self.status))
        if isinstance(self.reason, str):
            object.__setattr__(self, "reason", Written(message=self.reason))

    # -- the words, rendered when read ----------------------------------------------------------
    @functools.cached_property
    def words(self) -> Words:
        """Message, cause, fix and remedy: rendered by the reason from its fields (:func:`render`)."""
        return render(self)

    @property
    def message(self) -> str:
        """One line: what is wrong."""
        return self.words.message

    @property
    def cause(self) -> str:
        """Why it is so, in the user's terms."""
        return self.words.cause

    @property
    def fix(self) -> str:
        """The one-line fix."""
        return self.words.fix

    @property
    def remedy(self) -> Remedy | None:
        """The fix as data: code to paste and where it goes in the user's file, or words; None without a fix."""
        return self.words.remedy

    @property
    def args(self) -> dict[str, Any]:
        """The reason's fields as plain JSON data (a record's ``args``)."""
        return self.reason.to_args()

    # -- identity -------------------------------------------------------------------------------
    @property
    def key(self) -> tuple[str, str]:
        """What identifies a finding across steps: ``(kind, group)`` for a mistake, ``(kind, name)`` for one tensor."""
        return (self.kind, self.details.get("group", self.name)) if self.members else (self.kind, self.name)

    @property
    def group(self) -> str:
        """What makes this mistake one (:func:`group_of`)."""
        return str(self.details["group"]) if self.members and "group" in self.details else group_of(self)

    @property
    def tensors(self) -> tuple[Finding, ...]:
        """The per-tensor findings: the members of a mistake, or the finding itself."""
        return self.members or (self,)

    @property
    def names(self) -> tuple[str, ...]:
        """The qualified names of the tensors of this finding, in natural order."""
        return tuple(f.name for f in self.tensors)

    @property
    def is_open(self) -> bool:
        """Open: a warning or an error that holds now (neither resolved, ignored, intermittent,
        pending, nor info). The one meaning of "open" for ``bool(report)``, the counts, the
        ``leafwatch/open/<kind>`` scalars, the console summary and ``leafwatch report``'s exit code."""
        return self.status == Status.OPEN and self.severity != Severity.INFO

    def same(self, other: Finding) -> bool:
        """Whether ``other`` says what this finding says: the same status, severity and reason, compared as
        data (its counters left out: :func:`~leafwatch.report.reasons.counter`)."""
        return (self.status, self.severity) == (other.status, other.severity) \
            and self.reason.compared() == other.reason.compared()

    def replace(self, **changes: Any) -> Finding:
        """A copy with ``changes`` (as :func:`dataclasses.replace`, without re-running the checks of
        the fields left as they are: a report rebuilt at each check copies every finding).

        Raises:
            TypeError: a field it does not have.
        """
        unknown = changes.keys() - _FIELDS
        if unknown:
            raise TypeError(f"Finding has no field {sorted(unknown)[0]!r}")
        new = object.__new__(Finding)
        new.__dict__.update(self.__dict__)
        new.__dict__.pop("words", None)  # (rendered again when read)
        new.__dict__.update(changes)
        for name, words in (("kind", Kind), ("severity", Severity), ("status", Status)):
            if name in changes:
                new.__dict__[name] = _word(words, changes[name])
        return new

    def with_details(self, **details: Any) -> Finding:
        """A copy with ``details`` added (the history's bookkeeping)."""
        return self.replace(details={**self.details, **details})

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "words"}

    # -- plain data -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The finding as JSON data: its fields, its words (``message``, ``cause``, ``fix``, ``remedy``),
        its reason's word and ``args``."""
        words = self.words
        return {"kind": str(self.kind), "name": self.name, "severity": str(self.severity), "message": words.message,
                "cause": words.cause, "fix": words.fix, "step": self.step, "status": str(self.status),
                "first_step": self.first_step, "last_step": self.last_step, "steps_seen": self.steps_seen,
                "shape": list(self.shape) if self.shape is not None else None, "dtype": self.dtype,
                "device": self.device, "aliases": list(self.aliases), "ranks": list(self.ranks),
                "details": dict(self.details), "members": [m.to_dict() for m in self.members],
                "reason": self.reason.name, "args": self.args,
                "remedy": words.remedy.to_dict() if words.remedy is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """A finding from :meth:`to_dict`'s data; a record written before findings carried their reason (or
        whose reason this version does not read) keeps the words it was written with."""
        values = {k: v for k, v in data.items() if k in _FIELDS}
        if values.get("shape") is not None:
            values["shape"] = tuple(values["shape"])
        values["aliases"] = tuple(values.get("aliases", ()))
        values["ranks"] = tuple(values.get("ranks", ()))
        values["members"] = tuple(cls.from_dict(m) for m in values.get("members", ()))
        values["reason"] = _reason_of(data)
        return cls(**values)

    def sort_key(self) -> tuple[Any, ...]:
        """The one order of findings, everywhere they are listed (reports, the console, the
        distributed merge, the Leafwatch tab): by status (open first), then severity (errors
        first), then kind (in :data:`KINDS` order), then name."""
        return order_key(self.status, self.severity, self.kind, self.name)


def _reason_of(data: Mapping[str, Any]) -> Reason:
    """The reason of a finding's JSON data: read from its ``reason`` and ``args``, else the words it carries."""
    args = data.get("args")
    if isinstance(args, Mapping) and data.get("reason"):
        try:
            return from_args(str(data.get("kind", "")), str(data["reason"]), args)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # arguments of another version: the words they were written with
    remedy = data.get("remedy")
    return Written(message=str(data.get("message") or ""), cause=str(data.get("cause") or ""),
                   fix=str(data.get("fix") or ""), remedy=Remedy.from_dict(remedy) if isinstance(remedy, Mapping) else None,
                   name=str(data.get("reason") or ""), arguments=json.dumps(args) if isinstance(args, Mapping) and args
                   else "")


#: The names of the fields of a :class:`Finding`.
_FIELDS = frozenset(f.name for f in dataclasses.fields(Finding))


def order_key(status: str, severity: str, kind: str, name: str) -> tuple[Any, ...]:
    """:meth:`Finding.sort_key` from the four words it orders by (unknown words sort last;
    names in natural order: ``experts.2`` before ``experts.10``)."""
    return (_STATUS_RANK.get(status, 9), _SEVERITY_RANK.get(severity, 9), _KIND_RANK.get(kind, 99), natural_key(name))


def sort_key_of(data: Mapping[str, Any]) -> tuple[Any, ...]:
    """:meth:`Finding.sort_key` of a finding as plain data (``Finding.to_dict()``, a record).

    Example::

        >>> f = Finding("missing_grad", "head.weight", "error", "no gradient")
        >>> sort_key_of(f.to_dict()) == f.sort_key()
        True
    """
    return order_key(str(data.get("status", Status.OPEN)), str(data.get("severity", "")),
                     str(data.get("kind", "")), str(data.get("name", "")))


def group_of(f: Finding) -> str:
    """What makes a per-tensor finding part of one mistake with others of its kind:
    ``details["group"]`` when its detector names it (a cut point, an optimizer), else by the
    kind's :attr:`KindSpec.grouped_by` (the module holding it, or one group for the kind).

    Example::

        >>> group_of(Finding("missing_grad", "experts.7", "error", "m"))
        'experts'
        >>> group_of(Finding("missing_grad", "x", "error", "m", details={"group": "`.detach()` at a.py:3"}))
        '`.detach()` at a.py:3'
    """
    named = f.details.get("group") or f.details.get("cover")
    if isinstance(named, str) and named:
        return named
    spec = KIND_SPECS.get(f.kind)  # type: ignore[call-overload]
    how = spec.grouped_by if spec is not None else "tensor"
    if how == "module":
        return parent(f.name)
    if how == "container":
        return container(f.name)
    if how == "all":
        return f"*{f.severity}"  # every tensor of the kind (and severity) at once
    return f.name


def render(f: Finding) -> Words:
    """The one render of a finding's words, at the sink: by its reason, from the reason's fields; a mistake's
    from the reasons of its tensors that share its status and reason, together (their names, the mistake's
    group, each one's cover); a mistake of one tensor as that tensor, and words written as they were (a record no
    reason class reads: the mistake's own)."""
    if len(f.members) <= 1 or isinstance(f.reason, Written):
        return f.reason.words(Members.one(f.name, f.reason, described=bool(f.details.get("described"))))
    alike = [m for m in f.members if m.status == f.status and type(m.reason) is type(f.reason)
             and m.reason.name == f.reason.name] or [f.members[0]]
    return alike[0].reason.words(Members([m.name for m in alike], [m.reason for m in alike], f.name,
                                         [m.details.get("cover") for m in alike]))


def _mistake(group: str, members: list[Finding]) -> Finding:
    """One finding for the tensors of one mistake: the most urgent status and severity among
    them, and the reason of the first (its words are rendered from its tensors' reasons together)."""
    members.sort(key=Finding.sort_key)
    first = members[0]
    if len(members) == 1:
        return first.replace(details={**first.details, "group": group}, members=(first,))
    names = [m.name for m in members]
    # Every tensor of the kind at once, or of one place (a cut, a Function: said as a location, never as a name):
    # named by the module that holds them all when one does.
    located = group.startswith("*") or "location" in first.details
    label = (_holder(names) or compress_names(names, limit=3)) if located else group
    return Finding(
        kind=first.kind, name=label, severity=first.severity, reason=first.reason,
        step=max((m.step for m in members if m.step is not None), default=None), status=first.status,
        first_step=min((m.first_step for m in members if m.first_step is not None), default=None),
        last_step=max((m.last_step for m in members if m.last_step is not None), default=None),
        steps_seen=max(m.steps_seen for m in members),
        ranks=tuple(sorted({r for m in members for r in m.ranks})),
        details={**first.details, "group": group, "tensors": len(members)},
        members=tuple(sorted(members, key=lambda m: natural_key(m.name))))


def _holder(names: list[str]) -> str | None:
    """The deepest module above every one of ``names`` (``encoder`` of ``encoder.0.weight`` and
    ``encoder.2.bias``); None when only the model itself holds them all."""
    common = set.intersection(*(set(ancestors(name)) for name in names))
    return max(common, key=lambda m: m.count(".")) if common else None


def group_findings(findings: Iterable[Finding], memo: MistakeMemo | None = None) -> list[Finding]:
    """The mistakes of per-tensor findings (or of mistakes: their members are regrouped), one
    finding per ``(kind, group)``, in the one order (:meth:`Finding.sort_key`).

    Args:
        findings: Per-tensor findings, or mistakes.
        memo: The mistakes of the last grouping with this memo (kept by the caller, and only those:
            bounded by one report): a mistake whose tensors are the very same finding objects as then
            is taken from it, not worked out again (a report rebuilt after one tensor of hundreds of
            open mistakes changed regroups that one).

    Example::

        >>> found = [Finding("missing_grad", f"experts.{i}", "error", "m") for i in (10, 2, 3)]
        >>> [(f.name, f.names) for f in group_findings(found)]
        [('experts', ('experts.2', 'experts.3', 'experts.10'))]
    """
    buckets: dict[tuple[str, str], list[Finding]] = {}
    known = dict(memo or {})
    for f in findings:
        keys = {(member.kind, group_of(member)) for member in f.tensors}
        for member in f.tensors:
            buckets.setdefault((member.kind, group_of(member)), []).append(member)
        if f.members and len(keys) == 1:  # a mistake as it was written (a record read back): kept whole
            known[keys.pop()] = (f.members, f)
    kept: MistakeMemo = {}
    for key, members in buckets.items():
        last = known.get(key)
        if last is None or len(last[0]) != len(members) or not all(map(operator.is_, last[0], members)):
            given = tuple(members)  # before _mistake sorts them in place
            last = (given, _mistake(key[1], members))
        kept[key] = last
    if memo is not None:
        memo.clear()
        memo.update(kept)
    return sorted((mistake for _, mistake in kept.values()), key=Finding.sort_key)


#: The mistakes of the last :func:`group_findings` call given this memo, by ``(kind, group)`` with the
#: finding objects they were made of (frozen: the same objects make the same mistake).
MistakeMemo = dict[tuple[str, str], tuple[tuple[Finding, ...], Finding]]


class Report:
    """The findings of one check, one per mistake, most severe first.

    ``bool(report)`` is true when a finding is open. Iterating, ``len()``, ``findings``,
    :meth:`by_kind`, :attr:`open`, :meth:`at_least` and :meth:`counts` speak of mistakes (one
    finding lists its tensors in ``members``); :meth:`tensors` and :meth:`names` speak of
    tensors. Iterating yields every finding, the intermittent, resolved and ignored ones too
    (they say so in ``status``). A mistake is open while one of its tensors is: an ``ignore``
    pattern that matches some of them marks those ignored and keeps the rest open.
    ``nothing_to_check`` is true when the check had nothing to look at (no tensor requires grad
    and nothing is watched): the text says "nothing to check", not "no findings".

    Example::

        >>> import torch, leafwatch
        >>> model = torch.nn.Linear(2, 1)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> report = leafwatch.audit(model, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> bool(report), len(report)
        (False, 0)
    """

    def __init__(self, findings: Iterable[Finding] = (), step: int | None = None, *,
                 memo: MistakeMemo | None = None, nothing_to_check: bool = False) -> None:
        #: One finding per mistake, in the one order.
        self.findings: list[Finding] = group_findings(findings, memo)
        self.step = step
        #: The check had nothing to look at: no tensor requires grad and nothing is watched.
        self.nothing_to_check = nothing_to_check

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)

    def __bool__(self) -> bool:
        return any(f.is_open for f in self.findings)

    def __repr__(self) -> str:
        return f"Report(step={self.step}, findings={len(self.findings)}, open={len(self.open)})"

    @property
    def open(self) -> list[Finding]:
        return [f for f in self.findings if f.is_open]

    def by_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def tensors(self, kind: str | None = None) -> list[Finding]:
        """The per-tensor findings (the members of every mistake), of one kind or of all."""
        return sorted((m for f in self.findings if kind is None or f.kind == kind for m in f.tensors),
                      key=Finding.sort_key)

    def names(self, kind: str | None = None, status: str | None = "open") -> set[str]:
        """The names of the tensors with findings of one kind (every kind when None) with that status."""
        return {m.name for f in self.findings if kind is None or f.kind == kind
                for m in f.tensors if status is None or m.status == status}

    def counts(self) -> dict[str, int]:
        """Open mistakes per kind (one finding each, however many tensors it lists), every kind
        present (zeros included)."""
        counts = dict.fromkeys(KINDS, 0)
        for f in self.open:
            counts[f.kind] = counts.get(f.kind, 0) + 1
        return counts

    def at_least(self, min_severity: str) -> list[Finding]:
        if min_severity not in SEVERITIES:
            raise ValueError(f"`min_severity` can be one of {', '.join(SEVERITIES)}, got {min_severity!r}")
        limit = _SEVERITY_RANK[min_severity]
        return [f for f in self.open if _SEVERITY_RANK.get(f.severity, 9) <= limit]

    def __str__(self) -> str:
        """The findings table (:func:`leafwatch.report.format.report_text`)."""
        return report_text(self.findings, self.step, nothing_to_check=self.nothing_to_check)

    def to_markdown(self) -> str:
        """A markdown table (with the blank line before it that TensorBoard needs)."""
        return report_markdown(self.findings, self.step, nothing_to_check=self.nothing_to_check)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"step": ..., "counts": {...}, "findings": [...]}``, and
        ``"nothing_to_check": true`` only when it is (so older readers read it unchanged)."""
        data = {"step": self.step, "counts": self.counts(), "findings": [f.to_dict() for f in self.findings]}
        if self.nothing_to_check:
            data["nothing_to_check"] = True
        return data

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        return cls((Finding.from_dict(f) for f in data.get("findings", ())), step=data.get("step"),
                   nothing_to_check=data.get("nothing_to_check") is True)

    def raise_for_findings(self, min_severity: str = "error") -> None:
        """Raise :class:`LeafwatchError` with the table when an open finding is that severe.

        Raises:
            LeafwatchError: when at least one open finding is at least ``min_severity``.
            ValueError: for an unknown ``min_severity``.
        """
        failing = self.at_least(min_severity)
        if failing:
            raise LeafwatchError(str(Report(failing, step=self.step)), report=self)

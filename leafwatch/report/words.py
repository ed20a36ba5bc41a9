"""A finding's words, rendered once from its data by the one renderer of its ``(kind, reason)``.

A detector decides a reason and hands over its arguments: plain, JSON-able data (names, ops, the
user's ``file:line``, the optimizer's variable and class, counts, the earlier reason a transition
comes from). The renderer of that ``(kind, reason)``, which lives in the detector module that
decides it and registers itself with :func:`renders`, writes the message, the cause, the fix and
the fix's :class:`Remedy` (code to paste, and where it goes in the user's file; or words) from
those arguments alone, for one tensor or for the tensors of one mistake (:class:`Members`).
Nothing edits the words afterwards: a transition (intermittent, stalled, resolved, merged across
ranks) is a reason of its own, whose renderer is handed the earlier reason's arguments and calls
:func:`render` on them, never on their strings. As in ruff, where a rule's violation is a struct
with ``message()``, ``fix_title()`` and a declared fix availability.

Torch-free: ``leafwatch report`` and the tab read the words a run wrote, and never render.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from .names import compress_names

#: What a renderer declares of its fixes: code every time, code when the user's objects were
#: found (else words), or words only (advice).
Availability = Literal["always", "sometimes", "never"]


@dataclasses.dataclass(frozen=True)
class Edit:
    """Where a code fix goes in the user's file: insert ``text`` after line ``end`` (``insert_after``),
    or put it in place of lines ``start`` to ``end`` (``replace``); lines count from 1, ``text``
    holds whole lines (each ending with a newline), indented as the file is."""

    path: str
    start: int
    end: int
    action: Literal["insert_after", "replace"]
    text: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Edit:
        return cls(str(data["path"]), int(data["start"]), int(data["end"]), data["action"], str(data["text"]))


@dataclasses.dataclass(frozen=True)
class Remedy:
    """A fix as data: ``"code"`` (``code`` pastes as it is on the user's own objects, and ``edit``
    says where, when the place was found) or ``"words"`` (advice for the user to apply)."""

    applicability: Literal["code", "words"]
    code: str = ""
    edit: Edit | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"applicability": self.applicability, "code": self.code,
                "edit": self.edit.to_dict() if self.edit is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Remedy:
        edit = data.get("edit")
        return cls(data.get("applicability", "words"), str(data.get("code") or ""),
                   Edit.from_dict(edit) if isinstance(edit, Mapping) else None)


#: A fix in words: advice the user applies.
ADVICE = Remedy("words")


def code(snippet: str, edit: Edit | None = None) -> Remedy:
    """A code fix: ``snippet`` pastes as it is (and ``edit`` places it in the user's file)."""
    return Remedy("code", snippet, edit)


@dataclasses.dataclass(frozen=True)
class Words:
    """What a renderer writes: the message (what is wrong), the cause (why), the fix, and the
    remedy that says whether the fix is code (and where it goes) or advice."""

    message: str
    cause: str
    fix: str
    remedy: Remedy = ADVICE


class Members:
    """The tensors of one finding as its renderer sees them: each one's name and arguments, in
    natural order, and what makes them one mistake (``group``; the tensor's own name for one).

    Args:
        names: The tensors' names.
        args: Each tensor's arguments, in the same order.
        group: What they share (the module, the cut point, the optimizer); "" for one tensor.
        covers: For each tensor, the largest module whose trainable tensors all share its
            finding (what one ``ignore`` pattern names; None where there is none).
    """

    __slots__ = ("names", "args", "group", "covers")

    def __init__(self, names: Sequence[str], args: Sequence[Mapping[str, Any]], group: str = "",
                 covers: Sequence[str | None] | None = None) -> None:
        if len(names) != len(args) or not names:
            raise ValueError(f"`names` and `args` must be as long and not empty, got {len(names)} and {len(args)}")
        self.names = tuple(names)
        self.args = tuple(args)
        self.group = group
        self.covers = tuple(covers) if covers is not None else (None,) * len(self.names)

    @classmethod
    def one(cls, name: str, args: Mapping[str, Any]) -> Members:
        return cls((name,), (args,))

    @property
    def single(self) -> bool:
        return len(self.names) == 1

    @property
    def name(self) -> str:
        """The tensor's name, or the names of all of them in one short line (``aux.{bias,weight}``)."""
        return self.names[0] if self.single else compress_names(self.names)

    @property
    def who(self) -> str:
        """The subject of a sentence: `` `w` `` for one tensor, ``each of `aux.{bias,weight}` `` for several."""
        return f"`{self.names[0]}`" if self.single else f"each of `{compress_names(self.names)}`"

    @property
    def first(self) -> Mapping[str, Any]:
        """The first tensor's arguments."""
        return self.args[0]

    def shared(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` that every tensor has; ``default`` when they differ or lack it."""
        values = [a.get(key, default) for a in self.args]
        return values[0] if all(v == values[0] for v in values) else default

    def each(self, key: str) -> list[Any]:
        """Each tensor's value of ``key`` (None where it has none)."""
        return [a.get(key) for a in self.args]

    def earlier(self) -> tuple[str, Members]:
        """A transition's earlier reason and the tensors with the earlier arguments (``args["earlier"]``)."""
        reason = self.first["earlier"]["reason"]
        return reason, Members(self.names, [a["earlier"]["args"] for a in self.args], self.group, self.covers)


@dataclasses.dataclass(frozen=True)
class Renderer:
    """The one renderer of a ``(kind, reason)``: ``render(members) -> Words``; ``fixes``: the
    availability of code in its fixes, checked by the tests against what it renders."""

    kind: str
    reason: str
    render: Callable[[Members], Words]
    fixes: Availability

    @property
    def where(self) -> str:
        """``module.function`` of the renderer under ``leafwatch``."""
        module = self.render.__module__.removeprefix("leafwatch.")
        return f"{module}.{self.render.__qualname__}"


#: ``(kind, reason)`` -> its one renderer; filled by the detector modules as they are imported.
RENDERERS: dict[tuple[str, str], Renderer] = {}


def renders(kind: str, *reasons: str, fixes: Availability = "sometimes") -> Callable[[Callable[[Members], Words]], Callable[[Members], Words]]:
    """Register the decorated function as the renderer of ``(kind, reason)`` for each reason.

    Raises:
        ValueError: a ``(kind, reason)`` that has a renderer already (one voice per reason).
    """
    def register(function: Callable[[Members], Words]) -> Callable[[Members], Words]:
        for reason in reasons:
            known = RENDERERS.get((str(kind), reason))
            if known is not None and known.render is not function:
                raise ValueError(f"({str(kind)!r}, {reason!r}) has a renderer already: {known.where}")
            RENDERERS[(str(kind), reason)] = Renderer(str(kind), reason, function, fixes)
        return function
    return register


def render(kind: str, reason: str, members: Members) -> Words:
    """The words of ``members`` for ``(kind, reason)``.

    Raises:
        KeyError: no renderer is registered for it (the detectors are not imported).
    """
    return RENDERERS[(str(kind), reason)].render(members)


def has_renderer(kind: str, reason: str) -> bool:
    return (str(kind), reason) in RENDERERS

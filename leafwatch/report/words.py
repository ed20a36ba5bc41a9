"""What a finding's reason writes: :class:`Words` (message, cause, fix) and the fix as data,
:class:`Remedy` (code to paste, and :class:`Edit`, where it goes in the user's file; or words); and
:class:`Members`, the tensors of one finding as its reason renders them.

The words are rendered at the sink (:attr:`leafwatch.Finding.message`, ``.cause``, ``.fix``), by the
one :class:`~leafwatch.report.reasons.Reason` class of the finding's ``(kind, reason)``, from its
fields alone. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from .names import compress_names


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
        return dataclasses.asdict(self)

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
    """The tensors of one finding as its reason sees them: each one's name and reason, in natural
    order, and what makes them one mistake (``group``; the tensor's own name for one).

    Args:
        names: The tensors' names.
        reasons: Each tensor's reason (:class:`~leafwatch.report.reasons.Reason`), in the same order.
        group: What they share (the module, the cut point, the optimizer); "" for one tensor.
        covers: For each tensor, the largest module whose trainable tensors all share its
            finding (what one ``ignore`` pattern names; None where there is none).
        described: The one name is a description in words (a tensor the user holds under no name:
            "the float64 copy passed to `Adam` at train.py:3"), never printed as code.
    """

    __slots__ = ("names", "reasons", "group", "covers", "described")

    def __init__(self, names: Sequence[str], reasons: Sequence[Any], group: str = "",
                 covers: Sequence[str | None] | None = None, *, described: bool = False) -> None:
        if len(names) != len(reasons) or not names:
            raise ValueError(f"`names` and `reasons` must be as long and not empty, got {len(names)} and {len(reasons)}")
        self.names = tuple(names)
        self.reasons = tuple(reasons)
        self.group = group
        self.covers = tuple(covers) if covers is not None else (None,) * len(self.names)
        self.described = described and len(self.names) == 1

    @classmethod
    def one(cls, name: str, reason: Any, *, described: bool = False) -> Members:
        return cls((name,), (reason,), described=described)

    @property
    def single(self) -> bool:
        return len(self.names) == 1

    @property
    def name(self) -> str:
        """The tensor's name, or the names of all of them in one short line (``aux.{bias,weight}``)."""
        return self.names[0] if self.single else compress_names(self.names)

    @property
    def who(self) -> str:
        """The subject of a sentence: `` `w` `` for one tensor (or its description), ``each of `aux.{bias,weight}` ``
        for several."""
        if self.described:
            return self.names[0]
        return f"`{self.names[0]}`" if self.single else f"each of `{compress_names(self.names)}`"

    @property
    def first(self) -> Any:
        """The first tensor's reason."""
        return self.reasons[0]

    def shared(self, field: str, default: Any = None) -> Any:
        """The value of ``field`` that every tensor's reason has; ``default`` when they differ or lack it."""
        values = [getattr(r, field, default) for r in self.reasons]
        return values[0] if all(v == values[0] for v in values) else default

    def each(self, field: str) -> list[Any]:
        """Each tensor's value of ``field`` (None where it has none)."""
        return [getattr(r, field, None) for r in self.reasons]

    def earlier(self) -> Members:
        """The tensors with the reasons their transitions come from (each reason's ``earlier``)."""
        return Members(self.names, [r.earlier for r in self.reasons], self.group, self.covers, described=self.described)

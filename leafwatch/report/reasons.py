"""Why a finding holds, as a typed value: one :class:`Reason` class per ``(kind, reason)``.

A reason class lives in the detector module that decides it. It declares its kind, its word (the
``reason`` of the records) and whether its fixes are code (``fixes``: ``always``, ``sometimes``,
``never``) in its class line, holds what the detector saw as typed fields (names, ops, the user's
``file:line``, the optimizer's variable, the place of a code fix in the user's file, worked out when
the finding is decided), and writes its words from those fields alone in :meth:`Reason.words`: the
message, the cause, the fix and its :class:`~leafwatch.report.words.Remedy`, for one tensor or for
the tensors of one mistake (:class:`~leafwatch.report.words.Members`). A transition (intermittent,
stalled, not a target, merged across ranks) holds the reason it comes from in its ``earlier`` field
and calls that reason's :meth:`~Reason.words`: words are never edited. As in ruff, where a rule's
violation is a struct with ``message()``, ``fix_title()`` and a declared fix availability.

Every subclass is a frozen, keyword-only dataclass (declared by its base, as pydantic's models are),
so reasons compare as data: the history decides whether a finding changed on its fields, the
counters among them left out (:func:`counter`). :meth:`Reason.to_args` and :func:`from_args` turn
one into the plain ``args`` of a record and back; :class:`Written` carries the words a finding was
written with when no reason class reads it (made by hand, or a record of another version).

Torch-free: ``leafwatch report`` and the tab read records with it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from typing_extensions import dataclass_transform

from .words import Edit, Members, Remedy, Words

#: What a reason declares of its fixes: code every time, code when the user's objects were found
#: (else words), or words only (advice).
Availability = Literal["always", "sometimes", "never"]

#: ``(kind, reason)`` -> its one class; filled as the detector modules define them.
REASONS: dict[tuple[str, str], type[Reason]] = {}

_COUNTER = "counter"


def counter(**kwargs: Any) -> Any:
    """A field that counts (checks, steps): part of the words, not of what the finding is, so a change of
    it alone is no change of the finding (:meth:`Reason.compared`)."""
    return dataclasses.field(metadata={_COUNTER: True}, **kwargs)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(dataclasses.field, counter))
class Reason:
    """Why a finding holds: the base of every reason class (see the module's docstring).

    A subclass names its kind and word in its class line, ``class NeverRan(Reason, kind="missing_grad",
    name="never_ran", fixes="never")``, and becomes a frozen keyword-only dataclass of the fields it
    annotates.

    Raises:
        ValueError: a second class of one ``(kind, reason)`` (one voice per reason).
    """

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    fixes: ClassVar[Availability] = "sometimes"

    def __init_subclass__(cls, *, kind: str | None = None, name: str | None = None,
                          fixes: Availability | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for attribute, value in (("kind", kind), ("name", name), ("fixes", fixes)):
            if value is not None:
                setattr(cls, attribute, str(value))
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        if name is not None:
            known = REASONS.get((cls.kind, cls.name))
            if known is not None and known.__qualname__ != cls.__qualname__:
                raise ValueError(f"({cls.kind!r}, {cls.name!r}) has a class already: "
                                 f"{known.__module__.removeprefix('leafwatch.')}.{known.__qualname__}")
            REASONS[(cls.kind, cls.name)] = cls

    def words(self, m: Members) -> Words:
        """The words of the tensors of ``m`` (each with a reason of this class; ``self`` is the first's)."""
        raise NotImplementedError

    @property
    def observed(self) -> str:
        """The reason a tensor was observed with: its own, or the earlier one of a transition."""
        return self.name

    def to_args(self) -> dict[str, Any]:
        """The fields as plain JSON data (a record's ``args``)."""
        return {f.name: _to_json(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def compared(self) -> tuple[Any, ...]:
        """What the finding is, as data: the class and every field but the counters (an earlier reason
        compared the same way)."""
        return (type(self), *(v.compared() if isinstance(v, Reason) else v
                              for f in dataclasses.fields(self) if not f.metadata.get(_COUNTER)  # type: ignore[arg-type]
                              for v in (getattr(self, f.name),)))


class Transition(Reason):
    """A reason that follows an earlier one (intermittent, stalled, not a target, ...): it renders
    around the earlier reason's words, which it gets by calling that reason's :meth:`~Reason.words`."""

    earlier: Reason

    @property
    def observed(self) -> str:
        return self.earlier.name

    def before(self, m: Members) -> Words:
        """The earlier reason's words for the tensors of ``m``."""
        return self.earlier.words(m.earlier())


class Written(Reason):
    """The words a finding was written with, where no reason class reads it: a finding made by hand
    (``Finding(kind, name, severity, "message")``), a record of another version of leafwatch, or a record
    read where the detectors are not imported (``leafwatch report``, the tab: torch-free). The reason's
    word and its ``args`` (as JSON text) are kept as they were written, for the record they go back to."""

    message: str = ""
    cause: str = ""
    fix: str = ""
    remedy: Remedy | None = None
    name: str = ""  # type: ignore[misc]  (the word it was written with, an instance's own)
    arguments: str = ""

    def to_args(self) -> dict[str, Any]:
        return json.loads(self.arguments) if self.arguments else {}

    def words(self, m: Members) -> Words:
        """The words as they were written (a mistake's: its own, or its first tensor's)."""
        return Words(self.message, self.cause, self.fix, self.remedy)  # type: ignore[arg-type]


def from_args(kind: str, reason: str, args: Mapping[str, Any]) -> Reason:
    """The reason of ``(kind, reason)`` from its ``args`` (as :meth:`Reason.to_args` wrote them).

    Raises:
        KeyError: no class of that reason, or a field without a default is missing from ``args``.
        TypeError, ValueError: ``args`` of another form.
    """
    cls = REASONS[(str(kind), reason)]
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in args:
            values[f.name] = _from_json(hints[f.name], args[f.name], kind)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise KeyError(f"`args` of {kind}/{reason} has no {f.name!r}")
    return cls(**values)


#: The type hints of a class, read once.
_hints = functools.cache(typing.get_type_hints)


def _to_json(value: Any) -> Any:
    if isinstance(value, Reason):
        return {"reason": value.name, "args": value.to_args()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _to_json(v) for k, v in value.items()}
    return value


def _from_json(hint: Any, value: Any, kind: str) -> Any:
    """``value`` (plain JSON) as the type ``hint`` says: a reason of ``kind``, a dataclass, a tuple."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _from_json(options[0], value, kind) if len(options) == 1 else value
    if origin is tuple:
        inner = typing.get_args(hint)
        if len(inner) == 2 and inner[1] is Ellipsis:
            return tuple(_from_json(inner[0], v, kind) for v in value)
        return tuple(_from_json(h, v, kind) for h, v in zip(inner, value))
    if isinstance(hint, type) and issubclass(hint, Reason):
        return from_args(kind, value["reason"], value["args"])
    if hint is Remedy:
        return Remedy.from_dict(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = _hints(hint)
        return hint(**{f.name: _from_json(hints[f.name], value[f.name], kind)
                       for f in dataclasses.fields(hint) if f.name in value})
    return value


# -- the plain data reasons share ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Place:
    """A line of the user's code: the file, the line, the function that runs it."""

    file: str
    line: int
    function: str = ""

    @property
    def short(self) -> str:
        """``deep.py:13``."""
        return f"{self.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{self.line}"

    @property
    def within(self) -> str:
        """``deep.py:13 (in `Deep.forward`)``."""
        function = self.function
        return f"{self.short} (in `{function}`)" if function and not function.startswith("<") else self.short


@dataclasses.dataclass(frozen=True)
class Span:
    """Where a statement stands in the user's file: its absolute path, its first and last line, the
    indentation of its first line; read when the finding is decided. A statement the fix rewrites
    keeps its text too (``statement``; ``params``: the character span of the argument to rewrite,
    ``groups``: that argument is a list of dicts, ``own``: the character span of the statement itself)."""

    path: str
    start: int
    end: int
    indent: str = ""
    statement: str | None = None
    params: tuple[int, int] | None = None
    groups: bool = False
    own: tuple[int, int] | None = None

    def edit(self, action: Literal["insert_after", "replace"], text: str) -> Edit:
        """An edit of this statement: ``text`` (lines, indented here) after it or in its place."""
        return Edit(self.path, self.start, self.end, action, text)

    def put(self, code: str, action: Literal["insert_after", "replace"] = "insert_after") -> Edit:
        """An edit that puts the one-line ``code`` after this statement (or in its place), at its indentation."""
        return self.edit(action, f"{self.indent}{code}\n")


__all__ = ["REASONS", "Availability", "Place", "Reason", "Span", "Transition", "Written", "counter", "from_args"]

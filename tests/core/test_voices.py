"""One voice per finding: every reason a finding can carry is exactly one class, which the
registry (leafwatch/detectors/registry.py) lists under the one entry that decides it, and which writes
its words from its fields alone; nothing edits words after they are rendered, and every reason renders
the same words from its JSON fields alone."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import types
import typing
from pathlib import Path

import pytest
import torch
from torch import nn

import leafwatch
from leafwatch.detectors import constructors
from leafwatch.detectors.registry import BEYOND_THE_CHECK, DECIDED_BY, DETECTORS
from leafwatch.report.findings import Finding, Kind, render
from leafwatch.report.reasons import REASONS, Place, Reason, Span, Transition, Written
from leafwatch.report.words import Edit, Members, Remedy, Words

PACKAGE = Path(__file__).resolve().parents[2] / "leafwatch"


def test_every_reason_the_registry_lists_is_a_class_and_no_other_exists() -> None:
    assert set(DECIDED_BY) == set(REASONS)
    assert len(REASONS) > 70


def test_each_reason_class_lives_in_the_detector_package_and_each_kind_has_one() -> None:
    assert all(cls.__module__.startswith("leafwatch.detectors.") for cls in REASONS.values())
    assert {kind for kind, _ in REASONS} == {k.value for k in Kind}
    reasons = [reason for _, reason in REASONS]
    assert len(reasons) == len(set(reasons)), "a reason belongs to one kind"


def test_a_second_class_of_a_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="has a class already"):
        class Again(Reason, kind="missing_grad", name="never_ran"):  # noqa: F841 (refused as it is defined)
            pass


def test_each_reason_is_decided_by_one_entry_of_the_registry_which_lists_its_class() -> None:
    classes = [cls for decides in (*(d.decides for d in DETECTORS), BEYOND_THE_CHECK) for cls in decides]
    assert len(classes) == len(set(classes)) == len(DECIDED_BY)
    assert {d.name for d in DETECTORS if d.decides} >= {"the structure check", "the gradient check"}
    assert DECIDED_BY[("not_in_optimizer", "left_out")] == "the structure check"  # derived from the classes


def test_a_finding_cannot_be_made_without_its_reason() -> None:
    parameters = inspect.signature(constructors.make).parameters
    assert list(parameters)[0] == "reason" and parameters["reason"].default is inspect.Parameter.empty
    with pytest.raises(TypeError):
        Finding("missing_grad", "w", "error")  # type: ignore[call-arg]


def _word_edits(source: str) -> list[str]:
    """The places that write or edit a finding's words outside its reason: ``Finding(...)`` / ``.replace(...)``
    / ``.confirm(...)`` with ``message=``, ``cause=`` or ``fix=``, and any string method that edits one of a
    finding's or a rendering's words (``.rstrip``, ``.replace``, a regular expression, a slice)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            keywords = {k.arg for k in node.keywords}
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("replace", "confirm", "Finding") and keywords & {"message", "cause", "fix"}:
                out.append(ast.unparse(node)[:80])
            receiver = getattr(node.func, "value", None)
            if name in ("sub", "replace", "findall", "rstrip", "strip", "lstrip", "removesuffix", "split") \
                    and isinstance(receiver, ast.Attribute) and receiver.attr in ("message", "cause", "fix"):
                out.append(ast.unparse(node)[:80])
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr in ("message", "cause", "fix") and isinstance(node.slice, ast.Slice):
            out.append(ast.unparse(node)[:80])
    return out


def test_no_word_is_edited_after_its_reason_wrote_it() -> None:
    edits = {str(p.relative_to(PACKAGE)): _word_edits(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    assert {k: v for k, v in edits.items() if v} == {}


def test_the_scan_finds_a_words_edit() -> None:
    source = ("def decide(f, g):\n    return f.replace(status='open', message=g.message)\n"
              "def more(f):\n    return f.cause.replace('a', 'b')\n"
              "def ranks(before):\n    return before.message.rstrip('.') + ' (on any rank).'\n"
              "def cut(before):\n    return before.fix[:-1]\n"
              "def counted(f):\n    return f.replace(step=2, details={})\n")
    assert len(_word_edits(source)) == 4


def test_a_finding_holds_no_words_and_renders_them_when_read() -> None:
    fields = {f.name for f in dataclasses.fields(Finding)}
    assert not fields & {"message", "cause", "fix", "remedy", "args"}
    f = constructors.make(REASONS[("missing_grad", "never_ran")](module="head"), "head.weight", "error")
    assert "words" not in vars(f)  # nothing rendered until a sink reads it
    assert f.message == "`head.weight` requires grad but got no gradient: it does not train."
    again = f.replace(status="intermittent")
    assert "words" not in vars(again) and again.cause == f.cause


class _Grouped(nn.Module):
    """Mistakes of several tensors: a head never called, a container, a cut."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head, self.spare = nn.Linear(4, 4), nn.Linear(4, 1), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        self.blocks = [nn.Linear(4, 4), nn.Linear(4, 4)]  # a plain list
        self.cut = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.body(x) + self.cut(x).detach())


def test_the_words_of_a_grouped_mistake_are_exactly_what_its_reason_returns_for_its_members() -> None:
    model = _Grouped()
    opt = torch.optim.SGD([*model.parameters(), *(p for b in model.blocks for p in b.parameters())], lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            report = monitor.check(opt)
    grouped = [f for f in report if len(f.members) > 1]
    assert {(f.kind, f.name) for f in grouped} >= {("missing_grad", "spare"), ("orphan_tensor", "blocks")}
    for f in grouped:
        alike = [m for m in f.members if m.reason.name == f.reason.name and m.status == f.status]
        words = alike[0].reason.words(Members([m.name for m in alike], [m.reason for m in alike], f.name,
                                              [m.details.get("cover") for m in alike]))
        assert (f.message, f.cause, f.fix, f.remedy) == (words.message, words.cause, words.fix, words.remedy)
        assert f.words == render(f)
        assert f.message.startswith("each of `") or f.message.startswith(f"`{f.names[0]}")


def test_a_reason_declares_whether_its_fixes_are_code_and_keeps_to_it() -> None:
    """Every finding the registry's reasons can give in a run of seeded bugs: its remedy is code only
    where its class says it may be (``always``/``sometimes``), advice where it says ``never``."""
    model = _Grouped()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            report = monitor.check(opt)
    seen = [m for f in report for m in f.tensors]
    assert seen
    for m in seen:
        declared = type(m.reason).fixes
        if declared == "never":
            assert m.remedy is None or m.remedy.applicability == "words", (m.kind, m.reason.name)
        if declared == "always":
            assert m.remedy is not None and m.remedy.applicability == "code", (m.kind, m.reason.name)


# -- every reason, from its JSON fields alone ------------------------------------------------------------
#: Values that a field's type alone cannot give: a strategy the reason knows, a real op.
_KNOWN = {"strategy": "fsdp", "op": "`.detach()`", "kind": "dtype", "dtype": "torch.float64", "device": "cpu",
          "main_dtype": "torch.float32", "action": "insert_after", "library": "torchdiffeq"}


def _example(hint: object, name: str, kind: str) -> object:
    """A value of the type ``hint`` for the field ``name`` of a reason of ``kind``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _example(options[0], name, kind)
    if origin is tuple:
        inner = typing.get_args(hint)
        if len(inner) == 2 and inner[1] is Ellipsis:
            return (_example(inner[0], name, kind),)
        return tuple(_example(h, name, kind) for h in inner)
    if hint is Reason:
        return REASONS[(kind, "unused")](module="net") if kind == "missing_grad" else next(
            _instance(cls) for (k, _), cls in REASONS.items() if k == kind and not issubclass(cls, Transition))
    if hint is Remedy:
        return Remedy("code", "opt.step()")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: _example(hints[f.name], f.name, kind) for f in dataclasses.fields(hint)
                       if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                       or f.name in ("at", "leaf", "place", "target", "variable")})
    return {str: _KNOWN.get(name, "net.w"), int: 3, float: 0.5, bool: True}.get(hint, _KNOWN.get(name))  # type: ignore[arg-type]


def _instance(cls: type[Reason]) -> Reason:
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _example(hints[f.name], f.name, cls.kind) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


@pytest.mark.parametrize("pair", sorted(REASONS), ids=lambda pair: f"{pair[0]}-{pair[1]}")
def test_every_reason_renders_the_same_words_from_its_json_fields_alone(pair: tuple[str, str]) -> None:
    reason = _instance(REASONS[pair])
    made = Finding(pair[0], "net.w", "error", reason)
    read = Finding.from_dict(json.loads(json.dumps(made.to_dict())))
    assert type(read.reason) is type(reason) and read.reason == reason
    assert read.words == made.words and made.message and made.cause
    assert read.to_dict() == made.to_dict()


def test_a_record_written_before_findings_carried_their_reason_keeps_its_words() -> None:
    old = {"kind": "missing_grad", "name": "head.weight", "severity": "error", "message": "`head.weight` got none.",
           "cause": "it never ran", "fix": "call it", "details": {"reason": "never_ran", "applicability": "words"}}
    f = Finding.from_dict(old)
    assert isinstance(f.reason, Written) and (f.message, f.cause, f.fix) == ("`head.weight` got none.", "it never ran",
                                                                          "call it")
    assert f.remedy is None and f.to_dict()["reason"] == "" and Finding.from_dict(f.to_dict()) == f


def test_the_place_of_a_fix_is_data_the_reason_renders_without_reading_a_file(tmp_path: Path) -> None:
    """A code fix's place is worked out when the finding is decided; the reason renders it from its fields, so
    the same words come back once the file is gone."""
    from leafwatch.detectors import fixes
    at = Span(str(tmp_path / "train.py"), 3, 3, "    ")
    target = fixes.Target(None, "opt", "Adam", at)
    reason = REASONS[("not_in_optimizer", "left_out")](target=target, param_code="model.scale")
    words = reason.words(Members.one("scale", reason))
    assert words.remedy == Remedy("code", 'opt.add_param_group({"params": [model.scale]})',
                                  Edit(at.path, 3, 3, "insert_after", '    opt.add_param_group({"params": [model.scale]})\n'))
    assert Place("a/deep.py", 13, "Deep.forward").within == "deep.py:13 (in `Deep.forward`)"

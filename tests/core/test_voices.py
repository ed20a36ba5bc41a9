"""One voice per finding: every reason a finding can carry has exactly one renderer, the one
leafwatch/detectors/registry.py names for it, and nothing edits its words after it rendered them."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

import leafwatch
from leafwatch.detectors import constructors
from leafwatch.detectors.registry import BEYOND_THE_CHECK, DECIDED_BY, DETECTORS
from leafwatch.report.findings import Kind
from leafwatch.report.words import RENDERERS, Members, Words, render, renders

PACKAGE = Path(__file__).resolve().parents[2] / "leafwatch"


def test_every_reason_the_registry_declares_has_exactly_one_renderer_and_no_other_exists() -> None:
    assert set(DECIDED_BY) == set(RENDERERS)


def test_each_renderer_lives_in_the_detector_package_and_each_kind_has_one() -> None:
    assert all(r.where.startswith("detectors.") for r in RENDERERS.values())
    assert {kind for kind, _ in RENDERERS} == {k.value for k in Kind}
    reasons = [reason for _, reason in RENDERERS]
    assert len(reasons) == len(set(reasons)), "a reason belongs to one kind"


def test_a_second_renderer_of_a_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="has a renderer already"):
        renders("missing_grad", "never_ran")(lambda m: Words("m", "c", "f"))


def test_each_reason_is_decided_by_one_entry_of_the_registry() -> None:
    pairs = [(kind, reason) for decides in (*(d.decides for d in DETECTORS), BEYOND_THE_CHECK)
             for kind, reasons in decides.items() for reason in reasons]
    assert len(pairs) == len(set(pairs)) == len(DECIDED_BY)
    assert {d.name for d in DETECTORS if d.decides} >= {"the structure check", "the gradient check"}


def test_a_finding_cannot_be_made_without_its_reason_and_arguments() -> None:
    parameters = inspect.signature(constructors.make).parameters
    for name in ("reason", "args"):
        assert parameters[name].default is inspect.Parameter.empty


def _made_reasons(source: str) -> set[tuple[str, str]]:
    """The ``(kind, reason)`` literals of every ``make(kind, name, severity, reason, ...)`` call."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "make" \
                and len(node.args) >= 4:
            kind, reason = node.args[0], node.args[3]
            reasons = [reason.body, reason.orelse] if isinstance(reason, ast.IfExp) else [reason]
            for r in reasons:
                if isinstance(kind, ast.Constant) and isinstance(r, ast.Constant):
                    found.add((kind.value, r.value))
    return found


def test_every_reason_a_detector_makes_has_its_renderer() -> None:
    made = set().union(*(_made_reasons(p.read_text()) for p in sorted((PACKAGE / "detectors").glob("*.py"))))
    assert ("missing_grad", "requires_grad_false") in made and len(made) > 30  # the scan sees them
    assert made <= set(RENDERERS), f"made without a renderer: {sorted(made - set(RENDERERS))}"


def _word_edits(source: str) -> list[str]:
    """The places that write a finding's words outside a renderer: ``.replace(...)`` /
    ``.confirm(...)`` / ``Finding(...)`` with ``message=``, ``cause=`` or ``fix=``, and any regular
    expression or ``str.replace`` call on a finding's words."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        keywords = {k.arg for k in node.keywords}
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        if name in ("replace", "confirm", "Finding") and keywords & {"message", "cause", "fix"}:
            out.append(ast.unparse(node)[:80])
        receiver = getattr(node.func, "value", None)
        if name in ("sub", "replace", "findall") and isinstance(receiver, (ast.Attribute, ast.Name)) \
                and getattr(receiver, "attr", getattr(receiver, "id", "")) in ("message", "cause", "fix"):
            out.append(ast.unparse(node)[:80])
    return out


def test_no_word_is_edited_after_its_renderer_wrote_it() -> None:
    edits = {str(p.relative_to(PACKAGE)): _word_edits(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    # The report builds a mistake once, from the words its renderer gave (report/findings.py, _mistake).
    allowed = {"report/findings.py": 1}
    assert {k: v for k, v in edits.items() if len(v) > allowed.get(k, 0)} == {}


def test_the_scan_finds_a_words_edit() -> None:
    source = ("def decide(f, g):\n    return f.replace(status='open', message=g.message)\n"
              "def more(f):\n    return f.cause.replace('a', 'b')\n"
              "def counted(f):\n    return f.replace(step=2, details={})\n")
    assert len(_word_edits(source)) == 2


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


def test_the_words_of_a_grouped_mistake_are_exactly_what_its_renderer_returns_for_its_members() -> None:
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
        alike = [m for m in f.members if m.reason == f.reason and m.status == f.status]
        words = render(f.kind, f.reason, Members([m.name for m in alike], [m.args for m in alike], f.details["group"],
                                                 [m.details.get("cover") for m in alike]))
        assert (f.message, f.cause, f.fix, f.remedy) == (words.message, words.cause, words.fix, words.remedy)
        assert f.message.startswith("each of `") or f.message.startswith(f"`{f.names[0]}")


def test_a_renderer_declares_whether_its_fixes_are_code_and_keeps_to_it() -> None:
    """Every finding the registry's reasons can give in a run of seeded bugs: its remedy is code only
    where its renderer says it may be (``always``/``sometimes``), advice where it says ``never``."""
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
        declared = RENDERERS[(str(m.kind), m.reason)].fixes
        if declared == "never":
            assert m.remedy is None or m.remedy.applicability == "words", (m.kind, m.reason)
        if declared == "always":
            assert m.remedy is not None and m.remedy.applicability == "code", (m.kind, m.reason)

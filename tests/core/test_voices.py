"""One voice per finding: every reason a finding can carry is written by exactly one function,
the one leafwatch/detectors/registry.py names for it."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from leafwatch.detectors import constructors
from leafwatch.detectors.registry import VOICES
from leafwatch.report.findings import Kind

PACKAGE = Path(__file__).resolve().parents[2] / "leafwatch"


def _enclosing(tree: ast.Module) -> dict[int, str]:
    """id(node) -> the qualified name of the function (or method) it sits in."""
    out: dict[int, str] = {}

    def visit(node: ast.AST, stack: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = stack + [child.name] if isinstance(child, (ast.FunctionDef, ast.ClassDef)) else stack
            out[id(child)] = ".".join(inner)
            visit(child, inner)

    visit(tree, [])
    return out


def _written_reasons(source: str, module: str) -> dict[str, set[str]]:
    """reason -> the functions that write it as a literal (a ``reason=`` keyword, or a
    ``"reason":`` entry of a dict)."""
    tree = ast.parse(source)
    where = _enclosing(tree)
    found: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        literals = []
        if isinstance(node, ast.keyword) and node.arg == "reason":
            literals.append(node.value)
        elif isinstance(node, ast.Dict):
            literals += [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "reason"]
        for value in list(literals):
            if isinstance(value, ast.IfExp):  # `"plain_tensor" if plain else "frozen"`
                literals += [value.body, value.orelse]
        for value in literals:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.setdefault(value.value, set()).add(f"{module}.{where[id(value)]}")
    return found


def _all_written() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for reason, functions in _written_reasons(path.read_text(), module).items():
            found.setdefault(reason, set()).update(functions)
    return found


def test_every_reason_is_written_by_one_function_the_registry_names() -> None:
    written = _all_written()
    assert {"detached", "left_out", "never_stepped", "buffer"} <= set(written)  # the scan sees them
    registered = {reason: f"detectors.{builder}" for (_, reason), builder in VOICES.items()}
    for reason, functions in sorted(written.items()):
        assert len(functions) == 1, f"reason {reason!r} is written in {sorted(functions)}: one voice each"
        assert reason in registered, f"reason {reason!r} ({functions.pop()}) is not in detectors/registry.py"
        assert functions == {registered[reason]}, f"{reason!r}: written in {functions}, registered {registered[reason]}"
    assert set(registered) <= set(written), "an entry of detectors/registry.py no builder writes"


def test_each_reason_belongs_to_one_kind_and_every_kind_has_a_voice() -> None:
    reasons = [reason for _, reason in VOICES]
    assert len(reasons) == len(set(reasons))
    assert {kind for kind, _ in VOICES} == {k.value for k in Kind}


@pytest.mark.parametrize("builder", sorted(set(VOICES.values())))
def test_every_builder_the_registry_names_exists(builder: str) -> None:
    module, _, path = builder.partition(".")
    obj = importlib.import_module(f"leafwatch.detectors.{module}")
    for part in path.split("."):
        obj = getattr(obj, part)
    assert callable(obj)


def test_a_finding_cannot_be_made_without_its_reason() -> None:
    reason = inspect.signature(constructors.make).parameters["reason"]
    assert reason.kind is inspect.Parameter.KEYWORD_ONLY and reason.default is inspect.Parameter.empty


def test_the_scan_finds_a_reason_written_twice() -> None:
    source = ("def a():\n    make('k', 'n', 'error', 'm', 'c', 'f', reason='twice')\n"
              "def b():\n    return {'reason': 'twice'}\n")
    assert _written_reasons(source, "m") == {"twice": {"m.a", "m.b"}}


def _word_edits(source: str, module: str) -> set[str]:
    """The functions that call ``.replace(...)`` or ``.confirm(...)`` with ``message=``, ``cause=`` or
    ``fix=``: a finding's words written after (or beside) its builder."""
    tree = ast.parse(source)
    where = _enclosing(tree)
    return {f"{module}.{where[id(node)]}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("replace", "confirm") and {k.arg for k in node.keywords} & {"message", "cause", "fix"}}


def test_only_a_registered_builder_edits_a_findings_words() -> None:
    builders = {f"detectors.{builder}" for builder in VOICES.values()}
    edits = set().union(*(_word_edits(path.read_text(), f"detectors.{path.stem}")
                          for path in sorted((PACKAGE / "detectors").glob("*.py"))))
    assert "detectors.gradients.intermittent" in edits  # the scan sees them
    assert edits <= builders, f"words edited outside their voice (detectors/registry.py): {sorted(edits - builders)}"


def test_the_scan_finds_a_words_edit_outside_a_builder() -> None:
    source = ("class Judge:\n    def decide(self, f, g):\n        return f.replace(status='open', message=g.message)\n"
              "def confirmed(f):\n    return Verdict.confirm(f.key, cause=f.cause + ' more')\n"
              "def counted(f):\n    return f.replace(step=2, details={})\n")
    assert _word_edits(source, "m") == {"m.Judge.decide", "m.confirmed"}


def test_each_reason_is_decided_by_one_entry_of_the_registry() -> None:
    from leafwatch.detectors.registry import BEYOND_THE_CHECK, DETECTORS

    pairs = [(kind, reason) for voices in (*(d.voices for d in DETECTORS), BEYOND_THE_CHECK)
             for kind, *reasons in voices.values() for reason in reasons]
    assert len(pairs) == len(set(pairs)) == len(VOICES)
    assert {d.name for d in DETECTORS if d.voices} >= {"the structure check", "the gradient check"}

"""Each code fix leafwatch prints, executed (#46 item 5): for every script of ``tests/scripts/`` that
raises and whose crash's findings have a code fix placed in the script (an
:class:`~leafwatch.report.words.Edit`; the scripts that run to their end are patched in test_patch.py), the
edits are applied to a copy of the script, the copy is run
again under ``leafwatch run``, and the run is clean: the script ends, and no finding is open. A fix that
leaves a second finding (a non-leaf made a leaf but left out of the optimizer) or names a loop variable
(``opt`` of ``for opt in opts:``) fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fix_runs import SCRIPTS, apply_edits, code_edits, findings_of, fixed_copy

from leafwatch.report.words import Edit

#: The scripts whose findings carry a placed code fix and that raise before their loop trains (the crashes
#: patched from their record, `leafwatch report --diff`, and rerun: test_fixes_train.py's CRASHES), and the
#: (kind, name) of each finding those fix. The scripts that run to their end are patched with the real patch and rerun in
#: test_patch.py (PATCHED), with the same assertion: no open finding but the known ones.
FIXED = {
    "crash_inplace_parameter.py": {("non_leaf", "w")},
    "crash_optimize_non_leaf.py": {("non_leaf", "w")},
    "crash_second_backward.py": {("non_leaf", "model.scale")},
    "nonleaf_global_second_backward.py": {("non_leaf", "margin")},
}
#: Findings of those scripts that no code fix mends: still open after the others are fixed.
KNOWN: dict[str, set[tuple[str, str]]] = {}


def test_edits_apply_bottom_up_and_an_insert_after_a_replaced_span_keeps_its_place() -> None:
    text = "a = 1\nb = 2\nc = 3\n"
    edits = [Edit("f.py", 1, 2, "replace", "a = 10\nb = 20\n"), Edit("f.py", 2, 2, "insert_after", "d = 4\n"),
             Edit("f.py", 3, 3, "replace", "c = 30\n")]
    assert apply_edits(text, edits) == "a = 10\nb = 20\nd = 4\nc = 30\n"
    assert apply_edits(text, [edits[1], edits[1]]) == "a = 1\nb = 2\nd = 4\nc = 3\n"  # one fix, two findings
    with pytest.raises(ValueError, match="overlap"):
        apply_edits(text, [Edit("f.py", 1, 2, "replace", "x\n"), Edit("f.py", 2, 3, "replace", "y\n")])
    with pytest.raises(ValueError, match="outside"):
        apply_edits(text, [Edit("f.py", 4, 4, "replace", "x\n")])


def test_every_script_with_a_placed_code_fix_is_listed() -> None:
    """A new script whose finding has a placed code fix gets its run below (the list is the scripts')."""
    listed = set(FIXED)
    assert all((SCRIPTS / name).exists() for name in listed)


@pytest.mark.parametrize("name", sorted(FIXED))
def test_pasting_each_code_fix_leaves_a_clean_run(name: str, tmp_path: Path) -> None:
    script = SCRIPTS / name
    found, _ = findings_of(script, tmp_path / "before.json")
    findings = found["open"] + found["crash"]
    fixed = {(f["kind"], f["name"]) for f in findings
             if (f.get("remedy") or {}).get("applicability") == "code" and (f["remedy"].get("edit"))}
    assert fixed == FIXED[name], findings
    edits = code_edits(findings, script)
    copy = fixed_copy(script, edits, tmp_path / "fixed")
    after, result = findings_of(copy, tmp_path / "after.json")
    assert result.returncode == 0 and "Traceback" not in result.stderr, (copy.read_text(), result.stderr)
    assert after["crash"] == []
    assert {(f["kind"], f["name"]) for f in after["open"]} == KNOWN.get(name, set()), (copy.read_text(), after)
    assert all(f["reason"] == "leftovers" for f in after["open"] if f["kind"] == "stale_param"), after


def test_a_loop_variable_is_never_the_optimizer_a_fix_names(tmp_path: Path) -> None:
    found, _ = findings_of(SCRIPTS / "two_optimizers_in_a_loop.py", tmp_path / "out.json")
    (finding,) = found["open"]
    assert (finding["kind"], finding["name"], finding["reason"]) == ("not_in_optimizer", "extra", "root_outside")
    assert finding["remedy"]["code"] == 'opts[0].add_param_group({"params": extra.parameters()})'
    assert finding["remedy"]["edit"]["action"] == "insert_after" and finding["remedy"]["edit"]["end"] == 8
    assert "`opt." not in finding["fix"]


def test_a_global_non_leaf_in_no_optimizer_is_made_a_leaf_and_handed_to_the_optimizer(tmp_path: Path) -> None:
    found, _ = findings_of(SCRIPTS / "nonleaf_global_no_optimizer.py", tmp_path / "out.json")
    (finding,) = found["open"]
    assert (finding["kind"], finding["name"], finding["reason"]) == ("non_leaf", "margin", "not_a_leaf")
    assert finding["remedy"]["code"] == ('margin = torch.randn(1).double().requires_grad_()\n'
                                         'opt.add_param_group({"params": [margin]})')
    assert "`opt.add_param_group({\"params\": [margin]})`" in finding["fix"]
    crashed, _ = findings_of(SCRIPTS / "nonleaf_global_second_backward.py", tmp_path / "crash.json")
    (finding,) = crashed["crash"]
    assert (finding["kind"], finding["name"], finding["reason"]) == ("non_leaf", "margin", "persistent_non_leaf")
    assert finding["remedy"]["code"].endswith('\nopt.add_param_group({"params": [margin]})')

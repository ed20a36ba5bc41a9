"""leafwatch/report/patch.py on findings made by hand: the hunks, their line numbers, merged and
deduplicated edits, refused overlaps, files that are not the user's, and the exit codes of
``leafwatch report --diff`` (torch-free; the real runs are in tests/integrations/test_patch.py)."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from leafwatch import Finding
from leafwatch.report import patch
from leafwatch.report.reasons import Written
from leafwatch.report.words import Edit, Remedy

SOURCE = "".join(f"line{i}\n" for i in range(1, 21))


def _finding(name: str, *edits: Edit | None, kind: str = "not_in_optimizer", applicability: str = "code") -> Finding:
    remedy = Remedy(applicability, "x()" if applicability == "code" else "", edits[0] if edits else None)  # type: ignore[arg-type]
    return Finding(kind=kind, name=name, severity="error", reason=Written(message="m", fix="f", remedy=remedy))


def _file(tmp_path: Path, name: str = "train.py", text: str = SOURCE) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_two_edits_far_apart_are_two_hunks_with_their_line_numbers(tmp_path: Path) -> None:
    path = _file(tmp_path)
    made = patch.build([_finding("a", Edit(path, 3, 3, "insert_after", "new_a\n")),
                        _finding("b", Edit(path, 15, 15, "replace", "new_b\n"))], str(tmp_path))
    assert made.complete and not made.left_out
    assert made.diff == ("--- a/train.py\n+++ b/train.py\n"
                         "@@ -1,6 +1,7 @@\n line1\n line2\n line3\n+new_a\n line4\n line5\n line6\n"
                         "@@ -12,7 +13,7 @@\n line12\n line13\n line14\n-line15\n+new_b\n line16\n line17\n line18\n")


def test_edits_close_together_merge_into_one_hunk_and_identical_ones_count_once(tmp_path: Path) -> None:
    path = _file(tmp_path)
    same = Edit(path, 5, 5, "insert_after", "x = 1\n")
    made = patch.build([_finding("a", same), _finding("b", same), _finding("c", Edit(path, 8, 8, "replace", "y\n"))],
                       str(tmp_path))
    assert made.diff.count("@@ -") == 1 and made.diff.count("+x = 1\n") == 1
    assert "@@ -3,9 +3,10 @@\n line3\n line4\n line5\n+x = 1\n line6\n line7\n-line8\n+y\n" in made.diff
    assert [f.edits for f in made.files] == [2]


@pytest.mark.parametrize(("first", "second"), [
    (Edit("P", 4, 6, "replace", "a\n"), Edit("P", 6, 7, "replace", "b\n")),
    (Edit("P", 4, 6, "replace", "a\n"), Edit("P", 5, 5, "insert_after", "b\n")),
    (Edit("P", 4, 4, "replace", "a\n"), Edit("P", 4, 4, "replace", "b\n")),
])
def test_two_edits_on_overlapping_lines_are_refused_with_one_line(tmp_path: Path, first: Edit, second: Edit) -> None:
    path = _file(tmp_path)
    edits = [Edit(path, e.start, e.end, e.action, e.text) for e in (first, second)]
    with pytest.raises(patch.PatchRefused, match=r"^two fixes edit the same lines of train.py \(\d+-\d+ and \d+-\d+\): "
                       "apply them by hand, one at a time$"):
        patch.build([_finding("a", edits[0]), _finding("b", edits[1])], str(tmp_path))


def test_an_insert_after_the_last_line_of_a_replaced_span_goes_after_the_new_text(tmp_path: Path) -> None:
    path = _file(tmp_path)
    made = patch.build([_finding("a", Edit(path, 4, 5, "replace", "a\nb\nc\n")),
                        _finding("b", Edit(path, 5, 5, "insert_after", "d\n"))], str(tmp_path))
    assert "\n-line4\n-line5\n+a\n+b\n+c\n+d\n line6\n" in made.diff


def test_files_outside_the_folder_or_in_an_installed_library_are_left_out_and_said(tmp_path: Path) -> None:
    root = tmp_path / "project"
    mine = _file(root)
    theirs = _file(tmp_path / "elsewhere", "other.py")
    library = _file(root / ".venv" / "lib" / "site-packages" / "lib", "mod.py")
    made = patch.build([_finding("mine", Edit(mine, 1, 1, "insert_after", "z\n")),
                        _finding("theirs", Edit(theirs, 1, 1, "insert_after", "z\n")),
                        _finding("library", Edit(library, 1, 1, "insert_after", "z\n"))], str(root))
    assert [f.relative for f in made.files] == ["train.py"]
    assert [str(o) for o in made.left_out] == [
        f"not in the patch: not_in_optimizer library: {library} belongs to an installed library",
        f"not in the patch: not_in_optimizer theirs: {theirs} is outside the folder the run was started in ({root})"]
    assert not made.complete and patch.exit_code(made) == 1


def test_advice_and_code_without_a_place_are_left_out_and_only_the_latter_makes_it_partial(tmp_path: Path) -> None:
    advice = patch.build([_finding("head", kind="missing_grad", applicability="words")], str(tmp_path))
    assert [str(o) for o in advice.left_out] == ["not in the patch: missing_grad head: its fix is advice, not code"]
    assert advice.complete and advice.diff == "" and patch.exit_code(advice) == 0
    placeless = patch.build([_finding("scale")], str(tmp_path))
    assert [o.why for o in placeless.left_out] == [
        "its code has no place in a file (leafwatch could not find the statement it belongs to)"]
    assert patch.exit_code(placeless) == 1


def test_resolved_findings_are_not_patched(tmp_path: Path) -> None:
    path = _file(tmp_path)
    made = patch.build([_finding("a", Edit(path, 3, 3, "insert_after", "z\n")).replace(status="resolved")],
                       str(tmp_path))
    assert made.files == () and made.left_out == ()


def test_a_last_line_without_newline_is_marked_and_git_apply_takes_it(tmp_path: Path) -> None:
    path = _file(tmp_path, text="a = 1\nb = 2")
    made = patch.build([_finding("a", Edit(path, 2, 2, "insert_after", "c = 3\n"))], str(tmp_path))
    assert made.diff == ("--- a/train.py\n+++ b/train.py\n@@ -1,2 +1,3 @@\n a = 1\n-b = 2\n"
                         "\\ No newline at end of file\n+b = 2\n+c = 3\n")
    (tmp_path / "fix.diff").write_text(made.diff)
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True)
    assert Path(path).read_text() == "a = 1\nb = 2\nc = 3\n"


def test_the_record_holds_the_root_each_files_hash_and_each_findings_hunk(tmp_path: Path) -> None:
    path = _file(tmp_path)
    findings = [_finding("a", Edit(path, 3, 3, "insert_after", "z\n")), _finding("head", applicability="words")]
    saved = patch.record(findings, str(tmp_path), patch.disk_lines)
    assert saved["root"] == str(tmp_path)
    assert saved["files"] == {path: patch.digest(patch.disk_lines(path))}
    assert [(h["kind"], h["name"]) for h in saved["hunks"]] == [("not_in_optimizer", "a")]
    assert saved["hunks"][0]["diff"].startswith("--- a/train.py\n+++ b/train.py\n@@ -1,6 +1,7 @@\n")


def test_patch_main_prints_the_diff_and_the_left_out_lines_and_refuses_a_changed_file(tmp_path: Path) -> None:
    path = _file(tmp_path)
    findings = [_finding("a", Edit(path, 3, 3, "insert_after", "z\n")), _finding("head", applicability="words")]
    data = {"step": 1, "findings": [f.to_dict() for f in findings],
            "patch": patch.record(findings, str(tmp_path), patch.disk_lines)}
    out, err = io.StringIO(), io.StringIO()
    assert patch.patch_main([data], out=out, err=err) == 0
    assert out.getvalue().startswith("--- a/train.py\n") and err.getvalue() == (
        "not in the patch: not_in_optimizer head: its fix is advice, not code\n")
    Path(path).write_text(SOURCE + "more\n")
    out, err = io.StringIO(), io.StringIO()
    assert patch.patch_main([data], out=out, err=err) == 2
    assert out.getvalue() == "" and err.getvalue().count("\n") == 1 and "train.py changed since the run" in err.getvalue()


def test_runs_started_in_different_folders_are_refused(tmp_path: Path) -> None:
    records = [{"findings": [], "patch": {"root": os.fspath(tmp_path / name), "files": {}, "hunks": []}}
               for name in ("a", "b")]
    with pytest.raises(patch.PatchRefused, match="the runs were started in different folders"):
        patch.of_records(records)


def test_a_patch_of_no_file_says_why_in_one_line_and_one_with_a_file_says_nothing(tmp_path: Path) -> None:
    advice = _finding("aux", kind="missing_grad", applicability="words")
    placeless = _finding("calib")  # code, no place
    both = patch.build([advice, placeless], str(tmp_path))
    assert patch.nothing_to_give(both) == ("no code fix to give: of 2 open findings, 1 has advice only and 1 has a "
                                           "code fix that could not be placed")
    err = io.StringIO()
    assert patch.patch_main([], out=io.StringIO(), err=err) == 0
    assert err.getvalue() == "leafwatch report: no code fix to give: no open findings\n"
    placed = patch.build([_finding("scale", Edit(_file(tmp_path), 3, 3, "insert_after", "x()")), advice], str(tmp_path))
    assert placed.files and patch.nothing_to_give(placed) is None

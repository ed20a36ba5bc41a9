"""Report: text and markdown tables, the JSON round trip, raising, truthiness and counts."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from torch import nn

import leafwatch
from leafwatch import KINDS, Finding, LeafwatchError, Report
from leafwatch.report.reasons import Written
from leafwatch.report.words import Remedy


def _finding(kind: str = "missing_grad", name: str = "a.weight", severity: str = "error", **changes) -> Finding:
    """A finding made by hand: its words written as they are (:class:`Written`), its fields as given."""
    words = {"message": f"`{name}` got no gradient.", "cause": "it is cut by `a | b`", "fix": "use it"}
    words.update({k: changes.pop(k) for k in ("message", "cause", "fix", "remedy") if k in changes})
    values = dict(
        kind=kind, name=name, severity=severity, reason=Written(**words), step=3, first_step=1, last_step=3,
        shape=(3, 2), dtype="float32", device="cpu", aliases=("tied.weight",), details={"checks": 3},
    )
    values.update(changes)
    return Finding(**values)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
        self.extra = nn.Linear(3, 3)  # never used

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _real_report() -> Report:
    model = _Model()
    model.extra.bias.requires_grad_(False)
    opt = torch.optim.SGD([*model.body[0].parameters(), *model.extra.parameters()], lr=0.1)
    model(torch.randn(2, 3)).sum().backward()
    model.body[0].bias.grad[0] = float("nan")
    return leafwatch.audit(model, opt, step=7)


def test_report_lists_findings_most_severe_first():
    report = Report([_finding(severity="info", name="z"), _finding(name="b"),
                     _finding(kind="non_leaf", name="c", severity="error"),
                     _finding(name="a", status="resolved")])
    assert [(f.kind, f.name) for f in report] == [
        ("non_leaf", "c"), ("missing_grad", "b"), ("missing_grad", "z"), ("missing_grad", "a")]


def test_str_is_a_table_with_cause_and_fix():
    text = str(Report([_finding(), _finding(name="x", status="intermittent", severity="info")], step=5))
    lines = text.splitlines()
    assert lines[0] == "leafwatch: 1 open of 2 finding(s) at step 5"
    assert "ERROR" in lines[1] and "missing_grad" in lines[1] and "a.weight" in lines[1] and "(since step 1)" in lines[1]
    assert "cause: it is cut by `a | b`" in text
    assert "fix (advice): use it" in text
    assert "x [intermittent]" in text


def test_str_of_an_empty_report():
    assert str(Report(step=2)) == "leafwatch: no findings at step 2"
    assert str(Report()) == "leafwatch: no findings"


def test_markdown_escapes_pipes_and_has_a_blank_line_before_the_table():
    markdown = Report([_finding(cause="a | b\nnext line")], step=4).to_markdown()
    lines = markdown.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| severity"))
    assert lines[header - 1] == ""
    assert lines[header + 1].startswith("|---")
    (row,) = lines[header + 2:]
    assert "a \\| b next line" in row
    assert row.count(" | ") == 6  # seven cells, no extra column from the escaped pipe
    assert "`a.weight`" in row
    assert lines[0] == "**leafwatch**: 1 open finding(s) at step 4"


def test_markdown_of_an_empty_report():
    assert Report().to_markdown() == "**leafwatch**: no findings."


def test_a_report_with_nothing_to_check_says_so_and_keeps_old_records_readable():
    nothing = Report(step=2, nothing_to_check=True)
    assert str(nothing) == "leafwatch: nothing to check at step 2: no tensor requires grad and nothing is watched"
    assert str(Report(nothing_to_check=True)) == "leafwatch: nothing to check: no tensor requires grad and nothing is watched"
    assert nothing.to_markdown() == "**leafwatch**: nothing to check: no tensor requires grad and nothing is watched."
    assert not nothing and len(nothing) == 0
    data = json.loads(json.dumps(nothing.to_dict()))
    assert data["nothing_to_check"] is True and Report.from_dict(data).nothing_to_check
    # Written only when true: every other record, and those written before the flag, read as before.
    assert "nothing_to_check" not in Report(step=2).to_dict()
    old = Report.from_dict({"version": 2, "step": 3, "counts": {}, "findings": []})
    assert not old.nothing_to_check and str(old) == "leafwatch: no findings at step 3"
    # Findings are shown whatever the flag says.
    assert str(Report([_finding()], step=5, nothing_to_check=True)).startswith("leafwatch: 1 open of 1 finding(s) at step 5")


def test_to_dict_from_dict_round_trip_through_json():
    report = _real_report()
    assert len(report) >= 3
    data = json.loads(json.dumps(report.to_dict()))
    again = Report.from_dict(data)
    assert again.findings == report.findings
    assert again.step == 7
    assert data["counts"] == report.counts()
    assert json.loads(report.to_json()) == data


def test_finding_round_trip_keeps_tuples_and_details():
    f = _finding()
    again = Finding.from_dict(json.loads(json.dumps(f.to_dict())))
    assert again == f
    assert again.shape == (3, 2) and again.aliases == ("tied.weight",)


def test_report_pickles():
    report = _real_report()
    assert pickle.loads(pickle.dumps(report)).findings == report.findings


def test_raise_for_findings_with_min_severity():
    report = Report([_finding(severity="warning", kind="device_mismatch", name="w")], step=1)
    report.raise_for_findings()  # no error: nothing raised
    with pytest.raises(LeafwatchError, match="device_mismatch +w") as error:
        report.raise_for_findings(min_severity="warning")
    assert error.value.report is report
    with pytest.raises(LeafwatchError):
        report.raise_for_findings("info")


def test_raise_for_findings_ignores_findings_that_are_not_open():
    report = Report([_finding(status="resolved"), _finding(name="b", status="ignored")])
    report.raise_for_findings("info")


@pytest.mark.parametrize("bad", ["fatal", "ERROR", None, 2])
def test_bad_min_severity_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match=rf"`min_severity` can be one of error, warning, info, got {bad!r}"):
        Report([_finding()]).raise_for_findings(min_severity=bad)


def test_bool_is_true_only_with_an_open_finding():
    assert not Report()
    assert not Report([_finding(status="resolved"), _finding(status="intermittent", severity="info")])
    assert Report([_finding(status="resolved"), _finding(name="b")])
    assert Report([_finding(severity="warning", kind="orphan_tensor")])


def test_info_findings_are_listed_but_never_open():
    info = _finding(severity="info", kind="frozen_in_optimizer")
    report = Report([info])
    assert not report and report.open == [] and report.tensors() == [info]
    assert [(f.kind, f.name, f.severity, f.names) for f in report] == [("frozen_in_optimizer", "a.weight", "info", ("a.weight",))]
    assert report.counts()["frozen_in_optimizer"] == 0
    assert "0 open of 1 finding(s)" in str(report)


def test_counts_has_every_kind_and_counts_open_findings_only():
    report = Report([_finding(), _finding(name="b"), _finding(name="c", status="resolved"),
                     _finding(kind="orphan_tensor", name="d")])
    counts = report.counts()
    assert list(counts) == list(KINDS)
    assert counts["missing_grad"] == 2 and counts["orphan_tensor"] == 1
    assert sum(counts.values()) == 3


def test_names_and_by_kind():
    report = _real_report()
    assert report.names("not_in_optimizer") == {"body.1.weight", "body.1.bias"}
    assert report.names("frozen_in_optimizer") == {"extra.bias"}
    assert report.names("nonfinite_grad") == {"body.0.bias"}
    assert report.names("missing_grad") == {"extra.weight"}
    assert [f.name for f in report.by_kind("nonfinite_grad")] == ["body.0.bias"]
    assert report.names() == report.names(status="open")
    assert len(report.names(status=None)) == len(report.tensors()) == 5
    assert [f.name for f in report.by_kind("not_in_optimizer")] == ["body.1"]  # one module left out: one mistake
    assert len(report) == 4


# -- the words: leafwatch.report.format ------------------------------------------------------------
def test_finding_line_is_short_severity_kind_name_when_and_fix():
    from leafwatch.report.format import finding_line

    line = finding_line(_finding(step=4, first_step=2))
    assert line == "leafwatch: ERROR missing_grad `a.weight` at step 2. Fix (advice): use it"
    assert "cut by" not in line and "\n" not in line  # the cause waits for the table
    assert finding_line(_finding(fix="", first_step=None)) == "leafwatch: ERROR missing_grad `a.weight`: `a.weight` got no gradient."
    assert finding_line(_finding(severity="info", status="intermittent", ranks=(1,))) == \
        "leafwatch: INFO missing_grad `a.weight` at step 1 (intermittent) on rank(s) 1. Fix (advice): use it"


@pytest.mark.parametrize(("fix", "remedy", "mark"), [
    ("call `opt.step()` after the backward pass", Remedy("code", "opt.step()"), "code"),
    ('add it to `opt`: `opt.add_param_group({"params": [model.scale]})`',
     Remedy("code", 'opt.add_param_group({"params": [model.scale]})'), "code"),
    ("call `step()` on the `SGD` that holds it", Remedy("words"), "words"),  # whose step() is for the user to say
    ("register it: `self.w = nn.Parameter(torch.ones(1))`", None, "words"),  # made by hand, no remedy: advice
    ("", None, None),
])
def test_a_fix_is_marked_code_or_advice_in_the_line_the_table_and_the_markdown(fix, remedy, mark):
    """The mark is the remedy its reason declared (:mod:`leafwatch.report.reasons`), never read off the
    fix's prose; a finding made by hand with a fix and no remedy is advice."""
    from leafwatch.report.format import finding_line

    f = _finding(fix=fix, remedy=remedy)
    assert ((f.remedy.applicability if f.remedy else "words") if f.fix else None) == mark  # (no remedy: advice)
    assert "applicability" not in f.details
    again = Finding.from_dict(json.loads(json.dumps(f.to_dict())))  # the record carries it
    assert (again.details, again.remedy) == (f.details, f.remedy)
    shown = {"code": "code", "words": "advice"}.get(mark)
    if mark is None:
        assert "Fix" not in finding_line(f) and "fix" not in str(Report([f]))
        return
    assert finding_line(f).endswith(f". Fix ({shown}): {fix}")
    assert f"      fix ({shown}): {fix}" in str(Report([f]))
    assert f"| ({shown}) " in Report([f]).to_markdown()


def test_a_finding_holds_no_words_so_none_can_be_changed():
    from leafwatch.detectors.loop import grad_cleared_all

    f = grad_cleared_all("optimizers[0]", ["w"], step=3)
    assert (f.reason.name, f.remedy.applicability) == ("cleared", "words")
    for change in ({"fix": "use it"}, {"message": "m"}, {"cause": "c"}, {"remedy": None}, {"args": {}}):
        with pytest.raises(TypeError, match="has no field"):
            f.replace(**change)
    assert f.replace(step=4).fix == f.fix  # bookkeeping changes freely


def test_findings_of_the_scan_before_the_first_step_say_at_start():
    from leafwatch.report.format import finding_line

    f = _finding(kind="not_in_optimizer", name="loss_weight", step=0, first_step=0, last_step=0)
    assert finding_line(f) == "leafwatch: ERROR not_in_optimizer `loss_weight` at start. Fix (advice): use it"
    text = str(Report([f], step=0))
    assert text.splitlines()[:2] == ["leafwatch: 1 open of 1 finding(s) at start",
                                     "  ERROR   not_in_optimizer    loss_weight (since start)"]
    markdown = Report([f], step=0).to_markdown()
    assert markdown.startswith("**leafwatch**: 1 open finding(s) at start")
    assert markdown.splitlines()[-1].endswith("| start |")
    assert "step 0" not in text + markdown


def test_ignored_findings_print_as_ignored_with_the_reason_given():
    from leafwatch.report.format import finding_line

    ignored = _finding(status="ignored", details={"ignored_because": "kept for fine-tuning", "pattern": "a.*"})
    text = str(Report([ignored], step=3))
    assert text.splitlines() == [
        "leafwatch: 0 open of 1 finding(s) at step 3",
        "  IGNORED missing_grad        a.weight (since step 1)",
        "      `a.weight` got no gradient.",
        "      ignored: kept for fine-tuning (pattern 'a.*')",
    ]
    assert "ERROR" not in text and "[ignored]" not in text
    row = Report([ignored]).to_markdown().splitlines()[-1]
    assert "| ignored | ignored: kept for fine-tuning (pattern 'a.*') |" in row
    assert finding_line(ignored) == "leafwatch: ignored missing_grad `a.weight`: kept for fine-tuning (pattern 'a.*')"


def test_monitor_ignore_reason_reaches_the_printed_report():
    model = _Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, ignore={"extra.*": "an auxiliary head for later"}) as monitor:
        model(torch.randn(2, 3)).sum().backward()
        text = str(monitor.check())
    assert "  IGNORED missing_grad        extra (since step 1)" in text
    assert "      ignored: an auxiliary head for later (pattern 'extra.*')" in text
    assert "cause:" not in text


def _fresh_report(history, step: int) -> Report:
    """The report of ``history`` built from nothing (no memo of an earlier report)."""
    from leafwatch.report.findings import Status
    from leafwatch.report.history import lift_to_modules
    from leafwatch.report.findings import apply_ignore

    shown = [f for f in history if f.status != Status.PENDING]
    names = history.tensor_names() if history.tensor_names is not None else ()
    return Report(apply_ignore(lift_to_modules(shown, names), history.ignore), step=step)


@pytest.mark.parametrize("ignore", [None, {"layers.1*": "kept for later"}])
def test_a_report_rebuilt_after_one_change_equals_one_built_afresh_and_keeps_the_unchanged_mistakes(ignore):
    from leafwatch.detectors.dead import dead_grad
    from leafwatch.report.history import FindingHistory
    from leafwatch.report.verdicts import Verdict

    names = tuple(f"layers.{i}.{p}" for i in range(40) for p in ("weight", "bias"))
    history = FindingHistory(ignore)
    history.tensor_names = lambda: names
    history.apply([Verdict.open(dead_grad(name, 3, 3)) for name in names[:60]])
    first = history.report(3)
    # One tensor's gradient comes back, another's dies: only the mistakes of their modules change.
    history.apply([Verdict.resolve(("dead_grad", "layers.2.bias"), 4),
                   Verdict.open(dead_grad("layers.35.weight", 3, 4))])
    second = history.report(4)
    assert second.to_dict() == _fresh_report(history, 4).to_dict()
    before = {f.key: f for f in first}
    changed = {f.key for f in second if before.get(f.key) is not f}
    ignored = {f.key for f in second if f.status == "ignored"}  # marked afresh at each rebuild
    assert changed - ignored == {("dead_grad", "layers.2"), ("dead_grad", "layers.35")}
    assert len(second) == len(first) + 1 and len(ignored) == (11 if ignore else 0)
    # A report read again without a change is the same report; the step follows the check.
    assert history.report(5) is second and second.step == 5


def test_a_monitor_report_with_mistakes_coming_and_going_equals_one_built_afresh():
    torch.manual_seed(0)

    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(4, 4)
            self.heads = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)) for _ in range(6))
            self.used = 1

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.body(x)
            return sum(self.heads[i](h).sum() for i in range(self.used))

    model = Heads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        for step in range(1, 11):
            model.used = 1 + step // 2  # a head more every other step: its mistake changes status
            opt.zero_grad()
            model(torch.randn(2, 4)).backward()
            report = monitor.check()
            assert report.to_dict() == _fresh_report(monitor.history_store, step).to_dict()
            opt.step()
        assert [(f.name, f.status) for f in report] == [(f"heads.{i}", "intermittent") for i in range(1, 6)]

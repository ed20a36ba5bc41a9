"""The TensorBoard vocabulary lives in one place, and the one order of findings holds everywhere.

``leafwatch.report.records`` names every tag and encodes/decodes the versioned records for the sink, the
Leafwatch tab and ``leafwatch report``; ``Finding.sort_key`` orders findings for reports, the
distributed merge and the tab.
"""

from __future__ import annotations

import ast
import os
import random
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.tensorboard import SummaryWriter

import leafwatch
from leafwatch import Finding, Report
from leafwatch.report import records
from leafwatch.integrations.distributed import merge
from leafwatch.integrations.tensorboard import tensor_summary
from leafwatch.report.reader import format_text, read_reports
from leafwatch.tensorboard_plugin.plugin import _flat, sorted_findings

PACKAGE = Path(leafwatch.__file__).parent


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_tag_names_are_spelled_only_in_records() -> None:
    spelled = {
        str(path.relative_to(PACKAGE)): line
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in _string_literals(path)
        if "leafwatch/" in text or "leafwatch-layout" in text
    }
    assert spelled and set(spelled) == {"report/records.py"}, spelled


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(2, 2)
        self.unused = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _write_run(log_dir: Path) -> Report:
    model = _Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = SummaryWriter(str(log_dir))
    monitor = leafwatch.Monitor(model, opt, writer=writer)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        model(torch.ones(1, 2)).sum().backward()
        monitor.check()
        opt.step()
    report = monitor.close()
    writer.close()
    return report


def test_the_sink_writes_the_tags_of_records_and_records_decodes_them(tmp_path: Path) -> None:
    report = _write_run(tmp_path)
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert acc.Scalars(records.open_tag("missing_grad"))[-1].value == 1  # one mistake: `unused` (2 tensors)
    assert acc.Scalars(records.GRAD_COVERAGE_TAG)[-1].value == 0.5
    assert f"{records.FINDINGS_TEXT_TAG}/text_summary" in acc.Tags()["tensors"]
    written = records.decode(acc.Tensors(records.REPORT_TAG)[-1].tensor_proto.string_val[0])
    # ... with what `leafwatch report --diff` needs: the folder, no file to edit (the fix is advice) (#47)
    assert written == {"version": records.RECORD_VERSION, **report.to_dict(),
                       "patch": {"root": os.getcwd(), "files": {}, "hunks": []}}
    coverage = records.decode(acc.Tensors(records.coverage_tag(0))[-1].tensor_proto.string_val[0])
    assert coverage["chunk"] == 0
    assert coverage["groups"]["all"]["names"] == ["body.weight", "body.bias", "unused.weight", "unused.bias"]
    assert coverage["groups"]["all"]["missed"] == {"2": [[0, 2]], "3": [[0, 2]]}
    assert (tmp_path / records.LAYOUT_RUN).is_dir()


def test_a_record_of_a_newer_version_is_skipped_by_every_reader(tmp_path: Path) -> None:
    report = _write_run(tmp_path)
    writer = SummaryWriter(str(tmp_path))
    newer = records.encode_report({"step": 99, "findings": []}).replace(
        f'"version": {records.RECORD_VERSION}', f'"version": {records.RECORD_VERSION + 1}')
    writer._get_file_writer().add_summary(tensor_summary(records.REPORT_TAG, newer), 99)
    writer.close()
    assert records.decode(newer) is None
    (run,) = read_reports(str(tmp_path))
    assert run.report.step == report.step == 3  # the latest record this version can read
    assert run.report.names("missing_grad") == {"unused.weight", "unused.bias"}
    for payload in (b"not json", b"[1, 2]", '{"version": "1"}', b"x\x9c broken zlib"):
        assert records.decode(payload) is None


def test_leafwatch_report_names_a_run_in_the_log_dir_itself_by_its_folder(tmp_path: Path) -> None:
    _write_run(tmp_path / "runs" / "lit" / "version_0")
    (run,) = read_reports(str(tmp_path / "runs" / "lit" / "version_0"))
    assert run.run == "version_0"
    assert format_text([run]).startswith("run: version_0\nleafwatch: 1 open of 1 finding(s) at step 3\n"
                                         "  ERROR   missing_grad        unused (since step 1)\n")
    (nested,) = read_reports(str(tmp_path / "runs"))
    assert nested.run == "lit/version_0"


# -- one order ------------------------------------------------------------------------------
def _findings() -> list[Finding]:
    def f(kind: str, name: str, severity: str = "error", status: str = "open") -> Finding:
        return Finding(kind, name, severity, f"{name} is wrong", status=status)

    return [
        f("non_leaf", "temperature"),
        f("missing_grad", "b.weight"),
        f("missing_grad", "head.bias"),
        f("orphan_tensor", "scale"),
        f("device_mismatch", "a.weight", severity="warning"),
        f("frozen_in_optimizer", "backbone.weight", severity="info"),
        f("missing_grad", "experts.1.weight", severity="info", status="intermittent"),
        f("missing_grad", "old.weight", status="resolved"),
        f("missing_grad", "kept.weight", status="ignored"),
    ]


def test_the_tab_sorts_records_in_the_reports_order() -> None:
    expected = [(f.kind, f.name) for f in Report(_findings())]
    # Kinds in their KINDS order, which is not the alphabet's.
    assert expected[:2] == [("non_leaf", "temperature"), ("missing_grad", "b.weight")]
    dicts = [f.to_dict() for f in _findings()]
    random.Random(0).shuffle(dicts)
    served = sorted_findings(dicts)
    assert [(d["kind"], d["name"]) for d in served] == expected
    assert [d["sort_key"] for d in served] == [_flat(f.sort_key()) for f in Report(_findings())]


def test_the_distributed_merge_lists_findings_in_the_reports_order() -> None:
    findings = _findings()
    shuffled = findings[:]
    random.Random(1).shuffle(shuffled)
    merged = merge([findings[::-1], shuffled], step=3)
    assert [(f.kind, f.name) for f in merged] == [(f.kind, f.name) for f in Report(findings)]


def test_the_distributed_merge_keeps_the_finding_that_sorts_first_of_its_ranks() -> None:
    on_rank_0 = Finding("device_mismatch", "w", "info", "seen on rank 0", status="intermittent")
    on_rank_1 = Finding("device_mismatch", "w", "warning", "seen on rank 1", status="open")
    (merged,) = merge([[on_rank_0], [on_rank_1]])
    assert (merged.message, merged.status, merged.ranks) == ("seen on rank 1", "open", (0, 1))

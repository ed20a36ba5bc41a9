"""One finding per mistake: a Report groups its tensors, lists them in natural order, and the
console, the table, the records and ``ignore=`` all speak of the mistake."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import _warm
import torch
from torch import nn

import leafwatch
from leafwatch import Finding, Report
from leafwatch.report.reasons import Written
from leafwatch.sinks.console import NewFindingWarnings
from leafwatch.report.names import compress_names, natural_key
from leafwatch.report.records import decode, encode_report


class _Experts(nn.Module):
    """A ParameterList of 500 entries of which the forward uses 8."""

    def __init__(self, n: int = 500, used: int = 8) -> None:
        super().__init__()
        self.used = used
        self.experts = nn.ParameterList(nn.Parameter(torch.randn(4)) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum((x * self.experts[i]).sum() for i in range(self.used))


def _run_experts(**monitor_options) -> Report:
    model = _Experts()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, verbose=False, **monitor_options) as monitor:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4)).backward()
            monitor.check()
            opt.step()
        return monitor.report


def test_a_partly_used_container_is_one_mistake_listing_its_492_tensors_in_natural_order():
    report = _run_experts()
    (mistake,) = report.findings
    assert (mistake.kind, mistake.name, mistake.severity) == ("missing_grad", "experts", "error")
    assert mistake.names == tuple(f"experts.{i}" for i in range(8, 500))  # experts.9 before experts.10
    assert len(report) == 1 and report.counts()["missing_grad"] == 1
    assert len(report.tensors()) == 492 and report.names("missing_grad") == set(mistake.names)
    assert mistake.message == "each of `experts.{8..499}` requires grad but got no gradient: it does not train."
    assert "each of `experts.{8..499}`" in mistake.cause
    assert len(str(report).splitlines()) < 10


def test_an_ignore_pattern_on_some_members_keeps_the_rest_open_and_on_all_ignores_the_mistake():
    report = _run_experts(ignore={"experts.1*": "kept for later"})
    (mistake,) = report.findings
    ignored = {m.name for m in mistake.members if m.status == "ignored"}
    assert ignored == {n for n in mistake.names if n.startswith("experts.1")}
    assert mistake.status == "open" and report  # the rest stays open
    assert f"{len(ignored)} of them ignored" in str(report) and "kept for later" in str(report)
    everything = _run_experts(ignore={"experts.*": "a bank of spares"})
    (all_ignored,) = everything.findings
    assert all_ignored.status == "ignored" and not everything


def test_a_partly_used_container_prints_under_40_lines_under_leafwatch_run(tmp_path: Path):
    script = tmp_path / "experts.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Experts(nn.Module):
            def __init__(self):
                super().__init__()
                self.experts = nn.ParameterList(nn.Parameter(torch.randn(4)) for _ in range(500))

            def forward(self, x):
                return sum((x * self.experts[i]).sum() for i in range(8))

        model = Experts()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            model(torch.randn(4)).backward()
            opt.step()
    """))
    done = _warm.run([sys.executable, "-m", "leafwatch.cli", "run", str(script)],
                     capture_output=True, text=True, timeout=300)
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) < 40, "\n".join(lines[:60])
    live = [line for line in lines if line.startswith("leafwatch: ERROR missing_grad")]
    assert live == [line for line in live if "`experts` (492 tensors: experts.{8..499})" in line] and len(live) == 1


def test_frozen_layers_kept_in_the_optimizer_are_one_info_finding():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 1))
    for layer in list(model)[:5]:
        layer.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    report = leafwatch.audit(model, opt)
    (frozen,) = report.findings
    assert (frozen.kind, frozen.severity, len(frozen.members)) == ("frozen_in_optimizer", "info", 6)
    assert frozen.names == ("0.bias", "0.weight", "2.bias", "2.weight", "4.bias", "4.weight")


def test_names_sort_naturally_in_reports_and_in_compressed_names():
    names = ["experts.10", "experts.2", "experts.1.w", "head"]
    report = Report([Finding("non_leaf", n, "error", "m") for n in names])
    assert [f.name for f in report] == ["experts.1.w", "experts.2", "experts.10", "head"]
    assert sorted(names, key=natural_key) == [f.name for f in report]
    assert compress_names([f"blocks.{i}.fc{j}.weight" for i in range(4) for j in (1, 2)] + ["embed.bias"]) \
        == "blocks.{0..3}.{fc1,fc2}.weight, embed.bias"


def test_a_report_of_mistakes_round_trips_and_a_version_1_record_is_grouped_when_read():
    per_tensor = [Finding("missing_grad", f"unused.{w}", "error", Written(
        message=f"`unused.{w}` got no gradient.", cause=f"`unused.{w}` never ran.", fix="call it")) for w in ("weight", "bias")]
    report = Report(per_tensor, step=4)
    again = Report.from_dict(decode(encode_report(report.to_dict())))
    assert [(f.kind, f.name, f.names) for f in again] == [("missing_grad", "unused", ("unused.bias", "unused.weight"))]
    assert decode(encode_report(report.to_dict()))["version"] == 3
    version_1 = {"version": 1, "step": 4, "findings": [f.to_dict() | {"members": None} for f in per_tensor]}
    for f in version_1["findings"]:
        del f["members"]
    old = Report.from_dict(decode(__import__("json").dumps(version_1)))
    assert [(f.name, f.names) for f in old] == [("unused", ("unused.bias", "unused.weight"))]
    # Made by hand (no reason class): the words are the first tensor's, as they were written.
    assert (old.findings[0].message, old.findings[0].cause) == ("`unused.bias` got no gradient.", "`unused.bias` never ran.")


def test_one_mistake_is_one_console_warning_however_many_tensors_it_lists():
    model = _Experts(n=40, used=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lines: list[str] = []
    sink = NewFindingWarnings(lines.append)
    with leafwatch.Monitor(model, opt, verbose=False, sinks=[sink]) as monitor:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4)).backward()
            monitor.check()
            opt.step()
    assert len(lines) == 1 and "`experts` (38 tensors: experts.{2..39})" in lines[0]


def test_the_console_warns_at_the_check_where_a_mistake_appears_and_never_again():
    model = _Experts(n=12, used=10)  # experts.10 and .11 never used
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lines: list[str] = []
    counts = []
    with leafwatch.Monitor(model, opt, verbose=False, check_values_every_n_steps=1,
                           sinks=[NewFindingWarnings(lines.append)]) as monitor:
        for step in range(1, 9):
            opt.zero_grad()
            model(torch.randn(4)).backward()
            if step == 5:
                model.experts[0].grad[1] = float("nan")
            monitor.check()  # the same report between changes: the console has nothing new to say
            opt.step()
            counts.append(len(lines))
    assert counts == [1, 1, 1, 1, 2, 2, 2, 2]
    assert "`experts` (2 tensors: experts.{10,11})" in lines[0] and "experts.0" in lines[1]



class _Branch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer, self.branch, self.use_branch = nn.Linear(2, 2), nn.Linear(2, 2), True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch(self.layer(x)) if self.use_branch else self.layer(x)


def test_the_console_of_every_status_waits_for_the_cause_of_an_intermittent_miss_being_traced():
    model = _Branch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lines: list[str] = []
    counts, observed = [], []
    with leafwatch.Monitor(model, opt, verbose=False, sinks=[NewFindingWarnings(lines.append, every_status=True)]) as monitor:
        for step in range(1, 5):
            model.use_branch = step < 3  # intermittent from step 3: its cause is traced at step 3, known at step 4
            opt.zero_grad()
            model(torch.randn(3, 2)).sum().backward()
            observed.append({f.reason.observed for f in monitor.check().tensors("missing_grad")})
            opt.step()
            counts.append(len(lines))
    assert observed == [set(), set(), {"pending"}, {"never_ran"}] and counts == [0, 0, 0, 1]
    assert "INFO missing_grad `branch`" in lines[0] and "call `branch` in forward()" in lines[0], lines


_DEEP = textwrap.dedent("""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, h):
            return h + self.fc2(torch.relu(self.fc1(h)))

    class Deep(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(8, 16)
            self.blocks = nn.ModuleList(Block() for _ in range(12))
            self.head = nn.Linear(16, 1)

        def forward(self, x):
            h = self.embed(x)
            for i, block in enumerate(self.blocks):
                h = block(h)
                if i == 3:
                    h = h.detach()  # the cut
            return self.head(h)

    model = Deep()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(4):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
""")


def test_one_cut_in_a_12_block_model_is_one_live_line_naming_the_line_of_the_cut(tmp_path: Path):
    script = tmp_path / "deep.py"
    script.write_text(_DEEP)
    line = next(i for i, text in enumerate(_DEEP.splitlines(), 1) if "# the cut" in text)
    done = _warm.run([sys.executable, "-m", "leafwatch.cli", "run", str(script)],
                     capture_output=True, text=True, timeout=300)
    live = [text for text in done.stderr.split("leafwatch: summary")[0].splitlines() if text.startswith("leafwatch:")]
    assert len(live) <= 2, done.stderr
    # Named by its tensors (no module holds them all but the model), the cut said as where it is (#52 item 5).
    assert live[0].startswith("leafwatch: ERROR missing_grad `blocks.{0..3}.{fc1,fc2}.{bias,weight}, embed.{bias,weight}` "
                              f"(18 tensors), cut by `.detach()` at deep.py:{line}, at step "), live
    assert f"remove the `.detach()` at deep.py:{line}" in live[0]
    assert 'ignore=["blocks.0.*", "blocks.1.*", "blocks.2.*", "blocks.3.*", "embed.*"]' in live[0]

"""The Leafwatch tab rendered by a real headless Chromium from a real TensorBoard server.

Set ``LEAFWATCH_UPDATE_SCREENSHOT=1`` to refresh ``docs/leafwatch-tab.png`` from the screenshot.
"""

from __future__ import annotations

import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from _browser import DevTools, tab_screenshot
from _requirements import find_browser, require_browser
from _tensorboard_runs import (
    BUGGY_CUT,
    get_json,
    tensorboard_server,
    wait_for,
    write_buggy_run,
    write_gan_run,
    write_large_run,
    write_mixed_run,
)

CHROMIUM = find_browser()
# The module-scoped runs, TensorBoard server and browser are built once: under pytest-xdist
# (--dist loadgroup) these tests share a worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dashboard_browser")]


@pytest.fixture(scope="module", autouse=True)
def _browser() -> str:
    """Without a browser: skip locally, fail in CI (tests/_requirements.py)."""
    return require_browser()


STEPS = 60
ROUTED_MISSED = ", ".join(f"{s}\u2013{s + 1}" for s in range(1, STEPS, 3))  # the second expert runs every third step


#: The runs in the order they are written: the newest, `large`, has no finding; the newest with open
#: errors, `patched`, is neither the first by name nor the newest.
WRITTEN = ["buggy", "gan", "mixed", "patched", "large"]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("leafwatch_logs")
    write_buggy_run(root / "buggy", steps=STEPS)
    write_gan_run(root / "gan")
    write_mixed_run(root / "mixed")
    _write_patched_run(root / "patched", tmp_path_factory.mktemp("patched_source"))
    write_large_run(root / "large")
    return root


def _write_patched_run(log_dir: Path, scratch: Path) -> None:
    """The mixed run (trained in ``scratch``) as its sink recorded it: its report record carries the
    hunk of each placed code fix (``"patch"``), written with its coverage records by one writer (one
    event file: TensorBoard drops the records of a second file whose steps go back)."""
    import json
    import zlib

    from torch.utils.tensorboard import SummaryWriter

    from leafwatch.report import records
    from leafwatch.sinks.tensorboard import tensor_summary

    write_mixed_run(scratch)
    acc = _accumulator(scratch)
    writer = SummaryWriter(str(log_dir))
    for tag in acc.Tags()["tensors"]:
        last = acc.Tensors(tag)[-1]
        if records.is_coverage_tag(tag):
            assert json.loads(zlib.decompress(last.tensor_proto.string_val[0]))["in_no_optimizer"]
        if records.is_coverage_tag(tag) or tag == records.REPORT_TAG:
            writer._get_file_writer().add_summary(tensor_summary(tag, last.tensor_proto.string_val[0]), last.step)
    writer.close()


def _accumulator(log_dir: Path) -> Any:
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


def _recorded_hunks(log_dir: Path) -> dict[str, str]:
    """Finding name -> the hunk its run's report record carries."""
    from leafwatch.report import records

    record = records.decode(_accumulator(log_dir).Tensors(records.REPORT_TAG)[-1].tensor_proto.string_val[0])
    return {h["name"]: h["diff"] for h in record["patch"]["hunks"]}


@pytest.fixture(scope="module")
def server(logs: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    with tensorboard_server(logs, tmp_path_factory.mktemp("tensorboard")) as url:
        wait_for(lambda: len(get_json(f"{url}/data/plugin/leafwatch/runs")["runs"]) == 5, 120, "runs not loaded")
        yield url


@pytest.fixture(scope="module")
def tab_url(server: str) -> str:
    """The page TensorBoard loads in the tab's iframe."""
    return f"{server}/data/plugin_entry.html?name=leafwatch"


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=15000", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=True)


class _Elements(HTMLParser):
    """Collects the attributes of every element, and the page's text."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def having(self, tag: str, css_class: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and css_class in a.get("class", "").split()]


@pytest.fixture(scope="module")
def page(tab_url: str, tmp_path_factory: pytest.TempPathFactory) -> _Elements:
    result = _chromium(tmp_path_factory.mktemp("chromium"), "--dump-dom", f"{tab_url}&run=buggy")
    parsed = _Elements()
    parsed.feed(result.stdout)
    return parsed


def test_tab_renders_the_findings_table_open_errors_first(page: _Elements) -> None:
    rows = page.having("tr", "finding")
    names = [r["data-name"] for r in rows]
    # One row per mistake: the cut that detaches the encoder, the unused layer, the routed expert.
    assert names == [BUGGY_CUT, "unused", "experts.1"]  # intermittent after the open errors
    assert {r["data-kind"] for r in rows} == {"missing_grad"}
    # Each lists its tensors, collapsed under "N tensors".
    assert len(page.having("details", "members")) == 3
    text = " ".join(page.text)
    for tensor in ("encoder.0.weight", "encoder.2.bias", "unused.weight", "experts.1.bias"):
        assert tensor in page.text
    assert "never ran" in text and "call " in text
    assert "Could not load" not in text


def test_tab_renders_the_coverage_grid_with_missed_steps(page: _Elements) -> None:
    rows = {r["data-name"]: r for r in page.having("div", "row")}
    # Modules with a miss open down to their tensors; healthy modules stay folded.
    assert {"encoder", "encoder.0", "encoder.0.weight", "unused.weight", "experts", "experts.1.weight", "head"} <= set(rows)
    assert "head.weight" not in rows
    assert rows["unused.weight"]["data-missed-steps"] == f"1\u2013{STEPS}"
    assert rows["unused.weight"]["data-missed"] == str(STEPS)
    assert rows["experts.1.weight"]["data-missed-steps"] == ROUTED_MISSED
    assert rows["head"]["data-missed"] == "0"
    assert rows["encoder"]["data-missed"] == str(4 * STEPS)  # a module row sums its tensors
    assert len(page.having("canvas", "cells")) == len(rows)


def test_tab_renders_a_large_grid_in_at_most_200_columns_drawing_only_visible_rows(tab_url: str, tmp_path: Path) -> None:
    result = _chromium(tmp_path, "--window-size=1400,900", "--dump-dom", f"{tab_url}&run=large")
    page = _Elements()
    page.feed(result.stdout)
    text = " ".join(page.text)
    assert "2000 tensors \u00d7 steps 1\u20132000 in 200 columns of 10 steps" in text
    rows = {r["data-name"]: r for r in page.having("div", "row")}
    assert rows["blocks.3.norm.bias"]["data-missed-steps"] == "1\u20132000"
    assert rows["blocks.7.weight"]["data-missed"] == "1000"
    assert rows["blocks.7.weight"]["data-missed-steps"].startswith("1, 3, 5, ")
    assert rows["blocks.7.weight"]["data-missed-steps"].endswith(", \u2026")  # the exact steps are capped
    assert "blocks.0" in rows and "blocks.0.weight" not in rows  # healthy modules stay folded
    assert len(rows) < 100  # 500 module rows, only those in view are drawn


def test_tensorboard_app_shows_the_leafwatch_tab_in_an_iframe(server: str, tmp_path: Path) -> None:
    result = _chromium(tmp_path, "--dump-dom", f"{server}/#leafwatch")
    page = _Elements()
    page.feed(result.stdout)
    assert any(a.get("data-plugin-id") == "leafwatch" for _, a in page.elements)
    assert [a["src"] for t, a in page.elements if t == "iframe"] == ["data/plugin_entry.html?name=leafwatch"]


_INTERACT = """(async () => {
  const until = async (f) => {
    for (let i = 0; i < 300; i++) { const v = f(); if (v) return v; await new Promise((r) => setTimeout(r, 100)); }
    throw new Error("timed out waiting for the tab");
  };
  const rows = () => [...document.querySelectorAll(".row")].map((r) => r.dataset.name);
  const findings = () => [...document.querySelectorAll("tr.finding")].map((r) => r.dataset.name);
  const choose = (id, value) => { const s = document.getElementById(id); s.value = value; s.dispatchEvent(new Event("change")); };
  await until(() => document.querySelector('.row[data-name="unused.weight"]'));
  const out = { findings: findings() };
  const members = document.querySelector('tr.finding[data-name="encoder"] details.members');
  out.collapsed = !members.open && !members.querySelector("ul").checkVisibility();
  members.querySelector("summary").click();
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  out.opened = members.open && members.querySelector("ul").checkVisibility();
  out.members = [...members.querySelectorAll("li code")].map((c) => c.textContent);
  document.getElementById("lw-search").value = "encoder.2.b";
  document.getElementById("lw-search").dispatchEvent(new Event("input"));
  out.memberSearch = findings();
  document.getElementById("lw-search").value = "";
  document.getElementById("lw-search").dispatchEvent(new Event("input"));
  choose("lw-severity", "info");
  out.info = findings();
  choose("lw-severity", "__all__");
  document.getElementById("lw-search").value = "unused";
  document.getElementById("lw-search").dispatchEvent(new Event("input"));
  out.search = findings();
  document.querySelector('.row[data-name="encoder"] .toggle').click();
  out.folded = rows();
  document.getElementById("lw-only-missed").click();
  out.onlyMissed = rows();
  choose("lw-run", "gan");
  await until(() => document.querySelector('.row[data-name="generator_unused.weight"]'));
  out.gan = rows();
  out.ganFindings = findings();
  return out;
})()"""


def test_tab_filters_and_folds_in_a_live_browser(tab_url: str, tmp_path: Path) -> None:
    browser = DevTools(CHROMIUM, tmp_path / "profile")
    try:
        browser.open(f"{tab_url}&run=buggy")
        out = browser.evaluate(_INTERACT)
    finally:
        browser.close()
    assert out["findings"] == [BUGGY_CUT, "unused", "experts.1"]  # one row per mistake
    assert (out["collapsed"], out["opened"]) == (True, True), out  # its tensors folded until asked for
    assert out["members"] == ["encoder.0.bias", "encoder.0.weight", "encoder.2.bias", "encoder.2.weight"]
    assert out["memberSearch"] == [BUGGY_CUT]  # the name filter finds a mistake by one of its tensors
    assert out["info"] == ["experts.1"]  # the severity filter
    assert out["search"] == ["unused"]  # the name filter
    assert "encoder" in out["folded"] and "encoder.0.weight" not in out["folded"]  # folding a module
    assert "head" not in out["onlyMissed"] and "unused.weight" in out["onlyMissed"]
    assert out["gan"] == ["generator_unused", "generator_unused.weight", "generator_unused.bias"]
    assert out["ganFindings"] == ["generator_unused"]  # the name filter stays


_PICKER = """(async () => {
  const until = async (f) => {
    for (let i = 0; i < 300; i++) { const v = f(); if (v) return v; await new Promise((r) => setTimeout(r, 100)); }
    throw new Error("timed out waiting for the tab");
  };
  const rows = () => [...document.querySelectorAll(".row")].map((r) =>
    [r.dataset.run ?? null, r.dataset.kind, r.dataset.name, r.dataset.inNoOptimizer ?? null, r.querySelector(".stat").textContent]);
  const note = () => document.getElementById("lw-coverage-note").textContent;
  const choose = (id, value) => { const s = document.getElementById(id); s.value = value; s.dispatchEvent(new Event("change")); };
  const overview = () => [...document.querySelectorAll("#lw-runs tr.run-row")].map((r) =>
    [r.dataset.run, +r.dataset.errors, +r.dataset.warnings, r.getAttribute("aria-current")]);
  const findings = () => [...document.querySelectorAll("tr.finding")].map((r) => r.dataset.name);
  await until(() => document.querySelector('.row[data-name="loss_weight"]'));
  const out = { picked: document.getElementById("lw-run").value, overview: overview(), openedOn: findings(),
                overviewShown: document.getElementById("lw-runs").checkVisibility() };
  document.querySelector('#lw-runs tr.run-row[data-run="buggy"] button.pick').click();  // the overview picks a run
  await until(() => document.querySelector('.row[data-name="unused.weight"]') && !document.querySelector(".row[data-in-no-optimizer]"));
  out.pickedByOverview = document.getElementById("lw-run").value;
  out.overviewAfterPick = overview();
  out.first = rows();
  out.firstFindings = findings();
  choose("lw-run", "mixed");
  await until(() => document.querySelector(".row[data-in-no-optimizer]"));
  out.mixed = rows();
  out.mixedNote = note();
  out.mixedFindings = [...document.querySelectorAll("tr.finding")].map((r) => [r.dataset.kind, r.dataset.name]);
  const pixel = document.querySelector('.row[data-name="loss_weight"] canvas').getContext("2d").getImageData(1, 1, 1, 1).data;
  out.unheldPixel = [pixel[0], pixel[1], pixel[2]];
  const probe = document.createElement("span");
  probe.style.color = "var(--unheld)";
  document.body.append(probe);
  out.unheldColour = getComputedStyle(probe).color;
  choose("lw-run", "__all__");
  await until(() => document.querySelector('.row[data-kind="run"]'));
  out.allNote = note();
  out.allFirst = rows();
  document.querySelector('.row[data-kind="run"][data-name="large"] .toggle').click();  // its 2000 tensors
  out.all = rows();
  const body = document.querySelector(".grid-body");
  body.scrollTop = body.scrollHeight;  // the rows below the view are drawn once scrolled to
  body.dispatchEvent(new Event("scroll"));
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  for (const row of rows()) if (!out.all.some((seen) => JSON.stringify(seen) === JSON.stringify(row))) out.all.push(row);
  choose("lw-run", "gan");
  await until(() => document.querySelector('.row[data-name="generator_unused.weight"]') && !document.querySelector(".row[data-run]"));
  out.gan = rows();
  return out;
})()"""


def test_the_tab_opens_on_the_newest_run_with_open_errors_and_the_grid_follows_the_picker(
        logs: Path, tab_url: str, tmp_path: Path) -> None:
    from leafwatch.report.reader import read_reports

    browser = DevTools(CHROMIUM, tmp_path / "profile")
    try:
        browser.open(tab_url)
        out = browser.evaluate(_PICKER)
    finally:
        browser.close()
    # The overview: every run, newest first, with the open errors and warnings of its latest report, as
    # `leafwatch report` counts them; the tab opens on the newest run with open errors (not the newest run,
    # which is clean, nor the first by name).
    expected = []
    for run in reversed(WRITTEN):
        (read,) = read_reports(str(logs / run))
        errors, warnings = (len([f for f in read.report.open if f.severity == s]) for s in ("error", "warning"))
        expected.append([run, errors, warnings, "true" if run == "patched" else None])
    assert out["overviewShown"] and out["overview"] == expected, out["overview"]
    assert [row[1] for row in expected] == [0, 4, 4, 1, 2]  # (the counts the runs were written to give)
    assert out["picked"] == "patched"
    (patched,) = read_reports(str(logs / "patched"))
    assert out["openedOn"] == [f.name for f in patched.report]  # the findings table of that run
    # A click on a run of the overview picks it: the picker, the findings, the grid follow.
    assert out["pickedByOverview"] == "buggy"
    assert [(run, current) for run, _, _, current in out["overviewAfterPick"]] == [
        (run, "true" if run == "buggy" else None) for run in reversed(WRITTEN)]
    assert out["firstFindings"] == [BUGGY_CUT, "unused", "experts.1"]
    assert {run for run, *_ in out["first"]} == {None} and not any(row[3] for row in out["first"])
    # The mixed run: its two tensors that no optimizer holds form a group of their own, after the
    # others, marked as such, next to the findings that name them.
    assert [row[1:] for row in out["mixed"][-3:]] == [
        ["unheld", "in no optimizer", "true", "no optimizer"],
        ["tensor", "loss_weight", "true", "no optimizer"],
        ["tensor", "scale", "true", "no optimizer"]]
    assert not any(row[3] for row in out["mixed"][:-3])
    assert ["not_in_optimizer", "loss_weight"] in out["mixedFindings"] and ["orphan_tensor", "scale"] in out["mixedFindings"]
    assert "8 tensors \u00d7 steps 1\u20133" in out["mixedNote"] and "2 in no optimizer" in out["mixedNote"]
    unheld = [int(x) for x in out["unheldColour"][out["unheldColour"].index("(") + 1:-1].split(",")[:3]]
    assert all(abs(a - b) <= 2 for a, b in zip(out["unheldPixel"], unheld)), out  # drawn in its own colour
    # All runs: one row group per run, every row naming its run, on one step axis.
    assert ["large", "run", "large", None, "2 missed"] in out["allFirst"]  # each run opens the way to its misses
    assert ["large", "module", "blocks.3", None, "1 missed"] in out["allFirst"]
    assert [row[2] for row in out["all"] if row[1] == "run"] == ["buggy", "gan", "large", "mixed", "patched"]
    assert all(row[0] for row in out["all"])
    assert [row[0] for row in out["all"] if row[2] == "loss_weight"] == ["mixed", "patched"]
    assert {row[0] for row in out["all"] if row[2] == "unused.weight"} == {"buggy", "mixed", "patched"}
    assert "of 5 runs \u00d7 steps 1\u20132000" in out["allNote"]
    # Picking one run again shows that run alone.
    assert {run for run, *_ in out["gan"]} == {None}
    assert [None, "tensor", "generator_unused.weight", None, "missed 5/5"] in out["gan"]
    assert {row[2] for row in out["gan"]} >= {"generator", "discriminator"} and "unused.weight" not in {row[2] for row in out["gan"]}


_FIXES = """(async () => {
  const until = async (f) => {
    for (let i = 0; i < 300; i++) { const v = f(); if (v) return v; await new Promise((r) => setTimeout(r, 100)); }
    throw new Error("timed out waiting for the tab");
  };
  await until(() => document.querySelector("tr.finding"));
  const snippet = (r) => {
    const s = r.querySelector(".fix-snippet");
    if (!s) return null;
    const place = s.querySelector(".place");
    return { place: place.textContent, path: place.title, code: s.querySelector("pre").textContent,
             hunk: s.classList.contains("hunk") };
  };
  const out = { fixes: Object.fromEntries([...document.querySelectorAll("tr.finding")].map((r) => [r.dataset.name, snippet(r)])) };
  for (const name of ["loss_weight", "scale"]) {
    const button = document.querySelector(`tr.finding[data-name="${name}"] .fix-snippet .copy`);
    button.click();
    await until(() => button.dataset.copied);
    out[name] = { copied: button.dataset.copied, label: button.textContent, clipboard: await navigator.clipboard.readText() };
  }
  return out;
})()"""


def test_each_code_fix_shows_its_hunk_or_its_code_with_a_copy_button(
        logs: Path, server: str, tab_url: str, tmp_path: Path) -> None:
    from leafwatch.report.reader import read_reports

    (cli,) = read_reports(str(logs / "patched"))
    remedies = {f.name: f.remedy for f in cli.report}
    browser = DevTools(CHROMIUM, tmp_path / "profile")
    try:
        browser.call("Browser.grantPermissions", {"origin": server,
                                                  "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
        browser.open(f"{tab_url}&run=patched")
        browser.call("Emulation.setFocusEmulationEnabled", {"enabled": True})
        out = browser.evaluate(_FIXES)
    finally:
        browser.close()
    fixes = out["fixes"]
    # The hunk the run recorded for each placed code fix, as a patch of the user's file.
    hunks = _recorded_hunks(logs / "patched")
    assert set(hunks) == {"loss_weight", "scale"}
    assert '+    optimizer.add_param_group({"params": [model.loss_weight]})\n' in hunks["loss_weight"]
    for name in ("loss_weight", "scale"):
        assert remedies[name].applicability == "code" and remedies[name].edit is not None
        assert hunks[name].startswith("--- a/tests/_tensorboard_runs.py\n+++ b/tests/_tensorboard_runs.py\n@@ -")
        assert fixes[name] == {"place": "patch", "path": remedies[name].edit.path, "code": hunks[name], "hunk": True}
    # A code fix with no place (the watched non-leaf is made a leaf and handed to the optimizer: the two
    # statements stand at other indentations, so no one edit places both): the code, to paste.
    temperature = remedies["temperature"]
    assert temperature.applicability == "code" and temperature.edit is None
    assert fixes["temperature"] == {"place": "paste", "path": "", "code": temperature.code + "\n", "hunk": False}
    # Advice has no code to copy.
    assert {name for name, fix in fixes.items() if fix is None} == {
        name for name, remedy in remedies.items() if remedy is None or remedy.applicability == "words"} >= {"unused", "kept"}
    # The button copies what it shows.
    assert out["loss_weight"] == {"copied": "true", "label": "Copied", "clipboard": hunks["loss_weight"]}
    assert out["scale"] == {"copied": "true", "label": "Copied", "clipboard": hunks["scale"]}


_TABLE = """(async () => {
  for (let i = 0; i < 300 && !document.querySelector("tr.finding"); i++) await new Promise((r) => setTimeout(r, 100));
  const rows = [...document.querySelectorAll("tr.finding")];
  const wrap = document.getElementById("lw-findings");
  const last = rows[rows.length - 1];
  const box = wrap.getBoundingClientRect();
  const row = last.getBoundingClientRect();
  const out = {
    order: rows.map((r) => [r.dataset.kind, r.dataset.name]),
    steps: Object.fromEntries(rows.map((r) => [r.dataset.name, r.querySelector("td.steps").textContent])),
    causes: Object.fromEntries(rows.map((r) => [r.dataset.name, r.querySelector("td.cause").textContent])),
    marks: Object.fromEntries(rows.map((r) => [r.dataset.name, r.querySelector("td.fix .fix-mark")?.textContent ?? null])),
    lastInsideItsBox: row.top >= box.top && row.bottom <= box.bottom + 1,
    boxScrolls: wrap.scrollHeight > wrap.clientHeight + 1,
  };
  last.scrollIntoView({ block: "end" });
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const seen = last.getBoundingClientRect();
  const hit = document.elementFromPoint(seen.left + 20, seen.top + seen.height / 2);
  out.lastRowOnTop = !!hit && last.contains(hit);
  out.lastInViewport = seen.top >= 0 && seen.bottom <= window.innerHeight + 1;
  return out;
})()"""


def _table(url: str, profile: Path) -> dict:
    browser = DevTools(CHROMIUM, profile)
    try:
        browser.open(url)
        return browser.evaluate(_TABLE)
    finally:
        browser.close()


def test_the_findings_tables_last_row_is_visible(tab_url: str, tmp_path: Path) -> None:
    # Findings with long causes, where the old inner scroll box cut the last row off while the
    # page below stood empty (three mistakes of eight tensors).
    out = _table(f"{tab_url}&run=buggy", tmp_path / "profile")
    assert len(out["order"]) == 3
    assert out["lastInsideItsBox"] and not out["boxScrolls"]  # the table grows with the page
    assert out["lastRowOnTop"] and out["lastInViewport"]  # scrolled to, nothing covers it


def test_the_tab_lists_findings_in_the_clis_order_with_at_start_and_ignore_reasons(
        logs: Path, tab_url: str, tmp_path: Path) -> None:
    from leafwatch.report.reader import read_reports

    (cli,) = read_reports(str(logs / "mixed"))
    cli_order = [[f.kind, f.name] for f in cli.report]
    # Kinds in Finding.sort_key order (non_leaf first), not alphabetical (missing_grad first).
    assert cli_order[:2] == [["non_leaf", "temperature"], ["missing_grad", "unused"]]
    out = _table(f"{tab_url}&run=mixed", tmp_path / "profile")
    assert out["order"] == cli_order
    # Found by the structure scan before the first step: "at start", not "0".
    # (held at the scan until the first check confirms them: "at start" or "start–1", never "0")
    # (loss_weight: its gradient first seen at step 1, its value unchanged at step 2: the gradient rule)
    assert out["steps"]["loss_weight"] == "start\u20132"
    assert out["steps"]["scale"] in ("at start", "start\u20131")
    assert out["steps"]["unused"] == "1\u20133"
    assert out["causes"]["kept"].startswith("ignored: kept for later")
    # Each fix shows what it is, as the console says it ("fix (code):" / "fix (advice):").
    marks = {f.name: {"code": "code", "words": "advice"}[f.remedy.applicability] for f in cli.report if f.fix}
    assert out["marks"] == {name: marks.get(name) for name in out["marks"]}
    assert set(marks.values()) == {"code", "advice"}


def test_tab_screenshot_shows_the_findings_table_with_its_error_badges(logs: Path, server: str, tmp_path: Path) -> None:
    from leafwatch.report.reader import read_reports

    # TensorBoard's own page, which gives the tab no run: it opens on the newest run with open errors.
    seen, data, shares = tab_screenshot(CHROMIUM, server, tmp_path / "profile", "loss_weight")
    (patched,) = read_reports(str(logs / "patched"))
    errors = [f.name for f in patched.report.at_least("error")]
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1400, 900)
    assert seen["ratio"] == 1 and seen["rows"] == len(patched.report) and seen["text"] is False
    # The DOM at the moment of the picture: the table's open errors are in view, under the run overview...
    assert len(errors) == 4 and len(seen["badges"]) >= 2, seen
    assert {b["text"] for b in seen["badges"]} == {"error"}
    assert [b["row"] for b in seen["badges"]] == errors[:len(seen["badges"])], (seen, errors)
    # ...and the picture shows them: each badge's pixels are the error colour, where the DOM puts it.
    assert min(shares) > 0.5, list(zip([b["row"] for b in seen["badges"]], shares))


def test_a_run_with_nothing_to_check_says_so_in_the_tab_not_no_findings(tmp_path: Path) -> None:
    """A frozen model and nothing watched: the tab says what the console says ("nothing to
    check"), never "no findings: every checked tensor trains"."""
    import warnings

    import torch
    from torch.utils.tensorboard import SummaryWriter

    import leafwatch

    model = torch.nn.Linear(2, 1).requires_grad_(False)
    writer = SummaryWriter(str(tmp_path / "logs" / "idle"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)  # the "nothing to check" warning
        with leafwatch.Monitor(model, writer=writer) as monitor:
            model(torch.ones(1, 2))
            assert monitor.check().nothing_to_check
    writer.close()
    (tmp_path / "tensorboard").mkdir()
    with tensorboard_server(tmp_path / "logs", tmp_path / "tensorboard") as url:
        wait_for(lambda: get_json(f"{url}/data/plugin/leafwatch/runs")["runs"], 120, "run not loaded")
        result = _chromium(tmp_path / "chromium", "--dump-dom", f"{url}/data/plugin_entry.html?name=leafwatch")
    parsed = _Elements()
    parsed.feed(result.stdout)
    text = " ".join("".join(parsed.text).split())
    assert "Nothing to check: no tensor requires grad and nothing is watched." in text
    assert "nothing to check (no tensor requires grad and nothing is watched)" in text
    assert "No findings" not in text and "no findings" not in text

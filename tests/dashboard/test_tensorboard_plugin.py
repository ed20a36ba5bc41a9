"""The Leafwatch TensorBoard plugin: its grid binning, and its routes on a real TensorBoard server."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _tensorboard_runs import (
    BUGGY_CUT,
    BUGGY_CUT_AT,
    REPO_ROOT,
    get_json,
    tensorboard_server,
    wait_for,
    write_buggy_run,
    write_gan_run,
    write_plain_run,
)

from leafwatch.tensorboard_plugin import coverage_grid

PLUGIN_DIR = REPO_ROOT / "leafwatch" / "tensorboard_plugin"
DETACHED = {"encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias"}
UNUSED = {"unused.weight", "unused.bias"}
ROUTED = {"experts.1.weight", "experts.1.bias"}
ROUTED_MISSED = [[1, 2], [4, 5], [7, 8], [10, 11]]  # the second expert runs every third step

# The module-scoped TensorBoard servers start once: under pytest-xdist (--dist loadgroup) these
# tests share a worker.
pytestmark = pytest.mark.xdist_group("tensorboard_plugin")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("leafwatch_logs")
    write_buggy_run(root / "buggy")
    write_gan_run(root / "gan")
    with tensorboard_server(root, tmp_path_factory.mktemp("tensorboard")) as url:
        wait_for(lambda: {r["run"] for r in get_json(f"{url}/data/plugin/leafwatch/runs")["runs"]} == {"buggy", "gan"},
                 120, "runs not loaded")
        yield url


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("plain_logs")
    write_plain_run(root / "run")
    with tensorboard_server(root, tmp_path_factory.mktemp("tensorboard_plain")) as url:
        wait_for(lambda: get_json(f"{url}/data/plugins_listing")["scalars"]["enabled"], 120, "scalars not loaded")
        yield url


def _rows(grid: dict) -> dict[str, dict]:
    return {row["name"]: row for row in grid["rows"]}


# -- coverage_grid, the binning behind the grid ----------------------------------------------
def test_coverage_grid_maps_missed_positions_onto_steps_of_an_alternating_group() -> None:
    # The group was checked at odd steps only; its 2nd and 3rd checks (steps 3 and 5) missed.
    record = {"version": 1, "chunk": 0, "groups": {"0": {
        "names": ["g.weight"], "steps": [[1, 1], [3, 3], [5, 5], [7, 7]], "missed": {"0": [[1, 2]]}}}}
    grid = coverage_grid([record], bins=10)
    row = _rows(grid)["g.weight"]
    assert row["missed_steps"] == [[3, 3], [5, 5]]
    assert grid["columns"] == [[s, s] for s in range(1, 8)]
    assert grid["profiles"][row["profile"]] == [1, 0, 1, 0, 1, 0, 1]  # even steps: not checked
    assert row["missed_cols"] == [[2, 1], [4, 1]]
    assert (row["checks"], row["missed"]) == (4, 2)


def test_coverage_grid_bins_long_runs_into_at_most_the_columns_asked() -> None:
    records = [
        {"version": 1, "chunk": c, "groups": {"all": {
            "names": ["a", "b"], "steps": [[c * 1000 + 1, c * 1000 + 1000]],
            "missed": {"1": [[0, 499]]} if c == 1 else {}}}}
        for c in range(3)
    ]
    grid = coverage_grid(records, bins=200)
    assert len(grid["columns"]) == 200
    assert grid["width"] == 15
    assert (grid["first_step"], grid["last_step"]) == (1, 3000)
    rows = _rows(grid)
    assert list(rows) == ["a", "b"]
    assert rows["a"]["missed"] == 0
    assert rows["b"]["missed_steps"] == [[1001, 1500]]
    assert rows["b"]["missed"] == 500
    assert sum(n for _, n in rows["b"]["missed_cols"]) == 500
    assert grid["chunks"] == [0, 1, 2]


def test_coverage_grid_keeps_only_the_steps_of_the_window() -> None:
    record = {"version": 1, "chunk": 0, "groups": {"all": {
        "names": ["x"], "steps": [[1, 100]], "missed": {"0": [[9, 19]]}}}}
    grid = coverage_grid([record], bins=200, first=15, last=30)
    assert (grid["first_step"], grid["last_step"]) == (15, 30)
    assert _rows(grid)["x"]["missed_steps"] == [[15, 20]]
    assert _rows(grid)["x"]["checks"] == 16


@pytest.mark.parametrize(("bins",), [(0,), (-3,), (True,), ("200",)])
def test_coverage_grid_rejects_bad_bins(bins: object) -> None:
    with pytest.raises(ValueError, match="`bins` must be an int >= 1"):
        coverage_grid([], bins=bins)  # type: ignore[arg-type]


def test_plugin_modules_import_only_tensorboard_werkzeug_the_standard_library_and_the_vocabulary() -> None:
    # The tab shares the record format and the order of findings with the writer and the CLI
    # (leafwatch.report.records, leafwatch.report.findings) and the words of the console
    # (leafwatch.report.format: "nothing to check"): torch-free modules, and nothing else of leafwatch.
    allowed = {"tensorboard", "werkzeug", "__future__"} | set(sys.stdlib_module_names)
    vocabulary = {"report.records", "report.findings", "report.format"}
    for path in sorted(PLUGIN_DIR.glob("*.py")):
        roots, ours = set(), set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots.add(node.module.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.level == 2:
                ours.add(node.module or "")
        assert roots <= allowed, f"{path.name} imports {sorted(roots - allowed)}"
        assert ours <= vocabulary, f"{path.name} imports leafwatch's {sorted(ours - vocabulary)}"


def test_loading_the_plugin_entry_point_imports_neither_torch_nor_the_rest_of_leafwatch() -> None:
    # TensorBoard loads `leafwatch.tensorboard_plugin:LeafwatchPlugin` at start-up, through the
    # `leafwatch` package: a slow or broken torch must not reach TensorBoard.
    code = (
        "import sys; from leafwatch.tensorboard_plugin import LeafwatchPlugin; "
        "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') "
        "or m in ('leafwatch.monitor', 'leafwatch.detectors.constructors', 'leafwatch.integrations.lightning')); print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(PLUGIN_DIR.parent.parent)})
    assert out.stdout.strip() == "[]"


def test_static_files_make_no_external_requests() -> None:
    for name in ("index.js", "style.css"):
        text = (PLUGIN_DIR / "static" / name).read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name
        assert "@import" not in text, name


# -- the real server -----------------------------------------------------------------------
@pytest.mark.slow
def test_plugins_listing_enables_the_leafwatch_tab(server: str) -> None:
    listing = get_json(f"{server}/data/plugins_listing")
    leafwatch = listing["leafwatch"]
    assert leafwatch["enabled"] is True
    assert leafwatch["tab_name"] == "Leafwatch"
    assert leafwatch["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/leafwatch/index.js"}


@pytest.mark.slow
def test_plugin_entry_page_loads_the_tab_module(server: str) -> None:
    with urllib.request.urlopen(f"{server}/data/plugin_entry.html?name=leafwatch", timeout=30) as response:
        page = response.read().decode()
    assert '<base href="plugin/leafwatch/" />' in page
    assert 'import("./index.js")' in page
    with urllib.request.urlopen(f"{server}/data/plugin/leafwatch/index.js", timeout=30) as response:
        assert "javascript" in response.headers["Content-Type"]
        assert "export async function render()" in response.read().decode()
    with urllib.request.urlopen(f"{server}/data/plugin/leafwatch/style.css", timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/css")
        assert response.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.slow
def test_runs_route_lists_runs_with_leafwatch_records(server: str) -> None:
    runs = {r["run"]: r for r in get_json(f"{server}/data/plugin/leafwatch/runs")["runs"]}
    assert set(runs) == {"buggy", "gan"}  # the leafwatch-layout sub-runs hold no records
    assert runs["buggy"]["report"] is True
    assert runs["buggy"]["coverage_chunks"] == 1
    assert runs["buggy"]["last_step"] == 12


@pytest.mark.slow
def test_runs_route_gives_each_run_when_it_last_wrote_and_the_open_errors_and_warnings_of_its_report(
        server: str) -> None:
    """What the tab's run overview shows (newest first) and opens on (the newest run with open errors)."""
    runs = {r["run"]: r for r in get_json(f"{server}/data/plugin/leafwatch/runs")["runs"]}
    assert runs["gan"]["wall_time"] > runs["buggy"]["wall_time"] > 0  # written in that order
    for name in ("buggy", "gan"):
        findings = get_json(f"{server}/data/plugin/leafwatch/findings?run={name}")["findings"]
        for severity in ("error", "warning"):
            assert runs[name][f"open_{severity}s"] == len(
                [f for f in findings if f["status"] == "open" and f["severity"] == severity])
    # the cut and the unused layer (the routed expert is intermittent: info); the unused generator layer
    assert (runs["buggy"]["open_errors"], runs["gan"]["open_errors"]) == (2, 1)


@pytest.mark.slow
def test_findings_route_returns_the_latest_report_open_errors_first(server: str) -> None:
    data = get_json(f"{server}/data/plugin/leafwatch/findings?run=buggy")
    assert data["step"] == 12
    findings = data["findings"]
    by_name = {f["name"]: f for f in findings}  # one per mistake, its tensors in "members"
    tensors = {m["name"]: m for f in findings for m in f["members"]}
    assert {f["kind"] for f in findings} == {"missing_grad"}
    assert set(by_name) == {BUGGY_CUT, "unused", "experts.1"}  # the cut names the encoder's mistake
    assert {n for n, f in tensors.items() if f["status"] == "open" and f["severity"] == "error"} == DETACHED | UNUSED
    assert {n for n, f in tensors.items() if f["status"] == "intermittent"} == ROUTED
    assert {m["name"] for m in by_name["unused"]["members"]} == UNUSED
    assert "never ran" in by_name["unused"]["cause"]
    assert by_name[BUGGY_CUT]["cause"].startswith(f"cut by `.detach()` at {BUGGY_CUT_AT}")
    assert by_name[BUGGY_CUT]["details"]["location"] == f"cut by `.detach()` at {BUGGY_CUT_AT}"  # shown beside the name
    assert by_name["unused"]["fix"].startswith("call `unused` in forward()")
    assert (by_name["unused"]["first_step"], by_name["unused"]["last_step"]) == (1, 12)
    statuses = [f["status"] for f in findings]
    assert statuses == sorted(statuses, key=["open", "intermittent", "resolved", "ignored"].index)
    assert data["counts"]["missing_grad"] == 2  # open mistakes: the detached encoder, the unused layer


@pytest.mark.slow
def test_findings_route_without_a_run_returns_every_run(server: str) -> None:
    runs = get_json(f"{server}/data/plugin/leafwatch/findings")["runs"]
    assert set(runs) == {"buggy", "gan"}
    gan = [(f["kind"], f["name"], [m["name"] for m in f["members"]]) for f in runs["gan"]["findings"] if f["status"] == "open"]
    assert gan == [("missing_grad", "generator_unused", ["generator_unused.bias", "generator_unused.weight"])]


@pytest.mark.slow
def test_coverage_route_marks_the_missed_cells_at_their_steps(server: str) -> None:
    grid = get_json(f"{server}/data/plugin/leafwatch/coverage?run=buggy")
    assert grid["columns"] == [[s, s] for s in range(1, 13)]
    rows = _rows(grid)
    assert list(rows)[:4] == ["encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias"]
    for name in DETACHED | UNUSED:
        assert rows[name]["missed_steps"] == [[1, 12]], name
        assert rows[name]["missed_cols"] == [[c, 1] for c in range(12)], name
    for name in ROUTED:
        assert rows[name]["missed_steps"] == ROUTED_MISSED, name
        assert [c for c, _ in rows[name]["missed_cols"]] == [0, 1, 3, 4, 6, 7, 9, 10], name
    for name in ("head.weight", "experts.0.weight"):
        assert (rows[name]["missed"], rows[name]["checks"]) == (0, 12), name


@pytest.mark.slow
def test_coverage_route_bins_steps_into_columns(server: str) -> None:
    grid = get_json(f"{server}/data/plugin/leafwatch/coverage?run=buggy&bins=4")
    assert grid["columns"] == [[1, 3], [4, 6], [7, 9], [10, 12]]
    row = _rows(grid)["experts.1.weight"]
    assert grid["profiles"][row["profile"]] == [3, 3, 3, 3]
    assert row["missed_cols"] == [[0, 2], [1, 2], [2, 2], [3, 2]]  # a share of 1/3 got a gradient


@pytest.mark.slow
def test_coverage_route_zooms_into_a_window_of_steps(server: str) -> None:
    grid = get_json(f"{server}/data/plugin/leafwatch/coverage?run=buggy&first=4&last=8")
    assert grid["columns"] == [[s, s] for s in range(4, 9)]
    assert _rows(grid)["experts.1.bias"]["missed_steps"] == [[4, 5], [7, 8]]


@pytest.mark.slow
def test_coverage_route_leaves_the_other_optimizers_steps_unchecked(server: str) -> None:
    grid = get_json(f"{server}/data/plugin/leafwatch/coverage?run=gan")
    rows = _rows(grid)
    generator = grid["profiles"][rows["generator.weight"]["profile"]]
    discriminator = grid["profiles"][rows["discriminator.weight"]["profile"]]
    assert generator == [1, 0] * 5  # checked when the generator's optimizer steps
    assert discriminator == [0, 1] * 5
    assert rows["generator_unused.weight"]["missed_steps"] == [[s, s] for s in range(1, 11, 2)]
    assert rows["discriminator.weight"]["missed"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(("query", "code", "words"), [
    ("run=buggy&bins=0", 400, "`bins` must be between 1 and"),
    ("run=buggy&bins=many", 400, "`bins` must be an integer, got 'many'"),
    ("run=nope", 404, "`run` must name a run with Leafwatch records, got 'nope'"),
])
def test_coverage_route_rejects_bad_queries(server: str, query: str, code: int, words: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as raised:
        get_json(f"{server}/data/plugin/leafwatch/coverage?{query}")
    assert raised.value.code == code
    assert words in raised.value.read().decode()


@pytest.mark.slow
def test_logdir_without_leafwatch_records_lists_the_tab_disabled(plain_server: str) -> None:
    listing = get_json(f"{plain_server}/data/plugins_listing")
    assert listing["leafwatch"]["enabled"] is False
    assert listing["scalars"]["enabled"] is True
    assert get_json(f"{plain_server}/data/plugin/leafwatch/runs") == {"runs": []}
    scalars = get_json(f"{plain_server}/data/plugin/scalars/scalars?run=run&tag=loss")
    assert [step for _, step, _ in scalars] == [0, 1, 2]


@pytest.mark.parametrize(("with_records", "expected"), [(True, True), (False, False)])
def test_is_active_only_when_a_run_holds_leafwatch_records(tmp_path: Path, with_records: bool, expected: bool) -> None:
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin

    from leafwatch.tensorboard_plugin import LeafwatchPlugin

    if with_records:
        write_buggy_run(tmp_path / "buggy", steps=2)
    write_plain_run(tmp_path / "plain")
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path))
    plugin = LeafwatchPlugin(base_plugin.TBContext(data_provider=provider, logdir=str(tmp_path)))
    assert plugin.is_active() is expected


def test_only_the_very_hunk_a_verification_ran_is_marked_with_its_outcome() -> None:
    """`leafwatch report --diff --verify`'s record marks a finding whose kind, name and hunk it verified; a
    finding recorded since with another hunk (the file changed), or with no hunk, keeps no mark."""
    from leafwatch.tensorboard_plugin.plugin import with_verification

    findings = [{"kind": "not_in_optimizer", "name": "scale", "hunk": "--- a/t.py\n+optimizer.add_param_group"},
                {"kind": "orphan_tensor", "name": "blocks", "hunk": "--- a/t.py\n+nn.ModuleList, placed again"},
                {"kind": "missing_grad", "name": "aux_head", "hunk": None}]
    verification = {"step": 40, "steps": 10, "new": [{"kind": "device_mismatch", "name": "scale"}], "hunks": [
        {"kind": "not_in_optimizer", "name": "scale", "diff": "--- a/t.py\n+optimizer.add_param_group",
         "outcome": "undecided", "decided_step": 26},
        {"kind": "orphan_tensor", "name": "blocks", "diff": "--- a/t.py\n+nn.ModuleList", "outcome": "fixed",
         "decided_step": 1}]}
    marked = with_verification(findings, verification)
    assert marked[0] == {**findings[0], "verified": {"outcome": "undecided", "decided_step": 26, "steps": 10, "of": 40,
                                                     "new": 1}}
    assert marked[1:] == findings[1:]
    assert with_verification(findings, None) == findings

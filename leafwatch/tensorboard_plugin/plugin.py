"""The TensorBoard plugin behind the Leafwatch tab: routes that serve the tab and its JSON.

Routes, under ``/data/plugin/leafwatch``:

- ``/index.js``, ``/style.css``: the page (plain JS and CSS, no build step, nothing external);
- ``/runs``: the runs with Leafwatch records, each with when it last wrote one (``wall_time``) and the
  open errors and warnings of its latest report (the tab's run overview, newest first);
- ``/findings?run=R``: the latest ``leafwatch/report`` of run R (every run without ``run``), each
  hunk that ``--verify`` ran marked with its outcome (``"verified"``);
- ``/coverage?run=R&bins=N&first=A&last=B``: the coverage grid of run R (every run without
  ``run``, on one step axis, each row naming its run), steps binned into at most N columns (200
  by default), optionally only the steps from A to B.

The records are the ones :class:`leafwatch.TensorBoardSink` writes; their
tags and format are in :mod:`leafwatch.report.records`, and findings are listed in the order of
:meth:`leafwatch.Finding.sort_key` (each served finding carries its ``sort_key``, so the page
merges runs in that order too). This module imports TensorBoard, werkzeug and leafwatch's
torch-free modules only.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from tensorboard import context as tb_context
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from ..report.findings import Finding, group_findings, sort_key_of
from ..report.format import NOTHING_TO_CHECK
from ..report.records import PLUGIN_NAME, REPORT_TAG, VERIFY_TAG, decode, is_coverage_tag

#: Columns of the coverage grid unless the request asks otherwise, and the most it may ask.
DEFAULT_BINS = 200
MAX_BINS = 2000
#: Exact missed-step ranges sent per row (the binned counts are always complete).
MAX_MISSED_RANGES = 50

_STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
_STATIC_FILES = {"/index.js": "application/javascript", "/style.css": "text/css"}


def _json_response(request: wrappers.Request, data: Any, code: int = 200) -> wrappers.Response:
    body = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return http_util.Respond(request, body, "application/json", code=code)


def _decode(datum: Any) -> dict[str, Any] | None:
    """The record held by one ``TensorDatum`` (None when it is not one this version reads)."""
    try:
        value = datum.numpy.item()
    except (AttributeError, ValueError, TypeError):
        return None
    return decode(value) if isinstance(value, (str, bytes)) else None


def _flat(key: Iterable[Any]) -> list[Any]:
    """A sort key as one flat list of numbers and strings (the page compares them in turn)."""
    return [x for part in key for x in (_flat(part) if isinstance(part, (tuple, list)) else [part])]


def sorted_findings(findings: Iterable[Any]) -> list[dict[str, Any]]:
    """The findings of a report record, one per mistake, in :meth:`leafwatch.Finding.sort_key`
    order, each with its ``sort_key`` (a flat list) added for the page. A record of version 1
    (one finding per tensor) is grouped here, as :class:`leafwatch.Report` groups it.

    Example::

        >>> rows = sorted_findings([{"kind": "missing_grad", "name": f"experts.{i}", "severity": "error",
        ...                          "message": "m", "status": "open"} for i in (10, 2)])
        >>> [(r["name"], [m["name"] for m in r["members"]]) for r in rows]
        [('experts', ['experts.2', 'experts.10'])]
    """
    dicts = [f for f in findings if isinstance(f, dict)]
    # A finding's patch hunk (a unified diff of the user's file, recorded with the run) is the
    # record's, not the Finding's words: kept across the reading.
    hunks = {(f.get("kind"), f.get("name")): f["hunk"] for f in dicts if isinstance(f.get("hunk"), str)}
    try:
        dicts = [f.to_dict() for f in group_findings(Finding.from_dict(f) for f in dicts)]
    except (TypeError, ValueError, KeyError, AttributeError):
        pass  # not findings this version can read: shown as they are
    out = [{**f, "sort_key": _flat(sort_key_of(f))} for f in dicts]
    for f in out:
        if not f.get("hunk") and (f.get("kind"), f.get("name")) in hunks:
            f["hunk"] = hunks[f.get("kind"), f.get("name")]
    out.sort(key=sort_key_of)  # (findings this version cannot read come unsorted)
    return out


def with_hunks(findings: Any, patch: Any) -> list[Any]:
    """The findings of a report record, each open one with a code fix given the hunk its run recorded
    for it (the record's ``"patch"``: :func:`leafwatch.report.patch.record`), as ``"hunk"``: the tab
    shows the diff without the sources. A record without one (an older leafwatch) is read as it is.

    Example::

        >>> with_hunks([{"kind": "orphan_tensor", "name": "blocks"}],
        ...            {"hunks": [{"kind": "orphan_tensor", "name": "blocks", "diff": "--- a/t.py"}]})
        [{'kind': 'orphan_tensor', 'name': 'blocks', 'hunk': '--- a/t.py'}]
    """
    findings = list(findings) if isinstance(findings, list) else []
    hunks = patch.get("hunks") if isinstance(patch, dict) else None
    if not isinstance(hunks, list):
        return findings
    diffs = {(h.get("kind"), h.get("name")): h["diff"] for h in hunks if isinstance(h, dict) and isinstance(h.get("diff"), str)}
    return [{**f, "hunk": diffs[f.get("kind"), f.get("name")]}
            if isinstance(f, dict) and not f.get("hunk") and (f.get("kind"), f.get("name")) in diffs else f
            for f in findings]


def with_verification(findings: list[Any], verification: Any) -> list[Any]:
    """The findings of a report record, each whose hunk a ``--verify`` ran (its run's latest
    ``leafwatch/verify`` record, :mod:`leafwatch.report.verify`) marked with the outcome, as
    ``"verified"``: ``{"outcome": "fixed" | "still_open" | "undecided", "decided_step", "steps": the
    rerun's, "of": the run's, "new": the findings new in the rerun}``. A mark is given only to the very
    hunk that was verified (its kind, name and diff): a run recorded again with another patch has none.

    Example::

        >>> with_verification([{"kind": "orphan_tensor", "name": "blocks", "hunk": "--- a/t.py"}],
        ...                   {"step": 4, "steps": 4, "new": [], "hunks": [{"kind": "orphan_tensor", "name": "blocks",
        ...                    "diff": "--- a/t.py", "outcome": "fixed", "decided_step": 1}]})[0]["verified"]
        {'outcome': 'fixed', 'decided_step': 1, 'steps': 4, 'of': 4, 'new': 0}
    """
    hunks = verification.get("hunks") if isinstance(verification, dict) else None
    if not isinstance(hunks, list):
        return findings
    marks = {(h.get("kind"), h.get("name"), h.get("diff")): h for h in hunks if isinstance(h, dict) and h.get("diff")}
    out = []
    for f in findings:
        mark = marks.get((f.get("kind"), f.get("name"), f.get("hunk"))) if isinstance(f, dict) and f.get("hunk") else None
        out.append(f if mark is None else {**f, "verified": {
            "outcome": mark.get("outcome"), "decided_step": mark.get("decided_step"), "steps": verification.get("steps"),
            "of": verification.get("step"), "new": len(verification.get("new") or ())}})
    return out


def open_counts(findings: Iterable[Any]) -> dict[str, int]:
    """The open errors and warnings among a report's findings (one per mistake).

    Example::

        >>> open_counts([{"severity": "error", "status": "open"}, {"severity": "error", "status": "resolved"},
        ...              {"severity": "warning", "status": "open"}, {"severity": "info", "status": "open"}])
        {'error': 1, 'warning': 1}
    """
    counts = {"error": 0, "warning": 0}
    for f in findings:
        if isinstance(f, dict) and f.get("status") == "open" and f.get("severity") in counts:
            counts[f["severity"]] += 1
    return counts


def _ranges_to_steps(steps: list[list[int]], positions: Iterable[list[int]]) -> list[list[int]]:
    """Maps ranges of positions in a group's list of checks onto ranges of steps."""
    starts, total = [], 0  # position of the first check of each step range
    for first, last in steps:
        starts.append(total)
        total += last - first + 1
    out: list[list[int]] = []
    for i, j in positions:
        i, j = max(i, 0), min(j, total - 1)
        k = bisect.bisect_right(starts, i) - 1
        while i <= j and 0 <= k < len(steps):
            first, last = steps[k]
            offset = i - starts[k]
            length = min(j - i, last - first - offset)
            out.append([first + offset, first + offset + length])  # (a row merges its ranges: _row)
            i += length + 1
            k += 1
    return out


def _clip(ranges: Iterable[list[int]], lo: int, hi: int) -> list[list[int]]:
    return [[max(a, lo), min(b, hi)] for a, b in ranges if b >= lo and a <= hi]


def coverage_grid(records: Iterable[Mapping[str, Any]] | Mapping[str, Iterable[Mapping[str, Any]]],
                  bins: int = DEFAULT_BINS, *, first: int | None = None, last: int | None = None) -> dict[str, Any]:
    """Bins coverage records into a grid: one row per tensor, at most ``bins`` step columns.

    A cell counts, for its steps, the checks of that tensor (``profiles[row.profile][col]``)
    and those without a gradient (``row.missed_cols``); a step at which the tensor was not
    checked (another optimizer stepped) counts in neither. The tensors that no optimizer held
    (the records' ``in_no_optimizer``) are rows of their own, marked ``in_no_optimizer``: their
    profile counts the checks while no optimizer held them (nothing updated them then), and they
    miss nothing (their gradients are not read at each step). A record written before
    ``in_no_optimizer`` existed has none of those rows.

    Args:
        records: The latest ``leafwatch/coverage/NNNNNN`` record of each chunk of one run; or a
            mapping from each run to its records: every run on one step axis, each row naming its
            ``run`` (the tab's "All runs").
        bins: The most columns.
        first, last: Keep only these steps (inclusive); None keeps all.

    Returns:
        ``{"first_step", "last_step", "width", "columns": [[a, b], ...], "profiles": [[checks
        per column], ...], "rows": [{"name", "in_no_optimizer", "profile", "checks", "missed",
        "missed_cols": [[col, n], ...], "missed_steps": [[a, b], ...], "missed_steps_truncated"}],
        "chunks"}``; with a mapping, each row also has its ``"run"`` and ``"chunks"`` maps each
        run to its chunk numbers.

    Raises:
        ValueError: when ``bins`` is not an int >= 1.

    Example::

        >>> grid = coverage_grid([{"version": 1, "chunk": 0, "groups": {"all": {
        ...     "names": ["a", "b"], "steps": [[1, 4]], "missed": {"1": [[2, 3]]}}},
        ...     "in_no_optimizer": [{"names": ["c"], "steps": [[1, 4]]}]}])
        >>> [(r["name"], r["in_no_optimizer"], r["missed_steps"]) for r in grid["rows"]]
        [('a', False, []), ('b', False, [[3, 4]]), ('c', True, [])]
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"`bins` must be an int >= 1, got {bins!r}")
    by_run = records if isinstance(records, Mapping) else {None: records}
    groups: list[_Group] = []
    chunks: dict[Any, list[int]] = {}
    for run, run_records in by_run.items():
        chunks[run] = _read_groups(run, run_records, first, last, groups)
    chunks_out: Any = chunks if isinstance(records, Mapping) else chunks[None]
    if not groups:
        return {"first_step": None, "last_step": None, "width": 1, "columns": [], "profiles": [],
                "rows": [], "chunks": chunks_out}
    origin = min(g.steps[0][0] for g in groups)
    end = max(g.steps[-1][1] for g in groups)
    width = max(1, math.ceil((end - origin + 1) / bins))
    ncols = (end - origin) // width + 1
    columns = [[origin + c * width, min(end, origin + (c + 1) * width - 1)] for c in range(ncols)]
    profiles, rows = _grid_rows(groups, origin, width, ncols, with_run=isinstance(records, Mapping))
    return {"first_step": origin, "last_step": end, "width": width, "columns": columns,
            "profiles": profiles, "rows": rows, "chunks": chunks_out}


def _grid_rows(groups: list[_Group], origin: int, width: int, ncols: int, *,
               with_run: bool) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """The grid's profiles (checks per column, shared by the rows checked in the same groups) and
    its rows, in first-seen order (each naming its run when ``with_run``)."""
    # Each tensor by (run, in no optimizer, name), in first-seen order: the groups it is checked in
    # and its missed step ranges.
    by_name: dict[tuple[Any, bool, str], tuple[list[int], list[list[int]]]] = {}
    for g, group in enumerate(groups):
        for index, name in enumerate(group.names):
            checked_in, missed = by_name.setdefault((group.run, group.in_no_optimizer, name), ([], []))
            checked_in.append(g)
            missed.extend(group.missed.get(index, ()))
    group_checks = [_binned(g.steps, origin, width, ncols) for g in groups]
    profiles: list[list[int]] = []
    profile_index: dict[tuple[int, ...], int] = {}
    rows = []
    for (run, unheld, name), (checked_in, missed) in by_name.items():
        key = tuple(checked_in)
        if key not in profile_index:
            profile_index[key] = len(profiles)
            profiles.append([sum(column) for column in zip(*(group_checks[g] for g in key))])
        out = _row(name, profile_index[key], profiles[profile_index[key]], missed, origin, width, ncols)
        out["in_no_optimizer"] = unheld
        if with_run:
            out["run"] = run
        rows.append(out)
    return profiles, rows


@dataclasses.dataclass
class _Group:
    """One group of a coverage record: its run, its tensor names, its checked step ranges, for each
    name index the step ranges at which that tensor had no gradient, and whether these are the
    tensors that no optimizer held (checked steps: the checks while that was so)."""

    run: Any
    names: list[str]
    steps: list[list[int]]
    missed: dict[int, list[list[int]]]
    in_no_optimizer: bool = False


def _read_groups(run: Any, records: Iterable[Mapping[str, Any]], first: int | None, last: int | None,
                 groups: list[_Group]) -> list[int]:
    """Adds the groups of every record of ``run`` to ``groups``, in chunk order, clipped to
    ``[first, last]``, then its tensors in no optimizer; returns its chunk numbers."""
    chunks = []
    lo = first if first is not None else -(2**62)
    hi = last if last is not None else 2**62
    unheld: list[_Group] = []
    for record in sorted(records, key=lambda r: int(r.get("chunk", 0))):
        chunks.append(int(record.get("chunk", 0)))
        for group in (record.get("groups") or {}).values():
            steps = group.get("steps") or []
            missed = {int(k): _clip(_ranges_to_steps(steps, v), lo, hi) for k, v in (group.get("missed") or {}).items()}
            steps = _clip(steps, lo, hi)
            if steps:
                groups.append(_Group(run, list(group.get("names", [])), steps, missed))
        for entry in record.get("in_no_optimizer") or ():  # (absent from records written before it)
            steps = _clip(entry.get("steps") or [], lo, hi)
            if steps:
                unheld.append(_Group(run, list(entry.get("names", [])), steps, {}, in_no_optimizer=True))
    groups += unheld
    return chunks


def _binned(ranges: Iterable[list[int]], origin: int, width: int, ncols: int) -> list[int]:
    """How many of the steps in ``ranges`` fall in each column."""
    counts = [0] * ncols
    for first, last in ranges:
        col_a, col_b = (first - origin) // width, (last - origin) // width
        if col_a == col_b:
            counts[col_a] += last - first + 1
            continue
        counts[col_a] += origin + (col_a + 1) * width - first
        for col in range(col_a + 1, col_b):
            counts[col] += width
        counts[col_b] += last - (origin + col_b * width) + 1
    return counts


def _row(name: str, profile: int, checks: list[int], missed_ranges: list[list[int]],
         origin: int, width: int, ncols: int) -> dict[str, Any]:
    """One tensor's row: its missed steps binned per column, and merged into at most MAX_MISSED_RANGES ranges."""
    missed_ranges.sort()  # ranges from several groups (chunks) may interleave
    missed_counts = _binned(missed_ranges, origin, width, ncols)
    merged: list[list[int]] = []
    for a, b in missed_ranges:
        if merged and merged[-1][1] >= a - 1:
            merged[-1][1] = max(merged[-1][1], b)
        elif len(merged) <= MAX_MISSED_RANGES:
            merged.append([a, b])
    return {
        "name": name,
        "profile": profile,
        "checks": sum(checks),
        "missed": sum(missed_counts),
        "missed_cols": [[c, n] for c, n in enumerate(missed_counts) if n],
        "missed_steps": merged[:MAX_MISSED_RANGES],
        "missed_steps_truncated": len(merged) > MAX_MISSED_RANGES,
    }


def _int_arg(request: wrappers.Request, name: str, default: int | None) -> int | None:
    value = request.args.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"`{name}` must be an integer, got {value!r}") from None


class LeafwatchPlugin(base_plugin.TBPlugin):
    """The Leafwatch tab: findings per run and which tensors got a gradient at which step.

    Args:
        context: The ``base_plugin.TBContext`` TensorBoard gives each plugin.
    """

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._data_provider = context.data_provider
        self._lock = threading.Lock()
        # Decoded coverage records by (experiment, run, tag), with the (max_step, max_wall_time)
        # they were read at: a reload reads again only the chunks that changed.
        self._records: dict[tuple[str, str, str], tuple[Any, dict[str, Any]]] = {}
        self._grids: OrderedDict[Any, dict[str, Any]] = OrderedDict()

    # -- TBPlugin ----------------------------------------------------------------------------
    def get_plugin_apps(self) -> dict[str, Any]:
        return {**{route: self._serve_static for route in _STATIC_FILES}, "/runs": self._serve_runs,
                "/findings": self._serve_findings, "/coverage": self._serve_coverage}

    def is_active(self) -> bool:
        # TensorBoard already lists the tab as enabled when a run holds data of this plugin
        # name; this answers for the default experiment when it asks anyway.
        if self._data_provider is None:
            return False
        try:
            return bool(self._list("", tb_context.RequestContext()))
        except Exception:  # never break TensorBoard's plugin listing
            return False

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Leafwatch")

    # -- data --------------------------------------------------------------------------------
    def _list(self, experiment: str, ctx: Any = None) -> Mapping[str, Mapping[str, Any]]:
        return self._data_provider.list_tensors(ctx, experiment_id=experiment, plugin_name=PLUGIN_NAME)

    def _listing(self, request: wrappers.Request) -> tuple[Any, str, Mapping[str, Mapping[str, Any]]]:
        """The request's TensorBoard context, its experiment, and the experiment's runs with their Leafwatch tags."""
        ctx, experiment = plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)
        return ctx, experiment, self._list(experiment, ctx)

    def _latest(self, ctx: Any, experiment: str, runs: list[str], tags: list[str]) -> dict[str, dict[str, Any]]:
        """The latest JSON document of each (run, tag)."""
        if not runs or not tags:
            return {}
        # Every record holds the whole state of its tag (the report, or a chunk so far), so the
        # latest sample is all the tab needs; downsampling always keeps the latest one.
        data = self._data_provider.read_tensors(
            ctx, experiment_id=experiment, plugin_name=PLUGIN_NAME, downsample=1,
            run_tag_filter=provider.RunTagFilter(runs=runs, tags=tags))
        out: dict[str, dict[str, Any]] = {}
        for run, by_tag in data.items():
            for tag, datums in by_tag.items():
                if datums:
                    decoded = _decode(datums[-1])
                    if decoded is not None:
                        out.setdefault(run, {})[tag] = decoded
        return out

    def _reports(self, ctx: Any, experiment: str, runs: list[str]) -> dict[str, dict[str, Any]]:
        """The latest report of each run that has one, findings sorted open errors first."""
        out = {}
        for run, records in self._latest(ctx, experiment, runs, [REPORT_TAG, VERIFY_TAG]).items():
            report = records.get(REPORT_TAG)
            if report is None:
                continue
            findings = sorted_findings(with_hunks(report.get("findings", []), report.get("patch")))
            out[run] = {"run": run, "step": report.get("step"), "counts": report.get("counts", {}),
                        "findings": with_verification(findings, records.get(VERIFY_TAG)),
                        # Why there is nothing to check (the console's words), None when there is.
                        "nothing_to_check": NOTHING_TO_CHECK if report.get("nothing_to_check") is True else None}
        return out

    # -- routes ------------------------------------------------------------------------------
    @wrappers.Request.application
    def _serve_static(self, request: wrappers.Request) -> wrappers.Response:
        route = request.path[request.path.rfind("/"):]  # one of _STATIC_FILES: the only routes it serves
        with open(os.path.join(_STATIC_DIR, route.lstrip("/")), "rb") as handle:
            body = handle.read()
        return http_util.Respond(request, body, _STATIC_FILES[route])

    @wrappers.Request.application
    def _serve_runs(self, request: wrappers.Request) -> wrappers.Response:
        ctx, experiment, listing = self._listing(request)
        reports = self._reports(ctx, experiment, sorted(r for r, tags in listing.items() if REPORT_TAG in tags))
        runs = []
        for run, tags in sorted(listing.items()):
            coverage = sorted(t for t in tags if is_coverage_tag(t))
            last_step = max((getattr(ts, "max_step", 0) or 0 for ts in tags.values()), default=0)
            wall_time = max((getattr(ts, "max_wall_time", 0) or 0 for ts in tags.values()), default=0)
            counts = open_counts(reports[run]["findings"]) if run in reports else {"error": 0, "warning": 0}
            runs.append({"run": run, "report": REPORT_TAG in tags, "coverage_chunks": len(coverage),
                         "last_step": last_step, "wall_time": wall_time, "open_errors": counts["error"],
                         "open_warnings": counts["warning"]})
        return _json_response(request, {"runs": runs})

    @wrappers.Request.application
    def _serve_findings(self, request: wrappers.Request) -> wrappers.Response:
        ctx, experiment, listing = self._listing(request)
        run = request.args.get("run")
        if run:
            if run not in listing:
                return _json_response(request, {"error": f"no Leafwatch records in run {run!r}"}, 404)
            report = self._reports(ctx, experiment, [run]).get(run)
            return _json_response(request, report or {"run": run, "step": None, "counts": {}, "findings": []})
        reports = self._reports(ctx, experiment, sorted(listing))
        return _json_response(request, {"runs": dict(sorted(reports.items()))})

    @wrappers.Request.application
    def _serve_coverage(self, request: wrappers.Request) -> wrappers.Response:
        ctx, experiment, listing = self._listing(request)
        run = request.args.get("run")
        try:
            bins = _int_arg(request, "bins", DEFAULT_BINS)
            first = _int_arg(request, "first", None)
            last = _int_arg(request, "last", None)
            if bins is None or not 1 <= bins <= MAX_BINS:
                raise ValueError(f"`bins` must be between 1 and {MAX_BINS}, got {bins!r}")
        except ValueError as error:
            return _json_response(request, {"error": str(error)}, 400)
        if run and run not in listing:
            return _json_response(request, {"error": f"`run` must name a run with Leafwatch records, got {run!r}"}, 404)
        runs = [run] if run else sorted(listing)  # without `run`: every run, on one step axis
        stamps = {r: {t: (getattr(listing[r][t], "max_step", None), getattr(listing[r][t], "max_wall_time", None))
                      for t in sorted(listing[r]) if is_coverage_tag(t)} for r in runs}
        key = (experiment, run or None, bins, first, last, tuple((r, tuple(s.items())) for r, s in stamps.items()))
        with self._lock:
            grid = self._grids.get(key)
        if grid is None:
            records = {r: self._coverage_records(ctx, experiment, r, stamps[r]) for r in runs}
            grid = coverage_grid(records[run] if run else records, bins, first=first, last=last)
            grid["run"] = run or None
            with self._lock:
                self._grids[key] = grid
                while len(self._grids) > 16:
                    self._grids.popitem(last=False)
        return _json_response(request, grid)

    def _coverage_records(self, ctx: Any, experiment: str, run: str, stamps: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The latest record of each coverage chunk of ``run``, reading only those that changed."""
        with self._lock:
            known = {t: self._records.get((experiment, run, t)) for t in stamps}
        stale = [t for t, stamp in stamps.items() if known[t] is None or known[t][0] != stamp]
        fresh = self._latest(ctx, experiment, [run], stale).get(run, {})
        with self._lock:
            for tag in stale:
                if tag in fresh:
                    self._records[(experiment, run, tag)] = (stamps[tag], fresh[tag])
            return [self._records[(experiment, run, t)][1] for t in stamps if (experiment, run, t) in self._records]

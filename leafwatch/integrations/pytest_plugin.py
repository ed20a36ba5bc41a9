"""``pytest --leafwatch``: audit every optimizer step inside each test, as ``leafwatch run`` does a script.

pytest loads this module through the ``pytest11`` entry point. Without ``--leafwatch`` it only
adds its options and markers: no hook runs per test and torch is not imported. With it, each test
runs inside a ``leafwatch run`` :class:`~leafwatch.integrations.runner.Session` (global optimizer
and module hooks), installed before the test's setup (so training done by its fixtures counts)
and closed when its call ends. The test is judged from the session's final report (the whole
test's run, however many steps): an error finding still open fails a test that would have passed,
and the findings table is added to the test's report as a ``leafwatch`` section. A test that steps
no optimizer is left as it is, with no section. The options (``--leafwatch``, ``--leafwatch-ignore``)
and markers (``leafwatch_skip``, ``leafwatch(ignore=..., patience=...)``) are described in docs/testing.md.
"""

from __future__ import annotations

import io
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from ..report.findings import Finding, Report, Status, apply_ignore
from ..report.format import fix_mark, located, shown, tensor_count
from ..options import WarnOnce, parse_ignore, validate_ignore, validate_int

if TYPE_CHECKING:
    from .runner import Session

#: The name of the report section that holds the findings table.
SECTION = "leafwatch"
#: The ``user_properties`` key that says how leafwatch judged a test that stepped an optimizer.
VERDICT = "leafwatch"

_SESSION = pytest.StashKey["Session"]()
_VERDICT = pytest.StashKey["tuple[Report, list[Finding], int]"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("leafwatch", "leafwatch: name every tensor that will not train")
    group.addoption("--leafwatch", action="store_true", default=False,
                    help="audit every optimizer step inside each test; fail a test whose training "
                         "leaves an error finding open")
    group.addoption("--leafwatch-ignore", action="append", default=[], metavar="PATTERN[=REASON]",
                    help="report findings whose name matches the glob PATTERN as ignored (repeatable)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "leafwatch_skip(reason=None): do not audit this test's optimizer steps under --leafwatch")
    config.addinivalue_line(
        "markers", "leafwatch(ignore=None, patience=1): leafwatch options for this test under --leafwatch")
    if not config.getoption("leafwatch"):
        return
    try:
        ignore = parse_ignore(config.getoption("leafwatch_ignore"))
    except ValueError as error:
        raise pytest.UsageError(str(error).replace("`--ignore`", "`--leafwatch-ignore`")) from None
    config.pluginmanager.register(LeafwatchAudit(ignore), "leafwatch-audit")


class LeafwatchAudit:
    """The per-test hooks, registered only under ``--leafwatch``.

    Args:
        ignore: Pattern -> reason from ``--leafwatch-ignore``, applied to every test's report.
    """

    def __init__(self, ignore: Mapping[str, str]) -> None:
        self.ignore = dict(ignore)
        self.audited = 0
        self.failed: list[str] = []
        self._warn = WarnOnce("the test goes on without leafwatch's judgement.")

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_header(self, config: pytest.Config) -> str:
        ignored = f" (ignoring {', '.join(self.ignore)})" if self.ignore else ""
        return f"leafwatch: auditing every optimizer step in each test{ignored}"

    # The innermost wrapper: the other plugins' wrappers (logging, capture) are set up first, so a
    # bad marker fails this test's setup like any fixture error; the fixtures still run inside it.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        if item.get_closest_marker("leafwatch_skip") is None:
            options = _marker_options(item)  # a bad marker is the test's error: its setup fails
            try:
                from .runner import Session  # torch is imported only now

                session = Session(stream=io.StringIO(), **options)  # the table goes to the report
                session.install()
                item.stash[_SESSION] = session
            except Exception as error:  # leafwatch's own failure: the test runs unaudited
                self._warn("installing the hooks", error)
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            self._finish(item)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self._finish(item, judge=False)  # the setup failed or skipped: the call never ran, closed unjudged

    def _finish(self, item: pytest.Item, judge: bool = True) -> None:
        session = item.stash.get(_SESSION, None)
        if session is None:
            return
        del item.stash[_SESSION]
        try:
            report = session.close()
            if judge and session.steps:  # no optimizer stepped: the test is left as it is
                report = _ignore_more(report, self.ignore)
                item.stash[_VERDICT] = (report, report.at_least("error"), session.steps)
        except Exception as error:  # leafwatch's own failure: the test keeps its own outcome
            self._warn("judging the test" if judge else "removing the hooks", error)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.when != "call" or _VERDICT not in item.stash:
            return report
        final, failing, steps = item.stash[_VERDICT]
        del item.stash[_VERDICT]  # a rerun of the test is judged afresh
        plural = "s" if steps != 1 else ""
        report.sections.append((SECTION, f"leafwatch: the test's training, {steps} optimizer step{plural}\n{final}"))
        report.user_properties.append((VERDICT, "failed" if failing else "passed"))
        if failing and report.passed and not hasattr(report, "wasxfail"):
            report.outcome = "failed"
            report.longrepr = failure_message(failing, steps)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        verdict = dict(report.user_properties).get(VERDICT) if report.when == "call" else None
        if verdict is None:
            return
        self.audited += 1
        if verdict == "failed":
            self.failed.append(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_sep("=", "leafwatch")
        if not self.audited:
            terminalreporter.write_line("leafwatch: no test stepped an optimizer, nothing was checked.")
            return
        terminalreporter.write_line(
            f"leafwatch: {self.audited} test{'s' if self.audited != 1 else ''} stepped an optimizer; "
            f"{len(self.failed)} left an error finding open{': ' if self.failed else '.'}"
            + ", ".join(self.failed))


def failure_message(failing: list[Finding], steps: int) -> str:
    """The failure's first lines: which tensors will not train (the table is in the section)."""
    lines = [f"leafwatch: the training in this test left {len(failing)} error finding(s) open "
             f"after {steps} optimizer step{'s' if steps != 1 else ''}:"]
    for f in failing:
        lines.append(f"  {f.kind} {shown(f)}{tensor_count(f)}{located(f)}: {f.message}")
        if f.fix:
            lines.append(f"      fix{fix_mark(f)}: {f.fix}")
    lines.append("(the whole table is in the `leafwatch` section below; opt a test out with "
                 "@pytest.mark.leafwatch_skip or ignore names with --leafwatch-ignore PATTERN=REASON)")
    return "\n".join(lines)


def _marker_options(item: pytest.Item) -> dict[str, Any]:
    """The ``Session`` options a ``@pytest.mark.leafwatch(...)`` marker gives (validated)."""
    marker = item.get_closest_marker("leafwatch")
    if marker is None:
        return {}
    if marker.args:
        raise TypeError(f"@pytest.mark.leafwatch takes keyword arguments (ignore=..., patience=...), "
                        f"got positional {marker.args!r:.80}")
    unknown = set(marker.kwargs) - {"ignore", "patience"}
    if unknown:
        raise TypeError(f"@pytest.mark.leafwatch can take `ignore` and `patience`, got {', '.join(sorted(unknown))}")
    options: dict[str, Any] = {}
    if "ignore" in marker.kwargs:
        options["ignore"] = validate_ignore(marker.kwargs["ignore"], "ignored by @pytest.mark.leafwatch")
    if "patience" in marker.kwargs:
        options["patience"] = validate_int(marker.kwargs["patience"], "patience", 1)
    return options


def _ignore_more(report: Report, ignore: Mapping[str, str]) -> Report:
    """``report`` with the command line's patterns applied to what the test's own options left."""
    if not ignore:
        return report
    kept = [f for f in report.tensors() if f.status == Status.IGNORED]
    rest = apply_ignore((f for f in report.tensors() if f.status != Status.IGNORED), ignore)
    return Report([*kept, *rest], step=report.step)

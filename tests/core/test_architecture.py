"""The structure holds: no import cycle, no state shared between Monitors, no hook left behind."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
import torch
from _requirements import require_module
from torch import nn

import leafwatch
from leafwatch.observe import structure

PACKAGE = Path(leafwatch.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the leafwatch modules it imports, at the top or inside functions alike."""
    return _graph_of({_module_name(p): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")})


def _graph_of(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, tree in trees.items():
        is_package = any(other.startswith(name + ".") for other in trees)
        package = name if is_package else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in trees else base)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in trees and m not in (name, "leafwatch")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_the_import_graph_inside_leafwatch_has_no_cycle() -> None:
    graph = _import_graph()
    assert "leafwatch.monitor" in graph and "leafwatch.integrations.lightning" in graph
    assert "leafwatch.report.history" in graph["leafwatch.monitor"]  # the walk sees relative imports
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


#: The package's front doors: they name front-ends on purpose and nothing in the core imports
#: them. `leafwatch.cli` runs the `leafwatch demo | run` front-ends (`leafwatch.demo` asks the
#: environment for the TensorBoard command it prints); `leafwatch.transformers` is
#: the public import path of the Hugging Face callback (a re-export).
FRONT_DOORS = {"leafwatch.cli", "leafwatch.demo", "leafwatch.transformers"}


def _is_core(module: str) -> bool:
    return not module.startswith(("leafwatch.integrations", "leafwatch.tensorboard_plugin")) \
        and module not in FRONT_DOORS


def _core_imports_of_integrations(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    found = {module: sorted(dep for dep in deps if dep.startswith("leafwatch.integrations"))
             for module, deps in graph.items() if _is_core(module)}
    return {module: deps for module, deps in found.items() if deps}


def test_the_core_never_imports_integrations() -> None:
    graph = _import_graph()
    assert "leafwatch.sinks.tensorboard" in graph and "leafwatch.observe.sharding" in graph
    assert "leafwatch.detectors.gatherer" in graph["leafwatch.monitor"]  # the walk sees `from .detectors import x`
    assert _core_imports_of_integrations(graph) == {}


def test_the_core_check_finds_an_import_of_integrations_inside_a_function() -> None:
    trees = {name: ast.parse(code) for name, code in {
        "leafwatch.monitor": "def sink():\n    from .integrations.tensorboard import TensorBoardSink\n",
        "leafwatch.observe.structure": "import leafwatch.integrations.distributed\n",
        "leafwatch.integrations": "",
        "leafwatch.integrations.tensorboard": "from ..monitor import Monitor\n",
        "leafwatch.integrations.distributed": "",
    }.items()}
    assert _core_imports_of_integrations(_graph_of(trees)) == {
        "leafwatch.monitor": ["leafwatch.integrations.tensorboard"],
        "leafwatch.observe.structure": ["leafwatch.integrations.distributed"],
    }


#: The modules outside ``detectors/`` that import it, and why: everything else sits below the
#: detectors (a finding is data: ``Finding(kind, name, severity, reason)``, no detector's constructors needed).
DETECTOR_USERS = {
    "leafwatch.monitor": "builds the Checker (detectors/checker.py) and the rank Gatherer; its crash door "
                         "(Monitor.crashed) warns with the crash explanation's words when explaining fails",
    "leafwatch.integrations.lightning": "on_exception without a Monitor (before fit starts one): the crash "
                                        "explanation gives the note alone",
    "leafwatch.watching": "the watch-time warning of a non-leaf carries the fix of a non_leaf finding; while a "
                          "tensor is watched, the excepthook's door runs the crash explanation",
    "leafwatch.integrations.runner.session": "a run that ended before its first check: the misses of its "
                                             "only optimizer step, a part it hands its Monitor's scan",
    "leafwatch.integrations.distributed": "re-exports the merge and the Gatherer at their old path",
}


def test_only_the_modules_that_run_a_check_import_the_detectors() -> None:
    graph = _import_graph()
    users = {module for module, deps in graph.items() if not module.startswith("leafwatch.detectors")
             and any(dep.startswith("leafwatch.detectors") for dep in deps)}
    assert users - set(DETECTOR_USERS) == set(), "a module below the detectors imports them"
    assert "leafwatch.observe.sharding" not in users


def _builds_findings(tree: ast.Module) -> list[str]:
    """The calls a front-end makes that build findings itself (a name from ``report/findings.py``
    other than ``Report``, a ``Report`` of findings other than other reports' ``.tensors()``) or
    run a detector (a name from ``detectors/``; a ``Part`` of the pipeline is handed, not run)."""
    detectors, findings, found = set(), set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts, names = node.module.split("."), {alias.asname or alias.name for alias in node.names}
            if "detectors" in parts and parts[-1] != "pipeline":
                detectors |= names
            elif parts[-2:] == ["report", "findings"]:
                findings |= names
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            root = node.func
            while isinstance(root, ast.Attribute):
                root = root.value
            name = getattr(root, "id", "")
            given = [e.value if isinstance(e, ast.Starred) else e for a in node.args
                     for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])]  # (several reports' tensors)
            repackaged = all(isinstance(a, ast.Call) and getattr(a.func, "attr", "") == "tensors" for a in given)
            if name in detectors or name in findings and (name != "Report" or not repackaged):
                found.append(ast.unparse(node.func))
    return found


def test_leafwatch_run_hands_its_monitor_parts_and_never_builds_a_finding_or_runs_a_detector() -> None:
    runner = {path.name: _builds_findings(ast.parse(path.read_text()))
              for path in (PACKAGE / "integrations" / "runner").glob("*.py")}
    assert "session.py" in runner
    assert {name: calls for name, calls in runner.items() if calls} == {}


def test_the_front_end_scan_finds_a_finding_built_and_a_detector_run() -> None:
    tree = ast.parse("from ...detectors import constructors as checks\n"
                     "from ...detectors.pipeline import Part\n"
                     "from ...report.findings import Report, apply_ignore\n"
                     "def f(self, p, found, report):\n"
                     "    Part('a part', checks.missing_grad)\n"
                     "    Report(report.tensors(), step=1)\n"
                     "    return Report(apply_ignore([checks.missing_grad('w', p)], {}), step=1)\n")
    assert _builds_findings(tree) == ["Report", "apply_ignore", "checks.missing_grad"]


# -- imports run one way: observe -> detectors -> report -> sinks ----------------------------
#: What each package must never import (any module in it, at any depth, even inside a function).
FORBIDDEN = {
    "leafwatch.observe": ("leafwatch.detectors", "leafwatch.report", "leafwatch.sinks", "leafwatch.integrations",
                          "leafwatch.monitor", "leafwatch.auditing"),
    "leafwatch.detectors": ("leafwatch.sinks", "leafwatch.integrations"),
    "leafwatch.report": ("leafwatch.detectors", "leafwatch.sinks", "leafwatch.integrations", "leafwatch.monitor"),
}


def _wrong_way(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    out = {}
    for module, deps in graph.items():
        for package, banned in FORBIDDEN.items():
            if module == package or module.startswith(package + "."):
                bad = sorted(d for d in deps if d.startswith(banned))
                if bad:
                    out[module] = bad
    return out


def test_imports_run_one_way_from_observe_to_the_sinks() -> None:
    graph = _import_graph()
    assert {"leafwatch.observe.tracing", "leafwatch.observe.loop", "leafwatch.detectors.causes",
            "leafwatch.sinks.console"} <= set(graph)
    assert _wrong_way(graph) == {}


def test_the_one_way_check_finds_an_import_against_the_flow() -> None:
    trees = {name: ast.parse(code) for name, code in {
        "leafwatch.observe": "",
        "leafwatch.observe.tracing": "def explain():\n    from ..detectors import fixes\n",
        "leafwatch.detectors": "",
        "leafwatch.detectors.fixes": "from ..sinks.console import x\n",
        "leafwatch.sinks": "",
        "leafwatch.sinks.console": "from ..observe import tracing\n",
    }.items()}
    assert _wrong_way(_graph_of(trees)) == {
        "leafwatch.observe.tracing": ["leafwatch.detectors.fixes"],
        "leafwatch.detectors.fixes": ["leafwatch.sinks.console"],
    }


def _installs_hooks(tree: ast.Module) -> bool:
    """Whether a module registers a torch hook on a tensor or a module, or queues an autograd callback."""
    return any(isinstance(node, ast.Attribute) and node.attr in (
        "register_hook", "register_post_accumulate_grad_hook", "register_forward_hook", "register_forward_pre_hook",
        "register_full_backward_hook", "queue_callback") for node in ast.walk(tree))


def test_every_hook_a_check_reads_is_installed_in_observe_and_no_detector_installs_one() -> None:
    """observe/ holds the hooks and what they record (the loop hooks included: a skipped step's
    check is asked for through the ``request_check`` their owner injects); detectors read the records."""
    hooking = {_module_name(p) for p in PACKAGE.rglob("*.py") if _installs_hooks(ast.parse(p.read_text()))}
    assert {"leafwatch.observe.loop", "leafwatch.observe.tracing"} <= hooking  # the scan sees a hook
    assert sorted(m for m in hooking if m.startswith("leafwatch.detectors")) == []


#: The top level holds the public entry points only; everything else lives in a package.
TOP_LEVEL = {"__init__", "__main__", "auditing", "monitor", "watching", "testing", "transformers", "cli", "demo",
             "options"}


def test_the_top_level_holds_only_the_public_entry_points() -> None:
    assert {p.stem for p in PACKAGE.glob("*.py")} == TOP_LEVEL
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} == {
        "observe", "detectors", "report", "sinks", "integrations", "tensorboard_plugin"}


#: The modules that walk the call stack themselves, and why. Everything else asks `frames.py`.
STACK_WALKERS = {
    "leafwatch.observe.frames": "the one helper for the first frame of user code",
    "leafwatch.observe.tracing": "looks for torch's reentrant checkpoint frame, not for the user's",
    "leafwatch.observe.cuts": "finds the line of the op that cut a graph (a library's line, past torch's own "
                      "frames); the user's frame above it comes from frames.py",
    "leafwatch.detectors.loop": "looks for a scheduler in every frame, the frameworks' included (a Lightning Trainer)",
}


def _walks_the_stack(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("_getframe", "f_back", "currentframe", "stack"):
            if node.attr != "stack" or (isinstance(node.value, ast.Name) and node.value.id == "inspect"):
                return True
    return False


def test_the_first_frame_of_user_code_is_found_by_one_helper() -> None:
    walkers = {_module_name(p) for p in PACKAGE.rglob("*.py") if _walks_the_stack(ast.parse(p.read_text()))}
    assert "leafwatch.observe.frames" in walkers  # the scan sees a walk
    assert walkers - set(STACK_WALKERS) == set()


def test_torch_free_modules_import_no_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, leafwatch.report.findings, leafwatch.options, leafwatch.observe.frames, leafwatch.report.events, leafwatch.report.history, "
            "leafwatch.report.records, leafwatch.report.format, leafwatch.integrations.environment, leafwatch.report.reader; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# -- the history is the only writer ----------------------------------------------------------
#: The history's writers (private to it); detectors return verdicts, the pipeline applies them.
WRITERS = {"_upsert", "_touch", "_put", "_resolve", "_hold", "_confirm", "_drop"}
#: The modules that hand verdicts to the history: the pipeline (each part's verdicts), the
#: Checker (verdicts it asks for outside a part: a state_dict()'s counts), and the history itself.
APPLIERS = {"leafwatch.report.history", "leafwatch.detectors.pipeline", "leafwatch.detectors.checker"}


def _writes_history(tree: ast.Module) -> list[str]:
    """The history writes a module makes: calls of the private writers, or of ``.apply(...)``
    on something named ``history``/``history_store``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, owner = node.func.attr, node.func.value
            owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if attr in WRITERS or (attr == "apply" and owner_name in ("history", "history_store")):
                found.append(f"{owner_name}.{attr}")
    return found


def test_only_the_pipeline_and_the_checker_hand_verdicts_to_the_history() -> None:
    trees = {_module_name(p): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}
    writers = {m: _writes_history(t) for m, t in trees.items() if _writes_history(t)}
    assert set(writers) <= APPLIERS, writers
    assert "leafwatch.detectors.pipeline" in writers  # the scan sees a write


#: The modules of ``detectors/`` that run the detectors rather than being one: the pipeline
#: hands their verdicts to the history, the Checker owns the history and the check's order, the
#: Gatherer owns the merged history and runs the rank merge on it.
DETECTOR_RUNNERS = {"leafwatch.detectors.pipeline", "leafwatch.detectors.checker", "leafwatch.detectors.gatherer"}


def test_detectors_return_verdicts_and_never_hold_the_history() -> None:
    detectors = {_module_name(p): p.read_text() for p in (PACKAGE / "detectors").glob("*.py")
                 if _module_name(p) not in DETECTOR_RUNNERS}
    assert {"leafwatch.detectors.gradients", "leafwatch.detectors.structure", "leafwatch.detectors.loop"} <= set(detectors)
    for module, code in detectors.items():
        assert "FindingHistory" not in code, module  # they read a FindingsView
        assert not _writes_history(ast.parse(code)), module


#: The classes of ``detectors/`` with methods: the runners, and an AST rewriter of fixes.py (a
#: visitor of the user's code, not a detector's state); besides them, the reason classes (their words).
CLASSES_WITH_METHODS = {"Checker": "leafwatch.detectors.checker", "Gatherer": "leafwatch.detectors.gatherer",
                        "Pipeline": "leafwatch.detectors.pipeline", "Strip": "leafwatch.detectors.fixes"}


def _classes_with_methods(trees: dict[str, ast.Module]) -> dict[str, str]:
    return {node.name: module for module, tree in trees.items() for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and any(isinstance(f, ast.FunctionDef) for f in node.body)}


def _is_reason(module: str, name: str) -> bool:
    import importlib

    from leafwatch.report.reasons import Reason
    found = getattr(importlib.import_module(module), name, None)
    return isinstance(found, type) and issubclass(found, Reason)


def test_a_detectors_state_is_plain_data_and_only_the_runners_and_the_reasons_have_methods() -> None:
    trees = {_module_name(p): ast.parse(p.read_text()) for p in (PACKAGE / "detectors").glob("*.py")}
    assert {"GradientState", "MembershipState", "LoopState", "WatchedState"} <= {
        n.name for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    found = _classes_with_methods(trees)
    assert {n: m for n, m in found.items() if not _is_reason(m, n)} == CLASSES_WITH_METHODS
    assert {"NeverRan", "LeftOut", "Intermittent"} <= {n for n, m in found.items() if _is_reason(m, n)}
    tracker = ast.parse("class Tracker:\n    x: int = 0\n    def update(self):\n        pass\n")
    assert _classes_with_methods({"leafwatch.detectors.new": tracker}) == {"Tracker": "leafwatch.detectors.new"}


def test_no_object_of_observe_holds_a_detectors_state() -> None:
    # observe/ records; a detector's state is handed to it as plain values by the runner, never held
    # (the diagnostic hooks once read the gradient state and cleared the loop watch's list themselves).
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    checker = monitor._checker
    states = {id(s) for s in (checker.grads, checker.loop, *checker.states.values())}
    seen = checker.seen
    observers = [checker.diagnostics, checker.diagnostics.tracer, seen, seen.arrivals, seen.sentinels, seen.values,
                 *seen.hands.values(), monitor.structure, monitor.observer]
    held = {(type(o).__name__, name) for o in observers
            for name, value in (vars(o) if hasattr(o, "__dict__") else {n: getattr(o, n) for n in o.__slots__}).items()
            if id(value) in states}
    assert not held
    monitor.close()


def test_the_writer_scan_finds_a_write() -> None:
    tree = ast.parse("def f(self):\n    self.history._upsert(x)\n    self.history_store.apply([v])\n")
    assert _writes_history(tree) == ["history._upsert", "history_store.apply"]


# -- two monitors ---------------------------------------------------------------------------
def _step(model: nn.Module, optimizer: torch.optim.Optimizer, extra: torch.Tensor | None = None) -> None:
    loss = model(torch.ones(1, 2)).sum()
    if extra is not None:
        loss = loss + extra.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()


def test_two_monitors_on_two_models_do_not_see_each_others_tensors() -> None:
    a, b = nn.Linear(2, 1), nn.Linear(2, 1)
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    temperature = torch.ones(1, requires_grad=True).to(torch.float64)  # a non-leaf: a bug of A's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", leafwatch.LeafwatchWarning)  # the watch-time warning
        warnings.simplefilter("error", leafwatch.LeafwatchInternalWarning)  # its own failures still fail
        ma = leafwatch.Monitor(a, oa, tensors={"temp_of_a": temperature})
    mb = leafwatch.Monitor(b, ob)
    _step(a, oa, temperature)
    report_a = ma.check(oa)
    _step(b, ob)
    report_b = mb.check(ob)
    assert report_a.names("non_leaf") == {"temp_of_a"}
    assert report_b.findings == []
    assert leafwatch.audit(b, ob).findings == []  # nor does audit() of another model
    assert leafwatch.watched() == {}  # tensors= is the Monitor's own, not the process-wide set
    ma.close()
    mb.close()


def test_a_tensor_watched_with_watch_is_seen_by_every_check() -> None:
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    unused = leafwatch.watch(torch.ones(1, requires_grad=True), name="unused_scale")
    try:
        with leafwatch.Monitor(model, opt) as monitor:
            _step(model, opt)
            assert monitor.check(opt).names("missing_grad") == {"unused_scale"}
        assert leafwatch.audit(model, opt).names("missing_grad") == {"unused_scale"}
    finally:
        leafwatch.unwatch(unused)


# -- global hooks ---------------------------------------------------------------------------
def _global_hooks() -> dict[str, int]:
    import torch.optim.optimizer as optimizer

    module = torch.nn.modules.module
    names = [n for n in vars(module) if n.startswith("_global_") and n.endswith("_hooks")]
    counts = {f"module.{n}": len(getattr(module, n)) for n in names if isinstance(getattr(module, n), dict)}
    for n in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        counts[f"optimizer.{n}"] = len(getattr(optimizer, n))
    return counts


def test_global_hook_dicts_are_back_to_the_start_after_the_last_close() -> None:
    from leafwatch.observe import hooks

    before = _global_hooks()
    users_before = len(hooks.PARAMETER_REGISTRATION)
    assert "module._global_parameter_registration_hooks" in before
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = leafwatch.Monitor(model, opt).attach()
    second = leafwatch.Monitor(model, opt)
    during = _global_hooks()
    # One dispatcher per torch dict, registered by the first subscriber in the process (an earlier
    # test may still hold a Monitor it never closed), once for both Monitors' observers.
    installed = 1 if users_before == 0 else 0
    assert len(hooks.PARAMETER_REGISTRATION) == users_before + 2
    assert during["module._global_parameter_registration_hooks"] == \
        before["module._global_parameter_registration_hooks"] + installed
    first.close()
    # The second Monitor still sees a layer replaced after the first one closed.
    model[1] = nn.Linear(2, 1)
    _step(model, opt)
    assert second.check().names("stale_param") | second.report.names("not_in_optimizer") >= {"1.weight"}
    second.close()
    assert len(hooks.PARAMETER_REGISTRATION) == users_before
    assert _global_hooks() == before


def test_leafwatch_run_sessions_leave_no_global_hook(tmp_path: Path) -> None:
    from leafwatch.integrations.runner import Session

    before = _global_hooks()
    session = Session(stream=open(tmp_path / "out.txt", "w"))
    session.install()
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        _step(model, opt)
        opt.step()
    session.close()
    assert _global_hooks() == before


@pytest.mark.parametrize("name", sorted(leafwatch.__all__))
def test_every_public_name_resolves(name: str) -> None:
    assert name in leafwatch.__all__ and name in dir(leafwatch)
    if name == "LeafWatch":
        require_module("pytorch_lightning")  # the callback is built on Lightning's Callback
    assert getattr(leafwatch, name) is not None


def test_no_class_over_300_lines_and_no_function_over_60() -> None:
    """Counted from `def`/`class` to its last line, docstring included (a piece one can read whole)."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            lines = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines > 60 \
                    or isinstance(node, ast.ClassDef) and lines > 300:
                too_long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert not too_long, too_long


# -- the registry is the pipeline's one list --------------------------------------------------
def test_the_checks_parts_are_the_registrys_detectors_in_order() -> None:
    from leafwatch.detectors import registry

    model = nn.Linear(2, 1)
    monitor = leafwatch.Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1))
    checker = monitor._checker
    by_stage = {stage: [d.name for d in registry.DETECTORS if d.stage == stage]
                for stage in (registry.SCAN, registry.CHECK, registry.CLOSE)}
    assert [p.name for p in checker.pipeline.parts] == [*by_stage[registry.CHECK], "the diagnostic hooks"]
    assert [p.name for p in checker.scanning] == by_stage[registry.SCAN]
    assert [p.name for p in checker.closing] == by_stage[registry.CLOSE]
    monitor.close()


def test_registry_names_are_unique_and_each_need_names_an_earlier_detector() -> None:
    from leafwatch.detectors import registry

    names = [d.name for d in registry.DETECTORS]
    assert len(names) == len(set(names))
    assert registry.ordered(registry.DETECTORS) == list(registry.DETECTORS)  # listed in an order the needs keep
    for i, d in enumerate(registry.DETECTORS):
        assert set(d.needs) <= {e.name for e in registry.DETECTORS[:i]}, d.name
    late = registry.Detector("late", lambda *a: None, needs=("early",))
    early = registry.Detector("early", lambda *a: None)
    assert [d.name for d in registry.ordered([late, early])] == ["early", "late"]
    with pytest.raises(ValueError, match="unique"):
        registry.ordered([early, early])
    with pytest.raises(ValueError, match="no detector"):
        registry.ordered([late])


def test_a_part_failing_at_every_check_stays_incomplete_after_the_end_of_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its ``incomplete`` finding clears only when that very part runs through: the end of the run
    runs other parts (one once had the same name as the loss-graph check), never that one."""
    import dataclasses

    from leafwatch.detectors import registry

    def broken(*args):
        raise RuntimeError("cannot walk this graph")

    detectors = tuple(dataclasses.replace(d, judge=broken) if d.name == "the loss-graph check" else d
                      for d in registry.DETECTORS)
    monkeypatch.setattr(registry, "DETECTORS", detectors)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", leafwatch.LeafwatchInternalWarning)
        monitor = leafwatch.Monitor(model, optimizer)
        for _ in range(2):
            loss = model(torch.ones(1, 2)).sum()
            optimizer.zero_grad()
            loss.backward()
            monitor.check(optimizer, loss=loss)
        report = monitor.close()
    (f,) = report.by_kind("incomplete")
    assert (f.name, f.status) == ("the loss-graph check", "open")


def test_a_detector_added_to_the_registry_runs_at_each_check_with_its_own_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a detector is its module and one line in the registry: here, a gradient-norm limit
    (its verdicts, and the renderer of its reason)."""
    import dataclasses

    from leafwatch.detectors import registry
    from leafwatch.detectors.constructors import make
    from leafwatch.observe.evidence import LISTS, STEP
    from leafwatch.report import reasons
    from leafwatch.report.verdicts import Verdict
    from leafwatch.report.words import Members, Words

    monkeypatch.setattr(reasons, "REASONS", dict(reasons.REASONS))

    class Huge(reasons.Reason, kind="nonfinite_grad", name="huge", fixes="never"):  # the reason and its words
        norm: float

        def words(self, m: Members) -> Words:
            return Words(f"{m.who}'s gradient is huge.", "a learning rate too high", "lower the learning rate")

    @dataclasses.dataclass
    class Seen:
        checks: int = 0

    def huge(evidence, state, view):  # the detector: evidence, its own state, the findings so far -> verdicts
        state.checks += 1
        return [Verdict.open(make(Huge(norm=float(p.grad.norm())), name, "warning", step=evidence[STEP]))
                for _, clist, _ in evidence[LISTS] for name, p in zip(clist.names, clist.params)
                if p.grad is not None and p.grad.abs().max() > 1e3]

    added = registry.Detector("the gradient-norm check", huge, state=lambda config: Seen(), decides=(Huge,))
    monkeypatch.setattr(registry, "DETECTORS", (*registry.DETECTORS, added))
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    for scale in (1.0, 1e6):
        optimizer.zero_grad()
        (model(torch.ones(1, 2)) * scale).sum().backward()
        report = monitor.check(optimizer)
    assert monitor._checker.states["the gradient-norm check"].checks == 2
    assert [(f.kind, f.name, f.cause, f.reason.name) for f in report.findings] == [
        ("nonfinite_grad", "{bias,weight}", "a learning rate too high", "huge")]  # one mistake, its tensors
    assert {f.name for f in report.tensors()} == {"weight", "bias"}
    monitor.close()


def test_every_detector_of_a_check_reads_the_same_read_only_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    from leafwatch.detectors import registry
    from leafwatch.observe.evidence import LISTS, LOSS

    seen: list[object] = []

    def look(evidence, state, view):
        seen.append(evidence)
        with pytest.raises(TypeError):
            evidence[LOSS] = None  # no detector writes what the check observed

    monkeypatch.setattr(registry, "DETECTORS", (registry.Detector("first look", look), *registry.DETECTORS,
                                                registry.Detector("last look", look)))
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer)
    loss = model(torch.ones(1, 2)).sum()
    loss.backward()
    monitor.check(optimizer, loss=loss)
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0][LOSS] is loss
    assert [(key, missing) for key, _, missing in seen[0][LISTS]] == [(0, [])]  # both tensors had a gradient
    monitor.close()


def test_a_failed_evidence_read_is_an_incomplete_finding_resolved_once_a_read_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    from leafwatch.observe import evidence

    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, optimizer, verbose=False)
    real = evidence.read

    def broken(*args):
        raise RuntimeError("the structure could not be read")

    monkeypatch.setattr(evidence, "read", broken)
    _step(model, optimizer)
    with pytest.warns(leafwatch.LeafwatchInternalWarning, match="reading the model's structure"):
        failed = monitor.check(optimizer)
    monkeypatch.setattr(evidence, "read", real)
    _step(model, optimizer)
    after = monitor.check(optimizer)
    assert [(f.kind, f.name, f.status) for f in failed.by_kind("incomplete")] == [
        ("incomplete", "reading the model's structure", "open")]
    assert "RuntimeError: the structure could not be read" in failed.by_kind("incomplete")[0].cause
    assert [f.status for f in after.by_kind("incomplete")] == ["resolved"]
    monitor.close()

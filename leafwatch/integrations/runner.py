"""``leafwatch run``: audit an unmodified PyTorch script, the way ``python -m cProfile`` runs one.

The script runs as ``__main__`` with its own ``sys.argv``; leafwatch only adds global hooks:

- a global optimizer step pre-hook checks the parameters of each optimizer that steps, with a
  :class:`~leafwatch.Monitor` that adopts every optimizer it sees;
- global module forward hooks see the modules that run. The *roots* among them (modules that are
  neither a submodule of another one that ran, nor kept in one of its plain lists, dicts or
  attributes) give the qualified names: with one root no prefix, with several a prefix from the
  class name. Once the roots are stable the global module hooks are removed, so the script runs
  at full speed; they come back for a few steps when an optimizer steps with parameters that no
  known module owns.

The structural checks (``not_in_optimizer`` above all) need every optimizer of the script: the
first check waits until some optimizer steps a second time, so that alternating optimizers
(GANs) have all been seen, and optimizer membership stays pending for
:data:`LATE_OPTIMIZER_CHECKS` checks, so that an optimizer that steps for the first time later
(WGAN-GP's ``n_critic``, TD3's ``policy_delay``, a second optimizer after warm-up) is no false
alarm. A tensor that no stepping optimizer holds by then is a warning, and an error at the end
of the run; the optimizers the script holds (found in the calling frames) name the one that
never stepped. A run that ends before any check (a test that steps once) is still decided when
it ends: the structure then, every optimizer known, and the tensors that had no gradient when
their optimizer made its only step.

Findings go to stderr once each as they appear (one short line with the fix:
:func:`leafwatch.format.finding_line`), and the table of all of them, causes included, at exit;
the script's stdout and exit code are its own.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
import weakref
from collections.abc import Sequence
from typing import Any, TextIO

import torch
from torch import nn

from .. import checks, graph, inventory, watching
from ..events import CheckEvent
from ..findings import Finding, Report
from ..format import finding_line
from ..monitor import Monitor
from ..options import WarnOnce, apply_ignore, parse_ignore, positive_int
from ..tracing import Explanation

#: Checks during which optimizer membership stays pending (an optimizer may step late).
LATE_OPTIMIZER_CHECKS = 25
#: Optimizer steps the roots must stay unchanged before the global module hooks are removed.
STABLE_STEPS = 2
#: Exit code of a run stopped by ``--strict``.
STRICT_EXIT_CODE = 1
_MAX_FRAMES = 30
_MAX_LOCALS = 1000


class StrictStop(BaseException):
    """Raised from ``optimizer.step()`` in strict mode; a BaseException so scripts don't swallow it."""

    def __init__(self, report: Report, step: int) -> None:
        super().__init__(f"leafwatch --strict: an error finding at optimizer step {step}")
        self.report = report
        self.step = step


def _is_builtin(module: nn.Module) -> bool:
    return type(module).__module__.startswith("torch.")


def _contained_modules(module: nn.Module) -> list[nn.Module]:
    """Every module below ``module``: registered submodules and modules kept in plain containers
    (the walk :func:`leafwatch.inventory.contained` does for orphans)."""
    out: list[nn.Module] = []
    seen: set[int] = {id(module)}
    stack = [module]
    while stack:
        current = stack.pop()
        below: list[Any] = list(current._modules.values())
        below.extend(value for _, value, kinds in inventory.contained(current)
                     if kinds and isinstance(value, nn.Module))
        for sub in below:
            if isinstance(sub, nn.Module) and id(sub) not in seen:
                seen.add(id(sub))
                out.append(sub)
                stack.append(sub)
    return out


#: The first this many optimizer steps read the script's module-level variables (and each step
#: that gives an optimizer new parameters).
_SCRIPT_SCANS = 3
_MAX_GLOBALS = 2_000


class _RootInfo:
    """What one candidate root module holds: registered parameters and unregistered tensors."""

    def __init__(self, module: nn.Module) -> None:
        inv = inventory.Inventory(module)
        self.module = module
        self.registered = set(inv.tensors)
        self.unregistered = {id(o.tensor) for o in inv.orphans()}

    @property
    def owned(self) -> set[int]:
        return self.registered | self.unregistered


class Session:
    """The hooks and the Monitor of one ``leafwatch run``.

    Args:
        logdir: Write TensorBoard records there (``None``: no TensorBoard).
        strict: Stop the script at the first check with an open error finding.
        patience: Passed to the :class:`~leafwatch.Monitor`.
        ignore: Pattern -> reason, passed to the :class:`~leafwatch.Monitor`.
        stream: Where findings and the summary go (``sys.stderr`` when None, read at each write).
    """

    def __init__(self, *, logdir: str | None = None, strict: bool = False, patience: int = 1,
                 ignore: dict[str, str] | None = None, stream: TextIO | None = None) -> None:
        self.logdir = logdir
        self.strict = strict
        self.patience = patience
        self.ignore = dict(ignore or {})
        self._stream = stream
        self.steps = 0
        self.monitor: Monitor | None = None
        self._writer: Any = None
        self._sink: Any = None
        self._handles: list[Any] = []
        self._module_handles: list[Any] = []
        self._seen: dict[int, weakref.ReferenceType] = {}
        self._optimizers: list[torch.optim.Optimizer] = []
        self._step_counts: dict[int, int] = {}
        self._opt_keys: dict[int, tuple[int, ...]] = {}
        self._roots: dict[str, nn.Module] = {}
        self._roots_key: tuple[int, ...] = ()
        self._owned: set[int] = set()
        self._accepted_unknown: set[int] = set()
        self._stable = 0
        self._closure_steps: set[int] = set()
        self._first_misses: list[tuple[int, list[weakref.ReferenceType]]] = []
        self._held_optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._checking = False
        self._printed: set[tuple[str, str]] = set()
        self._warn = WarnOnce("the script goes on, leafwatch skips this part.")
        self._closed = False
        self.report: Report | None = None
        self._script_tensors: dict[str, weakref.ReferenceType] = {}
        self._script_watched: set[str] = set()
        #: Whether the script holds an optimizer in a module-level variable (its loop is visible).
        self.loop_at_module_level = False
        #: Whether any module ran through ``module(x)`` (hooks fire) rather than ``.forward(x)``.
        self.saw_forward = False

    # -- hooks -------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles.append(register_optimizer_step_pre_hook(self._on_step))
        self._handles.append(register_optimizer_step_post_hook(self._on_step_done))
        self._arm_module_hooks()

    def _arm_module_hooks(self) -> None:
        if self._module_handles:
            return
        module_mod = torch.nn.modules.module
        self._module_handles.append(module_mod.register_module_forward_pre_hook(self._on_forward_pre))
        self._stable = 0

    def _disarm_module_hooks(self) -> None:
        for handle in self._module_handles:
            handle.remove()
        self._module_handles.clear()

    @property
    def roots(self) -> dict[str, nn.Module]:
        """The named root modules found so far (a copy)."""
        return dict(self._roots)

    @property
    def module_hooks_armed(self) -> bool:
        """Whether the global module hooks are installed (they are removed once roots are stable)."""
        return bool(self._module_handles)

    def _on_forward_pre(self, module: nn.Module, args: Any) -> None:
        if module._parameters:  # a module with parameters of its own ran through module(x)
            self.saw_forward = True
        if id(module) not in self._seen:
            self._remember(module)

    def _remember(self, module: nn.Module) -> None:
        key = id(module)

        def forget(_: Any, key: int = key) -> None:
            self._seen.pop(key, None)

        try:
            self._seen[key] = weakref.ref(module, forget)
        except TypeError:  # a module class that refuses weak references
            pass

    def _on_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        closure = args[1] if len(args) > 1 else kwargs.get("closure")  # args[0] is the optimizer
        if closure is not None:
            # LBFGS and friends compute the gradients inside step(): check after it.
            self._closure_steps.add(id(optimizer))
            return
        self._checked_step(optimizer)

    def _on_step_done(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if id(optimizer) in self._closure_steps:
            self._closure_steps.discard(id(optimizer))
            self._checked_step(optimizer)

    def _checked_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._checking or self._closed:
            return
        self._checking = True
        try:
            self._step(optimizer)
        except StrictStop:
            raise
        except Exception as error:  # never stop training for leafwatch's own failure
            self._warn("the optimizer step hook", error)
        finally:
            self._checking = False

    def _step(self, optimizer: torch.optim.Optimizer) -> None:
        self.steps += 1
        oid = id(optimizer)
        count = self._step_counts.get(oid, 0) + 1
        self._step_counts[oid] = count
        if count == 1:
            self._optimizers.append(optimizer)
        key = tuple(len(g["params"]) for g in optimizer.param_groups)
        new_params = self._opt_keys.get(oid) != key
        self._opt_keys[oid] = key
        if new_params:
            unknown = self._unknown_params(optimizer) - self._accepted_unknown
            if unknown:
                self._arm_module_hooks()
                self._find_owners(unknown)
        if self._module_handles or new_params:
            self._update_roots()
        if self.monitor is None:
            self.monitor = self._make_monitor()
        if self.steps <= LATE_OPTIMIZER_CHECKS + STABLE_STEPS:
            self._find_optimizers()
        monitor = self.monitor
        if self.steps <= _SCRIPT_SCANS or new_params:
            self._scan_script_globals(monitor)
        if self.report is None and count < 2:
            # Not every optimizer has stepped yet: the first check waits for them. What this step
            # says about its own tensors is kept, for a run that ends before any check (close()).
            self._remember_first_misses(optimizer)
            return
        for opt in self._optimizers:
            monitor.add_optimizer(opt)
        report = monitor.check(optimizer, step=self.steps)
        self.report = report
        if self.strict:
            failing = report.at_least("error")
            if failing:
                raise StrictStop(report, self.steps)

    def _scan_script_globals(self, monitor: Monitor) -> None:
        """Watch the script's module-level tensors that require grad and stay the same tensor
        from one scan to the next (an activation or a loss is a new tensor each step): a leaf in
        no optimizer is ``not_in_optimizer``, a non-leaf is ``non_leaf``, under its variable name."""
        scope = getattr(sys.modules.get("__main__"), "__dict__", None)
        if not isinstance(scope, dict):
            return
        found: dict[str, torch.Tensor] = {}
        for name, value in list(scope.items())[:_MAX_GLOBALS]:
            if isinstance(value, torch.Tensor) and value.requires_grad and not name.startswith("__") \
                    and id(value) not in self._owned:
                found[name] = value
            elif isinstance(value, torch.optim.Optimizer):
                self.loop_at_module_level = True
        for name, t in found.items():
            before = self._script_tensors.get(name)
            if before is None or before() is not t or name in self._script_watched:
                continue
            if not t.is_leaf and self._derived_from_model(t):
                continue  # an output or a loss kept at module level
            # The Monitor reports it with the rest (no warning at the watch, as watch() gives).
            monitor.watches.add(t, name, named_by_caller=True, expect_leaf=True, expect_grad=False,
                                location="the script's module level")
            self._script_watched.add(name)
        self._script_tensors = {name: weakref.ref(t) for name, t in found.items()}

    def _derived_from_model(self, t: torch.Tensor) -> bool:
        leaves, complete = graph.leaves_of(t.grad_fn, limit=2_000)
        held = self._owned | {id(p) for opt in self._optimizers for g in opt.param_groups for p in g["params"]}
        return not complete or any(id(leaf) in held for leaf in leaves)

    def _remember_first_misses(self, optimizer: torch.optim.Optimizer) -> None:
        """The trainable tensors of ``optimizer`` without a gradient at its first step (held weakly)."""
        if self.patience > 1:
            return  # one step is less than the patience asked for
        missing = [weakref.ref(p) for g in optimizer.param_groups for p in g["params"]
                   if p.requires_grad and p.grad is None]
        if missing:
            self._first_misses.append((self.steps, missing))

    def _unknown_params(self, optimizer: torch.optim.Optimizer) -> set[int]:
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        return ids - self._owned

    def _find_owners(self, unknown: set[int]) -> None:
        """Remember the modules in the step's calling frames (locals, ``self``) owning ``unknown``.

        A container that never runs a forward of its own (an ``nn.ModuleDict`` whose members are
        called one by one) is found there: the training loop holds it in a variable.
        """
        frame: Any = sys._getframe(1)
        package = os.path.dirname(os.path.abspath(__file__))
        torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
        for _ in range(_MAX_FRAMES):
            if frame is None:
                break
            filename = frame.f_code.co_filename
            if filename.startswith((package, torch_dir)):
                frame = frame.f_back
                continue
            values = list(frame.f_locals.values())
            owner = frame.f_locals.get("self")
            if owner is not None and not isinstance(owner, nn.Module):
                try:
                    values.extend(vars(owner).values())
                except TypeError:
                    pass
            for value in values[:_MAX_LOCALS]:
                if isinstance(value, nn.Module) and id(value) not in self._seen:
                    if any(id(p) in unknown for p in value.parameters()):
                        self._remember(value)
            frame = frame.f_back

    def _find_optimizers(self) -> None:
        """Remember the optimizers the script holds in the calling frames, stepped or not."""
        frame: Any = sys._getframe(1)
        package = os.path.dirname(os.path.abspath(__file__))
        torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
        for _ in range(_MAX_FRAMES):
            if frame is None:
                break
            if not frame.f_code.co_filename.startswith((package, torch_dir)):
                values = list(frame.f_locals.values())
                owner = frame.f_locals.get("self")
                if owner is not None:
                    try:
                        values.extend(vars(owner).values())
                    except TypeError:
                        pass
                for value in values[:_MAX_LOCALS]:
                    if isinstance(value, torch.optim.Optimizer) or type(value).__name__.endswith("Optimizer"):
                        inner = self._real_optimizer(value)
                        if inner is not None:
                            self._held_optimizers.add(inner)
            frame = frame.f_back

    @staticmethod
    def _real_optimizer(value: Any) -> torch.optim.Optimizer | None:
        """The torch optimizer a script's variable holds (an accelerate or Fabric wrapper unwrapped:
        the global step hooks see the real one), or None."""
        try:
            inner, deepspeed = inventory.unwrap_optimizer(value)
        except Exception:
            return None
        return inner if isinstance(inner, torch.optim.Optimizer) and not deepspeed else None

    def waiting_optimizers(self) -> list[torch.optim.Optimizer]:
        """Optimizers the script holds that have not stepped (yet)."""
        return [o for o in list(self._held_optimizers) if id(o) not in self._step_counts]

    # -- roots -------------------------------------------------------------------------------
    def _candidate_roots(self) -> list[nn.Module]:
        seen = [m for m in (ref() for ref in list(self._seen.values())) if m is not None]
        contained: set[int] = set()
        for module in seen:
            if id(module) in contained:
                continue
            contained.update(id(m) for m in _contained_modules(module))
        return [m for m in seen if id(m) not in contained]

    def _update_roots(self) -> None:
        in_optimizers = {id(p) for opt in self._optimizers for g in opt.param_groups for p in g["params"]}
        kept: list[_RootInfo] = []
        for module in self._candidate_roots():
            if _is_builtin(module) and not any(True for _ in module.parameters()):
                continue  # a loss or an activation called at the top level
            info = _RootInfo(module)
            if not info.owned:
                continue
            if info.owned & in_optimizers or not info.registered:
                kept.append(info)
            # A module none of whose tensors any optimizer holds (an EMA copy, a teacher, a frozen
            # backbone) is not judged: leaving it out is what the script means.
        key = tuple(id(i.module) for i in kept)
        owned = set().union(*(i.owned for i in kept)) if kept else set()
        if key == self._roots_key:
            self._stable += 1
        else:
            self._stable = 0
            self._roots_key = key
            self._roots = inventory.name_roots([i.module for i in kept])
            if self.monitor is not None:
                self.monitor.set_roots(self._roots)  # rebuilt at the next check
        self._owned = owned
        if self._module_handles and self._stable >= STABLE_STEPS and self._step_counts:
            # Stable: what no root owns now is a tensor of the script's own (or a stale one).
            self._accepted_unknown |= {
                pid for opt in self._optimizers for g in opt.param_groups for pid in map(id, g["params"])
            } - owned
            if all(c >= 2 for c in self._step_counts.values()) or self.report is not None:
                self._disarm_module_hooks()

    def _make_monitor(self) -> Monitor:
        sinks: list[Any] = [self._print_new]
        writer = self._get_writer()
        if writer is not None:
            from .tensorboard import TensorBoardSink

            self._sink = TensorBoardSink(writer)
            sinks.append(self._sink)
        monitor = Monitor(None, patience=self.patience, ignore=self.ignore, sinks=sinks,
                          roots=dict(self._roots))
        monitor.wait_for_optimizers(LATE_OPTIMIZER_CHECKS, self.waiting_optimizers)
        return monitor

    def _get_writer(self) -> Any:
        if self.logdir is None or self._writer is not None:
            return self._writer
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(self.logdir)
        return self._writer

    # -- output ------------------------------------------------------------------------------
    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except Exception:  # a closed stderr must not break the script
            pass

    def _print_new(self, event: CheckEvent) -> None:
        if not event.changed:
            return
        for f in event.report:
            if f.status in ("resolved", "ignored") or f.key in self._printed:
                continue
            if f.details.get("reason") == "pending":
                continue  # its cause comes at the next check
            self._printed.add(f.key)
            self._write(finding_line(f))

    # -- the end -----------------------------------------------------------------------------
    def close(self) -> Report:
        """Remove every hook, flush the Monitor and TensorBoard, and return the final report."""
        if self._closed:
            return self.report or Report(step=self.steps)
        self._closed = True
        self._disarm_module_hooks()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        report: Report
        try:
            if self.monitor is not None and self.report is not None:
                report = self.monitor.close()
                if self._sink is not None:
                    # The last record carries the final step, even when nothing changed since.
                    self._sink.close(Report(report.findings, step=report.step))
            elif self._optimizers:
                # Too few steps for a check: only what the structure says.
                report = self._structural_report()
                if self.monitor is not None:
                    self.monitor.close()
                if self._sink is not None:
                    self._sink.close(report)  # written after the Monitor's empty one: the latest
            else:
                report = Report(step=0)
        except Exception as error:
            self._warn("closing the run", error)
            report = self.report or Report(step=self.steps)
        finally:
            if self._writer is not None:
                try:
                    self._writer.close()
                except Exception as error:
                    self._warn("closing the TensorBoard writer", error)
        self.report = report
        return report

    def _structural_report(self) -> Report:
        """The report of a run that ended before any check: the structure now, every optimizer
        known, and the tensors that got no gradient at their optimizer's only step."""
        self._update_roots()
        inv = inventory.Inventory(self._roots, self._optimizers)
        found = checks.structural(inv, step=self.steps)
        found += self._first_step_findings(inv, {f.name for f in found})
        return Report(apply_ignore(found, self.ignore), step=self.steps)

    def _first_step_findings(self, inv: inventory.Inventory, named: set[str]) -> list[Finding]:
        if not self._first_misses or _distributed_run():
            return []  # (across ranks the Monitor's merge decides; one local step cannot)
        ran = {name for prefix, root in inv.roots.items()
               for name, module in root.named_modules(remove_duplicate=False, prefix=prefix)
               if id(module) in self._seen}
        watched = {id(e.tensor()) for e in watching.entries()}
        out: list[Finding] = []
        for step, refs in self._first_misses:
            for ref in refs:
                p = ref()
                info = inv.params.get(id(p)) if p is not None else None
                if p is None or info is None or info.name in named or id(p) in watched or not p.requires_grad:
                    continue  # gone, owned by no model (orphans are named above), or named already
                named.add(info.name)
                out.append(checks.missing_grad(info.name, p, step=step, info=info,
                                               explanation=_one_step_explanation(info, ran)))
        return out

    def summary(self, report: Report) -> str:
        if not self._optimizers:
            return "leafwatch: no optimizer stepped, nothing was checked."
        plural = "s" if self.steps != 1 else ""
        text = f"leafwatch: summary after {self.steps} optimizer step{plural}\n{report}"
        if not self.saw_forward:
            text += ("\nleafwatch: no module ran through `module(x)`: the script calls `.forward()` directly, "
                     "where module hooks cannot see. Parameters are named from the modules that own the "
                     "optimizers' tensors (found in the calling frames), and the causes of missing gradients "
                     "cannot say where in a forward pass they were lost.")
        if not self.loop_at_module_level:
            text += ("\nleafwatch: the training loop runs inside a function: leafwatch run sees the modules "
                     "that run and the optimizers that step, not tensors created inside functions. A tensor "
                     "trained outside the model (a temperature, a loss weight) left out of the optimizer is not "
                     "seen: flag it with `leafwatch.watch(t)`.")
        return text


def _one_step_explanation(info: inventory.ParamInfo, ran: set[str]) -> Explanation:
    """Why a tensor got no gradient at its optimizer's only step, from the modules seen running."""
    if info.module not in ran and any(n in ran for n in _ancestors(info.module)):
        shown = f"`{info.module}`"
        return Explanation(
            cause=f"module {shown} never ran in a forward pass of this run (its optimizer stepped once).",
            fix=f"call {shown} in forward(), or remove it (or freeze it with requires_grad_(False) if that is intended)",
            reason="never_ran")
    return Explanation(
        cause=f"`{info.name}` had no gradient when its optimizer stepped, at the only step of this run; "
        "the cause is worked out from a second step on (or use leafwatch.assert_trains / a Monitor "
        "created before the first forward pass).",
        fix=f"use `{info.name}` in the loss, or freeze it with `requires_grad_(False)` if that is intended",
        reason="unknown")


def _ancestors(module_name: str) -> list[str]:
    parts = module_name.split(".") if module_name else []
    return [".".join(parts[:i]) for i in range(len(parts))]


def _distributed_run() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


# -- running the script ---------------------------------------------------------------------
def _exit_code(code: Any) -> int:
    """What ``sys.exit(code)`` makes the interpreter return (a message is printed, as Python does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def run_target(script: str | None, module: str | None, argv: Sequence[str]) -> int:
    """Run a script path or a module as ``__main__`` with ``argv`` after its name; its exit code.

    Exceptions raised by the script are printed with their traceback and give 1 (130 for
    KeyboardInterrupt), as the interpreter does. :class:`StrictStop` is let through.
    """
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    try:
        if module is not None:
            sys.argv = [module, *argv]
            if sys.path:
                sys.path[0] = os.getcwd()
            else:
                sys.path.insert(0, os.getcwd())
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            assert script is not None
            sys.argv = [script, *argv]
            directory = os.path.dirname(os.path.abspath(script))
            if sys.path:
                sys.path[0] = directory
            else:
                sys.path.insert(0, directory)
            runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as stop:
        return _exit_code(stop.code)
    except StrictStop:
        raise
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        _print_script_traceback()
        return 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _print_script_traceback() -> None:
    """The traceback without leafwatch's and runpy's own frames on top."""
    etype, value, tb = sys.exc_info()
    here = os.path.dirname(os.path.abspath(__file__))
    skip = (here, os.path.dirname(runpy.__file__) + os.sep + "runpy.py", "<frozen runpy>")
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(skip):
        tb = tb.tb_next
    traceback.print_exception(etype, value, tb)


def run(script: str | None, argv: Sequence[str] = (), *, module: str | None = None,
        logdir: str | None = None, strict: bool = False, patience: int = 1,
        ignore: dict[str, str] | None = None) -> int:
    """Run a script (or ``module``) under leafwatch; returns the exit code.

    Args:
        script: Path of the script (None with ``module``).
        argv: The script's arguments.
        module: Run this module as ``python -m`` would.
        logdir: Write TensorBoard records there.
        strict: Stop at the first check with an open error finding (exit code 1).
        patience: Checks a parameter may go without a gradient before it is reported.
        ignore: Name pattern -> reason; matching findings are reported as ignored.

    Returns:
        The script's exit code, or 1 when ``strict`` stopped it.

    Raises:
        ValueError: neither or both of ``script`` and ``module``; ``patience`` below 1.
    """
    if (script is None) == (module is None):
        raise ValueError(f"give exactly one of `script` and `module`, got script={script!r}, module={module!r}")
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f"`patience` must be an int >= 1, got {patience!r}")
    session = Session(logdir=logdir, strict=strict, patience=patience, ignore=ignore)
    session.install()
    code: int
    stopped: StrictStop | None = None
    try:
        code = run_target(script, module, argv)
    except StrictStop as stop:
        stopped = stop
        code = STRICT_EXIT_CODE
    finally:
        report = session.close()
    if stopped is not None:
        first = stopped.report.at_least("error")[0]
        session._write(f"leafwatch: --strict stopped the script at optimizer step {stopped.step}: "
                       f"{first.severity.upper()} {first.kind} `{first.name}`.")
    session._write(session.summary(report))
    return code


# -- the command line -----------------------------------------------------------------------
def configure_run_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--logdir", metavar="DIR", help="write TensorBoard records to DIR")
    parser.add_argument("--strict", action="store_true",
                        help=f"stop at the first error finding and exit {STRICT_EXIT_CODE} with the table")
    parser.add_argument("--patience", type=positive_int, default=1, metavar="N",
                        help="checks a parameter may go without a gradient before it is reported (default 1)")
    parser.add_argument("--ignore", action="append", default=[], metavar="PATTERN[=REASON]",
                        help="report findings whose name matches the glob PATTERN as ignored (repeatable)")
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE",
                        help="run a library module as a script (the rest of the line is its arguments)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="script.py [args ...]",
                        help="the script and its arguments")
    parser.set_defaults(handler=run_main)
    return parser


def run_main(args: argparse.Namespace) -> int:
    """Run what ``args`` (from the ``run`` parser) names; the exit code."""
    try:
        ignore = parse_ignore(args.ignore)
    except ValueError as error:
        sys.stderr.write(f"leafwatch run: {error}\n")
        return 2
    module_args = args.module
    if module_args is not None:
        if not module_args:
            sys.stderr.write("leafwatch run: -m needs a module name\n")
            return 2
        module, argv, script = module_args[0], module_args[1:], None
        if args.script_args:
            sys.stderr.write(f"leafwatch run: give a script or -m MODULE, not both (got {args.script_args[0]!r})\n")
            return 2
    else:
        if not args.script_args:
            sys.stderr.write("leafwatch run: give a script to run: leafwatch run [options] script.py [args ...]\n")
            return 2
        script, argv, module = args.script_args[0], args.script_args[1:], None
        if not os.path.exists(script):
            sys.stderr.write(f"leafwatch run: can't open file {script!r}: no such file\n")
            return 2
    return run(script, argv, module=module, logdir=args.logdir, strict=args.strict,
               patience=args.patience, ignore=ignore)

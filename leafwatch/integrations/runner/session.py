"""The :class:`Session` of one ``leafwatch run``: the global optimizer step hooks, the
:class:`~leafwatch.Monitor` that checks each step, the console lines and the summary.

What the script trains (modules, roots, optimizers, module-level tensors) is found by
:class:`~leafwatch.observe.discovery.Discovery`. The session judges the run as a Monitor attached
before its first forward would: its Observer subscribes from the script's first line (each
registration and its line, the optimizers built and stepping), its Monitor is built before the
first forward of a module with parameters (the diagnostic hooks see the first step), and every
optimizer step is checked from the first. Optimizer membership stays pending for
:data:`LATE_OPTIMIZER_CHECKS` checks (an optimizer may step late: WGAN-GP's ``n_critic``, TD3's
``policy_delay``), except for what was created after every optimizer was built.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, TextIO

import torch
from torch import nn

from ...sinks.console import NewFindingWarnings
from ...sinks.tensorboard import TensorBoardSink
from ...report.findings import Kind, Report
from ...report.names import natural_key
from ...monitor import Monitor
from ...observe import hooks
from ...observe.observer import Observer
from ...options import WarnOnce
from ...observe.crashes import Context
from ...observe.discovery import SCRIPT_SCANS, STABLE_STEPS, Discovery

#: Checks during which optimizer membership stays pending (an optimizer may step late).
LATE_OPTIMIZER_CHECKS = 25
#: The first this many optimizer steps check gradient values (NaN/Inf) at every check.
EVERY_STEP_VALUE_CHECKS = 20


class StrictStop(BaseException):
    """Raised from ``optimizer.step()`` in strict mode; a BaseException so scripts don't swallow it."""

    def __init__(self, report: Report, step: int) -> None:
        super().__init__(f"leafwatch --strict: an error finding at optimizer step {step}")
        self.report = report
        self.step = step


class MaxStepsStop(BaseException):
    """Raised from the optimizer step after the last one ``--max-steps`` lets run, before it is checked
    or made (a step given a closure too: LBFGS, Lightning); a BaseException so scripts don't swallow it."""

    def __init__(self, step: int) -> None:
        super().__init__(f"leafwatch --max-steps {step}: the script was stopped after optimizer step {step}")
        self.step = step


class Session:
    """The hooks and the Monitor of one ``leafwatch run``.

    Args:
        logdir: Write TensorBoard records there (``None``: no TensorBoard).
        strict: Stop the script at the first check with an open error finding.
        patience: Passed to the :class:`~leafwatch.Monitor`.
        ignore: Pattern -> reason, passed to the :class:`~leafwatch.Monitor`.
        stream: Where findings and the summary go (``sys.stderr`` when None, read at each write).
        max_steps: Stop the script when it calls the optimizer step after this many
            (:class:`MaxStepsStop`); None lets it run.
        command: What ``leafwatch run`` runs, for the records (their ``"command"``: its ``cwd`` is the
            folder the patch's paths are relative to).
    """

    def __init__(self, *, logdir: str | None = None, strict: bool = False, patience: int = 1,
                 ignore: dict[str, str] | None = None, stream: TextIO | None = None, max_steps: int | None = None,
                 command: dict[str, Any] | None = None) -> None:
        self.logdir = logdir
        self.strict = strict
        self.max_steps = max_steps
        self.command = command
        self._sink: TensorBoardSink | None = None
        self._limit: Any = None  # (with max_steps: the pre-step subscription that stops the script)
        self.patience = patience
        self.ignore = dict(ignore or {})
        self._stream = stream
        self.monitor: Monitor | None = None
        self.report: Report | None = None
        self.found = Discovery(on_roots=self._roots_changed, on_first_module=self._first_forward)
        # (what the end of a run too short for a check decides is said in the summary only)
        self._lines = NewFindingWarnings(every_status=True, warn=lambda text: self._closed and self.report is None or self.write(text))
        #: The script's global hooks, from its first line on (registrations, optimizers stepping, the
        #: checks at each step): the run's Monitor takes them over when the first optimizer steps.
        self.observer = Observer(self._checked_step, hooked=False)
        self._checking = self._closed = False
        self._warn = WarnOnce("the script goes on, leafwatch skips this part.")

    @property
    def steps(self) -> int:
        """Optimizer steps seen, all optimizers together."""
        return self.found.steps

    @property
    def roots(self) -> dict[str, nn.Module]:
        """The named root modules found so far (a copy)."""
        return self.found.roots

    @property
    def module_hooks_armed(self) -> bool:
        """Whether the global module hooks are installed (they are removed once roots are stable)."""
        return self.found.armed

    # -- hooks -------------------------------------------------------------------------------
    def install(self) -> None:
        self.observer = Observer(self._checked_step)  # (registrations and optimizers built, from here on)
        self.observer.unhooked = self.found.unhooked  # (a module its hook watched never run: a cause, at a miss)
        self.observer.install_global()
        self.found.arm()
        if self.max_steps is not None:  # (before a step given a closure too, which is checked after it)
            self._limit = hooks.OPTIMIZER_STEP_PRE.subscribe(self._stop_at_limit)

    def _stop_at_limit(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # A step given a closure is checked (and counted) after it is made: stopped here, before it. Any other
        # step is stopped by its check (:meth:`_checked_step`), which may come before this call in the same step.
        closure = args[1] if len(args) > 1 else kwargs.get("closure")
        if closure is not None and not self._closed and self.max_steps is not None and self.found.steps >= self.max_steps:
            raise MaxStepsStop(self.found.steps)

    def _checked_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._checking or self._closed:
            return
        if self.max_steps is not None and self.found.steps >= self.max_steps:
            raise MaxStepsStop(self.found.steps)  # (a step past the limit is neither checked nor made)
        self._checking = True
        try:
            self._step(optimizer)
        except Exception as error:  # leafwatch's own failure never stops training (StrictStop is no Exception)
            self._warn("the optimizer step hook", error)
        finally:
            self._checking = False

    def _first_forward(self, module: nn.Module) -> None:
        """Before the first forward of a module with parameters: the run's Monitor, its diagnostic hooks
        armed on that module (its forward and its backward are explained from the first step, as an
        attached Monitor's; the roots are read again at the first check)."""
        if self.monitor is None and not self._closed:
            try:
                self.found.find_optimizers()  # those built before the loop (none stepped yet)
                self.found.script_variables()
                self.monitor = self._make_monitor({"": module})
                self.monitor.forward_begun(module)
            except Exception as error:  # leafwatch's own failure never stops the script
                self._warn("starting the check at the first forward", error)

    def _step(self, optimizer: torch.optim.Optimizer) -> None:
        found = self.found
        if found.steps < LATE_OPTIMIZER_CHECKS + STABLE_STEPS:
            # Before the roots are read (a network whose optimizer waits is one): the optimizers the script
            # holds and every one built since its first line, stepped or not (an optimizer counts once built).
            found.find_optimizers(self.observer.built_optimizers())
        count, new_params = found.step(optimizer, checked=self.report is not None)
        if self.monitor is None:
            self.monitor = self._make_monitor()
        monitor = self.monitor
        if found.steps <= SCRIPT_SCANS or new_params:
            found.scan_script_globals(monitor.watches)
            found.script_variables()  # the names the fixes use, kept for decisions after the script ends
        for opt in found.optimizers:
            monitor.add_optimizer(opt)
        report = self.report = monitor.check(optimizer, step=found.steps)
        if self.strict and report.at_least("error"):
            raise StrictStop(report, found.steps)

    def _roots_changed(self, roots: dict[str, nn.Module]) -> None:
        if self.monitor is not None:
            self.monitor.set_roots(roots)  # rebuilt at the next check

    def _make_monitor(self, roots: dict[str, nn.Module] | None = None) -> Monitor:
        if self.logdir is not None and self._sink is None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._sink = TensorBoardSink(SummaryWriter(self.logdir), root=(self.command or {}).get("cwd"),
                                             command=self.command)
            except Exception as error:  # the check goes on without TensorBoard records
                self._warn("opening the TensorBoard writer", error)
        sinks = [self._lines] if self._sink is None else [self._lines, self._sink]
        monitor = Monitor(None, patience=self.patience, ignore=self.ignore, sinks=sinks,
                              roots=self.found.roots if roots is None else roots, observer=self.observer)
        # The first steps check gradient values at every check (a NaN is named at the step it
        # appears, and --strict stops there); then at the Monitor's cadence.
        monitor.wait_for_optimizers(LATE_OPTIMIZER_CHECKS, self.found.waiting_optimizers,
                                    self.found.outside_root_tensors, values_until=EVERY_STEP_VALUE_CHECKS,
                                    variables=self.found.script_variables)
        return monitor

    @property
    def failed_parts(self) -> list[str]:
        """The parts of the check that failed inside leafwatch (each warned once): the report may
        miss findings. Writing TensorBoard records is not a part of the check."""
        own = [where for where in self._warn.seen if "TensorBoard" not in where]
        failed = [f.name for f in self.monitor.history.values()
                  if f.kind == Kind.INCOMPLETE and f.reason.name == "part_failed"] if self.monitor else []
        return sorted({*own, *failed})

    def _unhooked_modules(self) -> str:
        """What the summary says of the modules whose tensors got gradients and were stepped without torch's module
        hooks seeing them run: how, only where it was seen (a ``.forward()`` call in the frames' source, the
        class's own ``__call__``)."""
        found, said = self.found.unhooked, []
        called = sorted(found.called_directly)
        forward = [m for m in called if m in found.forward_calls]
        own = [m for m in called if m in found.own_calls and m not in found.forward_calls]
        other = [m for m in called if m not in found.forward_calls and m not in found.own_calls]
        lead = "modules whose tensors got gradients and were stepped"
        if forward:
            places = ", ".join(sorted({found.forward_calls[m] for m in forward}))
            said.append(f"{lead} never ran through `module(x)`: the script calls `.forward()` directly, where module "
                        f"hooks cannot see ({places}).")
        if own:
            calls = ", ".join(sorted({f"`{found.own_calls[m]}`" for m in own}))
            said.append(f"{lead} ran through their class's own `__call__` ({self._module_names(own)}: {calls}), which "
                        "runs `forward` without torch's module hooks.")
        if other:
            said.append(f"{lead} never ran through `module(x)` ({self._module_names(other)}): their tensors are used "
                        "without a call of the module that module hooks see (read directly, as `emb.weight[idx]`; no "
                        "`.forward()` call on them was seen in the calling frames).")
        return ("leafwatch: " + " ".join(said) + " Parameters are named from the modules that own the optimizers' "
                "tensors (found in the calling frames), and the causes of missing gradients cannot say where in a "
                "forward pass they were lost.")

    def _module_names(self, ids: list[int]) -> str:
        """The script's names for these modules (its variable for the module found in its frames, and the path
        below it), at most six."""
        variables, names = self.found.script_variables(), set()
        for module_id in ids:
            top, path = self.found.unhooked.paths.get(module_id, (None, ""))
            module = top() if top is not None else None
            base = variables.get(id(module)) or (type(module).__name__ if module is not None else "")
            names.add(f"`{base}.{path}`" if base and path else f"`{base or path}`")
        ordered = sorted(names, key=natural_key)
        return ", ".join(ordered[:6]) + (f" and {len(ordered) - 6} more" if len(ordered) > 6 else "")

    def crashed(self, error: BaseException, contexts: Sequence[Context]) -> Sequence[str]:
        """The script raised ``error``: the run's Monitor explains it (:meth:`leafwatch.Monitor.crashed`), made now
        where no module ran before it, so that its record holds the crash finding; the notes to print after the
        traceback."""
        if self.monitor is None and not self._closed:
            try:
                self.monitor = self._make_monitor()
            except Exception as error_:  # leafwatch's own failure never changes the script's end
                self._warn("explaining the exception", error_)
                return ()
        return self.monitor.crashed(error, contexts) if self.monitor is not None else ()

    # -- output ------------------------------------------------------------------------------
    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def write(self, text: str) -> None:
        """One line to :attr:`stream` (a closed stream is ignored: it must not break the script)."""
        with suppress(Exception):
            self.stream.write(text + "\n")
            self.stream.flush()

    # -- the end -----------------------------------------------------------------------------
    def ended(self, *, exit_code: int | None, stopped_by: str | None) -> None:
        """How the script ended, for the last record (written at :meth:`close`): its exit code, or the option
        with which leafwatch stopped it (``--strict``, ``--max-steps``: it did not crash)."""
        if self._sink is not None:
            self._sink.ended(exit_code=exit_code, stopped_by=stopped_by, step=self.steps)

    def close(self, *, crashed: bool = False) -> Report:
        """Remove every hook, flush the Monitor and TensorBoard, and return the final report (``crashed``: the
        script raised or was stopped by ``--max-steps``, and what waits for a later step is left undecided)."""
        if self._closed:
            return self.report or Report(step=self.steps)
        self._closed = True
        self.found.disarm()
        try:
            report = Report(step=0)
            if self.monitor is not None:  # (built at the first forward: its hooks go even when no step was checked)
                if self.report is None:  # no step was checked: the optimizers the script ends with may tell why
                    self.found.find_optimizers(ended=True)
                    self.found.script_variables()
                closed = self.monitor.close(interrupted=crashed)
                report = closed if self.report is not None or closed.findings else report
        except Exception as error:
            self._warn("closing the run", error)
            report = self.report or Report(step=self.steps)
        finally:
            if self._limit is not None:
                self._limit.remove()
            self.observer.close()  # (after the Monitor's end-of-run decisions, which read the optimizers seen stepping)
            if self._sink is not None:
                try:
                    self._sink.writer.close()
                except Exception as error:
                    self._warn("closing the TensorBoard writer", error)
        self.report = report
        return report

    def summary(self, report: Report, *, crashed: bool = False) -> str:
        """The table at the end, with what the run could not see (``crashed``: the script raised; with no
        optimizer stepped, ``report`` is the structure scan of the modules that ran)."""
        found = self.found
        if not found.optimizers:
            if not crashed and report.findings:  # the modules trained with an optimizer whose steps were not seen
                return f"leafwatch: no optimizer step was seen, nothing was checked\n{report}"
            if not crashed:
                return "leafwatch: no optimizer stepped, nothing was checked."
            if not found.modules_seen():
                return "leafwatch: the script raised before any optimizer stepped or any module ran: nothing was checked."
            return ("leafwatch: the script raised before any optimizer stepped: no gradient was checked, only the "
                    f"structure of the modules that ran\n{report}")
        text = f"leafwatch: summary after {self.steps} optimizer step{'s' if self.steps != 1 else ''}\n{report}"
        failed = self.failed_parts
        if failed:
            text += (f"\nleafwatch: incomplete: {', '.join(failed)} failed inside leafwatch (warned above); "
                     "the findings above may miss some.")
        if not found.roots and not found.seen:
            text += ("\nleafwatch: the script trains no `nn.Module`: its optimizers hold plain tensors, named by the "
                     "script's module-level variables where it keeps them (else by shape).")
        elif found.unhooked.called_directly:  # seen: tensors stepped with gradients, their modules never ran as module(x)
            text += "\n" + self._unhooked_modules()
        if not found.loop_at_module_level:
            text += ("\nleafwatch: the training loop runs inside a function: leafwatch run sees the modules "
                     "that run and the optimizers that step, not tensors created inside functions. A tensor "
                     "trained outside the model (a temperature, a loss weight) left out of the optimizer is not "
                     "seen: flag it with `leafwatch.watch(t)`.")
        return text

"""Runs one unmodified script of ``tests/scripts/`` under ``leafwatch run``'s session, or with a
``Monitor`` the user could have attached before its first forward, and prints what stays open.

``python _run_or_attach.py {run|attach} SCRIPT [ARGS...]`` prints one line, ``OPEN <json>``: the
sorted ``[kind, tensor, severity, status]`` of each open tensor of each open finding.

``attach`` does what a user adding a Monitor to the script would: before the first forward of a
module with parameters once an optimizer exists (or, when no module runs through ``module(x)``,
before the first step, checked by hand for that step), it reads the script's frame for the root
modules (named by their variables when there are several), every optimizer (in a variable, a
plain list or dict, or an attribute of an object of the script's own class) and the module-level
tensors that require grad, and attaches ``Monitor(roots=..., optimizers=..., tensors=...)``.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any, Iterator

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import leafwatch
from leafwatch.integrations.runner.command import run_target
from leafwatch.integrations.runner.session import Session
from leafwatch.observe import frames

_attached: dict[str, leafwatch.Monitor] = {}


def _values(scope: dict[str, Any], nested: bool = True) -> Iterator[Any]:
    for value in list(scope.values()):
        yield value
        if isinstance(value, (list, tuple)):
            yield from value
        elif isinstance(value, dict):
            yield from value.values()
        elif nested and type(value).__module__ == "__main__" and frames.readable(value) \
                and not isinstance(value, (torch.nn.Module, type)) and hasattr(value, "__dict__"):
            yield from _values(vars(value), nested=False)  # an object of the script's own class (a recipe)


def _attach(extra: tuple[torch.optim.Optimizer, ...] = ()) -> None:
    if _attached:
        return
    frame = frames.user_frame(skip=(__file__,))
    if frame is None:
        return
    scope = {**frame.f_globals, **frame.f_locals}
    optimizers: list[torch.optim.Optimizer] = []
    for value in (*_values(scope), *extra):
        if isinstance(value, torch.optim.Optimizer) and all(value is not o for o in optimizers):
            optimizers.append(value)
    if not optimizers:
        return  # built after this forward: attach before the next one
    modules = [v for v in _values(scope) if isinstance(v, torch.nn.Module) and next(v.parameters(), None) is not None]
    roots: list[torch.nn.Module] = []
    for m in modules:
        inside_another = any(m is not o and any(m is s for s in o.modules()) for o in modules)
        if not inside_another and all(m is not r for r in roots):
            roots.append(m)
    names: dict[int, str] = {}
    for key, value in scope.items():
        if isinstance(value, torch.nn.Module):
            names.setdefault(id(value), key)
    named = {("" if len(roots) == 1 else names.get(id(m), type(m).__name__)): m for m in roots}
    owned = {id(p) for m in roots for p in m.parameters()}
    tensors = {k: v for k, v in frame.f_globals.items() if isinstance(v, torch.Tensor) and v.requires_grad
               and id(v) not in owned and not k.startswith("_")}
    _attached["monitor"] = leafwatch.Monitor(roots=named, optimizers=optimizers, tensors=tensors).attach()


def _before_forward(module: torch.nn.Module, args: Any) -> None:
    _attach()


def _before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if not _attached:  # no module ran through module(x) before the first step
        _attach((optimizer,))
        closure = args[1] if len(args) > 1 else kwargs.get("closure")
        if _attached and closure is None:  # (a closure computes this step's gradients inside step(): checked after it)
            _attached["monitor"].check(optimizer)  # this step's check: the attached hooks start with the next


def _open(report: leafwatch.Report) -> list[list[str]]:
    return sorted([f.kind, m.name, f.severity, m.status] for f in report.open for m in f.tensors if m.status == "open")


def main(mode: str, script: str, args: list[str]) -> None:
    crashed: list[BaseException] = []
    if mode == "run":
        session = Session(stream=open(os.devnull, "w"))
        session.install()
        try:  # (as `leafwatch run` does: a script that raised leaves undecided what waits for later steps)
            run_target(script, None, args, explain=lambda error: crashed.append(error) or ())
        finally:
            report = session.close(crashed=bool(crashed))
    else:
        forward = torch.nn.modules.module.register_module_forward_pre_hook(_before_forward)
        step = register_optimizer_step_pre_hook(_before_step)
        sys.argv, sys.path[0] = [script, *args], os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit:
            pass  # (a script that exits: what was checked until then is compared)
        except Exception as error:  # noqa: BLE001 - as a `with Monitor(...)` block left by the exception
            crashed.append(error)
        finally:
            forward.remove()
            step.remove()
            report = _attached["monitor"].close(interrupted=bool(crashed)) if _attached else leafwatch.Report()
    print("OPEN", json.dumps(_open(report)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])

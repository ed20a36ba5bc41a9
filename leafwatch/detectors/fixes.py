"""Fix text in the user's own terms: one place for every detector's snippets.

A fix names what the user wrote, never a placeholder: the variable that holds the optimizer
(``opt``), with its class and groups kept (``opt.add_param_group(...)``, which takes the
optimizer's defaults), or, under Lightning or the Hugging Face Trainer, the place where that
framework builds it (``configure_optimizers``, the Trainer's ``optimizers=`` / ``optim``); the
model's variable (``model.encoder[0].weight``); the module the user assigned (``encoder`` when
every tensor of the group sits under it, not ``encoder.0``); the right-hand side the user wrote
for an attribute (``self.log_scale = nn.Parameter(torch.tensor(x).float())``). What is not known
is said in words ("your optimizer", "your tensor"); every code span is valid Python
(:func:`code_spans` finds them, for the tests).

Names are looked up only when a finding is made (rare, never on a healthy step), in the frames
of the user's code and the script's module-level variables, once per object and structure
snapshot (``Inventory.fix_names`` keeps the names, never an object).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import dis
import functools
import inspect
import linecache
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from ..observe import frames
from ..observe.discovery import paths_to
from ..observe.inventory import unwrap, unwrap_optimizer
from ..observe.names import ancestors
from ..observe.source import Source
from ..report.names import natural_key
from ..report.reasons import Span
from ..report.words import ADVICE, Edit, Remedy, code
from .configured import configured_at, given_too


@dataclasses.dataclass(frozen=True)
class Target:
    """The optimizer a fix gives tensors to, as a reason's field: the framework that builds it
    (``"lightning"``, ``"transformers"`` or None), the user's code for it (``variable``), its class, and
    where the code fix goes (``at``: after the statement that built it; under Lightning, the statement of
    ``configure_optimizers`` that builds it, rewritten)."""

    framework: str | None = None
    variable: str | None = None
    cls: str | None = None
    at: Span | None = None

_MAX_FRAMES = 30
_MAX_VALUES = 1000
#: ``name`` or ``name[3]`` / ``name['k']``: one step of a qualified name that code can spell.
_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[(?:\d+|'[^'\\]*')\])*)$")


# -- what code can spell ----------------------------------------------------------------------
def code_spans(text: str) -> list[str]:
    """The backtick-quoted spans of a fix text (``ignore=[...]`` patterns included)."""
    return re.findall(r"`([^`]+)`", text)


def is_code(snippet: str) -> bool:
    """Whether ``snippet`` is a Python expression or statement."""
    for mode in ("eval", "exec"):
        try:
            compile(snippet, "<fix>", mode)
            return True
        except SyntaxError:
            continue
    return False


def attribute_path(name: str, owner: str) -> str | None:
    """The code for a qualified tensor or module name under the variable ``owner``:
    ``("encoder.0.weight", "model")`` -> ``model.encoder[0].weight``; None when a part cannot be
    spelled (a name leafwatch made up, such as ``optimizers[0] param 3``)."""
    if not name:
        return owner
    out = owner
    for part in name.split("."):
        if part.isdigit():
            out += f"[{part}]"
            continue
        if _PART.match(part) is None:
            return None
        out += f".{part}"
    return out if is_code(out) else None


def module_code(name: str) -> str:
    """A qualified module name as code reads it: ``layers.2`` -> ``layers[2]`` (``name`` itself
    when a part cannot be spelled)."""
    code = attribute_path(name, "_") if name else None
    return code[2:] if code is not None and code.startswith("_.") else name


# -- the user's variables ---------------------------------------------------------------------
def _unwrapped(value: Any) -> Any:
    """The optimizer or module a wrapper holds (accelerate, Fabric, Lightning, DDP, compile), else
    ``value`` (an object that merely holds an optimizer, such as a callback, is no wrapper; nor is an
    object that runs code of its own when read: :func:`leafwatch.observe.frames.readable`)."""
    if not frames.readable(value):  # torch's deprecated `torch.distributed.reduce_op` warns at each read
        return value
    try:
        if isinstance(value, nn.Module):
            return unwrap(value)
        # only optimizer types (AcceleratedOptimizer, LightningOptimizer, _FabricOptimizer): an
        # object that answers every attribute (a mock) is never followed
        if not isinstance(value, torch.optim.Optimizer) and type(value).__name__.endswith("Optimizer"):
            return unwrap_optimizer(value)[0]
    except Exception:
        return value
    return value


def _scopes() -> Iterable[tuple[str, dict[str, Any]]]:
    """``(prefix, variables)`` of the user's frames, innermost first, then the script's globals (read as
    they are: a value that runs code of its own when read is left to its readers, :func:`_unwrapped`
    and :func:`leafwatch.observe.discovery.paths_to`)."""
    for _, frame in zip(range(_MAX_FRAMES), frames.user_frames()):
        local = frame.f_locals
        loops = _loop_targets(frame.f_code)  # `opt` of `for opt in opts:` names a different one each turn
        yield "", {k: v for k, v in list(local.items())[:_MAX_VALUES] if k not in loops}
        owner = local.get("self")
        if owner is not None and frames.readable(owner):
            try:
                yield "self.", dict(list(vars(owner).items())[:_MAX_VALUES])
            except TypeError:
                pass
        yield "", dict(list(frame.f_globals.items())[:_MAX_VALUES])
    main = getattr(sys.modules.get("__main__"), "__dict__", None)
    if isinstance(main, dict):
        yield "", dict(list(main.items())[:_MAX_VALUES])


def variable_for(obj: Any, known: Any = None, cache: dict[Any, Any] | None = None) -> str | None:
    """The user's variable for ``obj`` (``opt``, ``self.optimizer``, ``model``): the innermost
    frame that holds it, directly or through a wrapper (accelerate, Fabric, DDP, compile).
    ``known``: a callable giving object id -> variable (a front-end that read them earlier);
    ``cache``: where an answer is kept for the next finding of the same check (by object id)."""
    if obj is None:
        return None
    obj = _unwrapped(obj)
    if cache is not None:
        key = ("variable", id(obj))
        if key not in cache:
            cache[key] = variable_for(obj, known)
        return cache[key]
    with contextlib.suppress(Exception):  # names a front-end cannot give are looked up here
        if known is not None and (name := known().get(id(obj))):
            return name
    try:
        scopes = list(_scopes())
        for prefix, scope in scopes:
            for key, value in scope.items():
                if key.startswith("_") or not key.isidentifier():
                    continue
                if value is obj or _unwrapped(value) is obj:
                    return prefix + key
        # No variable holds it: the user's path to it (`opts[0]`, `net.optimizer_`, `trainer.head`).
        for prefix, scope in scopes:
            found = paths_to([obj], {k: v for k, v in scope.items() if not k.startswith("_")}, depth=2)
            if found:
                return prefix + found[id(obj)]
    except Exception:  # a frame that cannot be read: the text falls back to words
        return None
    return None


def user_optimizers(limit: int = 8) -> list[Any]:
    """The optimizers the user's scopes hold (a variable, or an entry of a plain list or tuple), in the
    order met; at most ``limit``."""
    out: list[Any] = []
    try:
        for _, scope in _scopes():
            for key, value in scope.items():
                if key.startswith("_"):
                    continue
                for item in (value[:100] if isinstance(value, (list, tuple)) else (value,)):
                    item = _unwrapped(item)
                    if isinstance(item, torch.optim.Optimizer) and all(item is not o for o in out):
                        out.append(item)
                        if len(out) >= limit:
                            return out
    except Exception:  # a scope that cannot be read: the fix says less
        return out
    return out


@functools.lru_cache(maxsize=256)
def _loop_targets(code: Any) -> frozenset[str]:
    """The names a ``for`` loop of ``code`` assigns (read from its bytecode)."""
    out: set[str] = set()
    instructions = list(dis.get_instructions(code))
    for i, instruction in enumerate(instructions[:-1]):
        if instruction.opname == "FOR_ITER":
            following = instructions[i + 1:i + 1 + (instructions[i + 1].argval if instructions[i + 1].opname
                                                      == "UNPACK_SEQUENCE" else 0) + 2]
            out.update(str(ins.argval) for ins in following if ins.opname.startswith("STORE_"))
    return frozenset(out)


# -- the framework that builds the optimizer --------------------------------------------------
def framework(model: Any = None, cache: dict[Any, Any] | None = None) -> str | None:
    """``"lightning"`` when the model is a LightningModule (or a Lightning Trainer runs the
    check), ``"transformers"`` when a Hugging Face Trainer runs it, else None (``cache``: as
    for :func:`variable_for`)."""
    if cache is not None:
        if "framework" not in cache:
            cache["framework"] = framework(model)
        return cache["framework"]
    if model is not None and any(c.__name__ == "LightningModule" for c in type(model).__mro__):
        return "lightning"
    for frame in frames.every_frame():
        owner = frame.f_locals.get("self") if frame.f_code.co_name != "<module>" else None
        if owner is not None:
            for cls in type(owner).__mro__:
                module = getattr(cls, "__module__", "") or ""
                if cls.__name__ == "Trainer" and module.startswith(("lightning", "pytorch_lightning", "transformers")):
                    return "transformers" if module.startswith("transformers") else "lightning"
    return None


# -- giving tensors to an optimizer -----------------------------------------------------------
def tensor_code(name: str, model: Any = None, *, known: Any = None, cache: dict[Any, Any] | None = None) -> str | None:
    """The code for the model's tensor ``name`` (``model.scale``; ``self.scale`` under
    Lightning), or, without a model, for a free tensor the user holds under that name; None
    when unknown."""
    if model is None:
        return name if name.isidentifier() else None
    owner = "self" if framework(model, cache) == "lightning" else variable_for(model, known, cache)
    return None if owner is None else attribute_path(name, owner)


def model_tensor_code(name: str, inventory: Any) -> str | None:
    """The code for a tensor of the inventory's model(s) by its qualified name: the root whose
    prefix the name starts with (``leafwatch run`` with several roots), under its variable."""
    if inventory is None:
        return None
    known, cache = getattr(inventory, "variables", None), getattr(inventory, "fix_names", None)
    roots = getattr(inventory, "roots", {})
    # The longest prefix first: a root named beside the model ("" with "trainer.loss") owns its names.
    for prefix in sorted(roots, key=len, reverse=True):
        if prefix == "" or name.startswith(prefix + "."):
            return tensor_code(name[len(prefix) + 1:] if prefix else name, roots[prefix], known=known, cache=cache)
    return None


def optimizer_target(optimizers: Sequence[Any] = (), *, model: Any = None, variable: str | None = None,
                     known: Any = None, cache: dict[Any, Any] | None = None, built: Any = None) -> Target:
    """The optimizer a fix gives tensors to (:class:`Target`): the framework that builds it, the user's
    variable for it (the first of ``optimizers`` that one holds, unless ``variable`` is given), its class,
    and where the statement that built it stands.

    Args:
        optimizers: The optimizers leafwatch checks.
        model: The model (a LightningModule points at ``configure_optimizers``).
        variable: The optimizer's variable when the caller knows it already.
        known: Object id -> variable, from a front-end (see :func:`variable_for`).
        cache: Answers kept for the next finding (see :func:`variable_for`).
        built: Optimizer -> ``(mark, path:line, variable)`` of the statement that built it, when seen
            (:meth:`leafwatch.observe.observer.Observer.built`): its variable is named before any other
            (never a loop variable that holds it for now), and the fix goes right after that statement.
    """
    where = framework(model, cache)
    held = at = None
    if variable is None and where != "lightning":
        for o in optimizers:
            variable, at = _built_as(o, built, cache)
            if variable is None:
                variable = variable_for(o, known, cache)
                at = _built_at(o, built, variable)
            if variable is not None:
                held = o
                break
    if at is None and held is not None:  # (a variable holds it)
        at = assigned_at(held, variable) or _script_assignment(variable)
    cls = type(optimizers[0]).__name__ if optimizers else None
    if where == "lightning" and model is not None:
        at = configured_at(model, cls)
    return Target(where, variable, cls, at)


def _record(optimizer: Any, built: Any) -> tuple[int, str, str] | None:
    """The built record of ``optimizer`` (:func:`optimizer_target`'s ``built``) when its variable is code."""
    try:
        record = built(_unwrapped(optimizer)) if built is not None else None
    except Exception:
        return None
    return record if record is not None and record[2] and is_code(record[2]) else None


def _built_at(optimizer: Any, built: Any, variable: str | None) -> Span | None:
    """Where the statement that built ``optimizer`` stands, when it assigned ``variable`` (or the list
    ``variable`` indexes); None otherwise."""
    record = _record(optimizer, built) if variable else None
    if record is None or not (variable == record[2] or variable.startswith(record[2] + "[")):  # type: ignore[union-attr]
        return None
    return statement_span(record[1])


def _built_as(optimizer: Any, built: Any, cache: dict[Any, Any] | None = None) -> tuple[str | None, Span | None]:
    """The code for ``optimizer`` by the statement that built it (``opt_d`` of ``opt_d = Adam(...)``;
    ``opts[1]`` of ``opts = [SGD(...), Adam(...)]``) and where that statement stands; ``(None, None)``
    when it was not seen, or its variable holds something else now (its name was used again), or
    no scope holds it now (``cache``: an answer found earlier, kept by object id)."""
    key = ("built as", id(_unwrapped(optimizer)))
    if cache is not None and key in cache:
        return cache[key]
    record = _record(optimizer, built)
    if record is None:
        return None, None
    name = record[2]
    prefix, _, key = name.rpartition(".")  # what `opt` / `self.optimizer` holds now, in the innermost scope with it
    value = next((scope[key] for held_in, scope in _scopes()
                  if held_in == (prefix + "." if prefix else "") and key in scope), None)
    if value is not optimizer and _unwrapped(value) is not optimizer:
        index = next((i for i, v in enumerate(value) if v is optimizer or _unwrapped(v) is optimizer), None) \
            if isinstance(value, (list, tuple)) else None
        if index is None:
            return None, None
        name = f"{name}[{index}]"
    found = (name, statement_span(record[1]))
    if cache is not None:
        cache[key] = found
    return found


def add_words(params: str | None, target: Target, what: str = "it") -> tuple[str, Remedy]:
    """How to give ``params`` (code for a list or an iterable of tensors: ``[model.scale]``,
    ``model.aux.parameters()``; None: "your tensor") to the optimizer ``target``, keeping its class and
    groups; ``what``: the words for the tensors. The code's place is ``target.at`` (read when the finding
    was decided)."""
    where, cls, variable, at = target.framework, target.cls, target.variable, target.at
    if where == "lightning":
        listed = params[1:-1] if params and params.startswith("[") and params.endswith("]") else params
        given = f"`{listed}`" if listed else "your tensor"
        yours = f"your `{cls}`" if cls else "the optimizer"
        given_code = given_too(at, params) if at is not None and params else None
        if given_code is not None:
            written, snippet = given_code
            return (f"in `configure_optimizers`, give {given} to {yours} with the rest: `{snippet}`",
                    code(snippet, at.edit("replace", written)))  # type: ignore[union-attr]
        group = f': a group of its own is fine, `{{"params": {params}}}`' if params else ""
        return f"in `configure_optimizers`, give {given} to {yours} with the rest{group}", ADVICE
    group = f'{{"params": {params}}}' if params else None
    call = f"{variable}.add_param_group({group})" if variable is not None and group is not None else None
    edit = None if call is None or at is None else at.put(call)
    if where == "transformers":
        if call is not None:
            return (f"add {what} to `{variable}`, the optimizer you pass in the Trainer's `optimizers=`, before "
                    f"training: `{call}` (the new group takes its defaults)"), code(call, edit)
        return ("the Trainer builds its optimizer (`optim` in `TrainingArguments`) from the parameters of the "
                f"model that require grad when training starts: register {what} as an `nn.Parameter` of the "
                f"model that requires grad before training, or pass an optimizer of yours that holds {what} "
                "in the Trainer's `optimizers=` (with its scheduler)"), ADVICE
    if call is not None:
        yours = f"your `{cls}`, its groups as they are" if cls else "its groups as they are"
        return (f"add {what} to `{variable}` ({yours}): `{call}`; the new group takes `{variable}`'s defaults (lr, "
                "weight decay, ...), an `\"lr\"` key in the dict sets its own"), code(call, edit)
    defaults = "the new group takes the optimizer's defaults (lr, weight decay, ...), an `\"lr\"` key in the dict sets its own"
    if group is not None:
        return f"add {what} to your optimizer: call its `add_param_group` with `{group}`; {defaults}", ADVICE
    return (f"add your tensor to your optimizer: call its `add_param_group` with a dict whose "
            f"`\"params\"` list holds your tensor; {defaults}"), ADVICE


def inventory_target(inventory: Any, optimizers: Sequence[Any] | None = None, *,
                     variable: str | None = None) -> Target:
    """:func:`optimizer_target` in the inventory's terms (its optimizers, its model, the variables a
    front-end read); ``optimizers``: those to choose from, else all of the inventory's."""
    chosen = list(optimizers) if optimizers is not None else list(getattr(inventory, "optimizers", []))
    return optimizer_target(chosen, model=getattr(inventory, "model", None), variable=variable,
                            known=getattr(inventory, "variables", None), cache=getattr(inventory, "fix_names", None),
                            built=getattr(inventory, "built", None))


def params_of(members_codes: Sequence[str | None], limit: int = 8) -> str | None:
    """The ``"params"`` list of tensors spelled by ``members_codes`` (``[model.a, model.b]``), None when
    one cannot be spelled or there are more than ``limit``."""
    if not members_codes or any(c is None for c in members_codes) or len(members_codes) > limit:
        return None
    return "[" + ", ".join(sorted(dict.fromkeys(members_codes), key=natural_key)) + "]"  # type: ignore[arg-type]


def outside_module(name: str, inventory: Any) -> str | None:
    """The highest module (not the root) holding the tensor ``name`` whose trainable tensors are
    all in no optimizer: the part the user left out as a whole (``aux_head``, not ``aux_head.0``);
    None when the tensor alone is left out."""
    cache = getattr(inventory, "fix_names", None)
    outside = cache.get("outside modules") if cache is not None else None
    if outside is None:
        all_out: dict[str, bool] = {}
        for key, info in inventory.params.items():
            tensor = inventory.tensors.get(key)
            if tensor is None or not tensor.requires_grad:
                continue
            out = key not in inventory.in_optimizer
            for name_ in (info.name, *info.aliases):  # a module that holds the model too is not left out
                for module in ancestors(name_):
                    all_out[module] = all_out.get(module, True) and out
        outside = {m for m, out in all_out.items() if out}
        if cache is not None:
            cache["outside modules"] = outside
    return next((m for m in reversed(ancestors(name)) if m in outside and m in getattr(inventory, "modules", {})), None)


def trainable_params_code(code: str, module: nn.Module) -> str:
    """The code for the tensors of ``module`` (reached by ``code``) an optimizer should get:
    ``encoder.parameters()``, or its trainable ones only when it also holds frozen tensors (a
    LoRA'd model, whose base an optimizer may hold already: ``add_param_group`` refuses a tensor
    twice)."""
    if any(not p.requires_grad for p in module.parameters()):
        return f"[p for p in {code}.parameters() if p.requires_grad]"
    return f"{code}.parameters()"


# -- the module the user should call ----------------------------------------------------------
def module_to_call(module: str, ran: Iterable[str], modules: Any = None) -> str:
    """The module the user should call: the child of the nearest ancestor that ran, on the way
    to ``module`` (``encoder.0`` never ran because ``encoder`` was not called: ``encoder``). A
    container that never runs itself (``nn.ModuleList``: some of its entries ran) is passed
    over for its entry (``modules``: name -> module, when known, tells containers apart)."""
    containers = {name for name, m in (modules or {}).items()
                  if type(m).__name__ in ("ModuleList", "ModuleDict", "ParameterList", "ParameterDict")}
    ran = set(ran)
    parts = module.split(".") if module else []
    for depth in range(len(parts) - 1, -1, -1):
        if ".".join(parts[:depth]) in ran:
            break
    else:
        return module
    for end in range(depth + 1, len(parts) + 1):
        candidate = ".".join(parts[:end])
        if candidate not in containers and not any(r.startswith(candidate + ".") for r in ran):
            return candidate
    return module


# -- an attribute the user assigned -----------------------------------------------------------
def _strip_grad(node: ast.expr) -> ast.expr:
    """``node`` without ``requires_grad=True`` keywords and ``.requires_grad_()`` calls."""

    class Strip(ast.NodeTransformer):
        def visit_Call(self, call: ast.Call) -> Any:
            self.generic_visit(call)
            call.keywords = [k for k in call.keywords if k.arg != "requires_grad"]
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr == "requires_grad_" and not call.args:
                return func.value
            if ast.unparse(func).split(".")[-1] == "Parameter" and len(call.args) == 1:
                return call.args[0]  # re-wrapped as a whole by the fix
            return call

    return Strip().visit(node)


def _nn_name(scope: dict[str, Any]) -> str:
    """How the user's module spells ``torch.nn`` (``nn``, ``torch.nn``)."""
    nn_name = next((key for key, value in scope.items() if value is sys.modules.get("torch.nn")), None)
    torch_name = next((key for key, value in scope.items() if value is sys.modules.get("torch")), None)
    return nn_name or (f"{torch_name}.nn" if torch_name else "nn")


#: Right-hand sides that register already: an assignment with one of them is not the one to fix.
_REGISTERING = ("Parameter", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict")


def _class_sources(module: Any) -> Iterable[tuple[ast.Module, str, Callable[[ast.stmt], Span | None]]]:
    """For each class of ``module``'s MRO outside torch whose source can be read: its parsed source, how its
    module spells ``torch.nn``, and where a statement of it stands (as :func:`statement_span` gives it)."""
    for cls in type(module).__mro__:
        if cls.__module__.startswith(("torch", "builtins")):
            continue
        try:
            lines, first = inspect.getsourcelines(cls)
            tree = ast.parse(textwrap.dedent("".join(lines)))
            path = inspect.getsourcefile(cls)
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        nn_name = _nn_name(vars(sys.modules.get(cls.__module__, object())))
        yield tree, nn_name, lambda node, path=path, first=first: (  # type: ignore[misc]
            statement_span(f"{path}:{first + node.lineno - 1}") if path else None)


def assignment(module: Any, attr: str) -> tuple[str, str, str, Span | None] | None:
    """Where the user's class assigns ``attr``: ``(self's name, the right-hand side, how the class's
    module spells ``torch.nn``, where the statement stands)`` read from the source of the class (and its bases
    outside torch; where: as :func:`statement_span` gives it, None when unknown); an assignment that
    registers already (``nn.Parameter(...)`` in another branch) is passed over."""
    for tree, nn_name, place in _class_sources(module):
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or not func.args.args:
                continue
            me = func.args.args[0].arg
            for node in ast.walk(func):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    if (isinstance(target, ast.Attribute) and target.attr == attr
                            and isinstance(target.value, ast.Name) and target.value.id == me
                            and not (isinstance(node.value, ast.Call)
                                     and ast.unparse(node.value.func).split(".")[-1] in _REGISTERING)):
                        return me, ast.unparse(node.value), nn_name, place(node)
    return None


def registration_args(module: Any, attr: str) -> Assigned:
    """The buffer ``attr`` of ``module`` registered as a parameter in place of its registration
    (``self.register_buffer("scale", torch.ones(1, requires_grad=True))`` ->
    ``self.register_parameter("scale", nn.Parameter(torch.ones(1)))``), read from its class's source
    (:class:`Assigned`; no code when the registration is not one statement of the class)."""
    for tree, nn_name, place in _class_sources(module):
        for node in ast.walk(tree):
            call = node.value if isinstance(node, ast.Expr) else None
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "register_buffer" and isinstance(call.func.value, ast.Name)
                    and len(call.args) >= 2 and isinstance(call.args[0], ast.Constant) and call.args[0].value == attr):
                continue
            value = ast.unparse(_strip_grad(call.args[1]))
            snippet = f"{call.func.value.id}.register_parameter(\"{attr}\", {nn_name}.Parameter({value}))"
            return Assigned(attr, snippet if is_code(snippet) else None, place(node))  # type: ignore[arg-type]
    return Assigned(attr)


@dataclasses.dataclass(frozen=True)
class Assigned:
    """What a fix that registers the attribute ``attr`` as a Parameter needs from the user's source: the
    assignment rewritten (``parameter_code``: ``self.log_scale = nn.Parameter(torch.tensor(x).float())``)
    and where it stands (``at``), read when the finding is decided."""

    attr: str
    parameter_code: str | None = None
    at: Span | None = None


def parameter_args(module: Any, attr: str) -> Assigned:
    """:class:`Assigned` of the attribute ``attr`` of ``module``, read from its class's source."""
    found = assignment(module, attr)
    if found is None:
        return Assigned(attr)
    me, value, nn_name, where = found
    stripped = ast.unparse(_strip_grad(ast.parse(value, mode="eval").body))
    snippet = f"{me}.{attr} = {nn_name}.Parameter({stripped})"
    return Assigned(attr, snippet if is_code(snippet) else None, where)


def parameter_fix(assigned: Assigned) -> tuple[str, Remedy]:
    """Register a module attribute as a Parameter (:func:`parameter_args`), in the words the user
    wrote it with, in place of their assignment."""
    snippet, at = assigned.parameter_code, assigned.at
    if snippet is not None:
        return f"register it where it is assigned: `{snippet}`", code(snippet, _replace(at, snippet))
    attr = assigned.attr
    snippet = f"self.{attr} = nn.Parameter(self.{attr}.detach())"
    if is_code(snippet):
        return (f"register it right after it is assigned: `{snippet}` (or wrap its right-hand side in "
                "`nn.Parameter`)"), code(snippet)
    return "wrap the tensor in `nn.Parameter` where your module assigns it", ADVICE


def _replace(at: Span | None, snippet: str) -> Edit | None:
    """The edit that puts ``snippet`` in place of the statement ``at`` (None when unknown)."""
    return None if at is None else at.put(snippet, "replace")


@dataclasses.dataclass(frozen=True)
class Container:
    """What a fix that registers the plain container ``attr`` needs from the user's source: the container
    kinds (outer first) and its assignment (``me``: self's name, ``value``: the right-hand side, ``nn``: how
    the module spells ``torch.nn``, ``at``: where it stands), read when the finding is decided."""

    attr: str
    kinds: tuple[str, ...]
    me: str | None = None
    value: str | None = None
    nn: str = "nn"
    at: Span | None = None


def container_args(module: Any, attr: str, kinds: Sequence[str]) -> Container:
    """:class:`Container` of the attribute ``attr`` of ``module``, read from its class's source."""
    found = assignment(module, attr) if len(kinds) == 1 else None
    return Container(attr, tuple(kinds)) if found is None else Container(attr, tuple(kinds), *found)


def container_fix(c: Container, *, modules: bool) -> tuple[str, Remedy]:
    """Register a plain container as the registered one (:func:`container_args`):
    ``self.blocks = nn.ModuleList([...])`` with the user's own right-hand side, else
    ``self.blocks = nn.ModuleList(self.blocks)``."""
    kinds, attr = c.kinds, c.attr
    if any(k in ("dataclass", "namedtuple") for k in kinds):
        what = "modules" if modules else "tensors as `nn.Parameter`s"
        return (f"register the {what}: assign them as module attributes, or keep them in "
                f"`nn.ModuleDict`/`nn.ParameterDict` instead of a {'dataclass' if 'dataclass' in kinds else 'namedtuple'}"), ADVICE

    def registered(kind: str, inner: bool) -> str:
        if inner and not modules:
            return "ParameterList" if kind == "list" else "ParameterDict"
        return "ModuleList" if kind == "list" else "ModuleDict"
    if len(kinds) > 1:
        levels = [f"`nn.{registered(k, i == len(kinds) - 1)}`" for i, k in enumerate(kinds)]
        return (f"register every level of `{attr}`: " + " holding ".join(levels)
                + f" (the outer one first), assigned where your module assigns `{attr}`"), ADVICE
    cls, me, value, nn_ = registered(kinds[0], True), c.me, c.value, c.nn
    if me is not None:
        snippet = f"{me}.{attr} = {nn_}.{cls}({value})"
        if is_code(snippet) and len(snippet) <= 160:
            return f"register the container where it is assigned: `{snippet}`", code(snippet, _replace(c.at, snippet))
        snippet = f"{me}.{attr} = {nn_}.{cls}({me}.{attr})"
        return (f"register the container right after it is assigned: `{snippet}`",
                code(snippet, None if c.at is None else c.at.put(snippet)))
    snippet = f"self.{attr} = nn.{cls}(self.{attr})"
    return f"register the container right after it is assigned: `{snippet}`", code(snippet)


def _statement_at(location: str) -> ast.stmt | None:
    """The statement at ``file:line``, parsed from the file."""
    path, _, line = location.rpartition(":")
    tree = Source().tree(path) if path and line.isdigit() else None
    return None if tree is None else innermost(tree, int(line))


def innermost(tree: ast.AST, line: int, kinds: Any = ast.stmt) -> ast.stmt | None:
    """The innermost statement of ``kinds`` under ``tree`` whose lines hold ``line`` (a ``with`` or a function
    holds the assignment)."""
    around = [n for n in ast.walk(tree) if isinstance(n, kinds) and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return min(around, key=lambda n: (n.end_lineno or n.lineno) - n.lineno, default=None)


def statement_span(location: str | None) -> Span | None:
    """Where the statement at ``location`` (``file:line``) stands in its file (:class:`Span`: the
    absolute path, its first and last line, the indentation of its first line); None when the file
    cannot be read."""
    node = _statement_at(location) if location else None
    return None if node is None else span_of(location.rpartition(":")[0], node)  # type: ignore[union-attr]


def span_of(path: str, node: ast.stmt) -> Span:
    """Where ``node``, a statement of the file ``path``, stands (:class:`Span`)."""
    found = Source().span(path, node)
    return Span(found.path, found.start, found.end, found.indent)


def short_place(location: str) -> str:
    """``train.py:12`` of ``/path/to/train.py:12``."""
    path, _, line = location.rpartition(":")
    return f"{os.path.basename(path)}:{line}"


def assigned_at(obj: Any, variable: str) -> Span | None:
    """Where the user's code assigned ``obj`` to ``variable`` (``opt``, ``self.optimizer``): the last
    assignment to it before the running line, in the scope of the innermost user frame that holds
    it under that name (a function, the module, or for ``self.x`` the methods of ``self``'s class),
    as :func:`statement_span` gives it; None when it is not found."""
    attr = variable[5:] if variable.startswith("self.") else None
    if not (attr or variable).isidentifier():
        return None
    for _, frame in zip(range(_MAX_FRAMES), frames.user_frames()):
        local = frame.f_locals
        owner = local.get("self") if attr else None
        if attr is not None and getattr(owner, "__dict__", {}).get(attr) is obj:
            return _last_assignment(frame, variable, scope="class")
        if attr is None and _unwrapped(local.get(variable)) is obj:
            return _last_assignment(frame, variable, scope="function")
        if attr is None and _unwrapped(frame.f_globals.get(variable)) is obj:
            return _last_assignment(frame, variable, scope="module")
    return None


def _script_assignment(variable: str) -> Span | None:
    """The script's last module-level assignment to ``variable`` (its frames are gone: a crash explained
    after the script ended), as :func:`statement_span` gives it; None when not found."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not variable.isidentifier() or not isinstance(path, str) or not path.endswith(".py"):
        return None
    tree = Source().tree(path)
    return _assigned_last(path, tree.body if tree is not None else [], variable)


def _last_assignment(frame: Any, variable: str, scope: str) -> Span | None:
    path, line, source = frame.f_code.co_filename, frame.f_lineno, Source()
    node = source.tree(path) if scope != "function" else source.scope(frame)
    if scope == "class" and node is not None:
        node = next((c for c in ast.walk(node) if isinstance(c, ast.ClassDef) and c.lineno <= line <= (c.end_lineno or 0)
                     and any(isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for f in c.body)), None)
        line = 10**9  # the assignment may be in another method (`__init__`)
    return _assigned_last(path, _statements(node) if node is not None else [], variable, line)


def _assigned_last(path: str, statements: Iterable[ast.stmt], variable: str, line: int = 10**9) -> Span | None:
    """The last of ``statements`` before ``line`` that assigns ``variable``, as :func:`statement_span` gives it."""
    found = [n for n in statements if isinstance(n, ast.Assign) and n.lineno <= line
             and any(ast.unparse(t) == variable for t in n.targets)]
    return statement_span(f"{path}:{found[-1].lineno}") if found else None


def _statements(node: ast.AST) -> Iterable[ast.stmt]:
    """The statements under ``node`` in order, not those of the functions and classes it defines
    (a class's methods are walked for the class itself)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            yield child
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) \
                or isinstance(node, ast.ClassDef):
            yield from _statements(child)


def leaf_assignment(name: str, location: str | None) -> str | None:
    """``name = <what the user wrote, grad asked for last>`` from the assignment at
    ``location`` (``temperature = leafwatch.watch(torch.ones(1).to(torch.float64).requires_grad_(), ...)``)."""
    node = _statement_at(location) if location else None
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        return None
    target = ast.unparse(node.targets[0])
    if target != name:
        return None
    inner = value = node.value
    if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] == "watch" and value.args:
        inner = value.args[0]
    leaf = ast.Call(ast.Attribute(_strip_grad(inner), "requires_grad_", ast.Load()), [], [])
    if inner is not value:
        value.args[0] = leaf
    snippet = f"{target} = {ast.unparse(value if inner is not value else leaf)}"
    return snippet if is_code(snippet) else None


def _operand_groups(node: ast.AST) -> Iterable[list[ast.expr]]:
    """The operands that stand side by side under ``node``: a call's arguments, a list's or tuple's items, the
    terms of a ``+`` chain (``list(a.parameters()) + list(b.parameters())``)."""
    for child in ast.walk(node):
        if isinstance(child, ast.Call):
            yield [a.value if isinstance(a, ast.Starred) else a for a in child.args]
        elif isinstance(child, (ast.List, ast.Tuple, ast.Set)):
            yield [e.value if isinstance(e, ast.Starred) else e for e in child.elts]
        elif isinstance(child, ast.BinOp) and isinstance(child.op, ast.Add):
            terms: list[ast.expr] = []
            stack: list[ast.expr] = [child]
            while stack:
                term = stack.pop()
                if isinstance(term, ast.BinOp) and isinstance(term.op, ast.Add):
                    stack.extend((term.right, term.left))
                else:
                    terms.append(term)
            yield terms


def _receiver(operand: ast.expr, module: str) -> ast.expr | None:
    """The node that spells ``module`` in ``operand`` when the operand is ``module``'s parameters
    (``module.parameters()``, ``list(module.parameters())``, ``module.named_parameters()``...)."""
    for node in ast.walk(operand):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("parameters", "named_parameters") and ast.unparse(node.func.value) == module):
            return node.func.value
    return None


def corrected_operand(location: str, twice: str, meant: str) -> tuple[str, Edit, str] | None:
    """The statement that lists the parameters of the module ``twice`` (its code) twice side by side, with
    ``meant`` in place of the second: the optimizer's statement at ``location`` (``file:line``), or a statement
    of the same scope up to 30 lines above it that builds its parameter list (``params = list(d1.parameters())
    + list(d1.parameters())``). ``(the corrected statement, its edit, where it stands)``; None when not found."""
    path, _, line = location.rpartition(":")
    tree = Source().tree(path)
    if tree is None:
        return None
    lineno = int(line) if line.isdigit() else 0
    statements = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.Expr, ast.Return))
                         and lineno - 30 <= n.lineno <= lineno <= (n.end_lineno or n.lineno) + 30),
                        key=lambda n: -n.lineno)
    for statement in statements:
        for group in _operand_groups(statement):
            found = [r for r in (_receiver(o, twice) for o in group) if r is not None]
            if len(found) < 2 or any(_receiver(o, meant) is not None for o in group):
                continue
            made = rewritten(path, statement, found[1], meant)
            return None if made is None else (*made, f"{os.path.basename(path)}:{statement.lineno}")
    return None


def rewritten(path: str, statement: ast.stmt, node: ast.expr, text: str,
              valid: Callable[[str], bool] = is_code) -> tuple[str, Edit] | None:
    """``statement`` of the file ``path`` with ``node`` (on one line) spelled ``text``: its code and its edit;
    None when ``node`` spans lines or the new statement is not ``valid``."""
    lines = linecache.getlines(path)
    first, last = statement.lineno, statement.end_lineno or statement.lineno
    if node.end_lineno != node.lineno or node.end_col_offset is None or not lines[first - 1:last] \
            or not lines[node.lineno - 1].isascii():
        return None
    own = lines[first - 1:last]
    row = node.lineno - first
    own[row] = own[row][:node.col_offset] + text + own[row][node.end_col_offset:]
    new = "".join(own)
    snippet = textwrap.dedent(new).strip()
    if not valid(snippet):
        return None
    if "\n" in snippet and is_code(snippet):  # the fix's words give it on one line; the edit keeps the user's lines
        snippet = ast.unparse(ast.parse(snippet))
    return snippet, Edit(os.path.abspath(path), first, last, "replace", new)


@dataclasses.dataclass(frozen=True)
class LeafFix:
    """What the fix of a non-leaf needs from the user's source, read when the finding is decided: the
    statement that assigned it rewritten to make a leaf (``leaf_code``) and where it stands (``at``); the
    optimizer the leaf goes to (``target``, for a tensor no optimizer holds: the fix makes it a leaf *and*
    hands it over), and the one edit that does both where the two statements stand together (``together``)."""

    leaf_code: str | None = None
    at: Span | None = None
    target: Target | None = None
    together: Edit | None = None


def leaf_fix_args(name: str, location: str | None, *, tensor: Any = None, target: Target | None = None,
                  origin: Any = None) -> LeafFix:
    """:class:`LeafFix` of the non-leaf ``name``: the statement at ``location`` or, without one, the user's
    last assignment of ``tensor`` to the variable ``name``; ``origin``: what made it (the leaf's code)."""
    at = statement_span(location)
    if at is None and tensor is not None and name.isidentifier():
        at = assigned_at(tensor, name)
        location = f"{at.path}:{at.start}" if at is not None else None
    code = leaf_assignment(name, location)
    if target is None or not name.isidentifier():
        return LeafFix(code, at, target)
    _, made = leaf_fix(name, origin, LeafFix(code, at))
    add = add_words(f"[{name}]", target, what="the leaf")[1]
    both = made.edit is not None and add.applicability == "code" and target.at is not None
    together = _both(made.edit, at.indent, target.at, add.code) if both else None  # type: ignore[union-attr, arg-type]
    return LeafFix(code, at, target, together)


_NON_LEAF_WORDS = {
    "device": "create it where it lives (`device={device!r}` when creating it), or move first, then ask for grad",
    "dtype": "convert first, then ask for grad (or pass `dtype={dtype}` when creating it)",
    "clone": "make the copy a leaf",
    "arithmetic": "do the arithmetic first, then ask for grad",
    "view": "make the slice its own leaf, or slice the leaf where it is used",
    "other": "make it a leaf (or an `nn.Parameter`)",
}


def leaf_fix(name: str | None, origin: Any, fix: LeafFix) -> tuple[str, Remedy]:
    """The fix for the non-leaf tensor ``name`` (None: the user holds it under no name; ``origin``: what made
    it, a :class:`~leafwatch.detectors.leaves.Origin`): the statement that assigned it rewritten (``fix.leaf_code``, placed at ``fix.at``), else a leaf made
    from it right after it is made, else words."""
    kind = origin.kind if origin is not None else "other"
    hint = "device" if kind == "copy" else kind
    words = _NON_LEAF_WORDS.get(hint, _NON_LEAF_WORDS["other"]).format(
        device=origin.device if origin else "cpu", dtype=origin.dtype if origin else "")
    at, written = fix.at, fix.leaf_code
    if name is None:
        return (f"{words}, then hand the leaf to the optimizer: leafwatch has no name for this tensor (give it one "
                "with `watch()`'s `name=` or a key of `tensors=`)"), ADVICE
    if written is not None:
        return _handed_over(name, f"{words}: `{written}`", written, _replace(at, written), fix)
    if all(part.isidentifier() for part in name.split(".")):
        snippet = f"{name} = {name}.detach(){'.clone()' if hint in ('view', 'clone') else ''}.requires_grad_()"
        return _handed_over(name, f"{words}: `{snippet}` right after it is made", snippet,
                            None if at is None else at.put(snippet), fix)
    return (f"{words}. `{name}` is a name leafwatch made up: name your tensor with `watch()`'s `name=` "
            "or a key of `tensors=`"), ADVICE


def _handed_over(name: str, words: str, snippet: str, edit: Edit | None, fix: LeafFix) -> tuple[str, Remedy]:
    """The leaf fix ``words`` (``snippet``, placed by ``edit``) followed by handing the leaf ``name`` to the
    optimizer ``fix.target`` (none: the leaf fix alone), placed by ``fix.together`` (else not placed)."""
    if fix.target is None or not name.isidentifier():
        return words, code(snippet, edit)
    add, remedy = add_words(f"[{name}]", fix.target, what="the leaf")
    return f"{words}; then {add}", code(f"{snippet}\n{remedy.code}", fix.together) if remedy.applicability == "code" \
        else ADVICE


def _both(leaf: Edit, indent: str, at: Span, call: str) -> Edit | None:
    """One edit that makes the leaf (``leaf``, of a statement indented by ``indent``) and then calls ``call`` after
    the optimizer's statement ``at``: read from the file when the finding is decided."""
    if os.path.abspath(leaf.path) != at.path:
        return None
    lines = linecache.getlines(at.path)
    if indent != at.indent:
        return None  # a loop or a function between them: where the call goes is not plain
    made = leaf.text if leaf.action == "replace" else "".join(lines[leaf.start - 1:leaf.end]) + leaf.text
    added = f"{indent}{call}\n"
    if leaf.start > at.end:  # made after the optimizer was built: handed over right after it is made
        return Edit(leaf.path, leaf.start, leaf.end, "replace", made + added)
    if leaf.end < at.start and at.end - leaf.end <= 40:
        between = "".join(lines[leaf.end:at.end])
        return Edit(leaf.path, leaf.start, at.end, "replace", made + between + added)
    return None


__all__ = ["trainable_params_code", "assignment", "attribute_path", "code_spans", "container_fix",
           "framework", "is_code", "leaf_assignment", "leaf_fix", "model_tensor_code", "module_code", "module_to_call",
           "parameter_fix", "tensor_code", "variable_for"]

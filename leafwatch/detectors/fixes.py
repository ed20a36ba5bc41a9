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
import dis
import functools
import inspect
import linecache
import re
import sys
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from ..observe import frames
from ..observe.discovery import paths_to
from ..observe.inventory import unwrap, unwrap_optimizer
from ..observe.names import ancestors

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
    if known is not None:
        try:
            name = known().get(id(obj))
        except Exception:
            name = None
        if name:
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
def tensor_code(name: str, model: Any = None, *, owner: str | None = None, known: Any = None,
                cache: dict[Any, Any] | None = None) -> str | None:
    """The code for the model's tensor ``name`` (``model.scale``; ``self.scale`` under
    Lightning), or, without a model, for a free tensor the user holds under that name; None
    when unknown."""
    if owner is None and model is not None:
        owner = "self" if framework(model, cache) == "lightning" else variable_for(model, known, cache)
        if owner is None:
            return None
    if owner is not None:
        return attribute_path(name, owner)
    return name if name.isidentifier() else None


def model_tensor_code(name: str, inventory: Any) -> str | None:
    """The code for a tensor of the inventory's model(s) by its qualified name: the root whose
    prefix the name starts with (``leafwatch run`` with several roots), under its variable."""
    if inventory is None:
        return None
    known, cache = getattr(inventory, "variables", None), getattr(inventory, "fix_names", None)
    roots = getattr(inventory, "roots", {})
    # The longest prefix first: a root named beside the model ("" with "trainer.loss") owns its names.
    for prefix in sorted(roots, key=len, reverse=True):
        if prefix == "":
            return tensor_code(name, roots[prefix], known=known, cache=cache)
        if name.startswith(prefix + "."):
            return tensor_code(name[len(prefix) + 1:], roots[prefix], known=known, cache=cache)
    return None


def add_to_optimizer(params: str | None, optimizers: Sequence[Any] = (), *, model: Any = None,
                     what: str = "it", variable: str | None = None, known: Any = None,
                     cache: dict[Any, Any] | None = None) -> str:
    """How to give ``params`` (code for a list or an iterable of tensors: ``[model.scale]``,
    ``model.aux.parameters()``; None: "your tensor") to the optimizer the user already has,
    keeping its class and groups.

    Args:
        params: The ``"params"`` value in code, or None when it cannot be spelled.
        optimizers: The optimizers leafwatch checks (the first one that a variable holds is named).
        model: The model (a LightningModule points at ``configure_optimizers``).
        what: The words for the tensors (``it``, ``them``).
        variable: The optimizer's variable when the caller knows it already.
        known: Object id -> variable, from a front-end (see :func:`variable_for`).
        cache: Answers kept for the next finding (see :func:`variable_for`).
    """
    where = framework(model, cache)
    cls = type(optimizers[0]).__name__ if optimizers else None
    if where == "lightning":
        listed = params[1:-1] if params and params.startswith("[") and params.endswith("]") else params
        given = f"`{listed}`" if listed else "your tensor"
        yours = f"your `{cls}`" if cls else "the optimizer"
        group = f': a group of its own is fine, `{{"params": {params}}}`' if params else ""
        return f"in `configure_optimizers`, give {given} to {yours} with the rest{group}"
    group = f'{{"params": {params}}}' if params else None
    if variable is None:
        variable = next((v for v in (variable_for(o, known, cache) for o in optimizers) if v is not None), None)
    if where == "transformers":
        if variable is not None and group is not None:
            return (f"add {what} to `{variable}`, the optimizer you pass in the Trainer's `optimizers=`, before "
                    f"training: `{variable}.add_param_group({group})` (the new group takes its defaults)")
        return ("the Trainer builds its optimizer (`optim` in `TrainingArguments`) from the parameters of the "
                f"model that require grad when training starts: register {what} as an `nn.Parameter` of the "
                f"model that requires grad before training, or pass an optimizer of yours that holds {what} "
                "in the Trainer's `optimizers=` (with its scheduler)")
    if variable is not None and group is not None:
        yours = f"your `{cls}`, its groups as they are" if cls else "its groups as they are"
        return (f"add {what} to `{variable}` ({yours}): `{variable}.add_param_group({group})`; the new group "
                f"takes `{variable}`'s defaults (lr, weight decay, ...), an `\"lr\"` key in the dict sets its own")
    defaults = "the new group takes the optimizer's defaults (lr, weight decay, ...), an `\"lr\"` key in the dict sets its own"
    if group is not None:
        return f"add {what} to your optimizer: call its `add_param_group` with `{group}`; {defaults}"
    return (f"add your tensor to your optimizer: call its `add_param_group` with a dict whose "
            f"`\"params\"` list holds your tensor; {defaults}")


def give_to_optimizer(names: Sequence[str], inventory: Any, optimizers: Sequence[Any] | None = None, *,
                      what: str = "it") -> str:
    """:func:`add_to_optimizer` for the inventory's tensors ``names``, in the inventory's terms
    (its optimizers, its model's variable, the variables a front-end read)."""
    model, known = getattr(inventory, "model", None), getattr(inventory, "variables", None)
    codes = [model_tensor_code(n, inventory) for n in names]
    params = "[" + ", ".join(c for c in codes if c) + "]" if codes and all(codes) else None
    chosen = list(optimizers) if optimizers is not None else list(getattr(inventory, "optimizers", []))
    return add_to_optimizer(params, chosen, model=model, what=what, known=known,
                            cache=getattr(inventory, "fix_names", None))


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
    nn_module = sys.modules.get("torch.nn")
    for key, value in scope.items():
        if value is nn_module:
            return key
    for key, value in scope.items():
        if value is sys.modules.get("torch"):
            return f"{key}.nn"
    return "nn"


#: Right-hand sides that register already: an assignment with one of them is not the one to fix.
_REGISTERING = ("Parameter", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict")


def assignment(module: Any, attr: str) -> tuple[str, str, dict[str, Any]] | None:
    """Where the user's class assigns ``attr``: ``(self's name, the right-hand side, the class's
    module globals)`` read from the source of the class (and its bases outside torch); an
    assignment that registers already (``nn.Parameter(...)`` in another branch) is passed over."""
    for cls in type(module).__mro__:
        if cls.__module__.startswith(("torch", "builtins")):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        scope = vars(sys.modules.get(cls.__module__, object()))
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
                        return me, ast.unparse(node.value), dict(scope)
    return None


def parameter_fix(module: Any, attr: str) -> str:  # noqa: D401
    """Register a module attribute as a Parameter, in the words the user wrote it with:
    ``self.log_scale = nn.Parameter(torch.tensor(x).float())``."""
    found = assignment(module, attr) if module is not None else None
    if found is not None:
        me, value, scope = found
        stripped = ast.unparse(_strip_grad(ast.parse(value, mode="eval").body))
        snippet = f"{me}.{attr} = {_nn_name(scope)}.Parameter({stripped})"
        if is_code(snippet):
            return f"register it where it is assigned: `{snippet}`"
    snippet = f"self.{attr} = nn.Parameter(self.{attr}.detach())"
    return f"register it right after it is assigned: `{snippet}` (or wrap its right-hand side in `nn.Parameter`)" \
        if is_code(snippet) else "wrap the tensor in `nn.Parameter` where your module assigns it"


def container_fix(module: Any, attr: str, kinds: Sequence[str], *, modules: bool) -> str:
    """Register a plain container as the registered one: ``self.blocks = nn.ModuleList([...])``
    with the user's own right-hand side, else ``self.blocks = nn.ModuleList(self.blocks)``."""
    if any(k in ("dataclass", "namedtuple") for k in kinds):
        what = "modules" if modules else "tensors as `nn.Parameter`s"
        return (f"register the {what}: assign them as module attributes, or keep them in "
                f"`nn.ModuleDict`/`nn.ParameterDict` instead of a {'dataclass' if 'dataclass' in kinds else 'namedtuple'}")
    def registered(kind: str, inner: bool) -> str:
        if inner and not modules:
            return "ParameterList" if kind == "list" else "ParameterDict"
        return "ModuleList" if kind == "list" else "ModuleDict"
    if len(kinds) > 1:
        levels = [f"`nn.{registered(k, i == len(kinds) - 1)}`" for i, k in enumerate(kinds)]
        return (f"register every level of `{attr}`: " + " holding ".join(levels)
                + f" (the outer one first), assigned where your module assigns `{attr}`")
    cls = registered(kinds[0], True)
    found = assignment(module, attr) if module is not None else None
    if found is not None:
        me, value, scope = found
        snippet = f"{me}.{attr} = {_nn_name(scope)}.{cls}({value})"
        if is_code(snippet) and len(snippet) <= 160:
            return f"register the container where it is assigned: `{snippet}`"
        snippet = f"{me}.{attr} = {_nn_name(scope)}.{cls}({me}.{attr})"
    else:
        snippet = f"self.{attr} = nn.{cls}(self.{attr})"
    return f"register the container right after it is assigned: `{snippet}`"


def _statement_at(location: str) -> ast.stmt | None:
    """The statement at ``file:line``, parsed from the file."""
    path, _, line = location.rpartition(":")
    if not path or not line.isdigit():
        return None
    try:
        tree = ast.parse("".join(linecache.getlines(path)))
    except SyntaxError:
        return None
    lineno = int(line)
    around = [node for node in ast.walk(tree)
              if isinstance(node, ast.stmt) and node.lineno <= lineno <= (node.end_lineno or node.lineno)]
    # the innermost statement (a `with` or a function holds the assignment)
    return min(around, key=lambda n: (n.end_lineno or n.lineno) - n.lineno, default=None)


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
        snippet = f"{target} = {ast.unparse(value)}"
    else:
        snippet = f"{target} = {ast.unparse(leaf)}"
    return snippet if is_code(snippet) else None


_NON_LEAF_WORDS = {
    "device": "create it where it lives (`device=` when creating it), or move first, then ask for grad",
    "dtype": "convert first, then ask for grad (or pass `dtype=` when creating it)",
    "clone": "make the copy a leaf",
    "arithmetic": "do the arithmetic first, then ask for grad",
    "view": "make the slice its own leaf, or slice the leaf where it is used",
    "other": "make it a leaf (or an `nn.Parameter`)",
}


def non_leaf(name: str, found: Any = None, *, location: str | None = None, tensor: Any = None) -> str:
    """The fix for a non-leaf tensor (``found``: its :class:`leafwatch.observe.graph.Origin`), from the
    statement that assigned it when ``location`` points at it, else from its name."""
    hint = getattr(found, "fix_hint", "other")
    words = _NON_LEAF_WORDS.get(hint, _NON_LEAF_WORDS["other"])
    if tensor is not None:
        words = words.replace("`device=`", f"`device={str(tensor.device)!r}`").replace(
            "`dtype=`", f"`dtype={tensor.dtype}`")
    written = leaf_assignment(name, location)
    if written is not None:
        return f"{words}: `{written}`"
    if all(part.isidentifier() for part in name.split(".")):
        copy = ".clone()" if hint in ("view", "clone") else ""
        return f"{words}: `{name} = {name}.detach(){copy}.requires_grad_()` right after it is made"
    return (f"{words}. `{name}` is a name leafwatch made up: name your tensor with `watch()`'s `name=` "
            "or a key of `tensors=`")


__all__ = ["add_to_optimizer", "trainable_params_code", "assignment", "attribute_path", "code_spans", "container_fix",
           "framework", "is_code", "leaf_assignment", "model_tensor_code", "module_code", "module_to_call", "non_leaf",
           "parameter_fix", "tensor_code", "variable_for"]

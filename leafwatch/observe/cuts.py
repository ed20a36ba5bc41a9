"""Observed graph cuts: the operations inside a forward pass that leave autograd.

On an instrumented forward (see :class:`leafwatch.observe.tracing.Tracer`) a
:class:`torch.overrides.TorchFunctionMode` watches every torch call and records the few that take
a tensor out of autograd: ``.detach()``/``.detach_()``, ``.data``, ``.numpy()``/``__array__``,
``.tolist()``, ``.item()``, ``float()``/``int()``, ``torch.tensor``/``torch.as_tensor`` of a
tensor that requires grad, and any op run under ``torch.no_grad()`` (or with grad switched off)
on an input that requires grad. Each cut keeps its place in the code and the ids of the leaf
tensors upstream of what it cut, nothing else: no tensor and no autograd node outlives the
forward. A parameter that later misses its gradient and is upstream of a cut is explained by
that cut, at that line.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from . import follow as follow_
from . import frames, graph

#: Autograd nodes one cut site may visit in all (its upstream walks share what they saw).
MAX_NODES_PER_SITE = graph.MAX_NODES
#: Distinct cut sites kept per forward (a loop that cuts at a new line each time is bounded).
MAX_SITES = 64

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_TORCH_NN_DIR = _TORCH_DIR + "nn" + os.sep
#: torch.nn code that touches a parameter without autograd to set it up, never to compute with
#: it (a lazy module materializing and initializing its parameters in its first forward).
_TORCH_SETUP = tuple(_TORCH_NN_DIR + f for f in ("parameter.py", "init.py", os.path.join("modules", "lazy.py")))

#: Ops that give a value without autograd: the label shown, and the rank used when one tensor is
#: upstream of several cuts (a graph rewired by hand outranks a number read out for logging).
_OPS: dict[Any, tuple[str, int]] = {
    torch.Tensor.detach: ("`.detach()`", 0),
    torch.Tensor.detach_: ("`.detach_()`", 0),
    torch.Tensor.data.__get__: ("`.data`", 0),
    torch.tensor: ("`torch.tensor(...)`", 1),
    torch.as_tensor: ("`torch.as_tensor(...)`", 1),
    torch.Tensor.numpy: ("`.numpy()`", 1),
    torch.Tensor.__array__: ("a NumPy conversion (`np.asarray`)", 1),
    torch.Tensor.tolist: ("`.tolist()`", 1),
    torch.Tensor.item: ("`.item()`", 2),
    torch.Tensor.__float__: ("`float(...)`", 2),
    torch.Tensor.__int__: ("`int(...)`", 2),
}
#: Ops whose gradient is zero wherever it is defined: no cut (the result keeps a graph), but a
#: tensor whose every path to the loss passes through one gets a gradient that is exactly zero.
_ZERO_GRADIENT_OPS: dict[Any, str] = {
    **{getattr(torch, n): f"`torch.{n}()`" for n in ("round", "floor", "ceil", "trunc", "fix", "sign", "sgn")},
    **{getattr(torch.Tensor, n): f"`.{n}()`" for n in ("round", "floor", "ceil", "trunc", "fix", "sign", "sgn")},
}
#: Ops whose result is a tensor that may keep its graph (``torch.as_tensor`` of a tensor returns
#: it as it is): a cut only when the result does not require grad.
_MAY_KEEP_GRAPH = {torch.tensor, torch.as_tensor}
_SET_GRAD_ENABLED = torch._C._set_grad_enabled
#: Conversions that may give an integer (or bool) tensor, which carries no gradient in any form: a cut
#: when the result is one (``.round().long()`` pixel indices).
_INTEGER_METHODS: dict[Any, str] = {
    **{getattr(torch.Tensor, n): f"`.{n}()`" for n in ("long", "int", "short", "char", "byte", "bool")},
    torch.Tensor.to: "`.to(...)`", torch.Tensor.type: "`.type(...)`"}
#: Autograd nodes of ops whose gradient is zero almost everywhere, as the words name them.
_STEP_NODES = {"RoundBackward": "round", "FloorBackward": "floor", "CeilBackward": "ceil", "TruncBackward": "trunc",
               "SignBackward": "sign", "FracBackward": "frac"}
#: The calls that switch a tensor's ``requires_grad`` on in place (``t.requires_grad_()``, ``t.requires_grad = True``).
_SWITCHES_ON = {torch.Tensor.requires_grad_, torch.Tensor.requires_grad.__set__}
#: The names of the ops that add (``a + b``, ``torch.add``, ``a.add_(b)``): a tensor a forward switched on and then
#: only added to others is a loss's starting value, whose gradient is the loss's own.
ADDITIONS = frozenset({"add", "add_", "__add__", "__radd__", "__iadd__"})


@dataclasses.dataclass(frozen=True)
class SwitchedOn:
    """A leaf tensor whose ``requires_grad`` a forward switched on in place, and where: ``called_from``
    is the user's line that called into the library holding ``place`` (None: ``place`` is the user's)."""

    tensor: follow_.Ref  # through the module that holds it, else weakly
    place: Place
    called_from: Place | None
    #: The names of the ops the rest of that forward applied to it (``{"add"}``: only added to others).
    ops: set[str] = dataclasses.field(default_factory=set, compare=False)

    @property
    def added_only(self) -> bool:
        """Whether the forward used it, and only in additions (``loss = self.zero; loss.requires_grad_();
        loss = loss + term``): a loss's starting value, which has nothing to learn."""
        return bool(self.ops) and self.ops <= ADDITIONS


@dataclasses.dataclass(frozen=True)
class Place:
    """A line of code: the file, the line and the function."""

    file: str
    line: int
    function: str

    @classmethod
    def of(cls, frame: FrameType) -> Place:
        code = frame.f_code
        return cls(code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name))

    def __str__(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def described(self) -> str:
        """``deep.py:13 (in `Deep.forward`)``."""
        return f"{self} (in `{self.function}`)" if self.function and not self.function.startswith("<") else str(self)


@dataclasses.dataclass(frozen=True)
class CutSite:
    """Where a tensor left autograd: the op, its line, and the user's call into the library that ran it."""

    op: str
    place: Place
    #: The user's line that called into the library holding ``place``; None when ``place`` is the user's.
    called_from: Place | None
    rank: int = 0


@dataclasses.dataclass
class Cut:
    """One cut site and the ids of the leaf tensors upstream of what it cut there."""

    site: CutSite
    leaves: set[int]
    order: int
    complete: bool = True
    #: The leaves the op was applied to themselves (`self.weight.data`), not to a value made from them.
    direct: set[int] = dataclasses.field(default_factory=set)
    #: The integer dtype the op converted to (``torch.int64``): no gradient in any form; None for another cut.
    integer: str | None = None
    #: The ops of zero gradient met upstream of an integer cut (``floor``, ``round``): the values were rounded.
    steps: tuple[str, ...] = ()


def is_integer(dtype: Any) -> bool:
    """Whether ``dtype`` is a torch dtype that holds no gradient (integers, bool)."""
    return isinstance(dtype, torch.dtype) and not (dtype.is_floating_point or dtype.is_complex)


def _steps_upstream(sources: list[torch.Tensor]) -> tuple[str, ...]:
    found: dict[str, None] = {}
    seen: set[int] = set()
    for t in sources:
        for node in graph.iter_nodes(t.grad_fn, MAX_NODES_PER_SITE, seen):
            step = _STEP_NODES.get(type(node).__name__.rstrip("0123456789"))
            if step is not None:
                found[step] = None
    return tuple(found)


def _is_internal(filename: str) -> bool:
    """Frames that are never the op's place: leafwatch, and torch outside ``torch.nn`` (a
    ``no_grad`` context manager, ``Tensor.__array__``, the decorator of ``@torch.no_grad()``)."""
    return filename.startswith(frames.PACKAGE_DIR) or (
        filename.startswith(_TORCH_DIR) and not filename.startswith(_TORCH_NN_DIR))


def place_of_call(frame: FrameType | None) -> tuple[Place, Place | None] | None:
    """The line that made a torch call (``frame``: the caller of ``__torch_function__``), and the
    user's line that called into the library holding it (None when the line is the user's own).
    None for a call made by leafwatch itself (its own hooks run inside the forward too)."""
    while frame is not None and _is_internal(frame.f_code.co_filename) \
            and not frame.f_code.co_filename.startswith(frames.PACKAGE_DIR):
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith(frames.PACKAGE_DIR) \
            or frames.on_stack(frame, 8, lambda f: f.startswith(_TORCH_SETUP)):  # a torch.nn setup step
        return None
    user = next(frames.outside(frame), None)
    return Place.of(frame), None if user is None or user is frame else Place.of(user)


def _switch_name(frame: FrameType | None) -> str:
    """How grad mode was switched off, from torch's frames above the switch: a ``torch.no_grad()``
    block (or decorator) or ``torch.set_grad_enabled(False)``."""
    for _ in range(4):
        if frame is None or not _is_internal(frame.f_code.co_filename):
            break
        if "no_grad" in getattr(frame.f_code, "co_qualname", frame.f_code.co_name):
            return "`torch.no_grad()`"
        frame = frame.f_back
    return "`torch.set_grad_enabled(False)`"


def _tensors_in(args: Iterable[Any]) -> list[torch.Tensor]:
    """The tensors among ``args`` and in the lists and tuples among them (``torch.stack``'s, at most 64 each)."""
    return [t for a in args for t in (a[:64] if isinstance(a, (list, tuple)) else (a,)) if isinstance(t, torch.Tensor)]


def _inputs_with_grad(args: Iterable[Any]) -> list[torch.Tensor]:
    return [t for t in _tensors_in(args) if t.requires_grad]


def _at_callers_line(func: Any, args: tuple[Any, ...], kwargs: Any, caller: FrameType) -> Any:
    """``func(*args, **kwargs)`` with the warnings it raises put on ``caller``'s line: a cutting op
    (``float(t)``, ``.item()`` on a tensor that requires grad) warns from C++ at the Python frame that
    called it, which here is this mode's, not the code that wrote the op. Only cutting ops come here."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = func(*args, **kwargs)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, caller.f_code.co_filename, caller.f_lineno,
                               module=caller.f_globals.get("__name__"),
                               registry=caller.f_globals.setdefault("__warningregistry__", {}))
    return result


class CutRecorder(TorchFunctionMode):
    """Records the cuts of one forward pass (entered by the Tracer's root pre-hook, left at its end)."""

    def __init__(self, first_order: int, follow: Callable[[torch.Tensor], follow_.Ref]) -> None:
        super().__init__()
        #: How a tensor switched to requires_grad is followed (the Tracer's: through the module that holds it).
        self._follow = follow
        self.cuts: dict[tuple[str, Place, Place | None], Cut] = {}
        #: Where an op of zero gradient ran on a tensor that requires grad, with the leaves upstream.
        self.zero_ops: dict[tuple[str, Place, Place | None], Cut] = {}
        self._seen: dict[tuple[str, Place, Place | None], set[int]] = {}
        self._order = first_order
        #: Where grad mode was switched off inside the forward (a ``with torch.no_grad():`` line).
        self._off_at: tuple[str, tuple[Place, Place | None]] | None = None
        #: Leaf tensors whose ``requires_grad`` was switched on in place during the forward, by id.
        self.switched_on: dict[int, SwitchedOn] = {}
        #: The first error inside the mode; the Tracer warns once and trusts nothing it recorded.
        self.error: BaseException | None = None

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.switched_on and self.error is None:
            self._used(func, args)
        try:
            op = _OPS.get(func)
        except TypeError:  # an unhashable callable
            op = None
        if op is None:
            to_integer = False
            try:  # a failure is kept in `error` (the Tracer trusts nothing recorded), never raised in the forward
                if func is _SET_GRAD_ENABLED:
                    self._switch(args)
                elif not torch.is_grad_enabled() and self.error is None:
                    self._op_without_grad(func, args)
                elif func in _ZERO_GRADIENT_OPS and self.error is None:
                    self._zero_gradient(func, args)
                elif func in _SWITCHES_ON and self.error is None:
                    self._switch_on(func, args, kwargs)
                else:
                    to_integer = func in _INTEGER_METHODS and self.error is None and bool(args) \
                        and isinstance(args[0], torch.Tensor) and args[0].requires_grad
            except Exception as error:
                self.error = error
            return self._to_integer(func, args, kwargs) if to_integer else func(*args, **kwargs)
        integer = kwargs.get("dtype") if func in _MAY_KEEP_GRAPH and is_integer(kwargs.get("dtype")) else None
        if integer is not None:  # `torch.as_tensor(box, dtype=torch.long)`: indices
            op = (f"{op[0][:-5]}..., dtype={integer})`", op[1])
        # The inputs of the cutting op that require grad (``torch.tensor([a, b])`` reads each).
        cut_from = args[:1] if args and (isinstance(args[0], torch.Tensor) or func is torch.tensor) else ()
        sources = _inputs_with_grad(cut_from) if self.error is None else []
        if not sources:
            return func(*args, **kwargs)
        # Read before the call: `.detach_()` takes the graph away from its input.
        try:
            where = place_of_call(sys._getframe(1))
            cut = self._cut(op, where, sources) if where is not None else None
            if cut is not None and integer is not None and cut.integer is None:
                cut.integer, cut.steps = str(integer), _steps_upstream(sources)
        except Exception as error:
            self.error, cut = error, None
        result = _at_callers_line(func, args, kwargs, sys._getframe(1))
        if cut is not None and func in _MAY_KEEP_GRAPH and isinstance(result, torch.Tensor) and result.requires_grad:
            cut.leaves.difference_update(id(t) for t in sources if t.grad_fn is None)  # `as_tensor` kept it
        return result

    def _switch(self, args: tuple[Any, ...]) -> None:
        if args and args[0] is False and torch.is_grad_enabled():
            caller = sys._getframe(2)
            where = place_of_call(caller)
            self._off_at = None if where is None else (_switch_name(caller), where)
        elif args and args[0] is True:
            self._off_at = None

    def _op_without_grad(self, func: Any, args: tuple[Any, ...]) -> None:
        sources = _inputs_with_grad(args)
        if not sources:
            return
        if torch.is_inference_mode_enabled():
            op, where = "`torch.inference_mode()`", place_of_call(sys._getframe(2))
        elif self._off_at is not None:
            op, where = self._off_at
        else:  # switched off before the forward's own ops (by a library, or at its start)
            op, where = "grad mode off", place_of_call(sys._getframe(2))
        if where is not None:
            self._cut((op, 0), where, sources)

    def _switch_on(self, func: Any, args: tuple[Any, ...], kwargs: Any) -> None:
        """``t.requires_grad_()`` / ``t.requires_grad = True`` on a leaf: where (a registered buffer a
        library's forward switches on is that library's constant, not a tensor meant to train)."""
        t = args[0] if args else None
        on = args[1] if len(args) > 1 else kwargs.get("requires_grad", func is torch.Tensor.requires_grad_)
        if on is not True or not isinstance(t, torch.Tensor) or t.grad_fn is not None \
                or id(t) in self.switched_on or len(self.switched_on) >= MAX_SITES:
            return
        where = place_of_call(sys._getframe(2))
        if where is not None:
            self.switched_on[id(t)] = SwitchedOn(self._follow(t), *where)

    def _used(self, func: Any, args: tuple[Any, ...]) -> None:
        """Note ``func`` as a use of each tensor switched on earlier in this forward that it takes (in its
        arguments, or a list of them: ``torch.stack``)."""
        try:
            if func in _SWITCHES_ON:
                return
            for t in _tensors_in(args[:8]):
                seen = self.switched_on.get(id(t))
                if seen is not None and seen.tensor() is t:
                    seen.ops.add(getattr(func, "__name__", "?"))
        except Exception as error:
            self.error = error

    def _to_integer(self, func: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
        """``.long()``/``.to(torch.long)``/... of a tensor that requires grad: a cut when it gives integers."""
        result = func(*args, **kwargs)
        try:
            if isinstance(result, torch.Tensor) and is_integer(result.dtype):
                where = place_of_call(sys._getframe(2))
                cut = self._cut((_INTEGER_METHODS[func], 1), where, [args[0]]) if where is not None else None
                if cut is not None and cut.integer is None:
                    cut.integer, cut.steps = str(result.dtype), _steps_upstream([args[0]])
        except Exception as error:
            self.error = error
        return result

    def _zero_gradient(self, func: Any, args: tuple[Any, ...]) -> None:
        sources = _inputs_with_grad(args[:1])
        where = place_of_call(sys._getframe(2)) if sources else None
        if where is not None:
            self._cut((_ZERO_GRADIENT_OPS[func], 0), where, sources, self.zero_ops)

    def _cut(self, op: tuple[str, int], where: tuple[Place, Place | None], sources: list[torch.Tensor],
             into: dict[tuple[str, Place, Place | None], Cut] | None = None) -> Cut | None:
        key = (op[0], *where)
        into = self.cuts if into is None else into
        cut = into.get(key)
        if cut is None:
            if len(into) >= MAX_SITES:
                return None
            self._order += 1
            cut = into[key] = Cut(CutSite(op[0], where[0], where[1], op[1]), set(), self._order)
        seen = self._seen.setdefault(key, set())
        for t in sources:
            if t.grad_fn is None:
                cut.leaves.add(id(t))  # a leaf itself (`self.weight.detach()`)
                cut.direct.add(id(t))
                continue
            budget = MAX_NODES_PER_SITE - len(seen)
            if budget <= 0:
                cut.complete = False
                break
            for node in graph.iter_nodes(t.grad_fn, budget, seen):
                variable = getattr(node, "variable", None)
                if isinstance(variable, torch.Tensor):
                    cut.leaves.add(id(variable))
            if len(seen) >= MAX_NODES_PER_SITE:
                cut.complete = False  # a graph too large to walk: what lies beyond is not named
        return cut

    def finish(self) -> list[Cut]:
        """The cuts recorded, and forget every node id seen (called when the forward ends)."""
        self._seen.clear()
        return [c for c in self.cuts.values() if c.leaves]


def compiling() -> bool:
    """Whether dynamo is tracing now (a mode entered there would force a recompile)."""
    try:
        return bool(torch.compiler.is_compiling())
    except Exception:  # an old or stripped torch
        return False


def leave(mode: CutRecorder) -> bool:
    """Take ``mode`` off the torch-function mode stack wherever it is (modes above it are put back);
    False when it was not there."""
    stack = []
    found = False
    try:
        while torch._C._len_torch_function_stack() > 0:
            top = torch._C._pop_torch_function_stack()
            if top is mode:
                found = True
                break
            stack.append(top)
    finally:
        for other in reversed(stack):
            torch._C._push_on_torch_function_stack(other)
    return found

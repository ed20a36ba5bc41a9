"""Why a tensor missed its gradient: the cause read from the tracer's records, as a typed reason.

The tracer (:mod:`leafwatch.observe.tracing`) records plain facts during the forward pass; this
module turns the records of the modules that own a missing tensor into one :class:`Explanation`
(the op that cut the graph, the module that never ran or ran under ``no_grad``, the backward that
never reached it): a reason and the mistake it makes. The reason classes below write the cause and
the one-line fix of the ``missing_grad`` finding they explain.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch import nn

from ..observe import copies, cuts, functions, unhooked
from ..observe.tracing import RunRecord
from ..report.reasons import Place, Reason, Transition
from ..report.words import ADVICE, Members, Remedy, Words, code
from . import cut_fixes, fixes
from .cut_fixes import CutFix, GradOff
from .constructors import missing_words


def _is_descendant(name: str, ancestor: str) -> bool:
    return ancestor == "" or name.startswith(ancestor + ".")


class Miss(Reason, kind="missing_grad", fixes="never"):
    """A cause of a missing gradient; ``module``: the module that holds the tensor (filled when the finding
    is made). A cause whose words are fixed text says them in ``cause_text`` and ``fix_text`` (``{who}``: the
    tensors, ``{module}``: their module, shown, and the first tensor's fields), ``silenced`` when the fix names
    the ``ignore=`` pattern too."""

    module: str | None = None
    cause_text: ClassVar[str] = ""
    fix_text: ClassVar[str] = ""
    silenced: ClassVar[bool] = False

    def words(self, m: Members) -> Words:
        said = {**vars(self), "who": m.who, "module": shown(module_of(m))}
        return missing_words(m, self.cause_text.format(**said), self.fix_text.format(**said),
                             silenced=self.silenced)


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Why a tensor got no gradient: its reason (never ran, grad disabled, checkpoint, detached, ...),
    the mistake the tensor shares with others (``group``: an observed cut, ".detach() at model.py:13") and
    where that mistake is, in words (``location``: "cut by `.detach()` at model.py:13"), never its name."""

    reason: Miss
    group: str | None = None
    location: str | None = None


def shown(module: str) -> str:
    """How a module is named in the words: `` `encoder.0` ``, or "the root module"."""
    return f"`{module}`" if module else "the root module"


def module_of(m: Members) -> str:
    """The module the tensors of ``m`` sit in: theirs when they share it, else the mistake's group
    (the module that holds them all), else the first one's."""
    module, each = m.shared("module"), [str(r or "") for r in m.each("module")]  # (a transition's earlier
    if module is not None or m.single:                                          # reasons may differ)
        return module if module is not None else each[0]
    group = m.group
    if group and all(r.startswith(group) for r in each):
        return group
    return each[0]


def common_module(m: Members) -> str:
    """The innermost module that holds every tensor of ``m`` (``net`` for ``net.0`` and ``net.2``)."""
    parts = [str(r or "").split(".") for r in m.each("module")]
    common = []
    for names in zip(*parts):
        if any(n != names[0] for n in names):
            break
        common.append(names[0])
    return ".".join(common)


def place_of(place: cuts.Place | None) -> Place | None:
    return None if place is None else Place(place.file, place.line, place.function)


# -- a cut the recorder saw ------------------------------------------------------------------------
_GRAD_OFF_FIX = "keep grad mode on for the computation that feeds the loss: do not switch it off at {at}"
#: What to change at a cut's line, by op.
_CUT_FIXES = {
    "`.detach()`": "remove the `.detach()` at {at} (detach only a copy kept for logging or a target, "
                   "never the tensor that feeds the loss)",
    "`.detach_()`": "remove the `.detach_()` at {at} (it cuts the tensor in place: detach a copy for "
                    "logging or a target, never the tensor that feeds the loss)",
    "`.data`": "use the tensor itself, not `.data`, at {at}",
    "`torch.no_grad()`": "move the computation that feeds the loss out of the `torch.no_grad()` block at {at}",
    "`torch.inference_mode()`": "move the computation that feeds the loss out of the "
                                "`torch.inference_mode()` block at {at}",
    "`torch.set_grad_enabled(False)`": _GRAD_OFF_FIX,
}
_VALUE_FIX = ("keep the values a tensor at {at}: use torch ops on the tensor itself, not {op} (a Python "
              "number, list or NumPy array has no autograd graph, and a tensor made from it is a new leaf)")
#: Which reason a cut is, by op.
_CUT_REASONS: dict[str, type[Miss]] = {}


class Cut(Miss):
    """What a cut the recorder saw adds to a cause: the op, its line, the user's call into the library that
    ran it, and whether the op was applied to the tensor itself (``direct``: ``self.weight.data``)."""

    op: str | None = None
    place: Place | None = None
    called_from: Place | None = None
    rank: int = 0
    direct: bool = False
    attribute: str = ""
    fixed: CutFix | None = None

    def cut_words(self, m: Members) -> Words:
        op, place, called_from = self.op, self.place, self.called_from
        at = place.short  # type: ignore[union-attr]
        fix = _CUT_FIXES.get(op, _VALUE_FIX if self.rank else _GRAD_OFF_FIX).format(at=at, op=op)  # type: ignore[arg-type]
        attribute = self.attribute if m.single else m.shared("attribute")
        if self.direct and attribute and op in ("`.data`", "`.detach()`") and m.shared("direct"):
            fix = f"use `{attribute}` itself, not `{attribute}{op.strip('`')}`, at {at}"  # type: ignore[union-attr]
        fix, remedy = _placed(fix, at, self.fixed) if called_from is None else (fix, ADVICE)
        if called_from is not None:
            fix = (f"{fix}: it runs inside a library, reached from your call at {called_from.short}; change that "
                   "call (its arguments or where you call it) so its output keeps the graph")
        if _CUT_REASONS.get(op) is Detached and "detach" not in op:  # type: ignore[arg-type,operator]
            how = "the ops run there on values computed from it record no autograd graph"
        else:
            how = "what comes out of that op carries no autograd graph back to it"
        described = f"{op} at {place.within}" + (f", called from {called_from.within}" if called_from else "")  # type: ignore[union-attr]
        return missing_words(m, f"cut by {described}: {m.who} is used before that point of the forward, and {how}, "
                             "so backward never reaches it (leafwatch saw the op run).", fix, remedy, silenced=True)


_KEEP_TENSOR = ("keep the values a tensor at {at}: {how} (a NumPy array has no autograd graph, and removing the "
                "`.detach()` alone would make `.numpy()` raise)")


def _placed(fix: str, at: str, fixed: CutFix | None) -> tuple[str, Remedy]:
    """A cut's fix with the user's line rewritten (:func:`~leafwatch.detectors.cut_fixes.cut_fix`): the op
    removed, or a NumPy round trip replaced by the torch op; a round trip torch has no op for stays words,
    naming the NumPy op, and never says to remove the ``.detach()`` that feeds it."""
    if fixed is None:
        return fix, ADVICE
    if fixed.numpy:
        if fixed.twin is not None and fixed.corrected is not None:
            numpy_op, torch_op = fixed.twin
            return (f"replace the NumPy round trip at {at} by the torch op on the tensor itself (`np.{numpy_op}` is "
                    f"`torch.{torch_op}`, which keeps the graph): `{fixed.corrected}`"), code(fixed.corrected, fixed.edit)
        if fixed.twin is not None:
            how = f"`np.{fixed.twin[0]}` is `torch.{fixed.twin[1]}`, on the tensor itself, with no NumPy round trip"
        elif fixed.missing is not None:
            how = (f"torch has no op leafwatch knows for `np.{fixed.missing}`: compute it with torch ops on the tensor "
                   "itself, with no NumPy round trip")
        else:
            how = "use torch ops on the tensor itself, not a NumPy round trip"
        return _KEEP_TENSOR.format(at=at, how=how), ADVICE
    if fixed.corrected is None:
        return fix, ADVICE
    if fixed.how == "decorator":
        return (f"drop the `torch.no_grad()` decorator of `{fixed.function}`, which the line at {at} calls",
                code(fixed.corrected, fixed.edit))
    if "\n" in fixed.corrected:
        return fix, code(fixed.corrected, fixed.edit)
    return f"{fix}: `{fixed.corrected}`", code(fixed.corrected, fixed.edit)


class IntegerCut(Miss, name="integer_cut"):
    """The values became integers (indices, sizes): no op carries a gradient through them, so the fix is
    no other op at that line but float values all the way (a differentiable resampling)."""

    op: str
    place: Place
    dtype: str
    called_from: Place | None = None
    steps: tuple[str, ...] = ()

    def words(self, m: Members) -> Words:
        op, place, called_from, steps = self.op, self.place, self.called_from, m.shared("steps", self.steps)
        described = f"{op} at {place.within}" + (f", called from {called_from.within}" if called_from else "")
        rounded = f" (rounded on the way: {', '.join(f'`{s}()`' for s in steps)}, whose gradient is zero)" if steps else ""
        library = f" (it runs inside a library, reached from your call at {called_from.short})" if called_from else ""
        them = "it" if m.single else "them"
        return missing_words(
            m, f"cut by {described}: the values computed from {them}{rounded} become integers (`{self.dtype}`) there, "
            "such as pixel indices or crop sizes, and integer indexing cuts the gradient: an integer tensor carries no "
            f"gradient in any form, so backward never reaches {them} (leafwatch saw the op run).",
            f"no torch op carries a gradient through integers{library}: to learn {m.who}, let it act through float "
            "values, by a differentiable resampling (sample at float coordinates with `torch.nn.functional.grid_sample`, "
            "an interpolating crop, no rounding) or a straight-through estimator; if it is not meant to train, freeze it "
            "with `requires_grad_(False)`", silenced=True)


def explain_cut(cut: cuts.Cut, tensor_id: int, attribute: str = "") -> Explanation:
    """A parameter upstream of a cut the recorder saw: the op and its line, and what to change there."""
    site = cut.site
    at = site.called_from or site.place
    group, location = f"{site.op.strip('`')} at {at}", f"cut by {site.op} at {at}"
    if cut.integer is not None:
        return Explanation(IntegerCut(op=site.op, place=place_of(site.place), dtype=cut.integer,  # type: ignore[arg-type]
                                      called_from=place_of(site.called_from), steps=tuple(cut.steps)), group, location)
    reason = _CUT_REASONS.get(site.op, Rewrapped)
    fixed = cut_fixes.cut_fix(site.op, site.place.file, site.place.line) if site.called_from is None else None
    return Explanation(reason(op=site.op, place=place_of(site.place), called_from=place_of(site.called_from),
                              rank=site.rank, direct=tensor_id in cut.direct, attribute=attribute, fixed=fixed),
                       group, location)


# -- what the module hooks saw ---------------------------------------------------------------------
class CalledDirectly(Miss, name="called_directly"):
    """A module whose other parameters got gradients but whose forward hooks never fired: it is called
    through ``.forward()`` directly, where module hooks cannot see, or its class runs through a ``__call__``
    of its own that skips them (gpytorch's ``Module.__call__``: ``own_call``)."""

    own_call: str | None = None

    def words(self, m: Members) -> Words:
        own = m.shared("own_call", self.own_call)
        lead = (f"{m.who} is not used in the computation of the loss. {shown(module_of(m))}'s other parameters got "
                "gradients, but its forward hooks never ran: ")
        if own:
            return missing_words(
                m, f"{lead}its class's own `__call__` (`{own}`) runs `forward` without torch's module hooks, so "
                "leafwatch cannot say more about where.",
                f"use {m.who} in the forward pass, or delete it (or freeze it with `requires_grad_(False)`)")
        return missing_words(
            m, f"{lead}it is called through `.forward()` directly (or its parameters are used outside its forward), "
            "so leafwatch cannot say more about where.",
            f"use {m.who} in the forward pass, or delete it (or freeze it with `requires_grad_(False)`); "
            "call the module itself, not its `.forward`, so that hooks see it")


def called_directly(module: nn.Module | None) -> Explanation:
    """:class:`CalledDirectly`, with the class's own ``__call__`` where it has one."""
    return Explanation(CalledDirectly(own_call=unhooked.own_call(module) if module is not None else None))


def explain_missing(module_name: str, attribute: str, records: dict[str, RunRecord], armed: set[str],
                    modules: dict[str, nn.Module] | None = None, *, ops_traced: bool = False) -> Explanation | None:
    """Why a parameter of ``module_name`` got no gradient, from what the module hooks saw; None if
    unknown. ``ops_traced``: the cut recorder watched the forward and saw no cut upstream of it."""
    if module_name not in armed or not records:
        # Not watched for the whole step, or no armed module ran at all: the forward pass may
        # have happened before the hooks were armed, so nothing can be said.
        return None
    record = records.get(module_name)
    if record is None:
        return _did_not_run(module_name, records, modules)
    if record.in_function is not None and not record.function_inputs:
        return inside_function(record.in_function, grad_on=record.grad_enabled)
    if not record.grad_enabled:
        if record.in_checkpoint:
            return Explanation(Checkpoint())
        return Explanation(GradDisabled(off=cut_fixes.grad_off(module_name, modules) if modules else None))
    if record.substituted:
        return Explanation(SubstitutedWeights())
    if not record.output_requires_grad:
        if record.output_opaque:
            return None  # an output of a type the hook cannot look into: nothing to conclude
        return Explanation(DataAccess(attribute=attribute))
    if not record.backward_reached:
        return _not_reached(record, records, ops_traced)
    return Explanation(Unused(attribute=attribute))


class DataAccess(Cut, name="data_access", fixes="sometimes"):
    """The module ran with gradients on, but its output does not require grad: the tensor is used through
    ``.data``, ``.detach()`` or a rewrap (or the recorder saw the ``.data`` that cut it)."""

    cause_text = ("{module} ran with gradients on, but its output does not require grad: {who} is used through "
                  "`.data`, `.detach()` or a rewrap that makes a new tensor from its values "
                  "(`torch.tensor({attribute})`, `torch.tensor({attribute}.tolist())`, a NumPy round trip) inside its "
                  "forward.")
    fix_text = ("use `{attribute}` itself in forward, not `{attribute}.data` / `{attribute}.detach()` / "
                "`torch.tensor({attribute})`")

    def words(self, m: Members) -> Words:
        return self.cut_words(m) if self.op is not None else super().words(m)


class Unused(Miss, name="unused", fixes="sometimes"):
    """The module ran and backward reached its output, but its forward does not use the tensor itself."""

    attribute: str = ""
    cause_text = ("{module} ran and backward reached its output, but its forward does not use `{attribute}` itself: it "
                  "is unused, or used through `.data`, `.detach()` or a rewrap that makes a new tensor from its values "
                  "(`torch.tensor({attribute}.tolist())`, `torch.tensor({attribute})`, a NumPy round trip).")
    fix_text = ("use `{attribute}` itself in {module}'s forward (no `.data`/`.detach()`/`torch.tensor({attribute})`), "
                "or delete it")
    silenced = True


class SubstitutedWeights(Miss, name="substituted_weights"):
    """The module's forward ran with weights swapped in for its registered parameters."""

    cause_text = ("{module}'s forward ran with other tensors in place of its registered parameters "
                  "(`torch.func.functional_call`, a TensorDict's weights swapped in, a vmapped copy): the "
                  "gradient went to those tensors, not to {who}.")
    fix_text = ("nothing in the forward: give the optimizer the tensors the module is called with (those passed "
                "to `functional_call` or swapped in); if {who} itself is meant to train, call the module "
                "with its own parameters")


class NeverRan(Miss, name="never_ran"):
    """The module never ran in the step's forward; ``parent``: the module above it that ran, ``call``: the
    code of the module to call."""

    parent: str | None = None
    call: str | None = None

    def words(self, m: Members) -> Words:
        module = module_of(m)
        parent = m.shared("parent", self.parent)
        where = "" if parent is None else f" ({shown(parent)} ran, but did not call it)"
        call = m.shared("call", self.call)
        return missing_words(
            m, f"module {shown(module)} never ran in this step's forward{where}.",
            f"call {f'`{call}`' if call else shown(module)} in forward(), or remove it (or freeze it with "
            "requires_grad_(False) if that is intended)", silenced=True)


class NoForwardOfItsOwn(Miss, name="no_forward_of_its_own"):
    """The module holding the tensor ran no forward of its own (its children did)."""

    cause_text = ("{who} is never used in the computation of the loss ({module} did not run a forward of its own "
                  "that uses it).")
    fix_text = "use {who} in the forward pass, or delete it (or set requires_grad=False if it is frozen on purpose)"


def never_called(module_name: str) -> Explanation:
    """A module a global forward hook watched over the whole step and never saw run (``leafwatch run``'s module
    kept in a script's variable and never called): ``never_ran``, no parent that ran known."""
    return Explanation(NeverRan(call=fixes.module_code(module_name) if module_name else None))


def _did_not_run(module_name: str, records: dict[str, RunRecord], modules: dict[str, nn.Module] | None) -> Explanation:
    """The module holding the parameter ran no forward of its own: unused, or never called."""
    ran_below = [r for n, r in records.items() if n != module_name and _is_descendant(n, module_name)]
    if ran_below or module_name == "":
        return Explanation(NoForwardOfItsOwn())
    parents = [r for n, r in records.items() if _is_descendant(module_name, n) and n != module_name]
    parent = max(parents, key=lambda r: len(r.name), default=None)
    call = fixes.module_code(fixes.module_to_call(module_name, records, modules)) if module_name else None
    return Explanation(NeverRan(parent=None if parent is None else parent.name, call=call))


def call_kept(explanation: Explanation | None, earlier: Reason | None) -> Explanation | None:
    """``explanation``, with the module to call that ``earlier`` (the tensor's reason at an earlier check, or
    the reason a transition of it holds) worked out when it saw the same module not run: after its first check
    leafwatch watches only the modules that own the missing tensors and their ancestors, so a later check
    does not see the siblings that ran (``body.0`` of a ``body`` whose entries forward() calls one by one)."""
    while isinstance(earlier, Transition):
        earlier = earlier.earlier
    reason = explanation.reason if explanation is not None else None
    if not isinstance(reason, NeverRan) or not isinstance(earlier, NeverRan) or earlier.parent != reason.parent \
            or earlier.call is None:
        return explanation
    return dataclasses.replace(explanation, reason=dataclasses.replace(reason, call=earlier.call))  # type: ignore[arg-type]


class InsideFunction(Miss, name="inside_function"):
    """A module that ran only inside the forward of a custom autograd.Function not given its parameters
    (``grad_on``: under ``torch.enable_grad()`` there, its output detached by the Function)."""

    function: str
    library: str
    place: Place
    called_from: Place | None = None
    holder: str | None = None
    grad_on: bool = False

    def words(self, m: Members) -> Words:
        module, function = shown(common_module(m)), self.function
        at = f"at {self.place.short}" + (f", reached from your call at {self.called_from.short}"
                                         if self.called_from else "")
        if self.grad_on:
            how = ("It ran there under `torch.enable_grad()`, but the graph it built ends inside that forward: what "
                   f"`{function}` returns carries only its own backward node, and torch sends gradients back only "
                   f"through `{function}`'s backward, to the tensors given to `{function}.apply`: ")
        else:
            how = ("torch runs a Function's forward without autograd and sends gradients back only through its "
                   f"backward, to the tensors given to `{function}.apply`: ")
        cause = (f"{module} ran only inside the forward of the custom autograd.Function `{function}` (applied {at}). "
                 + how + (f"{m.who} was not among them, so no gradient reaches it." if m.single else
                          f"none of `{m.name}` was among them, so no gradient reaches them."))
        holder = f"`{self.holder}`" if self.holder else None
        if self.library == "torchdiffeq":
            fix = (f"register {module} as a submodule of {holder or 'the module you pass to `odeint_adjoint`'}, the "
                   "module you integrate (an attribute of it, so that `odeint_adjoint` finds its parameters), or pass "
                   "its parameters in `adjoint_params=`")
        else:
            given = f" (register {module} in {holder}, the module it receives)" if holder else ""
            fix = (f"give {module}'s parameters to `{function}.apply` as inputs{given}: its backward returns gradients "
                   "only for its inputs")
        return missing_words(m, cause, fix, silenced=True)


def inside_function(call: functions.FunctionCall, *, grad_on: bool = False) -> Explanation:
    """:class:`InsideFunction` of ``call``; every tensor the Function was not given is one mistake."""
    reason = InsideFunction(function=call.name, library=call.module.split(".")[0], place=place_of(call.place),  # type: ignore[arg-type]
                            called_from=place_of(call.called_from), holder=call.holder, grad_on=grad_on)
    where = f"inside `{call.name}` at {(call.called_from or call.place)}"
    return Explanation(reason, where, where)


class CopiedWeights(Miss, name="copied_weights"):
    """A module that never ran, a library's copy of it ran in its place on weights copied from its parameters
    as new leaves (higher's ``copy_initial_weights=True``): those copies got the gradients."""

    variable: str
    cls: str
    library: str | None = None

    def words(self, m: Members) -> Words:
        module, library, variable = shown(common_module(m)), self.library, self.variable
        made = f"`{library}`'s copy of it" if library else "a library's copy of it"
        higher = library == "higher"
        how = ("`copy_initial_weights=True`, higher's default for `higher.innerloop_ctx` and `higher.monkeypatch`, "
               "makes them new leaves" if higher else "they are new leaves")
        cause = (f"{module} never ran in this step: {made}, `{variable}` (a `{self.cls}`), ran in its place, on "
                 f"weights that start as copies of its parameters' values ({how}). Backward stops at those copies "
                 f"(they got the gradients), so no gradient reaches {m.who}.")
        if higher:
            fix = ("pass `copy_initial_weights=False` to `higher.innerloop_ctx(...)` (or `higher.monkeypatch(...)`): the "
                   f"fast weights of `{variable}` then start from {module}'s own parameters, and the meta-gradient "
                   "reaches them")
        else:
            fix = (f"make the weights of `{variable}` start from {module}'s own parameters, not from detached copies "
                   f"of them, so that backward reaches them; or give the optimizer the tensors `{variable}` trains on")
        return missing_words(m, cause, fix)


def copied_weights(copy: copies.Copy) -> Explanation:
    """:class:`CopiedWeights` of ``copy``: every tensor it copied is one mistake."""
    where = f"weights copied into `{copy.variable}`"
    return Explanation(CopiedWeights(variable=copy.variable, cls=copy.cls, library=copy.library), where, where)


class Checkpoint(Miss, name="checkpoint"):
    """The module ran inside a reentrant checkpoint whose inputs do not require grad."""

    cause_text = ("{module} ran inside a reentrant `torch.utils.checkpoint` whose inputs do not require grad, so it "
                  "ran without autograd and backward never recomputes it.")
    fix_text = "pass `use_reentrant=False` to your `checkpoint` call, or make the checkpoint's input require grad"


class GradDisabled(Miss, name="grad_disabled", fixes="sometimes"):
    """The module ran with gradients disabled; ``off``: the one place of the class above it that calls it with
    grad off (a ``with torch.no_grad():`` block, a ``@torch.no_grad()`` method), read when the finding is decided."""

    off: GradOff | None = None

    def words(self, m: Members) -> Words:
        module, off = shown(module_of(m)), self.off
        cause = f"{module} ran with gradients disabled (inside `torch.no_grad()` or `torch.inference_mode()`)."
        if off is None:
            return missing_words(m, cause, f"call {module} outside `torch.no_grad()` during training")
        one_line = "" if "\n" in off.corrected else f": `{off.corrected}`"
        if off.how == "block":
            fix = f"move the computation that feeds the loss out of the `torch.no_grad()` block at {off.place}{one_line}"
        else:
            fix = f"drop the `torch.no_grad()` decorator of `{off.function}` at {off.place}: it calls {module}"
        return missing_words(m, cause, fix, code(off.corrected, off.edit))


def _not_reached(record: RunRecord, records: dict[str, RunRecord], ops_traced: bool) -> Explanation:
    """Backward never reached a module's output: what the module hooks saw of it, and that the exact
    point is unknown (a cut the recorder saw is named by :func:`explain_cut` instead)."""
    storage = record.output_storage
    # The modules that ran after it (neither below nor above it), in their order.
    later = sorted((r for r in records.values() if r.order > record.order and not _is_descendant(r.name, record.name)
                    and not _is_descendant(record.name, r.name)), key=lambda r: r.order)
    # A tensor of the same shape is no evidence: a rewrap is named only when the recorder saw it.
    cut = next((r for r in later if storage and storage in r.detached_inputs), None)
    if cut is not None:
        return Explanation(Detached(ops_traced=ops_traced, received_detached=cut.name))
    user = next((r for r in later if storage and storage in r.grad_inputs), None)
    if user is not None:
        return Explanation(Detached(ops_traced=ops_traced, used_by=user.name))
    if not later:
        return Explanation(Detached(ops_traced=ops_traced))
    return Explanation(UnusedOutput(ops_traced=ops_traced, next=later[0].name, record=record.name))


#: What the cut recorder adds to a cause it has no cut for.
_UNSEEN = ("Where exactly is unknown: leafwatch did not watch the ops of this step (it records the ops "
           "that cut a graph (`.detach()`, `.data`, `.item()`, `.tolist()`, `torch.tensor(...)`, "
           "`torch.no_grad()`) on the first step and after a new miss, inside the model's own forward, "
           "never in a compiled module), or the cut left no trace it can see (`torch.from_numpy`).")
_UNSEEN_INSIDE = ("No op that cuts a graph (`.detach()`, `.data`, `.item()`, `.tolist()`, `torch.tensor(...)`, "
                  "`torch.no_grad()`) ran on it inside the model's forward: where it was cut is unknown (outside "
                  "the forward, in the training loop, or by a step that leaves no trace such as `torch.from_numpy`).")


class Detached(Cut, name="detached", fixes="sometimes"):
    """The graph was cut between the tensor and the loss: at the op the recorder saw (:class:`Cut`'s fields),
    or, where it saw none, what the module hooks saw (the module that received the output detached, the one
    that used it, or neither)."""

    ops_traced: bool = False
    received_detached: str | None = None
    used_by: str | None = None

    def words(self, m: Members) -> Words:
        if self.op is not None:
            return self.cut_words(m)
        module = shown(module_of(m))
        unseen = _UNSEEN_INSIDE if self.ops_traced else _UNSEEN
        if self.received_detached is not None:
            cut = self.received_detached
            return missing_words(
                m, f"{module} ran and its output required grad, but backward never reached that output: "
                f"`{cut}` received it detached (the same storage without grad). The cut is between {module} "
                f"and `{cut}`: a `.detach()`, `torch.no_grad()` or a NumPy round trip (`.numpy()` and "
                f"`torch.from_numpy()` share the storage). {unseen}",
                f"pass {module}'s output to `{cut}` as it is: remove the `.detach()` / `torch.no_grad()` / NumPy step "
                "between them", silenced=True)
        if self.used_by is not None:
            user = self.used_by
            return missing_words(
                m, f"{module} ran and its output required grad, and `{user}` used it, but backward never "
                f"reached it: what `{user}` made from it does not reach the loss (nothing in the loss uses it, or "
                f"it was cut after `{user}`). {unseen}",
                f"keep torch ops from `{user}`'s output to the loss: remove the `.detach()`/`.item()`/"
                "`.tolist()`/NumPy/`torch.tensor` rewrap step after it", silenced=True)
        # No module that the hooks watch ran after it: a cut and an unused output look the same to them.
        return missing_words(
            m, f"{module} ran and its output required grad, but backward never reached that output, and no "
            "module that leafwatch watches ran after it: it was cut from the loss outside any module, or "
            f"nothing in the loss uses it. {unseen}",
            f"keep torch ops from {module}'s output to the loss (remove the `.detach()`/`.item()`/NumPy/"
            f"`torch.tensor` rewrap step after it), or remove {module} if its output is not needed", silenced=True)


class Rewrapped(Detached, name="rewrapped"):
    """A cut by an op that rewraps the values (``.item()``, ``.tolist()``, ``torch.tensor(...)``)."""


_CUT_REASONS.update({"`.detach()`": Detached, "`.detach_()`": Detached, "`.data`": DataAccess,
                     "`torch.no_grad()`": Detached, "`torch.inference_mode()`": Detached,
                     "`torch.set_grad_enabled(False)`": Detached, "grad mode off": Detached})


class UnusedOutput(Miss, name="unused_output"):
    """The module ran and its output required grad, but backward never reached it: unused, or cut before
    the next module that ran."""

    next: str
    record: str
    ops_traced: bool = False

    def words(self, m: Members) -> Words:
        module = shown(module_of(m))
        unseen = _UNSEEN_INSIDE if self.ops_traced else _UNSEEN
        between = f" between {module} and `{self.next}` (the next module that ran)"
        record = self.record
        return missing_words(
            m, f"{module} ran and its output required grad, but backward never reached that output: nothing in "
            f"the loss uses it (an output computed and ignored, like a pooler whose output the loss never reads), "
            f"or it was cut{between}. {unseen}",
            f"use {module}'s output in the loss, or remove {module} (or ignore its parameters with "
            f"`ignore=[\"{record + '.*' if record else '*'}\"]`) if its output is not needed; if it should "
            f"feed the loss, look{between} for the cut")

"""``module.requires_grad = True``: the classic wrong unfreeze. On a tensor ``requires_grad`` is autograd's flag;
on an ``nn.Module`` it is a plain attribute that PyTorch ignores, so the module's parameters keep
``requires_grad=False`` and never train (``module.requires_grad_(True)`` is the method that unfreezes them).

``missing_grad`` / ``plain_requires_grad`` (:class:`PlainRequiresGrad`): an error for each parameter of a module
that holds ``requires_grad = True`` as a plain attribute and does not require grad, one mistake per module; nothing
when they all require grad already (the attribute is then harmless). The assignment is named by its line when it is
seen in the user's code (a statement ``X.requires_grad = True`` of a file of the user's frames whose ``X`` is that
module), and the fix, ``module.requires_grad_(True)``, is placed there when an optimizer holds the parameters
already; otherwise it goes before the optimizer is built (or the optimizer is rebuilt after it).

It reads the structure when it is read again (a rebuild), never on a healthy step; a module no user code set the
attribute on is judged only where its class is the user's or torch's (a library may keep a flag of its own by that
name).
"""

from __future__ import annotations

import ast
import linecache
import sys
from collections.abc import Iterator
from typing import Any

from torch import nn

from ..observe import frames
from ..observe.evidence import REBUILT, STEP, Evidence
from ..observe.inventory import Inventory
from ..observe.source import Source
from ..observe.unhooked import resolve
from ..report.reasons import Reason
from ..report.verdicts import Verdict, Verdicts
from ..report.words import ADVICE, Edit, Members, Words, code
from . import fixes
from .constructors import make

#: At most this many of the user's frames are read for the assignment.
_FRAMES = 16


class PlainRequiresGrad(Reason, kind="missing_grad", name="plain_requires_grad"):
    """The module ``module`` (``code``: the user's code for it) holds ``requires_grad = True`` as a plain attribute
    while its parameters do not require grad; ``at``/``statement``: the assignment, where seen; ``held``: an optimizer
    holds the parameters already, so the fix (``edit``) may stand where the assignment stands."""

    module: str
    code: str | None = None
    at: str | None = None
    statement: str | None = None
    held: bool = False
    edit: Edit | None = None

    def words(self, m: Members) -> Words:
        who = f"`{self.code}`" if self.code else f"`{self.module}`" if self.module else "the model"
        written = self.statement or f"{self.code or self.module or 'model'}.requires_grad = True"
        where = f"`{written}` at {self.at}" if self.at else f"`{written}`"
        they = "it does" if m.single else "they do"
        message = (f"{m.who} does not require grad, so {they} not train: {where} sets a plain attribute of {who}, which "
                   "PyTorch ignores.")
        cause = (f"`requires_grad` is autograd's flag on each tensor; on an `nn.Module` it is a plain attribute, so the "
                 f"parameters of {who} keep `requires_grad=False`: no gradient reaches them and no optimizer step "
                 "changes them.")
        snippet = f"{self.code}.requires_grad_(True)" if self.code else None
        if snippet is None:
            return Words(message, cause, "unfreeze it with the module's method, `requires_grad_(True)`, before the "
                                         "optimizer is built (or build the optimizer again after it)", ADVICE)
        if self.held:
            return Words(message, cause, f"unfreeze its parameters with the module's method: `{snippet}`",
                         code(snippet, self.edit))
        return Words(message, cause, f"unfreeze its parameters with the module's method, before the optimizer is built: "
                                     f"`{snippet}` (or build the optimizer again after it)", ADVICE)


def judge(evidence: Evidence, state: None, view: Any) -> Verdicts | None:
    """At a new reading of the structure: a finding for each frozen parameter of a module that holds
    ``requires_grad = True`` as a plain attribute; earlier ones of this reason that no longer hold are resolved."""
    inv, step = evidence[REBUILT], evidence[STEP]
    if inv is None:
        return None
    found = list(_found(inv, step))
    names = {f.name for f in found}
    out = [Verdict.open(f) for f in found]
    out += [Verdict.resolve(f.key, step) for f in view if isinstance(f.reason, PlainRequiresGrad)
            and f.status == "open" and f.name not in names]
    return out


def _found(inv: Inventory, step: int | None) -> Iterator[Any]:
    marked = [(name, module) for name, module in inv.modules.items() if vars(module).get("requires_grad") is True]
    if not marked:
        return
    names = {t_id: info.name for t_id, info in inv.params.items()}
    for name, module in marked:
        frozen = [p for p in module.parameters() if not p.requires_grad and id(p) in names]
        if not frozen:
            continue  # every parameter requires grad already: the attribute is harmless
        seen = _assignment(module)
        if seen is None and not _users_or_torchs(type(module)):
            continue  # a library's own flag by that name, set by no user code leafwatch saw
        user_code = fixes.variable_for(module, inv.variables)
        held = all(id(p) in inv.in_optimizer for p in frozen)
        at, statement, edit = None, None, None
        if seen is not None:
            at, statement = seen
            span = fixes.statement_span(at)
            if held and user_code and span is not None and "\n" not in statement:
                edit = span.put(f"{user_code}.requires_grad_(True)", "replace")
        reason = PlainRequiresGrad(module=name, code=user_code, at=fixes.short_place(at) if at else None,
                                   statement=statement, held=held, edit=edit)
        group = name or user_code or "the model"
        for p in frozen:
            yield make(reason, names[id(p)], "error", tensor=p, step=step, group=group)


def _users_or_torchs(cls: type) -> bool:
    """Whether ``cls`` is the user's class or torch's (neither keeps a ``requires_grad`` attribute of its own)."""
    module = getattr(cls, "__module__", "") or ""
    if module.startswith("torch."):
        return True
    source = getattr(sys.modules.get(module), "__file__", None)
    return module == "__main__" or (source is not None and frames.is_users_file(source))


def _assignment(module: nn.Module) -> tuple[str, str] | None:
    """Where the user's code set ``X.requires_grad = True`` on ``module``: ``(path:line, the statement as written)``,
    read in the files of the user's frames, ``X`` resolved in the frame that runs that file."""
    try:
        user = [frame for _, frame in zip(range(_FRAMES), frames.user_frames())]
    except Exception:  # a stack that cannot be read: the line is not said
        return None
    for frame in user:
        path = frame.f_code.co_filename
        for node in _assignments(path):
            if resolve(node.targets[0].value, frame) is module:
                text = ast.get_source_segment("".join(linecache.getlines(path)), node) or ast.unparse(node)
                return f"{path}:{node.lineno}", text
    return None


def _assignments(path: str) -> list[ast.Assign]:
    """The statements ``X.requires_grad = True`` of the file at ``path``."""
    tree = Source().tree(path) if "requires_grad" in "".join(linecache.getlines(path)) else None
    return [node for node in ast.walk(tree) if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Attribute) and node.targets[0].attr == "requires_grad"
            and isinstance(node.value, ast.Constant) and node.value.value is True] if tree is not None else []

"""Where the user's code is on the call stack: the one helper for "the first frame of user code".

A warning points at the user's line, a watched tensor records where it was watched, and a
tensor is named as the caller's variable: each walks up the stack past leafwatch's own frames
and, where leafwatch runs inside a framework (an optimizer hook inside torch, a callback inside
Lightning's Trainer), past the :data:`FRAMEWORKS` too. Torch-free; nothing here imports a framework.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType, WrapperDescriptorType
from typing import Any

#: The folder of the leafwatch package (every frame under it is leafwatch's own).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

#: The frameworks whose frames stand between the user's code and leafwatch's hooks and callbacks
#: (an optimizer step pre-hook runs inside torch, a callback inside Lightning's Trainer).
FRAMEWORKS = ("torch", "pytorch_lightning", "lightning", "lightning_fabric", "lightning_utilities",
              "transformers", "accelerate", "runpy", "_pytest", "pluggy")


def framework_dirs() -> tuple[str, ...]:
    """The folders (or files, for a single module such as runpy) of the :data:`FRAMEWORKS`
    imported so far (none is imported here)."""
    dirs = []
    for name in FRAMEWORKS:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            path = os.path.abspath(path)
            dirs.append(os.path.dirname(path) + os.sep if path.endswith("__init__.py") else path)
    return tuple(dirs)


def installed_dirs() -> tuple[str, ...]:
    """Where installed code lives: the interpreter's site-packages / dist-packages (the user's
    too, and any such folder on ``sys.path``) and its standard library. A frame there is a
    library's (skorch, torchrl, trl, ignite), never the user's, whether or not it is one of the
    :data:`FRAMEWORKS`."""
    extra = (os.path.abspath(p) + os.sep for p in sys.path
             if isinstance(p, str) and os.path.basename(os.path.normpath(p)) in ("site-packages", "dist-packages"))
    return tuple(dict.fromkeys((*_interpreter_dirs(), *extra)))


@functools.lru_cache(maxsize=1)
def _interpreter_dirs() -> tuple[str, ...]:
    import site
    import sysconfig

    dirs = set(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib"))
    with contextlib.suppress(Exception):  # a stripped interpreter without them: sysconfig's paths still hold
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    return tuple(sorted(os.path.abspath(d) + os.sep for d in dirs if d))


def _prefixes(frameworks: bool, skip: tuple[str, ...]) -> tuple[str, ...]:
    if not frameworks:
        return (PACKAGE_DIR, *skip)
    # Installed code, the frameworks (an addition, and a seam for tests) and pseudo-files
    # (``<frozen runpy>``, ``<string>``, code torch.fx generates) are never the user's.
    return (PACKAGE_DIR, *framework_dirs(), *installed_dirs(), "<", *skip)


def is_users_file(filename: str) -> bool:
    """Whether code of the file ``filename`` (a function's ``co_filename``) is the user's, as :func:`is_users`
    decides for a frame that runs it."""
    return not _file_under(filename, _prefixes(True, ()))


def _is_under(frame: FrameType, prefixes: tuple[str, ...]) -> bool:
    return _file_under(frame.f_code.co_filename, prefixes)


def _file_under(filename: str, prefixes: tuple[str, ...]) -> bool:
    if filename.startswith(prefixes):
        # The script run as ``__main__`` is the user's wherever it lives, and so is a notebook
        # cell (IPython names it ``<ipython-input-…>``).
        return filename != getattr(sys.modules.get("__main__"), "__file__", None) \
            and not filename.startswith("<ipython-input")
    # A module imported through a relative sys.path entry has a relative co_filename.
    return not os.path.isabs(filename) and not filename.startswith("<") \
        and os.path.abspath(filename).startswith(prefixes)


def user_frames(*, frameworks: bool = True, skip: tuple[str, ...] = (), depth: int = 1) -> Iterator[FrameType]:
    """The frames of the user's code, innermost first: every frame of the stack outside
    leafwatch (and, with ``frameworks``, outside the :data:`FRAMEWORKS`) and outside ``skip``.

    Args:
        frameworks: Pass over the frames of torch, Lightning, transformers, ... too.
        skip: More folders (or files) whose frames are not the user's.
        depth: Where to start: 1 is the caller of this function.
    """
    # Read the stack now, not when the iterator is first advanced (from another frame).
    return _outside(sys._getframe(depth), _prefixes(frameworks, skip))


def outside(frame: FrameType | None, *, frameworks: bool = True) -> Iterator[FrameType]:
    """The frames of the user's code from ``frame`` up (``frame`` itself included when it is the
    user's): outside leafwatch and, with ``frameworks``, outside the :data:`FRAMEWORKS`."""
    return _outside(frame, _prefixes(frameworks, ()))


def is_users(frame: FrameType, *, frameworks: bool = True) -> bool:
    """Whether ``frame`` runs the user's code: outside leafwatch and, with ``frameworks``, outside
    the :data:`FRAMEWORKS`, installed code and pseudo-files (as :func:`user_frames` decides)."""
    return not _is_under(frame, _prefixes(frameworks, ()))


def in_traceback(tb: TracebackType | None, limit: int = 200) -> list[tuple[FrameType, int]]:
    """The frames of a traceback and the line each one was running, outermost first (the one that
    raised last), at most the ``limit`` innermost: where an exception passed, read after the stack
    unwound (an excepthook, a front-end that caught it)."""
    found: list[tuple[FrameType, int]] = []
    while tb is not None:
        found.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return found[-limit:]


def every_frame(depth: int = 1) -> Iterator[FrameType]:
    """Every frame of the stack outside leafwatch, innermost first, the frameworks' included (a
    Trainer that runs the check); ``depth`` 1 is the caller of this function. leafwatch's own
    frames are never given: reading the locals of a running frame that holds a frame would tie
    them in a cycle that keeps the user's tensors alive until the next garbage collection."""
    return _outside(sys._getframe(depth), (PACKAGE_DIR,))


def _outside(frame: FrameType | None, prefixes: tuple[str, ...]) -> Iterator[FrameType]:
    while frame is not None:
        if not _is_under(frame, prefixes):
            yield frame
        frame = frame.f_back


def _first_outside(frame: FrameType | None, prefixes: tuple[str, ...]) -> tuple[FrameType | None, int]:
    """The first frame from ``frame`` up that is outside ``prefixes``, and its ``warnings``
    stacklevel counted from ``frame`` (1)."""
    level = 1
    while frame is not None and _is_under(frame, prefixes):
        frame = frame.f_back
        level += 1
    return frame, level


def user_frame(*, frameworks: bool = True, skip: tuple[str, ...] = ()) -> FrameType | None:
    """The first frame of user code above the caller (None when there is none).

    Args:
        frameworks: Pass over the frames of torch, Lightning, transformers, ... too; False: the
            first frame outside leafwatch, whoever called it.
        skip: More folders (or files) whose frames are not the user's.
    """
    return _first_outside(sys._getframe(1), _prefixes(frameworks, skip))[0]


def stacklevel_outside(skip: tuple[str, ...] = (), *, frameworks: bool = True) -> int:
    """The ``warnings.warn`` stacklevel (for a call made by the caller of this function) that
    points at the user's own line: the first frame outside leafwatch, outside the
    :data:`FRAMEWORKS` (torch, Lightning, transformers; unless ``frameworks=False``) and outside
    the folders ``skip``. From a Lightning callback that is the ``trainer.fit(...)`` line (or the
    user's own hook that stepped the optimizer); from an optimizer hook, the ``optimizer.step()``
    line."""
    return _first_outside(sys._getframe(1), _prefixes(frameworks, skip))[1]


def on_stack(frame: FrameType | None, limit: int, matches: Callable[[str], bool]) -> bool:
    """Whether one of the ``limit`` frames from ``frame`` up runs a file whose name ``matches``."""
    while frame is not None and limit > 0:
        if matches(frame.f_code.co_filename):
            return True
        frame, limit = frame.f_back, limit - 1
    return False


def library_of(path: str) -> tuple[str, str] | None:
    """``("pyro", "pyro/optim/optim.py")`` for a file of an installed package (its top-level name and
    its path from the folder that holds it); None for the user's code, the standard library's own files
    and leafwatch."""
    path = os.path.abspath(path)
    holders = [d for d in installed_dirs() if path.startswith(d)] if not path.startswith(PACKAGE_DIR) else []
    if not holders or os.path.basename(os.path.normpath(max(holders, key=len))) not in ("site-packages", "dist-packages"):
        return None
    relative = path[len(max(holders, key=len)):].replace(os.sep, "/")
    return (relative.split("/", 1)[0], relative) if "/" in relative else None


def library_class(klass: type) -> str | None:
    """The installed package that defines ``klass`` (``"higher"`` for higher's patched modules, ``"torch"`` for
    ``nn.Linear``), or None for a class of the user's code (the folder the run started in, an editable install),
    of the standard library or of leafwatch. What such an object holds is that library's, never the user's
    would-be parameter (higher keeps its fast weights in ``_fast_params``, a plain list).

    Example::

        >>> import torch
        >>> library_class(torch.nn.Linear), library_class(type("Net", (), {}))
        ('torch', None)
    """
    module = getattr(klass, "__module__", None)
    return _library_module(module) if isinstance(module, str) else None


@functools.lru_cache(maxsize=1024)
def _library_module(name: str) -> str | None:
    """The installed package of the Python module ``name`` (by module name: a class made anew at each call,
    as higher makes its patched classes, is never kept alive here)."""
    path = getattr(sys.modules.get(name), "__file__", None)
    found = library_of(path) if isinstance(path, str) else None
    return found[0] if found is not None else None


def running(frame: FrameType | None, limit: int, code: Any) -> FrameType | None:
    """The first of the ``limit`` frames from ``frame`` up that runs ``code`` (a code object), or None."""
    while frame is not None and limit > 0:
        if frame.f_code is code:
            return frame
        frame, limit = frame.f_back, limit - 1
    return None


def caller_location(*, frameworks: bool = False) -> str:
    """``file:line`` of the first frame of user code above the caller, ``"<unknown>"`` when none."""
    frame = _first_outside(sys._getframe(1), _prefixes(frameworks, ()))[0]
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "<unknown>"


#: Python's own ``__class__`` of every object, which ``isinstance`` reads when the type alone does not answer.
_OBJECT_CLASS = object.__dict__["__class__"]
_MISSING = object()
#: The built-in types most values are (a module's attributes: sizes, flags, names): read without a look at the class.
_BUILT_IN = frozenset({int, float, bool, str, bytes, type(None), tuple, list, dict, set})


def readable(value: Any) -> bool:
    """Whether leafwatch may look at ``value`` (``isinstance``, ``hasattr``, ``vars()``) without running code of
    the object's own: its class keeps Python's attribute lookup and ``__class__``. A class that overrides
    ``__getattribute__`` in Python runs it at every read, ``isinstance``'s read of ``__class__`` included: torch's
    deprecated ``torch.distributed.reduce_op`` warns there, and a warning of leafwatch's reads would reach the
    user (or, under ``-W error``, stop the read). The user's variables, frames' locals and objects' attributes
    that are not readable are passed over; reading the class itself runs nothing either (``type.__getattribute__``).

    leafwatch's own objects are never read either (:func:`own`): a ``Monitor`` the user keeps in a variable
    holds the model, the roots and leafwatch's records, and no walk of leafwatch's goes through them.

    Example::

        >>> import torch.distributed, leafwatch
        >>> readable(torch.nn.Linear(1, 1)), readable(torch.distributed.reduce_op), readable(leafwatch.Monitor())
        (True, False, False)
    """
    if type(value) in _BUILT_IN:
        return True
    getattribute = class_attribute = _MISSING
    for klass in type.__getattribute__(type(value), "__mro__"):
        namespace = type.__getattribute__(klass, "__dict__")
        if getattribute is _MISSING:
            getattribute = namespace.get("__getattribute__", _MISSING)
        if class_attribute is _MISSING:
            class_attribute = namespace.get("__class__", _MISSING)
        if _own_module(namespace.get("__module__")):
            return False
    return type(getattribute) is WrapperDescriptorType and class_attribute is _OBJECT_CLASS


#: leafwatch's module that holds the user's side of a run: the demo's model is trained, not leafwatch's machinery.
_USERS_SIDE = "leafwatch.demo"


def _own_module(name: Any) -> bool:
    return isinstance(name, str) and name.startswith("leafwatch") and (name == "leafwatch" or name[9:10] == ".") \
        and name != _USERS_SIDE


def own(value: Any) -> bool:
    """Whether ``value`` is one of leafwatch's own objects (its class, or a base of it, is leafwatch's): a
    ``Monitor``, a callback, a report. leafwatch never walks into them: the user's ``monitor`` variable is no
    path to the model, and what it holds is no tensor of the user's (the demo's model is the user's side).

    Example::

        >>> import torch, leafwatch
        >>> own(leafwatch.Monitor()), own(torch.nn.Linear(1, 1))
        (True, False)
    """
    klass = type(value)
    return any(_own_module(type.__getattribute__(k, "__dict__").get("__module__"))
               for k in type.__getattribute__(klass, "__mro__"))

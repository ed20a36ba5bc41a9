"""Qualified-name arithmetic: the module path above a tensor's name, and every path above it.

Torch-free, and the one copy: the tracer's hooks, the finding history's module lifting and
``leafwatch run``'s discovery all ask it.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1 << 16)  # the same names at every rebuild of the report
def ancestors(name: str) -> tuple[str, ...]:
    """The module paths above a name, nearest first (``a.b``, ``a`` of ``a.b.weight`` or of the
    module ``a.b.c``); the root module (``""``) is not among them.

    Example::

        >>> ancestors("blocks.0.fc1.weight"), ancestors("head")
        (('blocks.0.fc1', 'blocks.0', 'blocks'), ())
    """
    out = []
    module = parent(name)
    while module != name and module:
        out.append(module)
        name, module = module, parent(module)
    return tuple(out)


def parent(name: str) -> str:
    """The module path of a tensor's qualified name (``blocks.0.fc1`` of ``blocks.0.fc1.weight``,
    ``blocks[0]`` of ``blocks[0].weight``); the name itself when it has none.

    Example::

        >>> parent("blocks.0.fc1.weight"), parent("blocks[0].weight"), parent("temperature")
        ('blocks.0.fc1', 'blocks[0]', 'temperature')
    """
    head, dot, _ = name.rpartition(".")
    return head if dot and head else name

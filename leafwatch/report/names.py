"""Tensor names as people read them: natural order and a short form of many names.

Torch-free. ``experts.2`` sorts before ``experts.10`` everywhere leafwatch lists names
(:func:`natural_key`), and the 492 tensors of one mistake print as one line
(:func:`compress_names`).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable

from ..observe.names import parent


_DIGITS = re.compile(r"(\d+)")


@functools.lru_cache(maxsize=1 << 16)  # the same names are sorted at every report
def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """The sort key that puts ``experts.2`` before ``experts.10``.

    Example::

        >>> sorted(["experts.10", "experts.2", "experts.1.w"], key=natural_key)
        ['experts.1.w', 'experts.2', 'experts.10']
    """
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in _DIGITS.split(name) if part)


def container(name: str) -> str:
    """The plain-Python container on an attribute path (``blocks`` of ``blocks[0].weight``,
    ``encoder.stages`` of ``encoder.stages[1][0].bias``); the module path when there is none.

    Example::

        >>> container("blocks[0].weight"), container("encoder.stages[1][0].bias"), container("cfg.layer.weight")
        ('blocks', 'encoder.stages', 'cfg.layer')
    """
    head, bracket, _ = name.partition("[")
    return head if bracket and head else parent(name)


def _ranges(keys: list[str]) -> str:
    """``0..3,5`` of ``["0", "1", "2", "3", "5"]`` (numbers), ``bias,weight`` of words."""
    if not all(k.isdigit() for k in keys):
        return ",".join(sorted(keys, key=natural_key))
    out: list[str] = []
    for _, group in itertools.groupby(enumerate(sorted(int(k) for k in keys)), lambda pair: pair[1] - pair[0]):
        run = [n for _, n in group]  # consecutive numbers
        start, last = run[0], run[-1]
        out.append(str(start) if start == last else f"{start},{last}" if last == start + 1 else f"{start}..{last}")
    return ",".join(out)


def _render(tree: dict[str, dict]) -> list[str]:
    """The names below one node of the name tree, siblings with the same suffixes folded."""
    by_suffixes: dict[tuple[str, ...], list[str]] = {}
    for key, child in tree.items():
        by_suffixes.setdefault(tuple(_render(child)), []).append(key)
    out = []
    for suffixes, keys in sorted(by_suffixes.items(), key=lambda item: natural_key(min(item[1], key=natural_key))):
        head = keys[0] if len(keys) == 1 else "{" + _ranges(keys) + "}"
        out.extend([f"{head}.{s}" for s in suffixes] if suffixes else [head])
    return out


def compress_names(names: Iterable[str], limit: int = 6) -> str:
    """Many names in one short line: siblings folded into ``{...}``, at most ``limit`` parts.

    Example::

        >>> compress_names(["embed.weight", "embed.bias", "blocks.0.fc.weight", "blocks.1.fc.weight"])
        'blocks.{0,1}.fc.weight, embed.{bias,weight}'
        >>> compress_names([f"experts.{i}" for i in range(500) if i not in (0, 1, 7)])
        'experts.{2..6,8..499}'
    """
    return _compressed(tuple(names), limit)


@functools.lru_cache(maxsize=1 << 12)  # a mistake's names are the same from one report to the next
def _compressed(names: tuple[str, ...], limit: int) -> str:
    tree: dict[str, dict] = {}
    for name in names:
        node = tree
        for part in name.split("."):
            node = node.setdefault(part, {})
    parts = _render(tree)
    if len(parts) > limit:
        return ", ".join(parts[:limit - 1]) + f", … ({len(parts) - limit + 1} more)"
    return ", ".join(parts)


__all__ = ["compress_names", "container", "natural_key"]

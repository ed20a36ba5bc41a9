"""Lets torchvision 0.28.0's CUDA build import beside a CPU build of torch 2.13.0.

The only torchvision for torch 2.13 that pip finds here is a CUDA build: its C extension
(``torchvision/_C.so``) cannot load against the CPU torch, and its import then stops at
``torch.library.register_fake("torchvision::nms")``, an operator that only the extension defines.
Every import of torchvision fails, and with it the libraries that import it eagerly (torchmetrics,
and so PyTorch Lightning; timm).

``install.py`` copies this module into the environment's ``site-packages`` with a ``.pth`` line
that imports it at start-up. It imports nothing heavy then: it puts a finder on ``sys.meta_path``
that, at the first ``import torchvision``, tries to load torchvision's extension as torchvision
would; only when that fails does it define the two operator schemas the import expects
(``torchvision::nms`` and ``torchvision::qnms``) with ``torch.library``, and let the import go on.
torchvision's pure-Python parts (its models, transforms) then work; its compiled operators (NMS,
RoIAlign, ...) still raise when called. Where the extension loads (a CPU torchvision), nothing is
defined and nothing changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path
from typing import Any

#: The schemas ``torchvision/_meta_registrations.py`` registers fake kernels for unconditionally.
SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
           "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_library: Any = None  # the torch.library.Library that holds the schemas, kept alive


def _extension_loads(package: Path) -> bool:
    import torch

    for path in sorted(package.glob("_C*.so")) + sorted(package.glob("_C*.pyd")):
        try:
            torch.ops.load_library(str(path))
            return True
        except (ImportError, OSError, RuntimeError):
            continue
    return False


def define_schemas() -> bool:
    """Defines the schemas when torchvision's extension cannot load; whether it defined them."""
    global _library
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations or _library is not None:
        return False
    if _extension_loads(Path(next(iter(spec.submodule_search_locations)))):
        return False
    import torch

    _library = torch.library.Library("torchvision", "DEF")
    for schema in SCHEMAS:
        _library.define(schema)
    return True


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs :func:`define_schemas` once, just before torchvision is first imported."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "torchvision":
            sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self]
            define_schemas()
        return None  # the usual finders import it


def install() -> None:
    if "torchvision" not in sys.modules and not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())


install()

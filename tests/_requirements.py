"""What some tests need from the machine (a browser, PyTorch Lightning, accelerate, Fabric) and what happens without it.

Locally a missing requirement skips the test with the reason. In CI (``CI`` set to ``true``, as
GitHub Actions and GitLab do) it fails the test instead: a green CI run must mean the test ran.
Only the requirement itself may be missing: an import error inside leafwatch is never a skip.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Mapping
from typing import Any

import pytest

#: Browser binaries the dashboard tests can drive headless, in order of preference.
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the tests run in CI: ``CI`` is ``true`` (or ``1``, ``yes``), in any case."""
    return environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require(found: bool, missing: str, *, ci: bool | None = None) -> None:
    """Skip (locally) or fail (in CI) the calling test when a requirement is not ``found``.

    Args:
        found: Whether the requirement is there.
        missing: What is missing and how to get it, for the skip reason or the failure.
        ci: Whether this is CI; None: read the environment (:func:`in_ci`).
    """
    if found:
        return
    if in_ci() if ci is None else ci:
        pytest.fail(f"{missing}; CI is set (CI=true), where a missing requirement fails the test "
                    "instead of skipping it", pytrace=False)
    pytest.skip(missing)


def find_browser(path: str | None = None) -> str | None:
    """The first of :data:`BROWSERS` on ``path`` (default: ``PATH``), or None."""
    for name in BROWSERS:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def require_browser() -> str:
    """The browser to drive headless; skips locally and fails in CI without one."""
    browser = find_browser()
    require(browser is not None, f"no Chromium binary on PATH ({', '.join(BROWSERS)}): "
            "install Debian's `chromium` (.ci/run does)")
    assert browser is not None
    return browser


def require_lightning_callback() -> type:
    """leafwatch's ``LeafWatch`` callback; skips locally and fails in CI only when PyTorch
    Lightning itself is not installed. Any other import error (leafwatch's own) propagates."""
    try:
        import pytorch_lightning  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name != "pytorch_lightning":
            raise
        require(False, 'PyTorch Lightning is not installed: pip install -e ".[lightning]"')
    from leafwatch import LeafWatch

    return LeafWatch


def require_module(name: str, install: str) -> Any:
    """The optional package ``name`` (accelerate, lightning.fabric), imported; skips locally and
    fails in CI only when that package itself is not installed. Any other import error propagates.

    Args:
        name: The module to import (a dotted name imports its package first).
        install: How to install it, for the skip reason or the failure.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is None or not (name == error.name or name.startswith(error.name + ".")):
            raise
        require(False, f"{name} is not installed: {install}")

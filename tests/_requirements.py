"""What some tests need from the machine (a browser, PyTorch Lightning, accelerate, Fabric) and what happens without it.

Locally a missing requirement skips the test with the reason. In CI (``CI`` set to ``true``, as
GitHub Actions and GitLab do) it fails the test instead: a green CI run must mean the test ran.
Only the requirement itself may be missing: an import error inside leafwatch is never a skip.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
from collections.abc import Mapping
from types import ModuleType
from typing import Any, NoReturn

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
    pytest.skip(missing, allow_module_level=True)  # also at the top of a test file


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


#: How to install each optional package the tests use.
INSTALL = {
    "pytorch_lightning": 'pip install -e ".[lightning]"',
    "lightning": 'pip install -e ".[lightning]"',
    "transformers": 'pip install -e ".[transformers]"',
    "accelerate": 'pip install -e ".[transformers]"',
    "peft": 'pip install -e ".[test]"',
    "pyro": 'pip install -e ".[test]"',
    "opacus": 'pip install -e ".[test]"',
    "higher": 'pip install -e ".[test]"',
    "setuptools": 'pip install -e ".[test]"',
}


def _missing(package: str) -> str | None:
    """The reason ``package`` cannot be used, or None when it imports. Only the package itself
    may be missing: an import error of anything else (leafwatch's own) propagates."""
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != package.split(".")[0]:
            raise
        return f"{package} is not installed: {INSTALL.get(package, f'pip install {package}')}"
    return None


def require_module(name: str, *, needs: str | None = None, ci: bool | None = None) -> ModuleType:
    """``import name`` inside a test, like :func:`pytest.importorskip` but by this file's rule:
    skips locally and fails in CI when ``needs`` (default: ``name``'s top-level package) is not
    installed. Any other import error propagates."""
    reason = _missing(needs or name.split(".")[0])
    require(reason is None, reason or "", ci=ci)
    return importlib.import_module(name)


class Unavailable:
    """Stands for an optional module (or anything reached through it) that is not installed.

    A test file imports its optional packages through :func:`optional_import`, so the file
    collects without them and its other tests run. Calling a stand-in, or instantiating a class
    built on one, skips the test locally and fails it in CI (:func:`require`).
    """

    def __init__(self, what: str, reason: str) -> None:
        self._what = what
        self._reason = reason

    def __getattr__(self, attribute: str) -> Unavailable:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return Unavailable(f"{self._what}.{attribute}", self._reason)

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        require(False, f"{self._what} is needed: {self._reason}")
        raise AssertionError("unreachable")

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type]:
        # ``class Module(pl.LightningModule)`` defines a class whose instances cannot be made.
        reason = f"{self._what} is needed: {self._reason}"

        class _Base:
            def __init__(self, *args: object, **kwargs: object) -> None:
                require(False, reason)

        _Base.__qualname__ = _Base.__name__ = f"Unavailable({self._what})"
        return (_Base,)

    def __repr__(self) -> str:
        return f"<unavailable {self._what}: {self._reason}>"


def optional_import(name: str, *, needs: str | None = None) -> Any:
    """``import name`` at the top of a test file: the module when ``needs`` (default: ``name``'s
    top-level package) is installed, else an :class:`Unavailable` stand-in, so the file still
    collects and only the tests that use the module skip (locally) or fail (in CI)."""
    reason = _missing(needs or name.split(".")[0])
    if reason is None:
        return importlib.import_module(name)
    return Unavailable(name, reason)


def require_pytest_plugin() -> None:
    """Skips locally and fails in CI when leafwatch's ``pytest11`` entry point is not registered
    (leafwatch imported from the source tree without ``pip install -e .``): ``pytest --leafwatch``
    needs it."""
    registered = any(ep.group == "pytest11" and ep.name == "leafwatch"
                     for dist in importlib.metadata.distributions() for ep in dist.entry_points)
    require(registered, "leafwatch's pytest plugin is not registered (pytest11 entry point): "
            "pip install -e .")

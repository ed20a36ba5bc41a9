"""Every ``Example::`` in leafwatch's docstrings runs and prints what it shows."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
from _requirements import require_module

import leafwatch

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(leafwatch.__path__, prefix="leafwatch.")
    if not info.name.endswith("__main__")
)
WITH_EXAMPLES = {"leafwatch.auditing", "leafwatch.report.findings", "leafwatch.integrations.lightning",
                 "leafwatch.integrations.transformers", "leafwatch.monitor", "leafwatch.testing", "leafwatch.transformers",
                 "leafwatch.integrations.tensorboard", "leafwatch.sinks.tensorboard", "leafwatch.tensorboard_plugin.plugin", "leafwatch.watching"}

#: Modules that import an optional package: without it their examples skip (locally) or fail (in CI).
NEEDS = {"leafwatch.demo": "pytorch_lightning", "leafwatch.integrations.lightning": "pytorch_lightning",
         "leafwatch.integrations.transformers": "transformers", "leafwatch.transformers": "transformers"}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    if name in NEEDS:
        require_module(NEEDS[name])
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    if name in WITH_EXAMPLES:
        assert result.attempted > 0, f"{name} lost its examples"

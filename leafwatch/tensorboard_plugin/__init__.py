"""The Leafwatch tab for TensorBoard: the findings table and the gradient coverage grid.

Installed with leafwatch, TensorBoard finds it through the ``tensorboard_plugins`` entry point.
Without an install, ``python -m leafwatch.tensorboard_plugin --logdir runs`` starts TensorBoard
with the tab added. This package imports only TensorBoard, werkzeug and the standard library:
TensorBoard imports every installed plugin at start-up, so it must never fail to import.
"""

from __future__ import annotations

from .plugin import LeafwatchPlugin, coverage_grid

__all__ = ["LeafwatchPlugin", "coverage_grid"]

"""``python -m leafwatch.tensorboard_plugin --logdir runs``: TensorBoard with the Leafwatch tab.

Takes TensorBoard's own flags; for a leafwatch that is not installed (see the package docstring).
"""

from __future__ import annotations

import sys

from tensorboard import default, program

from .plugin import PLUGIN_NAME, LeafwatchPlugin


def main(argv: list[str] | None = None) -> int:
    """Runs TensorBoard with its default plugins and the Leafwatch tab; returns the exit code."""
    plugins = [p for p in default.get_plugins() if getattr(p, "plugin_name", None) != PLUGIN_NAME]
    tensorboard = program.TensorBoard(plugins=plugins + [LeafwatchPlugin])
    tensorboard.configure(argv=[sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    return tensorboard.main() or 0


if __name__ == "__main__":
    sys.exit(main())

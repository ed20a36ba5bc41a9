"""The TensorBoard sink, at its earlier import path: re-exports :mod:`leafwatch.sinks.tensorboard`.

The sink is part of the core (``Monitor(writer=...)`` builds one, and the core never imports
``leafwatch.integrations``); its public name is :class:`leafwatch.TensorBoardSink`.

Example::

    >>> import leafwatch
    >>> from leafwatch.integrations.tensorboard import TensorBoardSink
    >>> TensorBoardSink is leafwatch.TensorBoardSink
    True
"""

from __future__ import annotations

from ..report.records import LAYOUT_RUN
from ..sinks.tensorboard import TensorBoardSink, tensor_summary

__all__ = ["LAYOUT_RUN", "TensorBoardSink", "tensor_summary"]

"""The TensorBoard sink, at its earlier import path: re-exports :mod:`leafwatch.sinks.tensorboard`.

The sink is part of the core (``Monitor(writer=...)`` builds one, and the core never imports
``leafwatch.integrations``); its public name is :class:`leafwatch.TensorBoardSink`.

Example::

    >>> import tempfile, torch, leafwatch
    >>> from torch.utils.tensorboard import SummaryWriter
    >>> from leafwatch.integrations.tensorboard import TensorBoardSink
    >>> TensorBoardSink is leafwatch.TensorBoardSink
    True
    >>> model = torch.nn.Linear(2, 1)
    >>> monitor = leafwatch.Monitor(model, sinks=[TensorBoardSink(SummaryWriter(tempfile.mkdtemp()))])
    >>> model(torch.ones(1, 2)).sum().backward()
    >>> monitor.check().findings
    []
    >>> _ = monitor.close()
"""

from __future__ import annotations

from ..report.records import LAYOUT_RUN
from ..sinks.tensorboard import TensorBoardSink, tensor_summary

__all__ = ["LAYOUT_RUN", "TensorBoardSink", "tensor_summary"]

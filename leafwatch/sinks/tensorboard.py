"""The TensorBoard sink: scalars, a findings table, a custom-scalars layout and tab records.

What it writes, all under the ``leafwatch/`` prefix:

- scalars ``leafwatch/open/<kind>`` (open findings per kind) when the counts change and every
  ``log_every_n_steps``; ``leafwatch/grad_coverage`` (share of the checked trainable tensors
  that got a gradient) every ``log_every_n_steps``;
- text ``leafwatch/findings``: the markdown findings table, when the set of findings changes;
- a custom-scalars layout "leafwatch", in its own sub-run ``<log_dir>/leafwatch-layout`` so
  that it never replaces the user's own layout;
- records for the Leafwatch tab, tensor summaries with ``plugin_name="leafwatch"`` and
  ``DATA_CLASS_TENSOR`` holding one string (see :data:`leafwatch.report.records.RECORD_FORMAT`).

The tag names and the record format live in :mod:`leafwatch.report.records`, shared with the Leafwatch
tab and ``leafwatch report``. The sink is part of the core: ``Monitor(writer=...)`` builds one.
``leafwatch.integrations.tensorboard`` re-exports it at its earlier import path.
"""

from __future__ import annotations

import os
from typing import Any

from ..options import WarnOnce
from ..report import patch, records
from ..report.events import CheckEvent
from ..report.findings import KINDS, Report
from ..report.records import LAYOUT_RUN, REPORT_TAG, layout, tensor_summary


def _ranges_append(ranges: list[list[int]], value: int) -> None:
    if ranges and ranges[-1][1] == value - 1:
        ranges[-1][1] = value
    else:
        ranges.append([value, value])


class _Group:
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.steps: list[list[int]] = []
        self.count = 0
        self.missed: dict[int, list[list[int]]] = {}

    def add(self, step: int, missing: list[int]) -> None:
        _ranges_append(self.steps, step)
        for i in missing:
            _ranges_append(self.missed.setdefault(i, []), self.count)
        self.count += 1

    def to_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "steps": self.steps,
                "missed": {str(k): v for k, v in self.missed.items()}}


class _InNoOptimizer:
    """The tensors that no optimizer holds, and the steps of the checks while that was so."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.steps: list[list[int]] = []

    def add(self, step: int) -> None:
        if not self.steps or self.steps[-1][1] < step:  # (two optimizers checked at one step: once)
            _ranges_append(self.steps, step)

    def to_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "steps": self.steps}


_WARN_PATCH = WarnOnce("`leafwatch report --diff` has no patch for this run.")


class TensorBoardSink:
    """Writes each :class:`~leafwatch.CheckEvent` to a ``SummaryWriter``.

    Args:
        writer: A ``torch.utils.tensorboard.SummaryWriter`` (or one with the same methods).
        log_every_n_steps: Cadence of the coverage scalar and of refreshing the tab's records.
        chunk_steps: Steps per coverage record (one tag per chunk).
        write_layout: Write the custom-scalars layout to the ``leafwatch-layout`` sub-run.
        root: The folder the run was started in (default: the working folder when the sink is
            made): the paths of the patch its report record carries are relative to it.
        command: What ``leafwatch run`` ran (its command and working folder), carried by each report
            record as its ``"command"`` (:data:`leafwatch.report.records.RECORD_FORMAT`); :meth:`ended`
            adds how it ended.

    Example::

        >>> import tempfile, torch, leafwatch
        >>> from torch.utils.tensorboard import SummaryWriter
        >>> writer = SummaryWriter(tempfile.mkdtemp())
        >>> model = torch.nn.Linear(2, 1)
        >>> monitor = leafwatch.Monitor(model, writer=writer)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> _ = monitor.check(); _ = monitor.close()
    """

    def __init__(self, writer: Any, *, log_every_n_steps: int = 50, chunk_steps: int = 1000,
                 write_layout: bool = True, root: str | None = None, command: dict[str, Any] | None = None) -> None:
        for attr in ("add_scalar", "add_text"):
            if not callable(getattr(writer, attr, None)):
                raise TypeError(f"`writer` must be a SummaryWriter (with `{attr}`), got {type(writer).__name__}")
        for argument, value in (("log_every_n_steps", log_every_n_steps), ("chunk_steps", chunk_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{argument}` must be an int >= 1, got {value!r}")
        self.writer = writer
        self.root = os.path.abspath(root if root is not None else os.getcwd())
        self._command = None if command is None else {**command, "ended": None}
        self.log_every_n_steps = log_every_n_steps
        self.chunk_steps = chunk_steps
        # A live run's grid is refreshed a few times per chunk: every rewrite repeats the chunk so far.
        self.refresh_every_n_steps = max(log_every_n_steps, chunk_steps // 4)
        self._layout_pending = write_layout
        self._counts: dict[str, int] | None = None
        self._chunk: int | None = None
        self._groups: dict[str, _Group] = {}
        self._current: dict[str, str] = {}
        self._in_no_optimizer: list[_InNoOptimizer] = []
        self._last_step = 0
        self._written: tuple[int, int] | None = None  # (id of the report, step) last written

    def stats(self) -> dict[str, int]:
        """Sizes of the per-chunk coverage state (reset at every chunk), for tests of its bounds."""
        return {"coverage_groups": len(self._groups),
                "max_steps_in_a_group": max((len(g.steps) for g in self._groups.values()), default=0),
                "in_no_optimizer_sets": len(self._in_no_optimizer)}

    # -- the sink ----------------------------------------------------------------------------
    def __call__(self, event: CheckEvent) -> None:
        step = event.step
        self._last_step = step
        if self._layout_pending:
            self._layout_pending = False
            self._add_layout()
        counts = event.report.counts()
        periodic = step == 1 or step % self.log_every_n_steps == 0
        if counts != self._counts or periodic:
            for kind in KINDS:
                self.writer.add_scalar(records.open_tag(kind), counts.get(kind, 0), step)
            self._counts = counts
        if event.coverage is not None and (periodic or event.changed):
            self.writer.add_scalar(records.GRAD_COVERAGE_TAG, event.coverage, step)
        self._add_coverage(event)
        if event.changed:
            self._write_report(event.report, step)
        if event.changed or step % self.refresh_every_n_steps == 0:
            self._flush_chunk()

    def flush(self) -> None:
        """Write what waits (the coverage of this chunk) and flush the writer (the run may end now: a crash)."""
        self._flush_chunk()
        self.writer.flush()

    def ended(self, *, exit_code: int | None, stopped_by: str | None, step: int) -> None:
        """How the run ended, for the records written from now on (the last one at :meth:`close`):
        the script's exit code (None when leafwatch stopped it: ``stopped_by`` names the option)."""
        if self._command is not None:
            self._command["ended"] = {"exit_code": exit_code, "stopped_by": stopped_by, "step": step}
            self._written = None  # (the record at close carries it, even for a report written at that step)

    def close(self, report: Report | None = None) -> None:
        if report is not None:
            self._write_report(report, self._last_step)
        self.flush()

    # -- records -----------------------------------------------------------------------------
    def _write_report(self, report: Report, step: int) -> None:
        # A Monitor updates its unchanged report's step in place: the same object at a new step
        # is written again, so the last record carries the last step.
        if self._written == (id(report), step):
            return
        self._written = (id(report), step)
        self.writer.add_text(records.FINDINGS_TEXT_TAG, report.to_markdown(), step)
        self._add_record(REPORT_TAG, records.encode_report(report.to_dict(), patch=self._patch(report), command=self._command),
                         step)

    def _patch(self, report: Report) -> dict[str, Any] | None:
        """What ``leafwatch report --diff`` needs (:func:`leafwatch.report.patch.record`), written with the
        report when the findings change; its failure costs only the patch."""
        try:
            return patch.record(report.findings, self.root)
        except Exception as failure:
            _WARN_PATCH("recording the patch of the run", failure)
            return None

    def _add_coverage(self, event: CheckEvent) -> None:
        chunk = (event.step - 1) // self.chunk_steps
        if self._chunk is not None and chunk != self._chunk:
            self._flush_chunk()
            self._groups, self._current, self._in_no_optimizer = {}, {}, []
        self._chunk = chunk
        base = "all" if event.optimizer is None else str(event.optimizer)
        key = self._current.get(base, base)
        group = self._groups.get(key)
        if group is None or (group.names is not event.names and group.names != event.names):
            if group is not None:
                # The checked set changed mid-chunk: go on in a new group of this chunk.
                key = f"{base}@{event.step}"
            group = self._groups[key] = _Group(event.names)
            self._current[base] = key
        group.add(event.step, event.missing)
        unheld = event.in_no_optimizer
        if unheld:
            last = self._in_no_optimizer[-1] if self._in_no_optimizer else None
            if last is None or (last.names is not unheld and last.names != unheld):
                last = _InNoOptimizer(unheld)
                self._in_no_optimizer.append(last)
            last.add(event.step)

    def _flush_chunk(self) -> None:
        if self._chunk is None or not self._groups:
            return
        payload = records.encode_coverage(self._chunk, {k: g.to_dict() for k, g in self._groups.items()},
                                          [u.to_dict() for u in self._in_no_optimizer])
        self._add_record(records.coverage_tag(self._chunk), payload, self._last_step)

    def _add_record(self, tag: str, payload: str | bytes, step: int) -> None:
        get_writer = getattr(self.writer, "_get_file_writer", None)
        if get_writer is not None:
            get_writer().add_summary(tensor_summary(tag, payload), step)

    def _add_layout(self) -> None:
        log_dir = getattr(self.writer, "log_dir", None) or getattr(self.writer, "logdir", None)
        if not log_dir:
            return
        from torch.utils.tensorboard import SummaryWriter

        sub = SummaryWriter(os.path.join(str(log_dir), LAYOUT_RUN))
        try:
            sub.add_custom_scalars(layout())
        finally:
            sub.close()

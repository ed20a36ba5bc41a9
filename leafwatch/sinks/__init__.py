"""Where a report goes after each check: the console and TensorBoard.

A sink is a callable taking a :class:`~leafwatch.report.events.CheckEvent` (and optionally
``close(report)``); the Monitor builds these two from ``verbose=`` and ``writer=``.
"""

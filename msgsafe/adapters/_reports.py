"""Calling a :class:`~msgsafe.ports.BatchReport` from an adapter's I/O path.

Reports run where the broker library serves confirmations (librdkafka's poll, pika's
ioloop): one that raises is logged and dropped, never raised into the library, which
would lose every other report of that round.
"""

from __future__ import annotations

import logging

from msgsafe.errors import MsgsafeError
from msgsafe.ports import BatchReport

__all__ = ["report_confirmed", "report_failed"]

log = logging.getLogger("msgsafe.transport")


def report_confirmed(report: BatchReport, count: int) -> None:
    """``report.confirmed(count)``, guarded."""
    try:
        report.confirmed(count)
    except Exception:
        log.exception("BatchReport.confirmed raised; ignored")


def report_failed(report: BatchReport, index: int, error: MsgsafeError) -> None:
    """``report.failed(index, error)``, guarded."""
    try:
        report.failed(index, error)
    except Exception:
        log.exception("BatchReport.failed raised; ignored")

"""Calling back into the layer above from an adapter's I/O path.

Publish callbacks and :class:`~msgsafe.ports.BatchReport` methods run where the broker
library serves confirmations (librdkafka's poll, pika's ioloop, a timer thread): one
that raises is logged and dropped, never raised into the library, which would lose
every other report of that round (or stop the I/O thread).
"""

from __future__ import annotations

import logging

from msgsafe._callbacks import call_logged
from msgsafe.errors import MsgsafeError
from msgsafe.ports import BatchReport

__all__ = ["PUBLISH_CALLBACK", "call_logged", "report_confirmed", "report_failed"]

log = logging.getLogger("msgsafe.transport")

#: What :func:`call_logged` names a publish callback in its log line.
PUBLISH_CALLBACK = "publish callback"


def report_confirmed(report: BatchReport, count: int) -> None:
    """``report.confirmed(count)``, guarded."""
    call_logged(log, "BatchReport.confirmed", report.confirmed, count)


def report_failed(report: BatchReport, index: int, error: MsgsafeError) -> None:
    """``report.failed(index, error)``, guarded."""
    call_logged(log, "BatchReport.failed", report.failed, index, error)

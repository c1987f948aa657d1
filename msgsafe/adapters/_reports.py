"""Calling back into the layer above from an adapter's I/O path.

Publish callbacks and :class:`~msgsafe.ports.BatchReport` methods run where the broker
library serves confirmations (librdkafka's poll, pika's ioloop, a timer thread): one
that raises is logged and dropped, never raised into the library, which would lose
every other report of that round (or stop the I/O thread).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from msgsafe.errors import MsgsafeError
from msgsafe.ports import BatchReport

__all__ = ["call_logged", "report_confirmed", "report_failed"]

log = logging.getLogger("msgsafe.transport")


def call_logged(fn: Callable[..., object], *args: object) -> None:
    """``fn(*args)``; whatever it raises is logged (with its traceback) and dropped."""
    try:
        fn(*args)
    except Exception:
        log.exception("%s raised; ignored", getattr(fn, "__qualname__", None) or repr(fn))


def report_confirmed(report: BatchReport, count: int) -> None:
    """``report.confirmed(count)``, guarded."""
    call_logged(report.confirmed, count)


def report_failed(report: BatchReport, index: int, error: MsgsafeError) -> None:
    """``report.failed(index, error)``, guarded."""
    call_logged(report.failed, index, error)

"""Calling code that is not ours from a thread that must go on.

Receipt callbacks, batch reports and user hooks run on the threads that serve
confirmations (pika's ioloop, librdkafka's poll, proton's container, the outbox
forwarder and writer). An exception raised there would stop that thread or reach the
broker library, which would lose every other report of the round: it is logged with
its traceback and dropped, in one place, the same way everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVarTuple

__all__ = ["call_logged"]

_Args = TypeVarTuple("_Args")


def call_logged(
    log: logging.Logger,
    what: str,
    callback: Callable[[*_Args], object],
    *args: *_Args,
) -> None:
    """``callback(*args)``; anything it raises (``Exception``, not ``BaseException``) is
    logged on ``log`` as ``"<what> raised; ignored"`` with its traceback and dropped."""
    try:
        callback(*args)
    except Exception:
        log.exception("%s raised; ignored", what)

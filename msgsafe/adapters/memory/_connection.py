"""What stands in for a connection in ``memory://NAME``: the named broker, and the
thread a late confirm arrives on.

There is no socket: "connecting" is finding the :class:`~msgsafe.adapters.memory.broker.
MemoryBroker` registered under the URL's name (:func:`connect`). What a network
adapter's I/O thread does for its callers, delivering an outcome on another thread
later, :class:`LateConfirms` does with timers when a test delays the broker's confirms;
closing waits for them, as a network transport waits for its I/O thread.
"""

from __future__ import annotations

import logging
import threading

from msgsafe.adapters._reports import PUBLISH_CALLBACK, call_logged
from msgsafe.adapters.memory.broker import MemoryBroker
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import MsgsafeError
from msgsafe.ports import PublishCallback

__all__ = ["LateConfirms", "connect", "log"]

log = logging.getLogger("msgsafe.memory")


def connect(url: BrokerUrl) -> MemoryBroker:
    """The broker ``url`` names (``memory://NAME``), created on first use."""
    return MemoryBroker.named(url.path)


class LateConfirms:
    """Outcomes delivered later, each on its own timer thread. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._timers: set[threading.Timer] = set()

    def later(self, delay: float, callback: PublishCallback, error: MsgsafeError | None) -> None:
        """Call ``callback(error)`` in ``delay`` seconds."""

        def fire() -> None:
            with self._lock:
                self._timers.discard(timer)
            call_logged(log, PUBLISH_CALLBACK, callback, error)

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        with self._lock:
            self._timers.add(timer)
        timer.start()

    def join(self, timeout: float | None) -> None:
        """Wait for the outcomes still due (each at most ``timeout`` seconds)."""
        with self._lock:
            timers = list(self._timers)
        for timer in timers:
            timer.join(timeout)

"""The clock ``Consumer.run`` reads and waits on: injectable, so that a test drives
the retry schedule by hand and never sleeps."""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["MonotonicClock", "RunClock"]


@runtime_checkable
class RunClock(Protocol):
    """Seconds on a monotonic scale, and a wait on a condition until one of them.

    ``wait`` is called with ``condition`` held, as ``Condition.wait`` is; it returns
    when the condition is notified, when :meth:`now` reached ``deadline`` (None: no
    deadline), or earlier (callers check again): a test clock may wait briefly in real
    time while its ``now`` stands still until the test moves it.
    """

    def now(self) -> float:
        """The current time, in seconds."""
        ...

    def wait(self, condition: threading.Condition, deadline: float | None) -> None:
        """Wait on ``condition`` (held) until notified or ``now() >= deadline``."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and ``Condition.wait``."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, condition: threading.Condition, deadline: float | None) -> None:
        condition.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

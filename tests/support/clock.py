"""A clock a test moves by hand, for stores and forwarders that take ``clock=``."""

from __future__ import annotations

import threading


class Clock:
    """Epoch seconds: ``now`` until the test sets it."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class HandClock:
    """A :class:`~msgsafe.consuming.RunClock` whose time stands still until the test
    calls :meth:`advance`; its waits last a moment of real time at most, so that a
    waiting worker sees the moved time soon after."""

    def __init__(self) -> None:
        self.t = 0.0
        self.deadlines: list[float] = []

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def wait(self, condition: threading.Condition, deadline: float | None) -> None:
        if deadline is not None:
            self.deadlines.append(deadline)
        condition.wait(0.01)


class LeapingClock(HandClock):
    """A :class:`HandClock` that leaps to each deadline it is asked to wait for: a retry
    schedule runs at once, each attempt stamped with its exact time."""

    def wait(self, condition: threading.Condition, deadline: float | None) -> None:
        if deadline is None:
            condition.wait(0.01)
            return
        self.deadlines.append(deadline)
        self.t = max(self.t, deadline)

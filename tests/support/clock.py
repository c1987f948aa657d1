"""A clock a test moves by hand, for stores and forwarders that take ``clock=``."""

from __future__ import annotations


class Clock:
    """Epoch seconds: ``now`` until the test sets it."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

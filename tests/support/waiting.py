"""Polling a condition against a deadline: the one way tests wait (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], object], timeout: float, what: str, *, interval: float = 0.05
) -> float:
    """Poll ``condition`` until it is true; returns the seconds it took. Fails the test
    with ``what`` when ``timeout`` seconds pass first."""
    start = time.monotonic()
    deadline = start + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(interval)  # the polling period, bounded by the deadline above
    return time.monotonic() - start

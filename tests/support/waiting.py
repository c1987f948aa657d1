"""Polling a condition against a deadline: the one way tests wait (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], object],
    timeout: float,
    what: str,
    *,
    interval: float = 0.05,
    diagnose: Callable[[], str] | None = None,
) -> float:
    """Poll ``condition`` until it is true; returns the seconds it took. Fails the test
    with ``what`` when ``timeout`` seconds pass first, adding what ``diagnose`` says (the
    state a reader of the failure needs, gathered only then: it may be slow)."""
    start = time.monotonic()
    deadline = start + timeout
    while not condition():
        if time.monotonic() >= deadline:
            detail = f"\n{diagnose()}" if diagnose is not None else ""
            raise AssertionError(f"not within {timeout:g} s: {what}{detail}")
        time.sleep(interval)  # the polling period, bounded by the deadline above
    return time.monotonic() - start

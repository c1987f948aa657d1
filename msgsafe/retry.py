"""Retry policies as immutable values. The only module that imports tenacity.

A policy answers two questions — *how long to wait before attempt n* and *should we
try again* — and never sleeps itself: callers inject the sleep (or a clock), so tests
control time instead of waiting for it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import tenacity

from msgsafe.errors import ConfigurationError, TransientError

__all__ = ["Backoff", "RetryPolicy"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with full jitter and a cap.

    ``initial`` seconds before the second attempt, growing by ``multiplier`` up to
    ``maximum``; each wait is drawn uniformly from ``[0, cap]`` (full jitter) so many
    clients retrying one broker spread out instead of stampeding it. ``max_attempts``
    and ``deadline`` (seconds) bound the whole retry; None means unbounded.
    ``jitter=False`` waits the cap itself: a fixed, predictable schedule (one client,
    or a test that checks the delays).
    """

    initial: float = 0.1
    maximum: float = 5.0
    multiplier: float = 2.0
    max_attempts: int | None = None
    deadline: float | None = None
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < self.initial or self.multiplier < 1:
            raise ConfigurationError(
                "retry policy needs 0 <= initial <= maximum and multiplier >= 1"
            )
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        if self.deadline is not None and self.deadline < 0:
            raise ConfigurationError("deadline must be >= 0")

    def cap(self, attempt: int) -> float:
        """The upper bound of the wait after failed attempt number ``attempt`` (1-based)."""
        exponent = max(0, attempt - 1)
        # Avoid float overflow for very long outages: the cap is reached long before.
        if exponent > 64:
            return self.maximum
        return float(min(self.maximum, self.initial * self.multiplier**exponent))

    def wait(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """A jittered wait in ``[0, cap(attempt)]`` (``cap(attempt)`` itself without
        jitter); ``rng`` is injectable for tests."""
        if not self.jitter:
            return self.cap(attempt)
        return self.cap(attempt) * rng()

    def exhausted(self, attempt: int, elapsed: float) -> bool:
        """True when no attempt may follow attempt number ``attempt`` (1-based), made
        ``elapsed`` seconds after the first began: ``max_attempts`` reached, or the
        ``deadline`` passed."""
        if self.max_attempts is not None and attempt >= self.max_attempts:
            return True
        return self.deadline is not None and elapsed >= self.deadline

    def retrying(
        self,
        *,
        retry_on: tuple[type[BaseException], ...] = (TransientError,),
        sleep: Callable[[float], None] = time.sleep,
    ) -> tenacity.Retrying:
        """A tenacity ``Retrying`` that follows this policy and re-raises the last error."""
        stops: list[tenacity.stop.stop_base] = []
        if self.max_attempts is not None:
            stops.append(tenacity.stop_after_attempt(self.max_attempts))
        if self.deadline is not None:
            stops.append(tenacity.stop_after_delay(self.deadline))
        stop: tenacity.stop.stop_base = tenacity.stop_never
        for item in stops:
            stop = item if stop is tenacity.stop_never else stop | item
        wait: tenacity.wait.wait_base
        if self.jitter:
            wait = tenacity.wait_random_exponential(
                multiplier=self.initial, max=self.maximum, exp_base=self.multiplier
            )
        else:
            wait = tenacity.wait_exponential(
                multiplier=self.initial, max=self.maximum, exp_base=self.multiplier
            )
        return tenacity.Retrying(
            wait=wait,
            stop=stop,
            retry=tenacity.retry_if_exception_type(retry_on),
            sleep=sleep,
            reraise=True,
        )


@dataclass(slots=True)
class Backoff:
    """Mutable per-target state over a :class:`RetryPolicy`: consecutive failures and when
    the next attempt is allowed. Not thread-safe; owned by one component."""

    policy: RetryPolicy
    clock: Callable[[], float] = time.monotonic
    rng: Callable[[], float] = random.random
    failures: int = 0
    not_before: float = field(default=0.0)

    def ready(self) -> bool:
        """True when an attempt is allowed now."""
        return self.clock() >= self.not_before

    def remaining(self) -> float:
        """Seconds until the next attempt is allowed (0 when ready)."""
        return max(0.0, self.not_before - self.clock())

    def failure(self) -> float:
        """Record a failed attempt; returns the chosen wait."""
        self.failures += 1
        delay = self.policy.wait(self.failures, self.rng)
        self.not_before = self.clock() + delay
        return delay

    def success(self) -> None:
        """Record a success: the next failure starts from the initial wait again."""
        self.failures = 0
        self.not_before = 0.0

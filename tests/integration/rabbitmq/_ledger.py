"""Bookkeeping for reliability runs: every id sent, receipted and received."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from msgsafe.errors import MsgsafeError, TransientError
from msgsafe.message import Envelope
from msgsafe.ports import Receiver, Transport


@dataclass
class Ledger:
    """Ids sent, receipted (future resolved OK) and received, with failure counts."""

    sent: set[str] = field(default_factory=set)
    receipted: set[str] = field(default_factory=set)
    received: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    permanent: list[MsgsafeError] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def lost(self) -> set[str]:
        """Receipted ids never received."""
        return self.receipted - set(self.received)

    @property
    def duplicates(self) -> int:
        return sum(c - 1 for c in self.received.values() if c > 1)

    @property
    def unknown(self) -> set[str]:
        """Received ids that were never sent."""
        return set(self.received) - self.sent

    def report(self, name: str) -> str:
        failures = ", ".join(f"{k}={v}" for k, v in sorted(self.failures.items())) or "none"
        return (
            f"[{name}] sent={len(self.sent)} receipted={len(self.receipted)} "
            f"received={sum(self.received.values())} unique={len(self.received)} "
            f"lost={len(self.lost)} duplicates={self.duplicates} unknown={len(self.unknown)} "
            f"failures: {failures}"
        )


def publish_all(
    transport: Transport,
    envelopes: list[Envelope],
    ledger: Ledger,
    *,
    deadline_s: float,
) -> None:
    """Publish ``envelopes``; transient failures are published again (same envelope, same
    id), as the outbox would, until ``deadline_s`` from now. Permanent errors are kept."""
    deadline = time.monotonic() + deadline_s
    todo = list(envelopes)
    while todo and time.monotonic() < deadline:
        todo = _publish_round(transport, todo, ledger, deadline)


def _publish_round(
    transport: Transport, todo: list[Envelope], ledger: Ledger, deadline: float
) -> list[Envelope]:
    retry: list[Envelope] = []
    done = threading.Semaphore(0)

    def settled(env: Envelope, fut: Future[None]) -> None:
        exc = fut.exception()
        with ledger.lock:
            if exc is None:
                ledger.receipted.add(env.message_id)
            else:
                ledger.failures[type(exc).__name__] += 1
                if isinstance(exc, TransientError):
                    retry.append(env)
                elif isinstance(exc, MsgsafeError):
                    ledger.permanent.append(exc)
        done.release()

    for env in todo:
        with ledger.lock:
            ledger.sent.add(env.message_id)
        fut = transport.publish(env)
        fut.add_done_callback(lambda f, env=env: settled(env, f))
    for _ in todo:
        if not done.acquire(timeout=max(0.1, deadline - time.monotonic() + 60)):
            raise AssertionError("a publish future did not resolve: the contract is broken")
    return retry


def consume_until(
    receiver: Receiver,
    ledger: Ledger,
    *,
    expected: Iterable[str],
    quiet_s: float = 2.0,
    deadline_s: float = 120.0,
) -> None:
    """Receive and ack until every ``expected`` id arrived and nothing came for ``quiet_s``
    (so duplicates still on their way are counted too), or until ``deadline_s``."""
    want = set(expected)
    deadline = time.monotonic() + deadline_s
    last = time.monotonic()
    while time.monotonic() < deadline:
        batch = receiver.receive(max_messages=500, timeout=0.5)
        for delivery in batch:
            if delivery.message_id is not None:
                ledger.received[delivery.message_id] += 1
            delivery.ack()
        if batch:
            last = time.monotonic()
        elif want <= set(ledger.received) and time.monotonic() - last >= quiet_s:
            return


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")

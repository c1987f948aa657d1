"""Bookkeeping shared by the AMQP 1.0 reliability tests: what was sent, confirmed, received."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from msgsafe.errors import MsgsafeError, TransientError
from msgsafe.message import Delivery
from msgsafe.ports import Receiver


@dataclass
class Tally:
    """Every id sent, every id confirmed, every error, every id received (with repeats)."""

    sent: list[str] = field(default_factory=list)
    confirmed: set[str] = field(default_factory=set)
    errors: dict[str, MsgsafeError] = field(default_factory=dict)
    received: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def track(self, message_id: str, future: Future[None]) -> None:
        """Record ``message_id`` as sent and its outcome when ``future`` resolves."""
        self.sent.append(message_id)

        def done(f: Future[None]) -> None:
            exc = f.exception()
            with self.lock:
                if exc is None:
                    self.confirmed.add(message_id)
                elif isinstance(exc, MsgsafeError):
                    self.errors[message_id] = exc
                else:  # a foreign exception leaked: record it so the test fails loudly
                    self.errors[message_id] = MsgsafeError(f"leaked {type(exc).__name__}: {exc}")

        future.add_done_callback(done)

    def confirmed_count(self) -> int:
        with self.lock:
            return len(self.confirmed)

    def resolved(self) -> int:
        with self.lock:
            return len(self.confirmed) + len(self.errors)

    def receive(self, delivery: Delivery) -> None:
        with self.lock:
            if delivery.message_id is not None:
                self.received.append(delivery.message_id)

    def missing(self) -> set[str]:
        with self.lock:
            return self.confirmed - set(self.received)

    def report(self, label: str) -> dict[str, int]:
        """Counts (printed for the test log) and the invariants' inputs."""
        with self.lock:
            received = set(self.received)
            counts = {
                "sent": len(self.sent),
                "confirmed": len(self.confirmed),
                "errors": len(self.errors),
                "transient_errors": sum(
                    isinstance(e, TransientError) for e in self.errors.values()
                ),
                "received": len(self.received),
                "unique_received": len(received),
                "duplicates": len(self.received) - len(received),
                "lost": len(self.confirmed - received),
                "unknown": len(received - set(self.sent)),
            }
        print(f"[{label}] " + " ".join(f"{k}={v}" for k, v in counts.items()))
        return counts


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


class Drain(threading.Thread):
    """Consumes from ``receiver`` in the background, acknowledging every delivery."""

    def __init__(self, receiver: Receiver, tally: Tally) -> None:
        super().__init__(daemon=True, name="amqp10-test-drain")
        self.receiver = receiver
        self.tally = tally
        self.stop_flag = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_flag.is_set():
                for delivery in self.receiver.receive(max_messages=200, timeout=0.2):
                    self.tally.receive(delivery)
                    delivery.ack()
        except BaseException as exc:  # surfaced by stop()
            self.failure = exc

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(10)
        if self.failure is not None:
            raise AssertionError(f"consumer thread failed: {self.failure!r}")

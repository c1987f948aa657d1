"""The loss ledger every reliability test keeps: each id sent, receipted and received.

A receipt is the SDK's promise (the broker confirmed the message, or the outbox stored
it); ``lost`` are receipted ids never received and must be empty; ``unknown`` are
received ids never sent and must be empty too, so every duplicate carries a known id.

What works through the ports is here as well: publishing with retries
(:func:`publish_all`), receiving into the ledger (:func:`receive_until`,
:func:`receive_receipted`, :class:`Drain`).
How to read a given broker back otherwise stays with that protocol
(``tests/support/kafka_ledger.py`` reads a Kafka log).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Collection, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from msgsafe.adapters import open_receiver
from msgsafe.endpoints import parse_url
from msgsafe.errors import TransientError
from msgsafe.message import Envelope, Receipt, Status
from msgsafe.ports import Receiver, Transport


@dataclass
class Ledger:
    """Every id sent, receipted and received (with how often), and every failure.

    Senders, callbacks and consumers run on threads of their own: the ``add_*`` methods
    and :meth:`track` take ``lock``; a test that fills the fields itself holds it when
    other threads may be writing too.
    """

    sent: set[str] = field(default_factory=set)
    receipted: set[str] = field(default_factory=set)
    #: Receipts by status value ("confirmed", "stored").
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Failed attempts by error name: an id sent again after a failure counts again.
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Id -> the error of its last attempt, while no later attempt was receipted.
    failed: dict[str, BaseException] = field(default_factory=dict)
    received: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Id -> (key, n): the n-th message of its key, for :meth:`order_violations`.
    positions: dict[str, tuple[str, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # --- recording -----------------------------------------------------------------------

    def add_sent(self, *message_ids: str) -> None:
        """Record ids as sent before their outcome can arrive (a callback may be quick)."""
        with self.lock:
            self.sent.update(message_ids)

    def add_receipt(self, message_id: str, status: Status = Status.CONFIRMED) -> None:
        """A receipt; it settles an earlier failure of the same id (sent again)."""
        with self.lock:
            self.receipted.add(message_id)
            self.statuses[status.value] += 1
            self.failed.pop(message_id, None)

    def add_failure(self, message_id: str | None, error: BaseException) -> None:
        with self.lock:
            self.failures[type(error).__name__] += 1
            if message_id is not None:
                self.failed[message_id] = error

    def add_received(self, message_id: str | None) -> None:
        if message_id is not None:
            with self.lock:
                self.received[message_id] += 1

    def track(self, message_id: str, future: Future[Any]) -> None:
        """Record ``message_id`` as sent, and its outcome when ``future`` resolves: a
        :class:`Receipt` (a producer's) or ``None`` (a transport's, resolved on the
        broker's confirm) is a receipt; an exception, of any type, a failure."""
        self.add_sent(message_id)

        def settled(done: Future[Any]) -> None:
            exc = done.exception()
            if exc is not None:
                self.add_failure(message_id, exc)
                return
            result = done.result()
            self.add_receipt(
                message_id, result.status if isinstance(result, Receipt) else Status.CONFIRMED
            )

        future.add_done_callback(settled)

    # --- reading -------------------------------------------------------------------------

    @property
    def lost(self) -> set[str]:
        """Receipted ids never received."""
        return self.receipted - set(self.received)

    @property
    def duplicates(self) -> int:
        """Copies received beyond the first of each id."""
        return sum(c - 1 for c in self.received.values() if c > 1)

    @property
    def unknown(self) -> set[str]:
        """Received ids that were never sent (a duplicate must carry a known id)."""
        return set(self.received) - self.sent

    @property
    def permanent(self) -> list[BaseException]:
        """The last errors of ids that are not worth sending again (not transient)."""
        return [e for e in self.failed.values() if not isinstance(e, TransientError)]

    def missing(self) -> set[str]:
        """:attr:`lost` while consumers still write: receipted, not received yet."""
        with self.lock:
            return self.receipted - set(self.received)

    def resolved(self) -> int:
        """Ids whose latest attempt has an outcome (receipt or failure)."""
        with self.lock:
            return len(self.receipted) + len(self.failed)

    def unresolved(self) -> int:
        with self.lock:
            return len(self.sent) - len(self.receipted) - len(self.failed)

    def counts(self, name: str | None = None) -> dict[str, int]:
        """The figures, taken under the lock; printed for the test log when ``name``."""
        with self.lock:
            unique = set(self.received)
            figures = {
                "sent": len(self.sent),
                "receipted": len(self.receipted),
                "confirmed": self.statuses[Status.CONFIRMED.value],
                "stored": self.statuses[Status.STORED.value],
                "failed": len(self.failed),
                "transient": sum(isinstance(e, TransientError) for e in self.failed.values()),
                "received": sum(self.received.values()),
                "unique": len(unique),
                "duplicates": sum(c - 1 for c in self.received.values() if c > 1),
                "lost": len(self.receipted - unique),
                "unknown": len(unique - self.sent),
            }
        if name is not None:
            print(f"[{name}] " + " ".join(f"{k}={v}" for k, v in figures.items()))
        return figures

    def report(self, name: str) -> str:
        """One line for the test log and for assertion messages."""
        figures = self.counts()
        with self.lock:
            statuses = ", ".join(f"{k}={v}" for k, v in sorted(self.statuses.items())) or "none"
            failures = ", ".join(f"{k}={v}" for k, v in sorted(self.failures.items())) or "none"
        return (
            f"[{name}] sent={figures['sent']} receipted={figures['receipted']} ({statuses}) "
            f"received={figures['received']} unique={figures['unique']} "
            f"lost={figures['lost']} duplicates={figures['duplicates']} "
            f"unknown={figures['unknown']} failures: {failures}"
        )

    def order_violations(
        self, arrivals: Iterable[str], among: Collection[str] | None = None
    ) -> list[str]:
        """Ids whose first copy arrived after a message of their key at the same or a
        later position; ``arrivals`` in arrival order (copies included), counting only
        ids in ``among`` (default: every id with a position). Each as ``key n after m``."""
        seen: set[str] = set()
        last: dict[str, int] = {}
        late: list[str] = []
        for message_id in arrivals:
            if message_id in seen or message_id not in self.positions:
                continue
            if among is not None and message_id not in among:
                continue
            seen.add(message_id)
            key, n = self.positions[message_id]
            before = last.get(key, -1)
            if n <= before:
                late.append(f"{key} {n} after {before}")
            last[key] = max(n, before)
        return late


# --- through the ports -----------------------------------------------------------------


def publish_all(
    transport: Transport,
    envelopes: list[Envelope],
    ledger: Ledger,
    *,
    deadline_s: float,
) -> None:
    """Publish ``envelopes``; transient failures are published again (same envelope, same
    id), as the outbox would, until ``deadline_s`` from now. Permanent errors are kept
    (:attr:`Ledger.permanent`)."""
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
        if exc is None:
            ledger.add_receipt(env.message_id)
        else:
            ledger.add_failure(env.message_id, exc)
            if isinstance(exc, TransientError):
                with ledger.lock:
                    retry.append(env)
        done.release()

    for env in todo:
        ledger.add_sent(env.message_id)
        fut = transport.publish(env)
        fut.add_done_callback(lambda f, env=env: settled(env, f))
    for _ in todo:
        if not done.acquire(timeout=max(0.1, deadline - time.monotonic() + 60)):
            raise AssertionError("a publish future did not resolve: the contract is broken")
    return retry


def receive_until(
    receiver: Receiver,
    ledger: Ledger,
    *,
    expected: Iterable[str],
    quiet_s: float = 2.0,
    deadline_s: float = 120.0,
) -> list[str]:
    """Receive and ack until every ``expected`` id arrived and nothing came for ``quiet_s``
    (so duplicates still on their way are counted too), or until ``deadline_s``; returns
    the ids in arrival order, copies included (for :meth:`Ledger.order_violations`)."""
    want = set(expected)
    arrivals: list[str] = []
    deadline = time.monotonic() + deadline_s
    last = time.monotonic()
    while time.monotonic() < deadline:
        batch = receiver.receive(max_messages=500, timeout=0.5)
        for delivery in batch:
            arrivals.append(str(delivery.message_id))
            ledger.add_received(delivery.message_id)
            delivery.ack()
        if batch:
            last = time.monotonic()
        elif want <= set(ledger.received) and time.monotonic() - last >= quiet_s:
            break
    return arrivals


def receive_receipted(
    url: str,
    destination: str,
    ledger: Ledger,
    *,
    prefetch: int = 500,
    quiet_s: float = 2.0,
    deadline_s: float = 120.0,
) -> list[str]:
    """Open a receiver on ``url`` (the adapter its scheme names), subscribe to
    ``destination`` and :func:`receive_until` every receipted id arrived; closed after.
    Returns the ids in arrival order."""
    receiver = open_receiver(parse_url(url), {"prefetch": prefetch})
    try:
        receiver.subscribe(destination)
        return receive_until(
            receiver, ledger, expected=ledger.receipted, quiet_s=quiet_s, deadline_s=deadline_s
        )
    finally:
        receiver.close()


class Drain(threading.Thread):
    """Receives from ``receiver`` in the background into ``ledger``, acknowledging every
    delivery, until :meth:`stop` (which raises what the thread died of)."""

    def __init__(self, receiver: Receiver, ledger: Ledger) -> None:
        super().__init__(daemon=True, name="test-drain")
        self.receiver = receiver
        self.ledger = ledger
        self.stop_flag = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_flag.is_set():
                for delivery in self.receiver.receive(max_messages=200, timeout=0.2):
                    self.ledger.add_received(delivery.message_id)
                    delivery.ack()
        except BaseException as exc:  # surfaced by stop()
            self.failure = exc

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(10)
        if self.failure is not None:
            raise AssertionError(f"consumer thread failed: {self.failure!r}")

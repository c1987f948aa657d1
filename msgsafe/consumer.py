"""The consumer: at-least-once delivery, optional dedup by message id."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Self

from msgsafe.adapters import open_receiver
from msgsafe.checks import Inspector, inspector_for
from msgsafe.dedup import DedupWindow
from msgsafe.endpoints import BrokerUrl, parse_url
from msgsafe.errors import ClosedError, ConfigurationError, ConnectError, TransientError
from msgsafe.message import Delivery, Outcome
from msgsafe.ports import Receiver
from msgsafe.telemetry._observer import observing
from msgsafe.telemetry.consumer import ConsumerTelemetry
from msgsafe.telemetry.stats import ConsumerStats

__all__ = ["Consumer"]


class Consumer:
    """Receives messages at least once; settle each with ``ack()`` or ``nack()``.

    ``group`` shares the work between consumers (a Kafka consumer group, a shared
    queue); ``dedup=True`` (or a window size) drops messages whose id this consumer
    already acknowledged — the duplicates that at-least-once delivery and producer
    retries can cause — acknowledging them for you. ``telemetry=True`` adds
    OpenTelemetry spans and metrics (see :mod:`msgsafe.telemetry`); :meth:`stats`
    works without it. Options go to the adapter.

    Failing loudly, as the producer does: until the broker has answered once,
    :meth:`poll` checks it (the producer's destination check on the first subscribed
    destination, with the same connection settings): a peer of another protocol, a
    refused login or a certificate that does not verify raises its permanent error at
    once, and a consumer that reached no broker within ``connect_window`` seconds raises
    :class:`~msgsafe.errors.ConnectError`. Once it has, an outage is retried by the
    adapter (one WARNING), and ``poll`` returns what arrives.
    """

    def __init__(
        self,
        url: str,
        *,
        group: str | None = None,
        dedup: bool | int = False,
        telemetry: bool = False,
        connect_window: float = 10.0,
        **options: object,
    ) -> None:
        if connect_window <= 0:
            raise ConfigurationError("connect_window must be > 0 seconds")
        if isinstance(dedup, bool):
            self._dedup = DedupWindow() if dedup else None
        elif isinstance(dedup, int) and dedup > 0:
            self._dedup = DedupWindow(dedup)
        else:
            raise ConfigurationError("dedup must be True, False or a positive window size")
        self._url = parse_url(url)
        self._telemetry = ConsumerTelemetry(self._url, otel=telemetry)
        with observing(self._telemetry):
            self._receiver: Receiver = open_receiver(self._url, options, group=group)
        self._reach = _Reach(inspector_for(self._url, options), connect_window, self._url)
        self._closed = False
        self._lock = threading.Lock()
        #: message id -> copies held back while the first copy is unsettled.
        self._open: dict[str, list[Delivery]] = {}
        #: Duplicates dropped by dedup so far.
        self.duplicates_dropped = 0

    def subscribe(self, destination: str) -> Self:
        """Consume from ``destination`` (a queue, topic or address). Returns self."""
        self._check_open()
        self._receiver.subscribe(destination)
        self._reach.destinations.append(destination)
        return self

    def poll(self, timeout: float | None = None, *, max_messages: int = 1) -> list[Delivery]:
        """Up to ``max_messages`` deliveries, waiting at most ``timeout`` seconds for the
        first (None: until one arrives). Duplicates are dropped when dedup is on.

        ``timeout`` comes first, as in confluent-kafka's ``Consumer.poll(timeout)``:
        ``poll(10)`` waits up to 10 s for one message; ``max_messages`` is keyword-only,
        ``poll(0.5, max_messages=500)``.
        """
        self._check_open()
        if max_messages < 1:
            raise ConfigurationError("max_messages must be >= 1")
        if not self._reach.reached:
            self._reach.check()
        return self._telemetry.deliver(self._poll(max_messages, timeout))

    def _poll(self, max_messages: int, timeout: float | None) -> list[Delivery]:
        if self._dedup is None:
            return self._receiver.receive(max_messages=max_messages, timeout=timeout)
        # Dropped duplicates must not end the wait early: an empty list means the
        # timeout passed with nothing new.
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            raw = self._receiver.receive(max_messages=max_messages, timeout=left)
            kept = [d for d in (self._filter(d) for d in raw) if d is not None]
            if kept or not raw or (deadline is not None and time.monotonic() >= deadline):
                return kept

    def _filter(self, delivery: Delivery) -> Delivery | None:
        """Drop a copy of a message already handled; pass everything else through.

        A copy of a message that was acknowledged is acknowledged and dropped. A copy of
        a message still in the application's hands (a redelivery after fail-over, a
        retried publish arriving in the same batch) is held back and settled the same
        way as the first copy once the application settles that — so a requeue of the
        first copy never strands the message.
        """
        window = self._dedup
        message_id = delivery.message_id
        if window is None or message_id is None:
            return delivery
        with self._lock:
            holders = self._open.get(message_id)
            if holders is not None:
                holders.append(delivery)
                self.duplicates_dropped += 1
                return None
            if window.seen(message_id):
                self.duplicates_dropped += 1
                duplicate = True
            else:
                self._open[message_id] = []
                duplicate = False
        if duplicate:
            delivery.ack()
            return None
        first = delivery

        def settle(outcome: Outcome) -> None:
            first.settle(outcome)
            with self._lock:
                held = self._open.pop(message_id, [])
                if outcome is not Outcome.REQUEUE:
                    window.record(message_id)
            for copy in held:
                copy.settle(outcome)

        return Delivery(
            body=first.body,
            destination=first.destination,
            message_id=message_id,
            key=first.key,
            headers=first.headers,
            redelivered=first.redelivered,
            settle=settle,
        )

    def __iter__(self) -> Iterator[Delivery]:
        """Deliveries one at a time until :meth:`close` (from another thread) is called."""
        while not self._closed:
            try:
                batch = self.poll(0.5, max_messages=64)
            except ClosedError:
                return
            yield from batch

    def stats(self) -> ConsumerStats:
        """What this consumer did since it was created: received, acked, requeued,
        rejected, duplicates dropped, fail-overs and redirects (no OpenTelemetry needed)."""
        return self._telemetry.stats(self.duplicates_dropped)

    @property
    def target(self) -> str:
        """The broker URL without credentials."""
        return self._url.redacted()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("consumer is closed")

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop consuming; unsettled deliveries go back to the broker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._receiver.close(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Consumer({self._url.redacted()!r}, {state})"


class _Reach:
    """Whether the consumer's broker has answered once, asked with the destination
    check (at most once a second) until it has; see :class:`Consumer`."""

    def __init__(self, inspect: Inspector, window: float, url: BrokerUrl) -> None:
        self._inspect = inspect
        self._window = window
        self._url = url
        self._started = time.monotonic()
        self._next_try = 0.0
        self._last: TransientError | None = None
        self.destinations: list[str] = []
        self.reached = False

    def check(self) -> None:
        """Ask the broker (when due); raise its permanent error, or ConnectError once
        ``window`` passed without an answer."""
        now = time.monotonic()
        if now >= self._next_try and self.destinations:
            try:
                self._inspect(self.destinations[0])
            except TransientError as exc:
                self._last = exc
                self._next_try = now + 1.0
            else:
                self.reached = True
                return
        if self._last is not None and now - self._started >= self._window:
            raise ConnectError(
                f"no broker answered within connect_window={self._window:g}s: {self._last.message}",
                endpoint=self._url.redacted(),
            ) from self._last

"""The consumer: at-least-once delivery, optional dedup by message id, and ``run()``:
handlers on worker threads with per-key order, retries and a dead-letter destination."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Self

from msgsafe._observer import observing
from msgsafe.adapters import open_receiver
from msgsafe.checks import Inspector, inspector_for
from msgsafe.consuming.batching import BatchPolicy
from msgsafe.consuming.clock import MonotonicClock, RunClock
from msgsafe.consuming.runner import (
    BatchHandler,
    Handler,
    InboxHandler,
    OnExhausted,
    Runner,
    RunTally,
)
from msgsafe.dedup import AttemptMemory, DedupWindow
from msgsafe.endpoints import BrokerUrl, parse_url
from msgsafe.errors import ClosedError, ConfigurationError, ConnectError, TransientError
from msgsafe.inbox import open_inbox
from msgsafe.message import Delivery, Outcome
from msgsafe.ports import AttemptCounter, InboxStore, Receiver, inbox_capabilities
from msgsafe.producer import Producer
from msgsafe.retry import RetryPolicy
from msgsafe.schemas import Deserializer, Deserializers
from msgsafe.telemetry.consumer import ConsumerTelemetry
from msgsafe.telemetry.stats import ConsumerStats

__all__ = ["Consumer"]

_REQUEUE = Outcome.REQUEUE
_RELEASE = Outcome.RELEASE

#: run()'s default prefetch: also the most one fetch asks the receiver for, so it is a
#: batch's size (with 2 * concurrency, fetches of 8 messages cost more than the handling).
_PREFETCH = 500


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

    ``Delivery.attempt`` is the broker's count where it keeps one (RabbitMQ quorum
    queues, AMQP 1.0), otherwise ``attempts``' (:class:`~msgsafe.ports.AttemptCounter`;
    default: :class:`~msgsafe.dedup.AttemptMemory`, within this process). Without
    ``attempts``, :meth:`run` with an inbox also counts each handler call there
    (``record_attempt``, one commit of its own), so the count goes on across restarts.

    ``deserializer`` and ``key_deserializer`` (confluent-kafka's ``deserializer(data,
    ctx)`` protocol, see :mod:`msgsafe.schemas`) give each delivery its
    ``Delivery.value`` and ``Delivery.key_value``, decoded on first use; ``body`` keeps
    the bytes.
    """

    def __init__(
        self,
        url: str,
        *,
        group: str | None = None,
        dedup: bool | int = False,
        telemetry: bool = False,
        connect_window: float = 10.0,
        attempts: AttemptCounter | None = None,
        deserializer: Deserializer | None = None,
        key_deserializer: Deserializer | None = None,
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
        #: Handed to every delivery: Delivery.value and .key_value run them.
        self._deserializers = (
            Deserializers(deserializer, key_deserializer)
            if deserializer is not None or key_deserializer is not None
            else None
        )
        #: The URL as given (credentials included), for a dead-letter producer only.
        self._raw_url = url
        self._attempts: AttemptCounter = attempts if attempts is not None else AttemptMemory()
        #: False: ``run(inbox=...)`` also counts attempts in the inbox, across restarts.
        self._attempts_given = attempts is not None
        self._runner: Runner | None = None
        self._telemetry = ConsumerTelemetry(self._url, otel=telemetry)
        self._count_settled = self._telemetry.count_settled
        #: The attempt memory's count of a batch of first deliveries, when it has one.
        self._first_deliveries = (
            self._attempts.delivered_first if isinstance(self._attempts, AttemptMemory) else None
        )
        with observing(self._telemetry):
            self._receiver: Receiver = open_receiver(self._url, options, group=group)
        self._reach = _Reach(inspector_for(self._url, options), connect_window, self._url)
        self._closed = False
        self._lock = threading.Lock()
        #: message id -> copies held back while the first copy is unsettled (None: no
        #: copy yet; a list is made for the first copy only).
        self._open: dict[str, list[Delivery] | None] = {}
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
        return self._hand_out(self._telemetry.deliver(self._poll(max_messages, timeout)))

    def _hand_out(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Count each delivery's attempt and have its settling reported to
        :meth:`_settled` (:meth:`_counted` without dedup)."""
        if not deliveries:
            return deliveries
        counter = self._attempts
        after = self._settled if self._dedup is not None else self._counted
        deserializers = self._deserializers
        # NOTE: the slots set directly (what Delivery.observe does), in one pass: a
        # method call per delivery cost more than the store.
        fresh: list[str] = []
        counted: list[Delivery] = []
        for delivery in deliveries:
            delivery._after = after
            if delivery.message_id is not None and not delivery.attempt_from_broker:
                counted.append(delivery)
                if not delivery.redelivered:
                    fresh.append(delivery.message_id)
        if deserializers is not None:
            for delivery in deliveries:
                delivery.deserializers = deserializers
        if not counted:
            return deliveries
        # The common batch, first deliveries of new ids: counted at once, attempt 1 each
        # (what the deliveries say already).
        first = self._first_deliveries
        if first is not None and len(fresh) == len(counted) and first(fresh):
            return deliveries
        for delivery in counted:
            delivery.attempt = counter.delivered(
                delivery.message_id,  # type: ignore[arg-type]  # counted: it has one
                redelivered=delivery.redelivered,
            )
        return deliveries

    def _counted(self, delivery: Delivery, outcome: Outcome) -> None:
        """A delivery this consumer handed out was settled (without dedup): count it."""
        # NOTE: ``_value_`` (the member's value as Enum documents it) rather than the
        # ``value`` property, whose descriptor cost a fifth of a microsecond per message.
        self._count_settled[outcome._value_]()

    def _settled(self, delivery: Delivery, outcome: Outcome) -> None:
        """A delivery this consumer handed out was settled (with dedup): count it,
        remember its id (unless given back) and settle the copies held behind it."""
        self._count_settled[outcome._value_]()
        window = self._dedup
        message_id = delivery.message_id
        if window is None or message_id is None:
            return
        with self._lock:
            held = self._open.pop(message_id, None)
            if outcome is not _REQUEUE and outcome is not _RELEASE:  # not given back
                window.record(message_id)
        if held is not None:
            for copy in held:
                copy.settle(outcome)

    def _poll(self, max_messages: int, timeout: float | None) -> list[Delivery]:
        window = self._dedup
        if window is None:
            return self._receiver.receive(max_messages=max_messages, timeout=timeout)
        # Dropped duplicates must not end the wait early: an empty list means the
        # timeout passed with nothing new.
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            raw = self._receiver.receive(max_messages=max_messages, timeout=left)
            kept = self._filter(raw, window)
            if kept or not raw or (deadline is not None and time.monotonic() >= deadline):
                return kept

    def _filter(self, deliveries: list[Delivery], window: DedupWindow) -> list[Delivery]:
        """Drop the copies of messages already handled; pass everything else through.

        A copy of a message that was acknowledged is acknowledged and dropped. A copy of
        a message still in the application's hands (a redelivery after fail-over, a
        retried publish arriving in the same batch) is held back and settled the same
        way as the first copy once the application settles that (:meth:`_settled`) — so
        a requeue of the first copy never strands the message.
        """
        kept: list[Delivery] = []
        duplicates: list[Delivery] = []
        opened = self._open
        seen = window.seen
        ids = [delivery.message_id for delivery in deliveries]
        with self._lock:
            # The common batch: ids all new (not open, not in the window) and distinct,
            # opened at once with set operations, no Python step per delivery.
            if (
                None not in ids
                and opened.keys().isdisjoint(ids)
                and window.knows_none(ids)
                and len(set(ids)) == len(ids)
            ):
                opened.update(dict.fromkeys(ids))  # type: ignore[arg-type]  # no None
                return deliveries
            for delivery in deliveries:
                message_id = delivery.message_id
                if message_id is None:
                    kept.append(delivery)
                    continue
                if message_id in opened:
                    holders = opened[message_id]
                    if holders is None:
                        opened[message_id] = [delivery]
                    else:
                        holders.append(delivery)
                    self.duplicates_dropped += 1
                elif seen(message_id):
                    self.duplicates_dropped += 1
                    duplicates.append(delivery)
                else:
                    opened[message_id] = None
                    kept.append(delivery)
        for duplicate in duplicates:
            duplicate.ack()
        return kept

    def __iter__(self) -> Iterator[Delivery]:
        """Deliveries one at a time until :meth:`close` (from another thread) is called."""
        while not self._closed:
            try:
                batch = self.poll(0.5, max_messages=64)
            except ClosedError:
                return
            yield from batch

    def run(
        self,
        handler: Handler | InboxHandler | BatchHandler,
        *,
        inbox: str | InboxStore | None = None,
        batch: BatchPolicy | None = None,
        concurrency: int = 1,
        prefetch: int | None = None,
        retry: RetryPolicy | None = None,
        permanent: tuple[type[BaseException], ...] = (),
        dead_letter: str | None = None,
        dead_letter_url: str | None = None,
        dead_letter_producer: Producer | None = None,
        on_exhausted: OnExhausted | None = None,
        stop_timeout: float = 30.0,
        handle_signals: bool = True,
        clock: RunClock | None = None,
    ) -> None:
        """Call ``handler`` for every delivery until :meth:`stop`, SIGTERM or SIGINT, then
        close the consumer and return.

        With ``inbox`` (an inbox URL, ``sqlite:///…`` or ``postgresql://…``, or an
        :class:`~msgsafe.ports.InboxStore`; see :mod:`msgsafe.inbox`) each message's
        effects are applied once: the handler is called as ``handler(delivery, tx)``,
        ``tx`` a DB-API connection inside an open transaction of the inbox's database,
        through which it writes its effects (neither committing nor rolling back);
        msgsafe records the message id in that same transaction, commits, then
        acknowledges. A message the inbox has recorded (its earlier run committed, and
        the process died before the acknowledgement) is acknowledged without calling the
        handler (``stats().skipped``); a handler that raises is rolled back with the
        record, so a retry applies its effects once. A delivery without a message id is
        not handled through the inbox: it goes to ``dead_letter`` or ``on_exhausted`` at
        once (an ``InvalidMessage``). An inbox whose database takes no writes in time
        (:class:`~msgsafe.errors.InboxUnavailable`) gives the delivery back to be
        delivered again: no retry is spent on it and it is not dead-lettered for it. An
        inbox given by URL is opened here and closed when the run ends.

        With ``inbox`` and ``batch`` (a :class:`~msgsafe.consuming.batching.BatchPolicy`,
        which the inbox must declare it can serve: ``capabilities.batch``, as both of
        msgsafe's stores do) the handler takes a list, ``handler(deliveries, tx)``: up to
        ``batch.max_messages`` deliveries new to the inbox — runs of several keys, each in
        its order — whose ids are committed with the handler's writes in one transaction,
        then acknowledged. A batch whose handler raises is rolled back and its deliveries
        handled alone (``handler([delivery], tx)``), each with the retries and
        dead-letter destination below; a delivery seen before is always handled alone.
        See :mod:`msgsafe.consuming.batching`.

        ``concurrency`` worker threads call it; deliveries of one key are handled one at
        a time in arrival order, unkeyed ones freely. At most ``prefetch`` deliveries
        (default 500, or ``2 * concurrency`` when more) are held at once. The handler returning
        acknowledges the delivery (a worker takes up to 16 of a key's deliveries at once and
        acknowledges those whose handler returned together, after the last of them or
        before anything else of them is settled); raising is a failure:

        - with ``retry`` (a :class:`~msgsafe.retry.RetryPolicy` with ``max_attempts``)
          the handler is called again after the policy's backoff, ``delivery.attempt``
          one higher, the key's later deliveries waiting (other keys go on), until the
          attempts are exhausted; an error of a ``permanent`` type exhausts them at once;
        - exhausted, the message goes to ``dead_letter`` (a destination), sent through a
          :class:`~msgsafe.producer.Producer` (``dead_letter_producer``, or one of
          ``dead_letter_url``, default this consumer's URL, with its default outbox),
          with ``x-msgsafe-dlq-*`` headers (:mod:`msgsafe.consuming.dead_letter`); the
          original is acknowledged only after the dead letter's receipt, and given back
          if the send fails. Without ``dead_letter``, ``on_exhausted`` says what happens
          and is required: ``"reject"`` (``nack(requeue=False)``) or ``"stop"`` (given
          back; the run stops and raises the handler's error). Without ``retry`` either
          of them applies after the first failure;
        - with none of ``retry``, ``dead_letter`` or ``on_exhausted``, a failed delivery
          is given back (``nack()``) for the broker to deliver again.

        Stopping gives back the deliveries not started, lets running handlers end within
        ``stop_timeout`` seconds (then gives theirs back), and closes the consumer. No
        delivery is acknowledged without its handler having returned. SIGTERM and
        SIGINT stop the run when it runs on the main thread and ``handle_signals`` is
        true; the previous handlers are restored after. ``clock`` (for tests) times the
        retries. Raises what :meth:`poll` raises (after stopping), ``ConfigurationError``
        for bad arguments.
        """
        self._check_open()
        if concurrency < 1:
            raise ConfigurationError("concurrency must be >= 1")
        if prefetch is None:
            prefetch = max(_PREFETCH, 2 * concurrency)
        if prefetch < 1:
            raise ConfigurationError("prefetch must be >= 1")
        if stop_timeout < 0:
            raise ConfigurationError("stop_timeout must be >= 0 seconds")
        if retry is not None and retry.max_attempts is None:
            raise ConfigurationError("run(retry=...) needs a policy with max_attempts")
        if on_exhausted not in (None, "reject", "stop"):
            raise ConfigurationError('on_exhausted must be "reject" or "stop"')
        if dead_letter is not None and on_exhausted is not None:
            raise ConfigurationError("give dead_letter or on_exhausted, not both")
        if (retry is not None or permanent) and dead_letter is None and on_exhausted is None:
            raise ConfigurationError(
                "retry and permanent need a final choice: dead_letter=DESTINATION or"
                ' on_exhausted="reject" or "stop" (a message is never dropped silently)'
            )
        if dead_letter is None and (dead_letter_url is not None or dead_letter_producer):
            raise ConfigurationError("dead_letter_url and dead_letter_producer need dead_letter")
        if dead_letter_url is not None and dead_letter_producer is not None:
            raise ConfigurationError("give dead_letter_url or dead_letter_producer, not both")
        if self._runner is not None:
            raise ConfigurationError("run() is already running on this consumer")
        if batch is not None and not isinstance(batch, BatchPolicy):
            raise ConfigurationError(f"batch is a BatchPolicy, not {type(batch).__name__}")
        if batch is not None and inbox is None:
            raise ConfigurationError("batch needs an inbox: it commits a batch's ids at once")
        opened: InboxStore | None = None
        if isinstance(inbox, str):
            opened = inbox = open_inbox(inbox)
        elif inbox is not None and not isinstance(inbox, InboxStore):
            raise ConfigurationError(
                f"inbox is an inbox URL or an InboxStore, not {type(inbox).__name__}"
            )
        if batch is not None and inbox is not None and not inbox_capabilities(inbox).batch:
            if opened is not None:
                opened.close()
            raise ConfigurationError(
                f"batch needs an inbox that declares capabilities.batch; "
                f"{type(inbox).__name__} does not"
            )
        owned: Producer | None = None
        if dead_letter is not None and dead_letter_producer is None:
            try:
                owned = dead_letter_producer = Producer(dead_letter_url or self._raw_url)
            except BaseException:
                if opened is not None:
                    opened.close()
                raise
        runner = Runner(
            handler,
            fetch=lambda room, wait: self.poll(wait, max_messages=room),
            close=self.close,
            count=self._telemetry.add_run,
            tally=RunTally(
                started=self._telemetry.handler_started,
                ended=self._telemetry.handler_ended,
                handled=self._telemetry.count_handled,
            ),
            attempts=self._attempts,
            concurrency=concurrency,
            prefetch=prefetch,
            retry=retry,
            permanent=permanent,
            dead_letter=dead_letter,
            dead_letter_producer=dead_letter_producer,
            on_exhausted=on_exhausted,
            stop_timeout=stop_timeout,
            clock=clock if clock is not None else MonotonicClock(),
            inbox=inbox,
            count_in_inbox=not self._attempts_given,
            batch=batch,
        )
        self._runner = runner
        try:
            runner.run(signals=handle_signals)
        finally:
            self._runner = None
            if owned is not None:
                owned.close()
            if opened is not None:
                opened.close()

    def stop(self) -> None:
        """Ask :meth:`run` to stop (from any thread or a handler); it returns once it
        has shut down. Nothing happens when it is not running."""
        runner = self._runner
        if runner is not None:
            runner.stop()

    def stats(self) -> ConsumerStats:
        """What this consumer did since it was created: received, acked, requeued,
        rejected, duplicates dropped, fail-overs and redirects, and :meth:`run`'s
        handled, retried, dead-lettered and in flight (no OpenTelemetry needed)."""
        return self._telemetry.stats(self.duplicates_dropped)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (``run()`` closes when it returns)."""
        return self._closed

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

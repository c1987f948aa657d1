"""Typed snapshots of what a producer or consumer did, and the counters behind them.

The counters run whether or not OpenTelemetry is installed: ``Producer.stats()`` and
``Consumer.stats()`` read them. Each update is a few integer additions under one lock,
made once per message settled (once per batch for ``send_batch``): nothing is kept per
message after it settled.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from msgsafe.message import Outcome, Receipt, Status

log = logging.getLogger("msgsafe.telemetry")

__all__ = [
    "ConnectionCounters",
    "OutcomeCounts",
    "ConsumerCounters",
    "ConsumerStats",
    "ProducerCounters",
    "ProducerStats",
    "count_value",
]

_EMPTY: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """A producer's figures since it was created (and its outbox's, now)."""

    target: str  #: the broker URL without credentials
    sent: int  #: messages accepted by send(), send_async(), send_batch() and the like
    confirmed: int  #: confirmed by the broker on the first route (not through the outbox)
    stored: int  #: committed to the outbox instead (Status.STORED)
    failed: Mapping[str, int]  #: neither confirmed nor stored, by error type (the caller owns them)
    in_flight: int  #: sent and not yet confirmed, stored or failed
    drained: int  #: delivered from the outbox by this producer's forwarder
    outbox_depth: int  #: messages waiting in the outbox now
    outbox_oldest_age_s: float | None  #: age of the oldest of them, None when empty
    failovers: Mapping[str, int] = field(default_factory=lambda: _EMPTY)  #: by reason
    redirects: Mapping[str, int] = field(default_factory=lambda: _EMPTY)  #: by condition
    #: send() to broker confirm, mean and longest (measured with ``telemetry=True`` only)
    confirm_latency_mean_s: float | None = None
    confirm_latency_max_s: float | None = None
    #: True once the outbox file is no longer at its path (removed, replaced): the
    #: ``outbox_depth`` messages in it are lost if the process ends before they are
    #: forwarded, and new sends raise OutboxGone instead of being stored.
    outbox_gone: bool = False

    @property
    def failed_total(self) -> int:
        """Every failed message, whatever the error."""
        return sum(self.failed.values())


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A consumer's figures since it was created."""

    target: str  #: the broker URL without credentials
    received: int  #: deliveries handed to the application
    acked: int  #: settled with ack()
    requeued: int  #: settled with nack() (redelivered later)
    rejected: int  #: settled with nack(requeue=False)
    duplicates_dropped: int  #: copies dedup dropped (acknowledged for the application)
    failovers: Mapping[str, int] = field(default_factory=lambda: _EMPTY)  #: by reason
    redirects: Mapping[str, int] = field(default_factory=lambda: _EMPTY)  #: by condition
    #: ``Consumer.run``: deliveries whose handler returned, acknowledged after it
    handled: int = 0
    #: ``Consumer.run``: handler calls made again after a failure, in this process
    retried: int = 0
    #: ``Consumer.run``: messages sent to the dead-letter destination, then acknowledged
    dead_lettered: int = 0
    #: ``Consumer.run``: handlers running now
    in_flight: int = 0
    #: ``Consumer.run`` with an inbox: deliveries of messages the inbox had recorded as
    #: handled (a redelivery after a crash between commit and ack), acknowledged without
    #: calling the handler
    skipped: int = 0
    #: settled with release() (given back untried: a stop's prefetched deliveries)
    released: int = 0
    #: ``Consumer.run(batch=...)``: inbox transactions that committed a batch
    batches: int = 0
    #: ``Consumer.run(batch=...)``: batches rolled back because the handler raised, their
    #: deliveries then handled one at a time
    batches_split: int = 0

    @property
    def unsettled(self) -> int:
        """Deliveries in the application's hands, neither acked nor nacked nor released."""
        return self.received - self.acked - self.requeued - self.rejected - self.released


class ConnectionCounters:
    """Fail-overs and redirects by reason: a connection observer (see ``msgsafe._observer``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failovers: Counter[str] = Counter()
        self.redirects: Counter[str] = Counter()

    def failover(self, previous: str, endpoint: str, reason: str) -> None:
        with self.lock:
            self.failovers[reason] += 1

    def redirect(self, previous: str, endpoint: str, reason: str) -> None:
        with self.lock:
            self.redirects[reason] += 1

    def reachable(self, endpoint: str) -> None:
        """Not counted: the stored messages' delivery shows the outage's end."""

    def connection_figures(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """Copies of the fail-over and redirect counts."""
        with self.lock:
            return MappingProxyType(dict(self.failovers)), MappingProxyType(dict(self.redirects))


class _ConnectionEventSink(Protocol):
    def connection_event(self, kind: str, previous: str, endpoint: str, reason: str) -> None:
        """Record a fail-over or redirect on OpenTelemetry."""
        ...


class TracedConnectionCounters(ConnectionCounters):
    """Connection counters that also hand each event to OpenTelemetry when it is on
    (``_otel``, set by the producer's or consumer's telemetry). Called on I/O threads: an
    error there is logged, never raised."""

    _otel: _ConnectionEventSink | None = None

    def failover(self, previous: str, endpoint: str, reason: str) -> None:
        super().failover(previous, endpoint, reason)
        self._connection_event("failover", previous, endpoint, reason)

    def redirect(self, previous: str, endpoint: str, reason: str) -> None:
        super().redirect(previous, endpoint, reason)
        self._connection_event("redirect", previous, endpoint, reason)

    def _connection_event(self, kind: str, previous: str, endpoint: str, reason: str) -> None:
        if self._otel is None:
            return
        try:
            self._otel.connection_event(kind, previous, endpoint, reason)
        except Exception:
            log.warning("telemetry: cannot record a %s", kind, exc_info=True)


def count_value(counter: itertools.count[int]) -> int:
    """The next value an ``itertools.count`` would return, without taking it."""
    return int(counter.__reduce__()[1][0])


class OutcomeCounts:
    """How single sends ended, counted where the producer's bookkeeping settles them
    (:class:`msgsafe._settlement.Settlement`): one ``next()`` of an ``itertools.count``
    per message (atomic, no lock, no callback); failures, rare, under a lock."""

    __slots__ = ("_confirmed", "_stored", "count_confirmed", "failed", "lock")

    def __init__(self) -> None:
        self._confirmed = itertools.count()
        self._stored = itertools.count()
        #: Count one send confirmed: a C call (no Python frame), for a transport's fast path.
        self.count_confirmed = functools.partial(next, self._confirmed)
        self.lock = threading.Lock()
        self.failed: Counter[str] = Counter()

    def resolved(self, receipt: Receipt | None, error: BaseException | None) -> None:
        """One send ended with ``receipt`` (or ``error``)."""
        if error is not None:
            with self.lock:
                self.failed[type(error).__name__] += 1
        elif receipt is not None and receipt.status is Status.CONFIRMED:
            next(self._confirmed)
        else:
            next(self._stored)

    def stored(self, units: int, error: BaseException | None) -> None:
        """``units`` sends went through the outbox writer, stored unless ``error``."""
        if not units:
            return
        if error is not None:
            with self.lock:
                self.failed[type(error).__name__] += units
            return
        for _ in range(units):
            next(self._stored)

    def figures(self) -> tuple[int, int, Counter[str]]:
        """Confirmed, stored and failed so far."""
        with self.lock:
            failed = Counter(self.failed)
        return count_value(self._confirmed), count_value(self._stored), failed


class ProducerCounters(ConnectionCounters):
    """What :class:`ProducerStats` reports. Thread-safe. Single sends are counted by an
    :class:`OutcomeCounts` the producer's settlement updates; batches (one figure per
    batch) and confirm latencies (only with OpenTelemetry) here."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes = OutcomeCounts()
        self._sent = itertools.count()
        self._batched = 0
        self._confirmed = 0
        self._stored = 0
        self._failed: Counter[str] = Counter()
        self._latency_sum = 0.0
        self._latency_count = 0
        self._latency_max = 0.0

    def sent_one(self) -> None:
        """One single send accepted (atomic, no lock)."""
        next(self._sent)

    @property
    def count_sent(self) -> functools.partial[int]:
        """:meth:`sent_one` as a C call (no Python frame), for the producer's fast path."""
        return functools.partial(next, self._sent)

    def add_batch(self, count: int) -> None:
        with self.lock:
            self._batched += count

    def add_batch_outcome(self, confirmed: int, stored: int, failed: Mapping[str, int]) -> None:
        with self.lock:
            self._confirmed += confirmed
            self._stored += stored
            self._failed.update(failed)

    def add_latency(self, latency_s: float) -> None:
        with self.lock:
            self._latency_sum += latency_s
            self._latency_count += 1
            if latency_s > self._latency_max:
                self._latency_max = latency_s

    def snapshot(
        self,
        target: str,
        *,
        drained: int,
        outbox_depth: int,
        outbox_oldest_age_s: float | None,
        outbox_gone: bool = False,
    ) -> ProducerStats:
        failovers, redirects = self.connection_figures()
        # Outcomes before sends: a message is counted sent before it can settle, so the
        # difference (in flight) is never negative.
        confirmed, stored, failed = self.outcomes.figures()
        with self.lock:
            confirmed += self._confirmed
            stored += self._stored
            failed.update(self._failed)
            sent = count_value(self._sent) + self._batched
            count = self._latency_count
            mean = self._latency_sum / count if count else None
            longest = self._latency_max if count else None
        return ProducerStats(
            target=target,
            sent=sent,
            confirmed=confirmed,
            stored=stored,
            failed=MappingProxyType(dict(failed)),
            in_flight=max(0, sent - confirmed - stored - sum(failed.values())),
            drained=drained,
            outbox_depth=outbox_depth,
            outbox_oldest_age_s=outbox_oldest_age_s,
            outbox_gone=outbox_gone,
            failovers=failovers,
            redirects=redirects,
            confirm_latency_mean_s=mean,
            confirm_latency_max_s=longest,
        )


class ConsumerCounters(ConnectionCounters):
    """What :class:`ConsumerStats` reports. Thread-safe."""

    def __init__(self) -> None:
        super().__init__()
        self.received = 0
        self._settled = {outcome.value: itertools.count() for outcome in Outcome}
        #: Count one settling by its outcome's value: a C call (no Python frame, no
        #: lock), made once per delivery settled. NOTE: keyed by the value, a str, as
        #: an Enum member's hash is a Python call.
        self.count_settled = {
            value: functools.partial(next, counter) for value, counter in self._settled.items()
        }
        #: ``Consumer.run``'s figures: handled, retried, dead_lettered, in_flight.
        self.run: Counter[str] = Counter()
        self._started = itertools.count()
        self._ended = itertools.count()
        self._handled = itertools.count()
        #: ``Consumer.run``'s figures counted on every handler call, as C calls (no
        #: lock): a call starts, ends, and its delivery was handled (added to ``run``'s).
        self.handler_started = functools.partial(next, self._started)
        self.handler_ended = functools.partial(next, self._ended)
        self.count_handled = functools.partial(next, self._handled)

    def add_received(self, count: int) -> None:
        with self.lock:
            self.received += count

    def add_settled(self, outcome: str) -> None:
        """Count one settling with ``outcome`` (an :class:`~msgsafe.message.Outcome`'s value)."""
        self.count_settled[outcome]()

    @property
    def settled(self) -> dict[str, int]:
        """Settlings so far by outcome value (``accept``, ``requeue``, ...)."""
        return {value: count_value(counter) for value, counter in self._settled.items()}

    def add_run(self, figure: str, count: int = 1) -> None:
        """Add ``count`` (may be negative for ``in_flight``) to one of run()'s figures."""
        with self.lock:
            self.run[figure] += count

    def snapshot(self, target: str, *, duplicates_dropped: int) -> ConsumerStats:
        failovers, redirects = self.connection_figures()
        settled = self.settled
        # Ended before started: a call counted ended is counted started, so never < 0.
        ended = count_value(self._ended)
        in_flight = count_value(self._started) - ended
        handled = count_value(self._handled)
        with self.lock:
            return ConsumerStats(
                target=target,
                received=self.received,
                acked=settled["accept"],
                requeued=settled["requeue"],
                rejected=settled["reject"],
                duplicates_dropped=duplicates_dropped,
                failovers=failovers,
                redirects=redirects,
                handled=self.run["handled"] + handled,
                retried=self.run["retried"],
                dead_lettered=self.run["dead_lettered"],
                in_flight=self.run["in_flight"] + in_flight,
                skipped=self.run["skipped"],
                released=settled["release"],
                batches=self.run["batches"],
                batches_split=self.run["batches_split"],
            )

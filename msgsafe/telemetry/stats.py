"""Typed snapshots of what a producer or consumer did, and the counters behind them.

The counters run whether or not OpenTelemetry is installed: ``Producer.stats()`` and
``Consumer.stats()`` read them. Each update is a few integer additions under one lock,
made once per message settled (once per batch for ``send_batch``): nothing is kept per
message after it settled.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "ConnectionCounters",
    "ConsumerCounters",
    "ConsumerStats",
    "ProducerCounters",
    "ProducerStats",
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
    confirm_latency_mean_s: float | None = None  #: send() to broker confirm, mean
    confirm_latency_max_s: float | None = None  #: and the longest one

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

    @property
    def unsettled(self) -> int:
        """Deliveries in the application's hands, neither acked nor nacked."""
        return self.received - self.acked - self.requeued - self.rejected


class ConnectionCounters:
    """Fail-overs and redirects by reason: a connection observer (see ``_observer``)."""

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

    def connection_figures(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """Copies of the fail-over and redirect counts."""
        with self.lock:
            return MappingProxyType(dict(self.failovers)), MappingProxyType(dict(self.redirects))


class ProducerCounters(ConnectionCounters):
    """What :class:`ProducerStats` reports, counted as messages settle. Thread-safe."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0
        self.confirmed = 0
        self.stored = 0
        self.failed: Counter[str] = Counter()
        self._latency_sum = 0.0
        self._latency_count = 0
        self._latency_max = 0.0

    def add_sent(self, count: int) -> None:
        with self.lock:
            self.sent += count

    def add_settled(
        self,
        confirmed: int,
        stored: int,
        failed: Mapping[str, int] | None,
        latency_s: float | None,
    ) -> None:
        """``confirmed`` + ``stored`` + the failed ones settled; ``latency_s`` is the
        confirm latency when some were confirmed (one figure per send or batch)."""
        with self.lock:
            self.confirmed += confirmed
            self.stored += stored
            if failed:
                self.failed.update(failed)
            if latency_s is not None and confirmed:
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
    ) -> ProducerStats:
        failovers, redirects = self.connection_figures()
        with self.lock:
            failed = MappingProxyType(dict(self.failed))
            settled = self.confirmed + self.stored + sum(failed.values())
            count = self._latency_count
            return ProducerStats(
                target=target,
                sent=self.sent,
                confirmed=self.confirmed,
                stored=self.stored,
                failed=failed,
                in_flight=self.sent - settled,
                drained=drained,
                outbox_depth=outbox_depth,
                outbox_oldest_age_s=outbox_oldest_age_s,
                failovers=failovers,
                redirects=redirects,
                confirm_latency_mean_s=self._latency_sum / count if count else None,
                confirm_latency_max_s=self._latency_max if count else None,
            )


class ConsumerCounters(ConnectionCounters):
    """What :class:`ConsumerStats` reports. Thread-safe."""

    def __init__(self) -> None:
        super().__init__()
        self.received = 0
        self.settled: Counter[str] = Counter()

    def add_received(self, count: int) -> None:
        with self.lock:
            self.received += count

    def add_settled(self, outcome: str) -> None:
        with self.lock:
            self.settled[outcome] += 1

    def snapshot(self, target: str, *, duplicates_dropped: int) -> ConsumerStats:
        failovers, redirects = self.connection_figures()
        with self.lock:
            return ConsumerStats(
                target=target,
                received=self.received,
                acked=self.settled["accept"],
                requeued=self.settled["requeue"],
                rejected=self.settled["reject"],
                duplicates_dropped=duplicates_dropped,
                failovers=failovers,
                redirects=redirects,
            )

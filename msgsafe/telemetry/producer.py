"""A producer's telemetry: the counters behind ``Producer.stats()`` always, spans and
metrics when it was built with ``telemetry=True``.

Without OpenTelemetry a single send costs one ``next()`` here (:meth:`sent_one`) and
one in the settlement (:class:`~msgsafe.telemetry.stats.OutcomeCounts`); a batch one
done-callback. With it, the producer calls :meth:`ProducerTelemetry.start` for a
message (the span's context goes into its headers) and :meth:`ProducerTelemetry.track`
with the receipt future, whose done-callback ends the span on whatever thread resolves
it. Telemetry never breaks sending: an error inside OpenTelemetry (a processor, an
exporter) is logged and the message goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import BatchFailed
from msgsafe.message import Batch, BatchReceipt, Envelope, Receipt, Status, new_envelope
from msgsafe.telemetry.stats import ProducerCounters, ProducerStats, TracedConnectionCounters

if TYPE_CHECKING:
    from msgsafe.outbox.forwarder import Forwarder
    from msgsafe.ports import OutboxStore
    from msgsafe.telemetry._otel import Figures, OtelProducer

__all__ = ["ProducerTelemetry"]

log = logging.getLogger("msgsafe.telemetry")


class ProducerTelemetry(TracedConnectionCounters, ProducerCounters):
    """Counters for ``stats()``; with ``otel`` also OpenTelemetry spans and metrics.
    It is the producer's :class:`~msgsafe._observer.ConnectionObserver`."""

    def __init__(self, url: BrokerUrl, *, otel: bool) -> None:
        super().__init__()
        self.target = url.redacted()
        self._store: OutboxStore | None = None
        self._forwarder: Forwarder | None = None
        self._otel: OtelProducer | None = None
        if otel:
            from msgsafe.telemetry._otel import OtelProducer

            server = url.endpoints[0].host if url.endpoints else url.path
            self._otel = OtelProducer(url.protocol, self.target, server, self._figures)

    def attach(self, store: OutboxStore | None, forwarder: Forwarder | None) -> None:
        """The outbox whose depth, age and drained count ``stats()`` reports (the
        producer's settlement counts single sends into :attr:`outcomes`)."""
        self._store = store
        self._forwarder = forwarder

    # --- the send path ------------------------------------------------------------------

    def start(self, envelope: Envelope) -> tuple[Envelope, Any]:
        """Before a message is sent: its span, and the envelope whose headers carry the
        span's context (the same envelope, and no span, without OpenTelemetry)."""
        otel = self._otel
        if otel is None:
            return envelope, None
        try:
            headers, span = otel.start_one(
                envelope.destination, envelope.headers, envelope.message_id
            )
            # The same message with the span's context in its headers (tombstone kept).
            traced = new_envelope(
                envelope.destination,
                envelope.body,
                envelope.message_id,
                envelope.key,
                envelope.created_at,
                MappingProxyType(headers),
                envelope.tombstone,
            )
            return traced, span
        except Exception:
            log.warning("telemetry: cannot start a send span", exc_info=True)
            return envelope, None

    def start_batch(self, batch: Batch) -> tuple[Batch, Any]:
        """:meth:`start` for a batch: one span, its context in every message's headers."""
        otel = self._otel
        if otel is None:
            return batch, None
        try:
            headers, span = otel.start_batch(batch.destination, batch.headers, len(batch))
            return replace(batch, headers=MappingProxyType(headers)), span
        except Exception:
            log.warning("telemetry: cannot start a send span", exc_info=True)
            return batch, None

    @property
    def tracing(self) -> bool:
        """True with OpenTelemetry: sends go through :meth:`start` and :meth:`track`."""
        return self._otel is not None

    def track(
        self, future: Future[Receipt], span: Any = None, *, waited: bool = False
    ) -> Callable[[Future[Receipt]], None] | None:
        """One message sent with OpenTelemetry on: its span ends, and its latency is
        measured, when ``future`` resolves (its outcome is counted by the settlement).

        ``waited``: the caller blocks on ``future`` (``send()``) and gets back the
        callback that ends the span, to add to ``future`` itself once it stops waiting:
        then the span ends on the caller's thread, after the I/O thread that resolved
        the receipt has let it run, not before (a resolved future runs an added callback
        at once)."""
        self.sent_one()
        ended = partial(self._one_done, span, time.monotonic())
        if waited:
            return ended
        future.add_done_callback(ended)
        return None

    def track_batch(self, future: Future[BatchReceipt], count: int, span: Any = None) -> None:
        """A batch of ``count`` sent; its outcomes are counted, and with OpenTelemetry its
        span ended, when ``future`` resolves (one callback per batch, one reading of its
        outcome)."""
        self.add_batch(count)
        if self._otel is None:
            future.add_done_callback(self._batch_done)
        else:
            future.add_done_callback(partial(self._otel_done, span, time.monotonic(), True))

    def _batch_done(self, future: Future[BatchReceipt]) -> None:
        confirmed, stored, failed, _ = _batch_outcome(future)
        self.add_batch_outcome(confirmed, stored, failed)

    def _one_done(self, span: Any, started: float, future: Future[Receipt]) -> None:
        """:meth:`_otel_done` for a single send: a receipt, or an error (rare) that
        takes the general path."""
        if span is None or future.exception() is not None:
            self._otel_done(span, started, False, future)
            return
        latency = time.monotonic() - started
        otel = self._otel
        assert otel is not None
        confirmed: float | None = None  # stored: no confirm latency
        if future.result().status is Status.CONFIRMED:
            self.add_latency(latency)
            confirmed = latency
        try:
            otel.settled_one(span, confirmed)
        except Exception:
            log.warning("telemetry: cannot record a settled send", exc_info=True)

    def _otel_done(self, span: Any, started: float, batch: bool, future: Future[Any]) -> None:
        """A traced send or ``batch`` settled: its latency, its span's outcome and end
        (and a batch's outcomes counted; a single send's are the settlement's)."""
        otel = self._otel
        assert otel is not None
        confirmed, stored, failed, error = _batch_outcome(future)
        if batch:
            self.add_batch_outcome(confirmed, stored, failed)
        latency = time.monotonic() - started
        if confirmed:
            self.add_latency(latency)
        try:
            otel.settled(
                span,
                confirmed=confirmed,
                stored=stored,
                failed=failed,
                error=error,
                latency_s=latency,
            )
        except Exception:
            log.warning("telemetry: cannot record a settled send", exc_info=True)

    # --- ConnectionObserver ----------------------------------------------------------------

    # --- reading ---------------------------------------------------------------------------

    def stats(self) -> ProducerStats:
        """The snapshot ``Producer.stats()`` returns."""
        depth, age, drained, gone = 0, None, 0, False
        if self._forwarder is not None:
            snap = self._forwarder.stats()
            depth, age, drained, gone = snap.depth, snap.oldest_age_s, snap.delivered, snap.gone
        elif self._store is not None:
            store_snap = self._store.stats()
            depth, age, gone = store_snap.depth, store_snap.oldest_age_s, store_snap.gone
        return self.snapshot(
            self.target,
            drained=drained,
            outbox_depth=depth,
            outbox_oldest_age_s=age,
            outbox_gone=gone,
        )

    def _figures(self) -> Figures:
        """The metrics' values at a collection (see msgsafe.telemetry._otel)."""
        snap = self.stats()
        none: Mapping[str, str] = {}
        figures: dict[str, list[tuple[float, Mapping[str, str]]]] = {
            "msgsafe.producer.sent": [(snap.sent, none)],
            "msgsafe.producer.confirmed": [(snap.confirmed, none)],
            "msgsafe.producer.stored": [(snap.stored, none)],
            "msgsafe.producer.failed": [(n, {"error.type": k}) for k, n in snap.failed.items()],
            "msgsafe.producer.in_flight": [(snap.in_flight, none)],
            "msgsafe.outbox.depth": [(snap.outbox_depth, none)],
            "msgsafe.outbox.drained": [(snap.drained, none)],
            "msgsafe.connection.failovers": _by_reason(snap.failovers),
            "msgsafe.connection.redirects": _by_reason(snap.redirects),
        }
        if snap.outbox_oldest_age_s is not None:
            figures["msgsafe.outbox.oldest_age"] = [(snap.outbox_oldest_age_s, none)]
        return figures

    def close(self) -> None:
        """The producer closed: its outbox is no longer read (the counters stay, and
        stay observed until the producer is garbage)."""
        self._store = None
        self._forwarder = None


def _by_reason(counts: Mapping[str, int]) -> list[tuple[float, Mapping[str, str]]]:
    return [(n, {"msgsafe.reason": reason}) for reason, n in counts.items()]


def _batch_outcome(
    future: Future[Any],
) -> tuple[int, int, Mapping[str, int], BaseException | None]:
    """(confirmed, stored, failed by error type, the error) of a resolved receipt future."""
    error = future.exception()
    if isinstance(error, BatchFailed):
        failed: dict[str, int] = {}
        for exc in error.errors.values():
            failed[type(exc).__name__] = failed.get(type(exc).__name__, 0) + 1
        receipt = error.receipt
        if isinstance(receipt, BatchReceipt):
            return receipt.confirmed, receipt.stored, failed, error
        return 0, 0, failed, error
    if error is not None:
        return 0, 0, {type(error).__name__: _size_of(future)}, error
    result = future.result()
    if isinstance(result, Receipt):
        confirmed = 1 if result.status is Status.CONFIRMED else 0
        return confirmed, 1 - confirmed, {}, None
    return result.confirmed, result.stored, {}, None


def _size_of(future: Future[Any]) -> int:
    batch = getattr(future, "batch", None)
    return len(batch) if batch is not None else 1

"""A consumer's telemetry: the counters behind ``Consumer.stats()`` always, a span per
delivery (linked to the producer's span through the headers) with ``telemetry=True``.

The consumer counts each settling (:meth:`ConsumerTelemetry.add_settled`, from the
delivery's observer: nothing is made per message); with OpenTelemetry each delivery's
settle function is wrapped so that it ends the delivery's span. An error inside
OpenTelemetry is logged, never raised into the application's ``ack()``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from msgsafe.endpoints import BrokerUrl
from msgsafe.message import Delivery, Outcome, SettleFn
from msgsafe.telemetry.stats import ConsumerCounters, ConsumerStats, TracedConnectionCounters

if TYPE_CHECKING:
    from msgsafe.telemetry._otel import Figures, OtelConsumer

__all__ = ["ConsumerTelemetry"]

log = logging.getLogger("msgsafe.telemetry")


class ConsumerTelemetry(TracedConnectionCounters, ConsumerCounters):
    """Counters for ``stats()``; with ``otel`` also OpenTelemetry spans and metrics.
    It is the consumer's :class:`~msgsafe._observer.ConnectionObserver`."""

    def __init__(self, url: BrokerUrl, *, otel: bool) -> None:
        super().__init__()
        self.target = url.redacted()
        self._otel: OtelConsumer | None = None
        if otel:
            from msgsafe.telemetry._otel import OtelConsumer

            server = url.endpoints[0].host if url.endpoints else url.path
            self._otel = OtelConsumer(url.protocol, self.target, server, self._figures)

    def deliver(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Count ``deliveries`` and return them (with OpenTelemetry, each with a span
        that its settling ends). Their settling is counted by :meth:`add_settled`, which
        the consumer calls."""
        if not deliveries:
            return deliveries
        self.add_received(len(deliveries))
        if self._otel is None:
            return deliveries
        for delivery in deliveries:
            self._trace(delivery, self._otel)
        return deliveries

    def _trace(self, delivery: Delivery, otel: OtelConsumer) -> None:
        try:
            span = otel.received(delivery.destination, delivery.message_id, delivery.headers)
        except Exception:
            log.warning("telemetry: cannot start a receive span", exc_info=True)
            return

        def wrap(inner: SettleFn) -> SettleFn:
            def settle(outcome: Outcome) -> None:
                inner(outcome)
                try:
                    otel.settled(span, outcome.value)
                except Exception:
                    log.warning("telemetry: cannot end a receive span", exc_info=True)

            return settle

        # NOTE: the delivery's own settle function is wrapped in place rather than the
        # delivery copied: a copy (headers and lock made again) cost more than the rest
        # of the consumer's work per message. Delivery.settle keeps its exactly-once check.
        delivery._wrap_settle(wrap)

    # --- ConnectionObserver ----------------------------------------------------------------

    def _figures(self) -> Figures:
        """The metrics' values at a collection (see msgsafe.telemetry._otel)."""
        settled = self.settled
        with self.lock:
            received = self.received
            failovers, redirects = dict(self.failovers), dict(self.redirects)
        return {
            "msgsafe.consumer.received": [(received, {})],
            "msgsafe.consumer.settled": [(n, {"msgsafe.outcome": k}) for k, n in settled.items()],
            "msgsafe.connection.failovers": [
                (n, {"msgsafe.reason": k}) for k, n in failovers.items()
            ],
            "msgsafe.connection.redirects": [
                (n, {"msgsafe.reason": k}) for k, n in redirects.items()
            ],
        }

    def stats(self, duplicates_dropped: int) -> ConsumerStats:
        """The snapshot ``Consumer.stats()`` returns."""
        return self.snapshot(self.target, duplicates_dropped=duplicates_dropped)

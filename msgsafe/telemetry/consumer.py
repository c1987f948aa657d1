"""A consumer's telemetry: the counters behind ``Consumer.stats()`` always, a span per
delivery (linked to the producer's span through the headers) with ``telemetry=True``.

Each delivery handed to the application is wrapped so that its settling is counted
(and ends its span); an error inside OpenTelemetry is logged, never raised into the
application's ``ack()``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from msgsafe.endpoints import BrokerUrl
from msgsafe.message import Delivery, Outcome
from msgsafe.telemetry.stats import ConsumerCounters, ConsumerStats, TracedConnectionCounters

if TYPE_CHECKING:
    from msgsafe.telemetry._otel import Figures, OtelConsumer

__all__ = ["ConsumerTelemetry"]

log = logging.getLogger("msgsafe.telemetry")


class ConsumerTelemetry(TracedConnectionCounters, ConsumerCounters):
    """Counters for ``stats()``; with ``otel`` also OpenTelemetry spans and metrics.
    It is the consumer's :class:`~msgsafe.telemetry._observer.ConnectionObserver`."""

    def __init__(self, url: BrokerUrl, *, otel: bool) -> None:
        super().__init__()
        self.target = url.redacted()
        self._otel: OtelConsumer | None = None
        if otel:
            from msgsafe.telemetry._otel import OtelConsumer

            server = url.endpoints[0].host if url.endpoints else url.path
            self._otel = OtelConsumer(url.protocol, self.target, server, self._figures)

    def deliver(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Count ``deliveries`` and return them with their settling counted too (and,
        with OpenTelemetry, a span each that their settling ends)."""
        if not deliveries:
            return deliveries
        self.add_received(len(deliveries))
        return [self._wrap(delivery) for delivery in deliveries]

    def _wrap(self, delivery: Delivery) -> Delivery:
        otel = self._otel
        span: Any = None
        if otel is not None:
            try:
                span = otel.received(delivery.destination, delivery.message_id, delivery.headers)
            except Exception:
                log.warning("telemetry: cannot start a receive span", exc_info=True)
        inner = delivery._settle
        count = self.add_settled

        def settle(outcome: Outcome) -> None:
            inner(outcome)
            count(outcome.value)
            if span is not None and otel is not None:
                try:
                    otel.settled(span, outcome.value)
                except Exception:
                    log.warning("telemetry: cannot end a receive span", exc_info=True)

        # NOTE: the delivery's own settle function is wrapped in place rather than the
        # delivery copied: a copy (headers and lock made again) cost more than the rest
        # of the consumer's work per message. Delivery.settle keeps its exactly-once check.
        delivery._settle = settle
        return delivery

    # --- ConnectionObserver ----------------------------------------------------------------

    def _figures(self) -> Figures:
        """The metrics' values at a collection (see msgsafe.telemetry._otel)."""
        with self.lock:
            received = self.received
            settled = dict(self.settled)
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

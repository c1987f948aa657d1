"""The Kafka client: one librdkafka producer with the adapter's settings, and the rules
every path that produces to Kafka through it shares.

Three users keep their own policy on top of a :class:`KafkaClient`:

- the transport of :class:`msgsafe.Producer`
  (:class:`~msgsafe.adapters.kafka._connection.ProducerLink`): a poll thread serves the
  reports, a watchdog bounds every outcome by ``confirm_timeout``, a fatal error has the
  producer renewed;
- the confluent-kafka drop-in's fast path (:mod:`msgsafe.compat._kafka_fast`): the
  caller's ``poll()``/``flush()`` serve the reports, the first failure switches the
  wrapper to the outbox;
- the Spark sink without an outbox (:mod:`msgsafe.spark.kafka_fast`): reports of failed
  deliveries only, rows counted per partition.

What they share is here:

- the producer, built from :func:`~msgsafe.adapters.kafka.config.producer_settings`
  (``acks=all``, idempotence, ``message.timeout.ms`` inside ``confirm_timeout``, TLS,
  credentials), renewed with the same settings (:meth:`KafkaClient.renew`);
- how ``produce`` is called: positionally (:data:`BY_KEY`, :data:`NOW`), one message
  (the caller's own code, on its hot path) or a run of them in one C loop
  (:meth:`KafkaClient.produce_run`: ids given in bulk, no Python frame per message);
- the record headers, built once per message: ``{msgsafe-id: id}`` (a dict of strings
  is no container the cyclic GC tracks, a list is) or, with headers of the caller's,
  one list with the id first (:func:`message_headers`);
- delivery reports: a run of messages shares one counting callable
  (:class:`ReportRun`), or librdkafka reports failures only (``failures_only``); a
  report object per message exists only where a caller asked for one;
- librdkafka's errors as msgsafe errors (:meth:`KafkaClient.error`).
"""

from __future__ import annotations

import collections
import itertools
import logging
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from msgsafe.adapters._config import build_config, size_error
from msgsafe.adapters.kafka._errors import translate
from msgsafe.adapters.kafka._wire import ID_HEADER, RecordHeaders
from msgsafe.adapters.kafka.config import KafkaOptions, producer_settings
from msgsafe.endpoints import BrokerUrl, parse_url
from msgsafe.errors import ConfigurationError, MsgsafeError
from msgsafe.message import Envelope

__all__ = [
    "BY_KEY",
    "ID_HEADER",
    "NOW",
    "DeliveryCallable",
    "Headers",
    "KafkaClient",
    "RecordHeaders",
    "ReportRun",
    "exceeds_size_limit",
    "message_headers",
]

log = logging.getLogger("msgsafe.kafka")

#: ``Producer.produce(topic, value, key, partition, on_delivery, callback, timestamp,
#: headers)`` is called positionally. NOTE: the binding parses keyword arguments about
#: 1 µs slower per call than positional ones (measured: 1.0 µs against 2.0 µs for
#: ``produce(t, v, on_delivery=cb)``), a third of the client's CPU per message.
#: -1: the partitioner picks (by key); 0: librdkafka stamps the time.
BY_KEY = -1
NOW = 0

#: One message's headers as ``produce`` takes them: ``{msgsafe-id: id}``, or a list.
Headers = dict[str, str | bytes | None] | RecordHeaders

#: librdkafka's delivery callback: ``(error or None, message)``.
DeliveryCallable = Callable[[KafkaError | None, Message], object]

#: Seconds of one flush() while :meth:`KafkaClient.drain` waits for the producer to empty.
_DRAIN_SLICE_S = 0.05
#: Seconds between warnings while a drain without a timeout waits.
_DRAIN_WARN_S = 10.0
#: The id header's name, as ``dict.fromkeys`` takes it.
_ID_NAME = (ID_HEADER,)


def message_headers(message_id: str | bytes, extra: RecordHeaders | None = None) -> Headers:
    """One message's record headers: ``{msgsafe-id: message_id}``, or with ``extra``
    (record headers without one named like the id header) one list, the id first.

    A report that keeps these headers reads the id back from either form; hot paths
    build the dict form inline, without this call.
    """
    if not extra:
        return {ID_HEADER: message_id}
    return [(ID_HEADER, message_id), *extra]


def exceeds_size_limit(envelope: Envelope, limit: int) -> bool:
    """Whether the Kafka adapter refuses ``envelope`` as too large: its body, key and
    headers (as :attr:`~msgsafe.message.Envelope.size` counts them) pass ``limit``
    (:attr:`KafkaClient.size_limit`), the check every transport makes before sending."""
    return size_error(envelope, limit, "") is not None


class ReportRun:
    """The delivery callable of messages ``start`` to ``stop - 1`` of a run handed to
    librdkafka together: one object for all of them instead of one per message.

    librdkafka's report does not say which message it is for beyond its key and value
    (confluent-kafka gives no headers there), so a run counts its reports (``next()`` on
    an ``itertools.count`` is atomic, and reports may be served on several threads) and
    keeps each failure's ``(error, key, value)``; once every message of the run is
    reported, ``done(run)`` gets it, and its owner tells which messages failed.
    """

    __slots__ = ("_count", "done", "failures", "size", "start", "stop")

    def __init__(self, done: Callable[[ReportRun], object], start: int, stop: int) -> None:
        self.done = done
        self.start = start
        self.stop = stop
        #: Reports owed (stop - start, kept: this is read once per delivery report).
        self.size = stop - start
        self._count = itertools.count(1)
        #: (error, key, value) of each failed report, appended before it is counted.
        self.failures: list[tuple[KafkaError, bytes | None, bytes | None]] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        # librdkafka's delivery report; must never raise into librdkafka.
        if err is not None:
            self.failures.append((err, msg.key(), msg.value()))
        if next(self._count) == self.size:
            self.done(self)

    def skip(self) -> None:
        """Count a message of the run that never reached librdkafka (no report will come
        for it); its owner has reported it failed already."""
        if next(self._count) == self.size:
            self.done(self)


class KafkaClient:
    """One librdkafka producer built from the Kafka adapter's settings for a URL.

    :attr:`producer` is the live ``confluent_kafka.Producer``: callers produce to it
    directly (positionally, see :data:`BY_KEY`) and serve its reports with its ``poll``
    / ``flush``; read it afresh per call where :meth:`renew` may replace it. With
    ``failures_only`` librdkafka reports failed deliveries only, into :attr:`failures`
    (a message librdkafka no longer holds and that is not there was confirmed).
    ``on_error`` gets librdkafka's global error events (``error_cb``) on the thread that
    serves them; it must not raise. Thread-safe as librdkafka is; :meth:`renew` is the
    caller's to serialise.
    """

    __slots__ = (
        "_on_error",
        "failures",
        "fatal",
        "options",
        "producer",
        "settings",
        "size_limit",
        "target",
    )

    def __init__(
        self,
        url: BrokerUrl,
        options: KafkaOptions,
        *,
        on_error: Callable[[KafkaError], object] | None = None,
        failures_only: bool = False,
        logger: object | None = None,
    ) -> None:
        #: The redacted URL: the ``endpoint`` of every error.
        self.target = url.redacted()
        self.options = options
        #: The largest message sent (see :func:`exceeds_size_limit`); librdkafka's own
        #: ``message.max.bytes`` is set above it.
        self.size_limit = options.size_limit
        #: With ``failures_only``: the error of each failed delivery, in report order.
        self.failures: list[KafkaError] = []
        #: The fatal error librdkafka reported through ``error_cb`` (the idempotence
        #: state is lost: this producer is done for); None again after :meth:`renew`.
        self.fatal: KafkaError | None = None
        self._on_error = on_error
        settings: dict[str, Any] = producer_settings(url, options)
        settings["error_cb"] = self._error
        if failures_only:
            settings["delivery.report.only.error"] = True
            settings["on_delivery"] = self._failed
        if logger is not None:
            # confluent-kafka's ``logger``: librdkafka's lines (a caller's ``debug``
            # raises their level) go to it, served by poll()/flush(), never to stderr.
            settings["logger"] = logger
        #: The producer's settings, callbacks included (read-only).
        self.settings: Mapping[str, Any] = MappingProxyType(settings)
        self.producer = self._new_producer()

    @classmethod
    def for_url(
        cls,
        url: str,
        options: Mapping[str, object],
        *,
        on_error: Callable[[KafkaError], object] | None = None,
        failures_only: bool = False,
        logger: object | None = None,
    ) -> KafkaClient:
        """A client for ``url`` (``kafka://`` or ``kafka+ssl://``) with ``options`` as
        :class:`~msgsafe.adapters.kafka.config.KafkaOptions` takes them (URL query and
        keywords); :class:`~msgsafe.errors.ConfigurationError` for a bad one."""
        parsed = parse_url(url)
        config = build_config(KafkaOptions, parsed, options)
        return cls(parsed, config, on_error=on_error, failures_only=failures_only, logger=logger)

    def _new_producer(self) -> Producer:
        try:
            return Producer(dict(self.settings))
        except KafkaException as exc:
            raise ConfigurationError(f"kafka producer settings: {exc.args[0].str()}") from exc

    def _error(self, err: KafkaError) -> None:
        # librdkafka's error_cb, on the thread that serves the producer.
        if err.fatal() and self.fatal is None:
            self.fatal = err
        if self._on_error is not None:
            self._on_error(err)

    def _failed(self, err: KafkaError | None, _msg: Message) -> None:
        # librdkafka's delivery report with failures_only; must never raise into it.
        if err is not None:
            self.failures.append(err)

    def error(self, err: KafkaError, message_id: str | None = None) -> MsgsafeError:
        """The msgsafe error for librdkafka's ``err`` (a delivery report, produce, an
        error event), classified by whether the broker could have acted."""
        return translate(err, endpoint=self.target, message_id=message_id)

    def __len__(self) -> int:
        """Messages (and error events) librdkafka holds: produced, not yet reported."""
        return len(self.producer)

    # --- producing -------------------------------------------------------------------------

    def produce_run(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        ids: Sequence[str | bytes],
        extra: RecordHeaders | None,
        on_delivery: DeliveryCallable | None,
        start: int,
        stop: int,
    ) -> tuple[int, Exception | None]:
        """Hand messages ``start`` to ``stop - 1`` (``values[i]``, ``keys[i]``, the id
        ``ids[i]`` in its header, then ``extra``) to librdkafka in order, in one C loop,
        each with ``on_delivery`` (None: the producer's own, or no report).

        Returns ``(stop, None)``, or the index of the first message librdkafka refused
        with what it raised (``BufferError``: its queue is full; ``KafkaException``;
        ``TypeError``/``ValueError``): the messages before it were taken, it and the
        rest were not.
        """
        if start >= stop:
            return stop, None
        rows = iter(values[start:stop])
        part = ids[start:stop]
        headers: Iterable[Any] = (
            [[(ID_HEADER, i), *extra] for i in part]
            if extra
            else map(dict.fromkeys, itertools.repeat(_ID_NAME), part)
        )
        calls = map(
            self.producer.produce,
            itertools.repeat(topic),
            rows,
            itertools.repeat(None) if keys is None else keys[start:stop],
            itertools.repeat(BY_KEY),
            itertools.repeat(on_delivery),
            itertools.repeat(None),
            itertools.repeat(NOW),
            headers,
        )
        try:
            collections.deque(calls, maxlen=0)
        except (BufferError, KafkaException, TypeError, ValueError) as exc:
            # The refused message is the last one map took from ``rows``.
            return stop - operator.length_hint(rows) - 1, exc
        return stop, None

    # --- emptying --------------------------------------------------------------------------

    def purge(self, *, in_flight: bool = True, blocking: bool = False) -> None:
        """Take back what librdkafka holds: queued messages (never sent) and, with
        ``in_flight``, those sent and not yet answered (which the broker may have
        written); their reports (``_PURGE_QUEUE``, ``_PURGE_INFLIGHT``) are served here,
        as far as they are ready."""
        try:
            self.producer.purge(True, in_flight, blocking)
            self.producer.poll(0)
        except KafkaException as exc:
            # NOTE: confluent-kafka raises a fatal error out of poll() (instead of through
            # error_cb): it must reach the error callback, which has the producer renewed,
            # not end here (the client would then produce into a dead producer for good).
            self._error(exc.args[0])
        except RuntimeError:
            log.debug("purging the producer to %s", self.target, exc_info=True)

    def drain(self, timeout: float | None) -> int:
        """Serve reports (and send what lingers) until librdkafka holds nothing, at most
        ``timeout`` seconds (None: however long it takes, with a warning every 10 s);
        returns how many it still holds."""
        producer = self.producer
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        warned = start
        while len(producer):
            now = time.monotonic()
            if deadline is None:
                if now - warned > _DRAIN_WARN_S:
                    warned = now
                    log.warning(
                        "kafka client to %s: %d messages still in librdkafka",
                        self.target,
                        len(producer),
                    )
                producer.flush(_DRAIN_SLICE_S)
                continue
            if now >= deadline:
                break
            producer.flush(min(deadline - now, _DRAIN_SLICE_S))
        return len(producer)

    def renew(self) -> None:
        """Replace :attr:`producer` with a new one of the same settings (after a fatal
        error: the idempotence state is lost). What the old one held fails through its
        delivery reports, served here: queued ``_PURGE_QUEUE``, in flight
        ``_PURGE_INFLIGHT``. :class:`~msgsafe.errors.ConfigurationError` if the new one
        cannot be made (the old one stays)."""
        old = self.producer
        self.producer = self._new_producer()
        try:
            old.purge(True, True, False)
            old.poll(0)
            old.flush(0)
        except (KafkaException, RuntimeError):
            log.debug("purging the failed producer to %s", self.target, exc_info=True)
        # Cleared after the old producer's last events: they were about it.
        self.fatal = None

    def __repr__(self) -> str:
        return f"KafkaClient({self.target!r}, {len(self.producer)} held)"

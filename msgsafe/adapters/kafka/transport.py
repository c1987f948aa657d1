"""The Kafka publishing transport: what callers call.

``publish`` hands the envelope to librdkafka (which batches, retries idempotently and
keeps per-partition order) and returns a future; ``publish_callback`` does the same with
a callback instead of a future; ``publish_batch`` hands over a whole
:class:`~msgsafe.message.Batch` with one delivery callable per chunk of it. Delivery
reports resolve them. While publishers are busy they serve the reports themselves every
256 messages (no GIL ping-pong with another thread); when they pause, the poll thread
does. The producer is a :class:`~msgsafe.adapters.kafka.client.KafkaClient`; that thread and
the watchdog that gets every message its outcome by ``confirm_timeout`` are
:class:`~msgsafe.adapters.kafka._connection.ProducerLink`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from msgsafe.adapters._config import oversized, size_error
from msgsafe.adapters._reports import PUBLISH_CALLBACK, call_logged, report_failed
from msgsafe.adapters.kafka._connection import BatchReports, ProducerLink, SendReport, log
from msgsafe.adapters.kafka._wire import user_headers
from msgsafe.adapters.kafka.client import (
    BY_KEY,
    ID_HEADER,
    NOW,
    Headers,
    RecordHeaders,
    ReportRun,
    message_headers,
)
from msgsafe.adapters.kafka.config import KafkaOptions
from msgsafe.adapters.kafka.fast import KafkaFastSender
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ClosedError, MsgsafeError, Refused
from msgsafe.message import Batch, Envelope
from msgsafe.ports import (
    BatchReport,
    FastPathHost,
    PublishCallback,
    PublishFuture,
    TransportCapabilities,
)

__all__ = ["KafkaTransport"]

_monotonic = time.monotonic

#: Publishing threads serve delivery reports every 256 messages themselves.
_INLINE_EVERY_MASK = 255
#: Seconds a publisher waiting for room blocks in one poll.
_ROOM_POLL_S = 0.01
#: Messages of a batch that share one delivery callable (and serve reports between).
_CHUNK = 256
#: Seconds of the one flush() of a blocking send (see KafkaTransport.hurry), and of each
#: poll after it: a poll returns as soon as it served a report.
_HURRY_FLUSH_S = 0.005
_HURRY_POLL_S = 0.005
#: Seconds of each flush while the poll thread serves the reports (it only has
#: librdkafka send now, and returns once the poll thread served them).
_HURRY_TRIGGER_S = 0.001
#: Share of confirm_timeout that publish may wait for room in a full local queue.
_ROOM_WAIT_SHARE = 0.25


class KafkaTransport:
    """Publishes to Kafka with ``acks=all`` and idempotence; see :class:`msgsafe.ports.Transport`.

    Thread-safe. A fatal producer error (the idempotence state is lost) recreates the
    producer; the messages it held fail transiently, so the caller stores them in the
    outbox and nothing is lost. An envelope marked ``tombstone`` is produced with a null
    value (``capabilities.tombstones``: the producer lets such envelopes through).
    """

    def __init__(self, url: BrokerUrl, options: KafkaOptions) -> None:
        self._target = url.redacted()
        self._options = options
        self._timeout = options.confirm_timeout
        self._size_limit = options.size_limit
        self._lock = threading.Lock()
        self._closed = False
        self._published = 0
        self._link = ProducerLink(url, options)

    @property
    def target(self) -> str:
        """The redacted URL this transport publishes to."""
        return self._target

    @property
    def capabilities(self) -> TransportCapabilities:
        """Every optional seam of msgsafe.ports; tombstones (a Kafka record can have a
        null value: a tombstone envelope is sent as one); and ordered_rounds with
        idempotence: what is handed over later goes out later on each key's partition,
        across batches (max.in.flight <= 5, ordered retries, what is queued behind a
        failure fails), so the outbox forwarder may publish its next round while the
        last is answered (see msgsafe.outbox.forwarder); and fast_path (a KafkaFastSender
        for the producer's single sends) for the same reason. Neither without idempotence
        (``allow_unsafe``): a retry may then overtake."""
        return TransportCapabilities(
            callback=True,
            batch=True,
            hurry=True,
            tombstones=True,
            ordered_rounds=self._options.enable_idempotence,
            listen_errors=True,
            fast_path=self._options.enable_idempotence,
        )

    def open_fast_path(self, host: FastPathHost) -> KafkaFastSender:
        """A :class:`~msgsafe.adapters.kafka.fast.KafkaFastSender` over this transport's
        librdkafka producer (see :class:`msgsafe.ports.FastPathTransport`); its watchdog
        runs on the poll thread."""
        fast = KafkaFastSender(self._link, host, timeout=self._timeout, size_limit=self._size_limit)
        self._link.fast_watchdogs.append(fast.expire)
        return fast

    @property
    def recreated(self) -> int:
        """Producers recreated after a fatal error (for tests and metrics)."""
        return self._link.recreated

    def listen_errors(self, listener: Callable[[KafkaError], object] | None) -> None:
        """Have ``listener`` told each of librdkafka's global error events (what
        confluent-kafka's ``error_cb`` gets: ``_TRANSPORT``, ``_ALL_BROKERS_DOWN``,
        ``_AUTHENTICATION``, ...) as it happens, before the transport acts on it; None
        stops. It runs on librdkafka's or a publisher's thread: it must not block, and
        what it raises is logged and dropped. For ``msgsafe.compat.confluent_kafka``."""
        self._link.listener = listener

    @property
    def _producer(self) -> Producer:
        # The librdkafka producer in use (tests reach for its handle).
        return self._link.client.producer

    # --- publishing -----------------------------------------------------------------------

    def publish(self, envelope: Envelope) -> Future[None]:
        """Send ``envelope``; the future resolves on its ``acks=all`` delivery report."""
        future = PublishFuture()
        self.publish_callback(envelope, future)
        return future

    def publish_callback(self, envelope: Envelope, callback: PublishCallback) -> None:
        """Send ``envelope``; ``callback`` gets its ``acks=all`` delivery report (None)
        or the error, exactly once (see :class:`msgsafe.ports.CallbackTransport`)."""
        message_id = envelope.message_id
        if self._closed:
            call_logged(
                log,
                PUBLISH_CALLBACK,
                callback,
                ClosedError("transport is closed", endpoint=self._target, message_id=message_id),
            )
            return
        body: bytes | None = envelope.body
        key = envelope.key
        extra = envelope.headers
        # NOTE: the common envelope (no headers) is measured here, without a call:
        # size_error is the one place that words the refusal and counts headers.
        if extra or len(envelope.body) + (0 if key is None else len(key)) > self._size_limit:
            too_large = size_error(envelope, self._size_limit, self._target)
            if too_large is not None:
                call_logged(log, PUBLISH_CALLBACK, callback, too_large)
                return
        link = self._link
        now = _monotonic()
        # ProducerLink.down, read without its own clock read (this one is reused below).
        if link.mismatch is not None or now < link.down_until:
            # Every broker is down: fail now (to the outbox), not at message.timeout.ms.
            down = link.unreachable(message_id, envelope.destination)
            call_logged(log, PUBLISH_CALLBACK, callback, down)
            return
        # The client's record headers (see message_headers), the common form built inline.
        headers: Headers = (
            {ID_HEADER: message_id}
            if not extra
            else message_headers(message_id, user_headers(extra))
        )
        if envelope.tombstone:
            body = None  # a null value, which b"" is not (a compacted topic's delete)
        report = SendReport(link, message_id, now + self._timeout, callback)
        # Open before produce: another thread may serve the report before produce returns.
        link.open.add(report)
        error: MsgsafeError | None = None
        topic = envelope.destination
        try:
            link.client.producer.produce(topic, body, key, BY_KEY, report, None, NOW, headers)
        except BufferError:
            # librdkafka's local queue is full (max_in_flight): wait for room, bounded.
            error = self._produce_when_room(topic, body, key, headers, report, message_id)
        except (KafkaException, TypeError, ValueError) as exc:
            error = link.produce_error(exc, message_id)
        if error is not None:
            # librdkafka did not take it: no report will come.
            link.open.discard(report)
            call_logged(log, PUBLISH_CALLBACK, callback, error)
            return
        link.watch.append(report)
        self._published += 1
        if not self._published & _INLINE_EVERY_MASK:
            # Serve delivery reports on the publishing thread while it is busy: the poll
            # thread then stays off the GIL instead of contending for it per report.
            link.inline_at = now
            link.serve(0)

    def publish_batch(self, batch: Batch, report: BatchReport) -> None:
        """Send every message of ``batch``; ``report`` learns each outcome once (see
        :class:`msgsafe.ports.BatchTransport`): ``acks=all`` delivery reports, counted
        per chunk of messages (a :class:`~msgsafe.adapters.kafka.client.ReportRun` each,
        settled by :class:`~msgsafe.adapters.kafka._connection.BatchReports`)."""
        count = len(batch)
        if not count:
            return
        target = self._target
        if self._closed:
            error = ClosedError("transport is closed", endpoint=target)
            for index in range(count):
                report_failed(report, index, error)
            return
        link = self._link
        if link.down:
            for index in range(count):
                down = link.unreachable(batch.message_ids[index], batch.destination)
                report_failed(report, index, down)
            return
        reports = BatchReports(link, batch, report)
        topic = batch.destination
        bodies, ids, keys = batch.bodies, batch.message_ids, batch.keys
        extra = user_headers(batch.headers)
        too_large = oversized(batch, self._size_limit, target)
        client = link.client
        # Registered before the first produce: a report may be served before the loop ends.
        link.batches.append(reports)
        try:
            for start in range(0, count, _CHUNK):
                stop = min(start + _CHUNK, count)
                chunk = reports.chunk(start, stop)
                at = start
                while at < stop:
                    end = stop
                    if too_large:
                        # Runs end before a message too large to send (most batches have none).
                        end = next((i for i in range(at, stop) if i in too_large), stop)
                        if end == at:
                            reports.fail(chunk, at, too_large[at])
                            at += 1
                            continue
                    at, refused = client.produce_run(
                        topic, bodies, keys, ids, extra, chunk, at, end
                    )
                    if refused is not None:
                        failure = self._refused(refused, batch, extra, chunk, at)
                        if failure is not None:
                            reports.fail(chunk, at, failure)
                        at += 1
                # Serve delivery reports here while busy, as publish does.
                link.inline_at = time.monotonic()
                link.serve(0)
        finally:
            reports.deadline = time.monotonic() + self._timeout

    def _refused(
        self,
        refused: Exception,
        batch: Batch,
        extra: RecordHeaders,
        chunk: ReportRun,
        index: int,
    ) -> MsgsafeError | None:
        """What becomes of message ``index`` of ``batch`` that librdkafka refused with
        ``refused``: produced once its queue has room (None), or the error to report."""
        if isinstance(refused, BufferError):
            key = None if batch.keys is None else batch.keys[index]
            headers = message_headers(batch.message_ids[index], extra)
            return self._produce_when_room(
                batch.destination, batch.bodies[index], key, headers, chunk
            )
        return self._link.produce_error(refused)

    def hurry(self, done: Future[Any], timeout: float) -> None:
        """Send what librdkafka holds without ``linger.ms``, then wait until ``done``
        resolves or ``timeout`` passes, serving delivery reports on this thread unless
        the poll thread is already waiting for them (see
        :class:`msgsafe.ports.HurryingTransport`)."""
        deadline = time.monotonic() + timeout
        link = self._link
        # NOTE: librdkafka skips linger.ms only while a flush() call runs, and only for a
        # broker thread that looks while it runs: on a busy machine one that wakes after
        # the flush returned waited out the whole linger (a send after a pause took
        # linger_ms = 1000 ms with six busy processes on two cores). So a slice that ends
        # without the report flushes again; most sends need one flush only (a flush()
        # per slice wakes every broker thread: about twice the CPU per send of a raw
        # produce()+flush() when every slice did it).
        flush = True
        while not done.done() and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # NOTE: keeps the poll thread out of librdkafka (see ProducerLink.inline_at):
            # a report it serves would reach this thread only after its next wake-up.
            # One that is in its poll() already leaves it after the next report.
            link.inline_at = time.monotonic()
            try:
                if link.polling:
                    # NOTE: the poll thread already waits in librdkafka's poll(), and
                    # librdkafka hands a report to one waiting thread: most likely that
                    # one, while a long flush() here would sit out its whole slice (a
                    # send after a pause measured 2 ms slower than a raw
                    # produce()+flush()). Shortest flushes, one after another, keep
                    # librdkafka sending now; the report resolves ``done`` on whichever
                    # thread serves it, and a flush returns once nothing is queued.
                    link.client.producer.flush(min(_HURRY_TRIGGER_S, left))
                    continue
                if flush:
                    flush = False
                    link.client.producer.flush(min(_HURRY_FLUSH_S, left))
                else:
                    flush = True
                    link.serve(min(_HURRY_POLL_S, left))
            except KafkaException as exc:
                link.on_error(exc.args[0])
            except SystemError:
                # NOTE: confluent-kafka's poll()/flush() return NULL without an exception
                # when a signal handler raised inside them: Ctrl-C would surface as a
                # SystemError. Signals run on the main thread only: give it back.
                if threading.current_thread() is threading.main_thread():
                    raise KeyboardInterrupt from None
                raise
            except Exception:  # a report callback bug: the plain wait still follows
                log.exception("kafka flush failed")
                return

    def _produce_when_room(
        self,
        topic: str,
        body: bytes | None,
        key: bytes | None,
        headers: Headers,
        on_delivery: SendReport | ReportRun,
        message_id: str | None = None,
    ) -> MsgsafeError | None:
        """Produce once librdkafka's local queue has room, waiting a bounded share of
        confirm_timeout; the error if it never had room (or refused the message)."""
        deadline = time.monotonic() + self._timeout * _ROOM_WAIT_SHARE
        link = self._link
        while True:
            # Serve delivery reports here: that is what makes room in librdkafka's queue.
            link.serve(_ROOM_POLL_S)
            if self._closed:
                return ClosedError("transport closed", endpoint=self._target, message_id=message_id)
            try:
                link.client.producer.produce(
                    topic, body, key, BY_KEY, on_delivery, None, NOW, headers
                )
                return None
            except BufferError:
                if time.monotonic() >= deadline:
                    return Refused(
                        "local producer queue full (max_in_flight reached)",
                        endpoint=self._target,
                        message_id=message_id,
                    )
            except KafkaException as exc:
                return link.client.error(exc.args[0], message_id)

    # --- lifecycle --------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for outstanding delivery reports, then fail the rest
        with :class:`ConnectionLost` and release the producer. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._link.close(timeout)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"KafkaTransport({self._target!r}, {state})"

"""The Kafka publishing transport: one librdkafka producer and its poll thread.

``publish`` hands the envelope to librdkafka (which batches, retries idempotently and
keeps per-partition order) and returns a future; ``publish_callback`` does the same with
a callback instead of a future; ``publish_batch`` hands over a whole
:class:`~msgsafe.message.Batch` with one delivery callable for all of it. Delivery
reports resolve them.
While publishers are busy they serve the reports themselves every 256 messages (no GIL
ping-pong with another thread); when they pause, the poll thread does. librdkafka bounds
every message by ``message.timeout.ms`` (set inside ``confirm_timeout``), and a watchdog
on the poll thread fails anything still open at ``confirm_timeout``: every message's
outcome arrives in time.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from msgsafe.adapters._reports import call_logged, report_confirmed, report_failed
from msgsafe.adapters.kafka._errors import PRODUCER_STATE, translate
from msgsafe.adapters.kafka.config import KafkaOptions, producer_settings
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    ConfirmTimeout,
    ConnectionLost,
    InvalidMessage,
    MsgsafeError,
    Refused,
)
from msgsafe.message import MESSAGE_ID_HEADER, Batch, Envelope
from msgsafe.ports import BatchReport, PublishCallback, PublishFuture

__all__ = ["KafkaTransport"]

log = logging.getLogger("msgsafe.kafka")

#: Seconds the poll thread blocks in librdkafka when idle.
_POLL_S = 0.05
#: Publishing threads serve delivery reports every 256 messages themselves.
_INLINE_EVERY_MASK = 255
#: The poll thread leaves librdkafka to the publishers while they polled this recently.
_INLINE_GRACE_S = 0.02
#: Seconds a publisher waiting for room blocks in one poll.
_ROOM_POLL_S = 0.01
#: Seconds between repeated "all brokers down" warnings.
_DOWN_WARN_EVERY_S = 30.0
#: Messages of a batch that share one delivery callable (and serve reports between).
_CHUNK = 256
#: Share of confirm_timeout that publish may wait for room in a full local queue.
_ROOM_WAIT_SHARE = 0.25

#: Positional arguments of ``Producer.produce(topic, value, key, partition, callback,
#: on_delivery, timestamp, headers)``. NOTE: the binding parses keyword arguments about
#: 1 µs slower per call than positional ones (measured: 1.0 µs against 2.0 µs for
#: ``produce(t, v, on_delivery=cb)``), a third of the client's CPU per message.
#: -1: the partitioner picks (by key); 0: the client stamps the time.
_BY_KEY = -1
_NOW = 0
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


class _Report:
    """One message in librdkafka: its delivery callback and the watchdog's entry.

    A slotted object rather than a future or a closure: on the hot path every container
    object counts, because the cyclic GC walks all of them while messages are in flight.
    """

    __slots__ = ("callback", "deadline", "message_id", "transport")

    def __init__(
        self,
        transport: KafkaTransport,
        message_id: str,
        deadline: float,
        callback: PublishCallback,
    ) -> None:
        self.transport = transport
        self.message_id = message_id
        self.deadline = deadline
        self.callback = callback

    def __call__(self, err: KafkaError | None, _msg: Message) -> None:
        # librdkafka's delivery report. Runs where reports are served (poll thread, a
        # publisher, close()) and must never raise into librdkafka.
        transport = self.transport
        try:
            # NOTE: set.remove is atomic under the GIL: whoever removes the report
            # settles it; a report that arrives after the watchdog did is dropped.
            transport._open.remove(self)
        except KeyError:
            return
        if err is None:
            call_logged(self.callback, None)
        else:
            transport._failed(self, err)


class _Chunk:
    """The delivery callable of up to ``_CHUNK`` consecutive messages of one batch.

    librdkafka's delivery report does not say which message it is for beyond the
    message's key and value (confluent-kafka does not return headers there), so a
    chunk counts its reports (``next()`` on an ``itertools.count`` is atomic, and
    reports may be served on several threads) and keeps each failure's key and value.
    Once every message of the chunk has a report, failures are matched to indexes by
    ``(key, value)``, exactly where that content is unique in the chunk. Where identical
    messages both failed and succeeded, all of them are failed as possibly delivered:
    they go to the outbox, and the ones the broker had in fact confirmed become
    duplicates with known ids, never losses.
    """

    __slots__ = ("_count", "failures", "owner", "size", "start", "stop")

    def __init__(self, owner: _BatchReports, start: int, stop: int) -> None:
        self.owner = owner
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
            self.owner.chunk_done(self)

    def fail(self, index: int, error: MsgsafeError) -> None:
        """Message ``index`` never reached librdkafka: report it failed now, and count
        it (no delivery report will come for it)."""
        self.owner.fail_local(index, error)
        if next(self._count) == self.size:
            self.owner.chunk_done(self)


class _BatchReports:
    """Everything the transport tracks for one batch: its chunks, its deadline, and
    which indexes are settled. Reports ``confirmed`` once per finished chunk."""

    __slots__ = ("_lock", "_settled", "batch", "deadline", "finished", "report", "transport")

    def __init__(self, transport: KafkaTransport, batch: Batch, report: BatchReport) -> None:
        self.transport = transport
        self.batch = batch
        self.report = report
        self.deadline = float("inf")
        self.finished = False
        #: Indexes already reported (failed before librdkafka took them, or settled
        #: with their chunk); under _lock.
        self._settled: set[int] = set()
        self._lock = threading.Lock()

    def fail_local(self, index: int, error: MsgsafeError) -> None:
        """Message ``index`` never reached librdkafka: report it failed now."""
        with self._lock:
            if self.finished or index in self._settled:
                return
            self._settled.add(index)
        report_failed(self.report, index, error)

    def chunk_done(self, chunk: _Chunk) -> None:
        """Every message of ``chunk`` has a report: settle the ones not settled yet."""
        with self._lock:
            if self.finished:
                return
            indexes = [i for i in range(chunk.start, chunk.stop) if i not in self._settled]
            self._settled.update(indexes)
            if len(self._settled) == len(self.batch):
                self.finished = True
        failures = chunk.failures
        if not failures:
            self._confirm(len(indexes))
            return
        failed = self._attribute(indexes, failures)
        self._confirm(len(indexes) - len(failed))
        for index, error in failed.items():
            report_failed(self.report, index, error)

    def _attribute(
        self,
        indexes: list[int],
        failures: list[tuple[KafkaError, bytes | None, bytes | None]],
    ) -> dict[int, MsgsafeError]:
        """Match failed reports to message indexes by (key, value); see :class:`_Chunk`."""
        transport = self.transport
        batch = self.batch
        keys = batch.keys
        same: dict[tuple[bytes | None, bytes], list[int]] = {}
        for index in indexes:
            key = None if keys is None else keys[index]
            same.setdefault((key, batch.bodies[index]), []).append(index)
        errors: dict[tuple[bytes | None, bytes], list[MsgsafeError]] = {}
        for err, key, value in failures:
            errors.setdefault((key, value or b""), []).append(transport._delivery_error(err))
        if any(content not in same for content in errors):
            # A report that matches no message of the chunk: nothing says which failed.
            unknown = ConfirmTimeout(
                "a delivery report matched no message of its chunk", endpoint=transport._target
            )
            log.error("kafka: %s; the chunk goes to the outbox", unknown.message)
            return dict.fromkeys(indexes, unknown)
        failed: dict[int, MsgsafeError] = {}
        for content, found in errors.items():
            members = same[content]
            if len(found) >= len(members):
                # Every message with this content failed: each gets an error of them.
                failed.update(zip(members, found, strict=False))
                continue
            # Some of the identical messages were confirmed, some not, and nothing says
            # which: all go to the outbox as possibly delivered.
            ambiguous = ConfirmTimeout(
                f"{len(found)} of {len(members)} identical messages failed "
                f"({type(found[0]).__name__}: {found[0].message}); which ones is unknown",
                endpoint=transport._target,
            )
            failed.update(dict.fromkeys(members, ambiguous))
        return failed

    def _confirm(self, count: int) -> None:
        if count:
            report_confirmed(self.report, count)

    def abandon(self, error: MsgsafeError) -> None:
        """End the batch now: every message not settled fails with ``error`` (which must
        say ``maybe_delivered``): nothing says which of them the broker confirmed."""
        with self._lock:
            if self.finished:
                return
            self.finished = True
            rest = [i for i in range(len(self.batch)) if i not in self._settled]
            self._settled.update(rest)
        for index in rest:
            report_failed(self.report, index, error)


class KafkaTransport:
    """Publishes to Kafka with ``acks=all`` and idempotence; see :class:`msgsafe.ports.Transport`.

    Thread-safe. A fatal producer error (the idempotence state is lost) recreates the
    producer; the messages it held fail transiently, so the caller stores them in the
    outbox and nothing is lost.
    """

    def __init__(self, url: BrokerUrl, options: KafkaOptions) -> None:
        self._target = url.redacted()
        self._options = options
        self._settings = producer_settings(url, options)
        self._timeout = options.confirm_timeout
        self._lock = threading.Lock()
        self._closed = False
        self._closing = False
        #: True while the poll thread serves a replaced producer's last reports.
        self._draining = False
        self._fatal: KafkaError | None = None
        #: Reports in publish order with their deadline: the watchdog's list.
        self._watch: deque[_Report] = deque()
        #: Reports not settled yet; removing one from here is the right to settle it.
        self._open: set[_Report] = set()
        #: Batches in publish order: the watchdog's other list.
        self._batches: deque[_BatchReports] = deque()
        self._published = 0
        self._down_warned_at = -_DOWN_WARN_EVERY_S
        self._inline_at = 0.0
        self._stop = threading.Event()
        #: Producers recreated after a fatal error (for tests and metrics).
        self.recreated = 0
        self._producer = self._new_producer()
        self._thread = threading.Thread(target=self._run, name="msgsafe-kafka-poll", daemon=True)
        self._thread.start()

    @property
    def target(self) -> str:
        """The redacted URL this transport publishes to."""
        return self._target

    def _new_producer(self) -> Producer:
        settings: dict[str, Any] = dict(self._settings)
        settings["error_cb"] = self._on_error
        try:
            return Producer(settings)
        except KafkaException as exc:
            raise ConfigurationError(f"kafka producer settings: {exc.args[0].str()}") from exc

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
                callback,
                ClosedError("transport is closed", endpoint=self._target, message_id=message_id),
            )
            return
        too_large = self._options.size_error(envelope, endpoint=self._target)
        if too_large is not None:
            call_logged(callback, too_large)
            return
        headers: list[tuple[str, str | bytes | None]] = [(MESSAGE_ID_HEADER, message_id)]
        if envelope.headers:
            # NOTE: the id header is ours; a user header of the same name would let a
            # consumer read a different id than the one the receipt names.
            headers.extend(kv for kv in envelope.headers.items() if kv[0] != MESSAGE_ID_HEADER)
        now = time.monotonic()
        report = _Report(self, message_id, now + self._timeout, callback)
        # Open before produce: another thread may serve the report before produce returns.
        self._open.add(report)
        error: MsgsafeError | None = None
        try:
            self._producer.produce(
                envelope.destination,
                envelope.body,
                envelope.key,
                _BY_KEY,
                report,
                None,
                _NOW,
                headers,
            )
        except BufferError:
            # librdkafka's local queue is full (max_in_flight): wait for room, bounded.
            error = self._produce_when_room(
                envelope.destination,
                envelope.body,
                envelope.key,
                headers,
                report,
                envelope.message_id,
            )
        except KafkaException as exc:
            if exc.args[0].fatal():
                self._fatal = exc.args[0]
            error = translate(exc.args[0], endpoint=self._target, message_id=message_id)
        except (TypeError, ValueError) as exc:
            error = InvalidMessage(f"kafka refused the message: {exc}", message_id=message_id)
        if error is not None:
            # librdkafka did not take it: no report will come.
            self._open.discard(report)
            call_logged(callback, error)
            return
        self._watch.append(report)
        self._published += 1
        if not self._published & _INLINE_EVERY_MASK:
            # Serve delivery reports on the publishing thread while it is busy: the poll
            # thread then stays off the GIL instead of contending for it per report.
            self._inline_at = now
            try:
                self._producer.poll(0)
            except KafkaException as exc:
                self._on_error(exc.args[0])

    def publish_batch(self, batch: Batch, report: BatchReport) -> None:
        """Send every message of ``batch``; ``report`` learns each outcome once (see
        :class:`msgsafe.ports.BatchTransport`): ``acks=all`` delivery reports, counted
        per chunk of messages (see :class:`_Chunk`)."""
        count = len(batch)
        if not count:
            return
        target = self._target
        if self._closed:
            error = ClosedError("transport is closed", endpoint=target)
            for index in range(count):
                report_failed(report, index, error)
            return
        reports = _BatchReports(self, batch, report)
        topic = batch.destination
        bodies, ids, keys = batch.bodies, batch.message_ids, batch.keys
        extra: list[tuple[str, str | bytes | None]] = [
            kv for kv in batch.headers.items() if kv[0] != MESSAGE_ID_HEADER
        ]
        too_large = self._options.oversized(batch, endpoint=target)
        produce = self._producer.produce
        poll = self._producer.poll
        name = MESSAGE_ID_HEADER
        # Registered before the first produce: a report may be served before the loop ends.
        self._batches.append(reports)
        try:
            for start in range(0, count, _CHUNK):
                stop = min(start + _CHUNK, count)
                chunk = _Chunk(reports, start, stop)
                for index in range(start, stop):
                    body = bodies[index]
                    key = None if keys is None else keys[index]
                    if too_large and index in too_large:
                        chunk.fail(index, too_large[index])
                        continue
                    headers: list[tuple[str, str | bytes | None]] = (
                        [(name, ids[index]), *extra] if extra else [(name, ids[index])]
                    )
                    try:
                        produce(topic, body, key, _BY_KEY, chunk, None, _NOW, headers)
                    except BufferError:
                        failure = self._produce_when_room(topic, body, key, headers, chunk)
                        if failure is not None:
                            chunk.fail(index, failure)
                    except KafkaException as exc:
                        if exc.args[0].fatal():
                            self._fatal = exc.args[0]
                        chunk.fail(index, translate(exc.args[0], endpoint=target))
                    except (TypeError, ValueError) as exc:
                        chunk.fail(index, InvalidMessage(f"kafka refused the message: {exc}"))
                # Serve delivery reports here while busy, as publish does.
                self._inline_at = time.monotonic()
                try:
                    poll(0)
                except KafkaException as exc:
                    self._on_error(exc.args[0])
        finally:
            reports.deadline = time.monotonic() + self._timeout

    def _produce_when_room(
        self,
        topic: str,
        body: bytes,
        key: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
        on_delivery: _Report | _Chunk,
        message_id: str | None = None,
    ) -> MsgsafeError | None:
        """Produce once librdkafka's local queue has room, waiting a bounded share of
        confirm_timeout; the error if it never had room (or refused the message)."""
        deadline = time.monotonic() + self._timeout * _ROOM_WAIT_SHARE
        while True:
            # Serve delivery reports here: that is what makes room in librdkafka's queue.
            try:
                self._producer.poll(_ROOM_POLL_S)
            except KafkaException as exc:
                self._on_error(exc.args[0])
            if self._closed:
                return ClosedError("transport closed", endpoint=self._target, message_id=message_id)
            try:
                self._producer.produce(topic, body, key, _BY_KEY, on_delivery, None, _NOW, headers)
                return None
            except BufferError:
                if time.monotonic() >= deadline:
                    return Refused(
                        "local producer queue full (max_in_flight reached)",
                        endpoint=self._target,
                        message_id=message_id,
                    )
            except KafkaException as exc:
                return translate(exc.args[0], endpoint=self._target, message_id=message_id)

    def _failed(self, report: _Report, err: KafkaError) -> None:
        # Runs where reports are served (poll thread, a publisher, close()), for a report
        # already taken out of _open; must never raise into librdkafka.
        call_logged(report.callback, self._delivery_error(err, report.message_id))

    def _delivery_error(self, err: KafkaError, message_id: str | None = None) -> MsgsafeError:
        """The msgsafe error of a failed delivery report; recreates the producer when its
        own state is what failed."""
        if self._closing and err.code() in _PURGED:
            return ConnectionLost(
                "transport closed before the broker confirmed",
                endpoint=self._target,
                message_id=message_id,
            )
        if err.code() in PRODUCER_STATE and not self._draining and self._fatal is None:
            # NOTE: tansu answers PRODUCER_FENCED after a restart for a producer id it no
            # longer knows; librdkafka keeps using it, so start a fresh producer.
            log.warning("kafka %s: recreating the producer", err.name())
            self._fatal = err
        return translate(err, endpoint=self._target, message_id=message_id)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            if self._fatal is not None or self._draining:
                return
            log.error("kafka producer fatal error %s: recreating the producer", err.name())
            self._fatal = err
        elif err.code() == KafkaError._ALL_BROKERS_DOWN:
            # librdkafka repeats this on every reconnect round: warn once a while.
            now = time.monotonic()
            if now - self._down_warned_at >= _DOWN_WARN_EVERY_S:
                self._down_warned_at = now
                log.warning("kafka: all brokers down (%s)", self._target)
        else:
            log.info("kafka: %s: %s", err.name(), err.str())

    # --- the poll thread --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() - self._inline_at < _INLINE_GRACE_S:
                # Publishers are serving reports themselves; only the watchdog runs.
                self._stop.wait(_INLINE_GRACE_S)
                if self._fatal is not None:
                    self._recreate()
                self._expire(time.monotonic())
                continue
            try:
                self._producer.poll(_POLL_S)
            except KafkaException as exc:
                # NOTE: confluent-kafka raises a fatal error out of poll() as well as
                # through error_cb.
                self._on_error(exc.args[0])
            except Exception:  # a callback bug must not stop delivery reports
                log.exception("kafka poll failed")
            if self._fatal is not None:
                self._recreate()
            self._expire(time.monotonic())

    def _recreate(self) -> None:
        old = self._producer
        self._fatal = None
        try:
            self._producer = self._new_producer()
        except MsgsafeError:
            log.exception("kafka producer could not be recreated")
            return
        self.recreated += 1
        # Everything the old producer held fails transiently (queued: Refused, in flight:
        # ConnectionLost) and goes to the outbox; the watchdog catches any report that
        # never comes.
        self._draining = True
        try:
            old.purge(in_queue=True, in_flight=True, blocking=False)
            old.poll(0)
            old.flush(0)
        except (KafkaException, RuntimeError):
            log.debug("purging the failed producer", exc_info=True)
        finally:
            self._draining = False

    def _expire(self, now: float) -> None:
        batches = self._batches
        while batches:
            reports = batches[0]
            if not reports.finished:
                if reports.deadline > now:
                    break
                reports.abandon(
                    ConfirmTimeout(
                        f"no delivery report within confirm_timeout={self._timeout}s",
                        endpoint=self._target,
                    )
                )
            batches.popleft()
        watch = self._watch
        pending = self._open
        while watch:
            report = watch[0]
            if report in pending:
                if report.deadline > now:
                    return
                try:
                    pending.remove(report)
                except KeyError:
                    pass  # its delivery report came in just now
                else:
                    call_logged(
                        report.callback,
                        ConfirmTimeout(
                            f"no delivery report within confirm_timeout={self._timeout}s",
                            endpoint=self._target,
                            message_id=report.message_id,
                        ),
                    )
            watch.popleft()

    # --- lifecycle --------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for outstanding delivery reports, then fail the rest
        with :class:`ConnectionLost` and release the producer. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._thread.join()
        producer = self._producer
        wait = self._timeout if timeout is None else max(0.0, timeout)
        try:
            left = producer.flush(wait)
            if left:
                self._closing = True
                producer.purge(in_queue=True, in_flight=True, blocking=False)
                producer.poll(0)
        except (KafkaException, RuntimeError):
            log.debug("closing the kafka producer", exc_info=True)
        self._closing = True
        while self._batches:
            self._batches.popleft().abandon(
                ConnectionLost(
                    "transport closed before the broker confirmed", endpoint=self._target
                )
            )
        while self._watch:
            report = self._watch.popleft()
            try:
                self._open.remove(report)
            except KeyError:
                continue
            call_logged(
                report.callback,
                ConnectionLost(
                    "transport closed before the broker confirmed",
                    endpoint=self._target,
                    message_id=report.message_id,
                ),
            )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"KafkaTransport({self._target!r}, {state})"

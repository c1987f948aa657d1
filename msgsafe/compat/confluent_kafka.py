"""``confluent_kafka`` with msgsafe's :class:`Producer`; every other name is the original.

``from msgsafe.compat.confluent_kafka import Producer`` (or ``from msgsafe.compat import
confluent_kafka``) in place of the confluent-kafka import is the whole migration.
How librdkafka settings translate is in :mod:`msgsafe.compat._kafka_config`.

The producer keeps the same constructor, ``produce`` / ``poll`` / ``flush`` / ``len()``
and callback rules: delivery callbacks run on the thread that calls
:meth:`Producer.poll` or :meth:`Producer.flush`, as ``on_delivery(err, msg)``. What
changes:

- every message is published with ``acks=all`` and idempotence (weaker settings are
  overridden with a :class:`~msgsafe.compat.CompatWarning`);
- a message the brokers cannot take in time goes to msgsafe's durable outbox and is
  forwarded later instead of failing with ``_MSG_TIMED_OUT``. Its callback gets
  ``err=None`` and a message whose ``offset()`` is ``OFFSET_INVALID`` (-1001),
  ``stored()`` is True and whose headers carry ``("msgsafe-status", b"stored")``;
- a permanent failure reaches the callback as a ``KafkaError`` (never a silent loss).

Messages go to the wrapper's own librdkafka client while nothing fails (the fast path,
:mod:`._kafka_fast`), else through msgsafe's Producer (:mod:`._kafka_queue`),
per-key order kept. ``SerializingProducer`` is this producer with confluent-kafka's
serializers in front (:mod:`._confluent_serializing`). ``docs/migration.md`` lists
every difference. Other names of
``confluent_kafka`` (``KafkaError``, ``Consumer``, ``admin`` ...) are re-exported as is.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from msgsafe.errors import MissingExtra

try:
    from confluent_kafka import (
        OFFSET_BEGINNING,
        OFFSET_END,
        OFFSET_STORED,
        TIMESTAMP_CREATE_TIME,
        TIMESTAMP_LOG_APPEND_TIME,
        TIMESTAMP_NOT_AVAILABLE,
        Consumer,
        KafkaError,
        KafkaException,
        Message,
        TopicPartition,
        admin,
        libversion,
        version,
    )
    from confluent_kafka import Producer as _Librdkafka
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("kafka", "confluent-kafka") from exc

from msgsafe.adapters.kafka.client import BY_KEY, NOW, message_headers
from msgsafe.compat._common import ClosesOnExit, warn
from msgsafe.compat._kafka_config import (
    DeliveryCallback,
    check_with_librdkafka,
    merged_config,
    options_for,
    translate_config,
)
from msgsafe.compat._kafka_fast import FastReport, KafkaFastPath
from msgsafe.compat._kafka_queue import (
    FLUSH_SLICE_S,
    Parked,
    SafeReports,
    as_bytes,
    error_listener,
    purged,
)
from msgsafe.compat._kafka_report import (
    OFFSET_INVALID,
    PARTITION_UA,
    STATUS_HEADER,
    DeliveredMessage,
    RecordHeaders,
    check_batch,
    kafka_error,
    record_headers,
)
from msgsafe.errors import (
    ConfigurationError,
    MsgsafeError,
    TransientError,
    UnsafeDestination,
)
from msgsafe.message import MESSAGE_ID_HEADER, new_message_id
from msgsafe.producer import Producer as _SafeProducer

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "PARTITION_UA",
    "STATUS_HEADER",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "AIOProducer",
    "Consumer",
    "DeliveredMessage",
    "DeserializingConsumer",
    "KafkaError",
    "KafkaException",
    "Message",
    "Producer",
    "SerializingProducer",
    "TopicPartition",
    "admin",
    "kafka_error",
    "libversion",
    "version",
]


#: What a closed producer's methods raise, in confluent-kafka's words.
_CLOSED = "Producer has been closed"


def _close_quietly(
    producer: _SafeProducer | None, fast: KafkaFastPath | None, timeout: float
) -> None:
    # Sends in flight get ``timeout`` to be confirmed, then are stored; what is stored
    # stays in the outbox for the next run. librdkafka's handles and the threads are
    # released here.
    if fast is not None:
        with contextlib.suppress(Exception):
            fast.close(timeout)
    if producer is not None:
        with contextlib.suppress(MsgsafeError):
            producer.close(timeout)


def _release(producer: _SafeProducer | None, fast: KafkaFastPath | None, timeout: float) -> None:
    """The finalizer of a producer nobody closed: what it holds goes to be confirmed or
    stored, and its threads and librdkafka handles are released, as the real client
    frees a dropped producer at once (confluent-kafka's tests drop hundreds; each
    handle takes one of the process's ~1,000 thread-local keys).

    NOTE: it runs wherever the last reference went, or wherever the garbage collector
    ran: maybe inside a callback served by this very producer's rk, or on one of its own
    threads, which cannot be joined from themselves. So the closing is handed to
    :class:`_Releases`' threads, which hold nothing of it. While the interpreter exits
    (the main thread has stopped: a thread started now might never finish) it closes
    here, with the full ``timeout``, as :meth:`Producer.close` would."""
    if not threading.main_thread().is_alive() or not _RELEASES.hand(producer, fast):
        _close_quietly(producer, fast, timeout)


class _Releases:
    """Closes dropped producers on a few threads of its own (at most ``workers``, started
    when a producer is dropped and ended once idle), so that any number of drops keeps
    the process's thread count bounded.

    A dropped producer's messages in flight get ``grace`` seconds from the drop to be
    confirmed (librdkafka goes on sending them meanwhile), then are stored: the graces
    of producers dropped together run at the same time, not one after another, so the
    closing keeps up with producers dropped in a loop while the brokers refuse.

    After each run of closings the garbage is collected: msgsafe's producer and the
    fast paths hold their librdkafka clients in reference cycles, which Python's collector
    would otherwise free only at some later full collection; until then every client
    keeps its threads and its thread-local key. The threads are not daemons: an exiting
    interpreter waits for the closings handed over.

    The real client frees a dropped producer before the dropping line returns, so a
    loop that makes and drops producers never holds more than one. Here the closing
    comes later; on a slow or loaded machine a loop could outrun it by hundreds of
    producers (thousands of threads), so :meth:`make_room` holds up the making of a new
    producer while more than ``backlog`` dropped ones wait to be closed."""

    def __init__(self, workers: int, grace: float, backlog: int) -> None:
        self._workers = workers
        self._grace = grace
        self._backlog = backlog
        # NOTE: reentrant: a collection inside hand() (it allocates) may run another
        # dropped producer's finalizer on the same thread.
        self._lock = threading.RLock()
        #: Notified whenever a closing ends (see make_room).
        self._closed = threading.Condition(self._lock)
        #: (producer, its fast path, monotonic() when its grace ends), in drop order.
        self._queue: deque[tuple[_SafeProducer | None, KafkaFastPath | None, float]] = deque()
        self._running = 0
        self._closing = 0  #: closings taken from the queue and not yet ended

    def make_room(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until no more than ``backlog`` dropped
        producers are queued or being closed. Never on a release thread (it would wait
        for itself); after the timeout the caller goes on regardless, as a slow closing
        must not stop the application."""
        if threading.current_thread().name == _RELEASE_THREAD:
            return
        with self._closed:
            self._closed.wait_for(
                lambda: len(self._queue) + self._closing <= self._backlog, timeout
            )

    def hand(self, producer: _SafeProducer | None, fast: KafkaFastPath | None) -> bool:
        """Queue the closing of a dropped producer; False if no thread can take it."""
        with self._lock:
            self._queue.append((producer, fast, time.monotonic() + self._grace))
            if self._running >= min(self._workers, len(self._queue)):
                return True
            self._running += 1
            try:
                threading.Thread(target=self._work, name=_RELEASE_THREAD, daemon=False).start()
            except RuntimeError:  # interpreter shutdown: no new thread
                self._running -= 1
                self._queue.pop()
                return False
        return True

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._running -= 1
                    return
                producer, fast, until = self._queue.popleft()
                self._closing += 1
            try:
                _close_quietly(producer, fast, max(0.0, until - time.monotonic()))
                del producer, fast  # this frame's references: the cycles become garbage
                if not self._queue:
                    gc.collect()
            finally:
                with self._closed:
                    self._closing -= 1
                    self._closed.notify_all()


#: Seconds from the drop a dropped producer's messages in flight get to be confirmed
#: before they are stored (a closed one's get close()'s timeout). Brokers that answer
#: confirm within milliseconds; longer would keep more dropped producers' threads alive
#: at a time (producers dropped in a loop come by the dozen a second), and a message
#: stored after all may have been written: forwarded, it is a duplicate of a known id.
_DROPPED_GRACE_S = 0.1
#: The name of _Releases' threads.
_RELEASE_THREAD = "msgsafe-compat-release"
#: Dropped producers that may wait to be closed before a new one waits for them: each
#: keeps its librdkafka threads (about 8 a broker) until closed.
_DROPPED_BACKLOG = 8
#: The longest a new producer waits for dropped ones to be closed.
_ROOM_WAIT_S = 30.0
#: Where dropped producers are closed (see _release).
_RELEASES = _Releases(workers=4, grace=_DROPPED_GRACE_S, backlog=_DROPPED_BACKLOG)


class Producer(ClosesOnExit, SafeReports):
    """A ``confluent_kafka.Producer`` that confirms with ``acks=all`` or stores in the outbox.

    ``Producer(config)``, ``Producer(**config)`` or both (keywords win), as
    confluent-kafka takes them; ``default.topic.config`` is merged in. See
    :func:`translate_config` for the mapping; ``msgsafe.outbox`` selects the outbox
    (default the user's data directory). A bad setting raises ``KafkaException`` with
    ``_INVALID_ARG``. Without ``bootstrap.servers`` the producer is made (as librdkafka
    does) and every message fails with ``_MSG_TIMED_OUT``. ``_url`` replaces the broker
    URL (tests point it at ``memory://``). Thread-safe like the original: ``produce``,
    ``poll`` and ``flush`` from any threads; callbacks run in ``poll``/``flush``.
    """

    def __init__(
        self,
        config: Mapping[str, object] | None = None,
        /,
        *,
        _url: str | None = None,
        **settings: object,
    ):
        merged = merged_config(config, settings)
        # NOTE: confluent-kafka hands default.topic.config to librdkafka last, as the
        # default topic configuration: its settings win over the same top-level ones
        # (confluent-kafka's test_topic_config_update).
        for given in (config, settings):
            topic_config = given.get("default.topic.config") if given is not None else None
            if isinstance(topic_config, Mapping):
                merged.update(topic_config)
        # NOTE: librdkafka's own log lines go to ``logger`` (confluent-kafka's setting);
        # without brokers its statistics go to ``stats_cb`` too (see _idle below).
        logger = merged.pop("logger", None)
        brokerless = merged.get("bootstrap.servers", merged.get("metadata.broker.list")) in (
            None,
            "",
        )
        idle_callbacks = {
            name: merged.pop(name)
            for name in ("stats_cb", "throttle_cb")
            if brokerless and callable(merged.get(name))
        }
        # Dropped producers still being closed hold their threads: a loop that makes and
        # drops producers waits here for them, as it would for the real client's drop.
        _RELEASES.make_room(_ROOM_WAIT_S)
        try:
            translated = translate_config(merged)
            check_with_librdkafka(translated.options.get("librdkafka"))
            for note in translated.warnings:
                warn(note)
            target = _url or translated.url
            producer = None
            if target:
                options = options_for(target, translated)
                # A dropped producer's release thread may be closing the same outbox file
                # this moment: SqliteOutbox.shared waits for it to let the file go.
                producer = _SafeProducer(
                    target, outbox=translated.outbox, require=translated.require, **options
                )
        except ConfigurationError as exc:
            raise KafkaException(kafka_error(exc)) from exc
        SafeReports.__init__(self, translated, producer)
        self._on_delivery = translated.on_delivery
        listener = None
        if translated.error_cb is not None:
            listener = error_listener(self._errors, self._reports)
        self._fast: KafkaFastPath | None = None
        #: Without brokers: librdkafka's client as confluent-kafka makes it, connecting
        #: nowhere; poll()/flush() serve its log lines, statistics and error events.
        self._idle: Any = None
        if producer is None and (logger is not None or idle_callbacks or translated.error_cb):
            idle: dict[str, Any] = dict(translated.options.get("librdkafka") or {})
            idle.update(idle_callbacks)
            if logger is not None:
                idle["logger"] = logger
            if translated.error_cb is not None:
                idle["error_cb"] = translated.error_cb
            self._idle = _Librdkafka(idle)
        if producer is not None and _url is None:
            try:
                self._fast = KafkaFastPath(
                    producer,
                    target,
                    options,
                    producer.outbox,
                    self._lock,
                    listener,
                    logger,
                    # Rows of an earlier run: not to be overtaken.
                    resting=producer.pending() > 0,
                )
            except BaseException:
                producer.close(0)
                raise
        elif listener is not None and producer is not None:
            # NOTE: the transport's librdkafka client sees the same connection events
            # as confluent-kafka's would; error_cb gets them from poll()/flush(). A
            # transport without them (memory://, in tests) declares so: nothing to hear.
            producer.listen_errors(listener)
        self._safe_sent = 0  #: safe-path produces so far (under _lock; see _maybe_reopen)
        self._next_check = 0.0  #: monotonic() of the next look at reopening the fast path
        self._closed = False
        self._admin: Any = None
        self._warned: set[str] = set()
        self._finalizer = weakref.finalize(
            self, _release, producer, self._fast, self._confirm_timeout
        )

    # --- producing ----------------------------------------------------------------------

    def _checked_for_fast(self, topic: str) -> bool:
        """Whether the fast path may produce to ``topic``: the safe producer's
        destination check (see :mod:`msgsafe.checks.gate`) admitted it, once. A topic
        below ``require=`` raises ``KafkaException(POLICY_VIOLATION)`` before anything
        is queued; one that could not be checked (no broker answers) goes the safe path,
        which stores it and checks before forwarding."""
        producer = self._producer
        if producer is None:
            return True
        # NOTE: on a thread of its own: the check's error may be kept (and raised again)
        # by the destination gate, and its traceback's frames, through their callers,
        # would keep this producer and all its threads alive after it was dropped.
        refused = _CHECKS.submit(_guarantee, producer, topic).result()
        if isinstance(refused, UnsafeDestination):
            raise KafkaException(kafka_error(refused)) from refused
        return refused is None

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = PARTITION_UA,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Mapping[str, object] | Iterable[tuple[str, object]] | None = None,
        callback: DeliveryCallback | None = None,
    ) -> None:
        """Queue one message; its callback runs from a later :meth:`poll` / :meth:`flush`.

        Raises ``BufferError`` when ``queue.buffering.max.messages`` reports wait to be
        served (call ``poll``), ``TypeError`` for bad argument types, ``KafkaException``
        for a message msgsafe refuses before sending (e.g. ``MSG_SIZE_TOO_LARGE``),
        and ``RuntimeError`` after :meth:`close`. An explicit ``partition`` is ignored with a
        warning (msgsafe places messages by key).
        """
        fast = self._fast
        if (
            fast is not None
            and not headers
            and partition == -1
            and not timestamp
            and type(value) is bytes
            and (key is None or type(key) is bytes)
            and type(topic) is str
            and topic in fast.topics
            and len(value) + (0 if key is None else len(key)) <= fast.size_limit
        ):
            # The common message on the fast path (bytes, no headers, a known topic);
            # the rest takes _produce's general path. Its headers: the dict form
            # (message_headers), built inline.
            produced: dict[str, str | bytes | None] = {MESSAGE_ID_HEADER: new_message_id()}
            cb = on_delivery or callback or self._on_delivery
            with self._lock:
                if not fast.resting:
                    fast.seq = seq = fast.seq + 1
                    try:
                        # (topic, value, key, partition, on_delivery, callback, timestamp,
                        # headers): positional, as the client calls it (faster).
                        fast.produce(
                            topic,
                            value,
                            key,
                            BY_KEY,
                            FastReport(fast, cb, seq, produced),
                            None,
                            NOW,
                            produced,
                        )
                        return
                    except KafkaException:
                        pass  # the general path produces it again and handles the error
        self._produce(topic, value, key, partition, on_delivery, timestamp, headers, callback)

    def _produce(
        self,
        topic: str,
        value: str | bytes | None,
        key: str | bytes | None,
        partition: int,
        on_delivery: DeliveryCallback | None,
        timestamp: int,
        headers: Mapping[str, object] | Iterable[tuple[str, object]] | None,
        callback: DeliveryCallback | None,
    ) -> None:
        """:meth:`produce`, every case: the checks, then the fast or the safe path."""
        if self._closed:  # _check_open, inlined: this runs for every message
            raise RuntimeError(_CLOSED)
        if partition not in (PARTITION_UA, None):
            if not isinstance(partition, int):
                raise TypeError(f"partition must be int, not {type(partition).__name__}")
            self._warn_once(
                "partition",
                "produce(partition=...) is ignored: msgsafe places a message by its key "
                "(messages with the same key keep their order)",
            )
        if timestamp:
            self._warn_once(
                "timestamp", "produce(timestamp=...) is ignored; the producer stamps the send time"
            )
        # value=None is a tombstone: the envelope carries the mark, Kafka gets a null value.
        body = value if type(value) is bytes else as_bytes("value", value)
        key_bytes = key if key is None or type(key) is bytes else as_bytes("key", key)
        record: RecordHeaders
        header_map: dict[str, str] | None
        if headers:
            record, header_map = record_headers(headers)
        else:
            record, header_map = [], None
        cb = on_delivery or callback or self._on_delivery
        if type(topic) is str:
            self._check_size(topic, body, key_bytes, record, header_map)
        fast = self._fast
        if (
            fast is not None
            and type(topic) is str
            and (topic in fast.topics or self._checked_for_fast(topic))
            and fast.takes(topic)
        ):
            # The fast path (see _kafka_fast): the client's record headers, the id first.
            produced = message_headers(
                new_message_id(), [h for h in record if h[0] != MESSAGE_ID_HEADER]
            )
            refused: KafkaError | None = None
            with self._lock:
                if not fast.resting:
                    fast.seq = seq = fast.seq + 1
                    # produce(topic, value, key, partition, on_delivery, callback,
                    # timestamp, headers): positional, as the client calls it.
                    try:
                        fast.produce(
                            topic,
                            body,
                            key_bytes,
                            BY_KEY,
                            FastReport(fast, cb, seq, produced),
                            None,
                            NOW,
                            produced,
                        )
                        return
                    except KafkaException as exc:
                        refused = exc.args[0]
                elif fast.switching:
                    if self._unreported >= self._config.queue_max:
                        raise BufferError("Local: Queue full (serve delivery reports with poll())")
                    self._unreported += 1
                    self._safe_sent += 1
                    fast.parked.append((topic, body, key_bytes, record, header_map, cb))
                    return
            if refused is not None and refused.fatal():
                # rk is done for: its messages go to the outbox before this one goes on.
                fast.broke()
                fast.leave(self._send_parked)
        with self._lock:
            if self._unreported >= self._config.queue_max:
                raise BufferError("Local: Queue full (serve delivery reports with poll())")
            self._unreported += 1
            self._safe_sent += 1
        self._send_safe((topic, body, key_bytes, record, header_map, cb))

    def _send_parked(self, item: Parked) -> None:
        # A produce parked during the switch: its errors reach its callback.
        try:
            self._send_safe(item)
        except (KafkaException, MsgsafeError) as exc:
            err = exc.args[0] if isinstance(exc, KafkaException) else kafka_error(exc)
            if self._fast is not None:
                self._fast.fail_local(item, err)

    def produce_batch(
        self,
        topic: str,
        messages: list[dict[str, Any]],
        partition: int = PARTITION_UA,
        on_delivery: DeliveryCallback | None = None,
        callback: DeliveryCallback | None = None,
    ) -> int:
        """``produce`` each of ``messages`` (dicts of ``value``, ``key``, ``headers``,
        ``timestamp``, ``partition``, ``callback`` / ``on_delivery``); returns how many
        were queued. A message that could not be queued gets its error as a
        ``KafkaError`` under ``"_error"``; malformed input raises ``TypeError`` and a
        ``timestamp`` ``NotImplementedError`` before anything is queued, as with
        confluent-kafka."""
        self._check_open()
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, not {type(topic).__name__}")
        if not isinstance(partition, int):
            raise TypeError(f"partition must be int, not {type(partition).__name__}")
        check_batch(messages)
        on_delivery = on_delivery or callback
        queued = 0
        for message in messages:
            try:
                self.produce(
                    topic,
                    message.get("value"),
                    message.get("key"),
                    message.get("partition", partition),
                    message.get("callback", message.get("on_delivery", on_delivery)),
                    message.get("timestamp", 0),
                    message.get("headers"),
                )
            except KafkaException as exc:
                message["_error"] = exc.args[0]
            except (BufferError, TypeError, NotImplementedError, MsgsafeError) as exc:
                message["_error"] = KafkaError(KafkaError._INVALID_ARG, str(exc))
            else:
                queued += 1
        return queued

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warn(message, depth=2)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(_CLOSED)

    # --- delivery reports ---------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> int:
        """Serve delivery callbacks, waiting up to ``timeout`` seconds for the first
        (None or a negative value: until one arrives). Returns how many were served."""
        self._check_open()
        fast = self._fast
        if fast is None:
            if self._idle is not None:
                return self._poll_idle(timeout)
            return self._poll_queue(timeout)
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        wait = 0.0
        while True:
            if not fast.resting and not self._unreported:
                # Only rk has reports to come: wait in librdkafka, as the real client.
                served = self._fast_round(wait)
                served += self._poll_queue(0) if self._errors else 0
            else:
                served = self._fast_round(0)
                served += self._poll_queue(wait)
            if served:
                return served
            left = FLUSH_SLICE_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return 0
            wait = min(left, _FAST_SLICE_S)

    def _poll_idle(self, timeout: float | None) -> int:
        """:meth:`poll` without brokers: the held messages' reports and the idle
        librdkafka client's events (log lines, statistics), whichever come first."""
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            served = self._poll_queue(0)
            left = FLUSH_SLICE_S if deadline is None else deadline - time.monotonic()
            wait = 0.0 if served else max(0.0, min(left, FLUSH_SLICE_S))
            served += int(self._idle.poll(wait))
            if served or left <= 0:
                return served

    def _fast_round(self, timeout: float) -> int:
        """rk's reports (waiting up to ``timeout``), the switch when one failed, the
        callbacks of stored messages, and now and then a look at reopening the fast
        path. Returns the number served."""
        fast = self._fast
        assert fast is not None
        holds = fast.holds
        served = fast.client.producer.poll(timeout) if holds or timeout == 0 else 0
        if fast.wants_switch:
            fast.leave(self._send_parked)
        if fast.ready:
            served += fast.serve_ready()
            self._notify_served()
        if not fast.holds:
            self._maybe_reopen(fast)
        fast.reraise()
        return int(served)

    def _maybe_reopen(self, fast: KafkaFastPath) -> None:
        """Back to the fast path once the safe path holds nothing of this wrapper and the
        outbox is empty (looked at every _BACK_EVERY_S, not per message).

        NOTE: the outbox is asked between two looks under the lock that see no
        unreported message and no new safe-path produce. A stored message is reported
        only after its row was committed, so every row of ours was in the store before
        the first look; ``pending() == 0`` after it means all were forwarded. A produce
        after the reopening goes to rk, and cannot overtake a row of its key."""
        now = time.monotonic()
        if now < self._next_check or not fast.may_reopen(now):
            return
        self._next_check = now + _BACK_EVERY_S
        safe = self._producer
        with self._lock:
            if self._unreported or fast.deferred or safe is None:
                return
            sent = self._safe_sent
        if safe.pending() > 0:
            return
        with self._lock:
            if not self._unreported and not fast.deferred and self._safe_sent == sent:
                fast.down = False  # an outage's events, read while resting
                fast.reopen()

    def flush(self, timeout: float | None = None) -> int:
        """Serve callbacks until every produced message is reported, or ``timeout``.

        Safe while other threads call ``poll``/``flush``/``produce``: a report another
        thread serves counts too. Then, while time is left, give the outbox up to that
        long (at most ``message.timeout.ms`` when no timeout is given) to forward what it
        holds, so a short-lived script leaves nothing behind when the brokers are back.
        Returns the number of messages not yet reported (0 when all are confirmed or
        stored).
        """
        self._check_open()
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        if self._errors:
            self._serve_errors()
        fast = self._fast
        # librdkafka's flush() serves the client's queued events (log lines, error
        # events) even when no message waits: so does this.
        if fast is not None:
            self._fast_round(0)
        elif self._idle is not None:
            self._idle.poll(0)
        while len(self) > 0:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return len(self)
            if fast is not None and len(fast.client.producer):
                # rk sends what lingers now and serves its reports here.
                fast.client.producer.flush(
                    _FAST_SLICE_S if left is None else min(left, _FAST_SLICE_S)
                )
                self._fast_round(0)
                continue
            if self.poll(0) == 0:
                # Another thread may hold the last reports: wait for a report to be
                # served anywhere (or to arrive), never on the queue alone.
                with self._served:
                    self._flushing += 1
                    try:
                        waiting = self._unreported + (0 if fast is None else fast.deferred)
                        if waiting > 0 and self._reports.empty():
                            self._served.wait(min(left or FLUSH_SLICE_S, FLUSH_SLICE_S))
                    finally:
                        self._flushing -= 1
        left = self._confirm_timeout if deadline is None else deadline - time.monotonic()
        if left > 0 and self._producer is not None and self._producer.pending() > 0:
            self._producer.drain(left)
            if fast is not None:
                self._fast_round(0)  # rk's events of the wait, and the reopening
        if self._errors:
            self._serve_errors()
        return len(self)

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """With ``in_queue``, messages still waiting for brokers that were never configured
        fail with ``_PURGE_QUEUE`` (their callbacks run from the next ``poll``/``flush``).
        Nothing else is dropped: a message handed to the brokers is on its way to be
        confirmed or stored, and msgsafe never discards it."""
        self._check_open()
        if in_queue and self._held:
            self._fail_held(None, purged)
        if self._producer is not None:
            self._warn_once("purge", "purge() drops nothing: produced messages stay safe")

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """Use these credentials for the ``list_topics`` client from now on; the
        producing connection keeps the ones it was made with (see the migration notes).
        ``TypeError`` unless both are ``str``, as confluent-kafka."""
        self._check_open()
        for position, value in ((1, username), (2, password)):
            if not isinstance(value, str):
                raise TypeError(f"argument {position} must be str, not {type(value).__name__}")
        self._config.admin["sasl.username"] = username
        self._config.admin["sasl.password"] = password
        if self._admin is not None:
            self._admin.set_sasl_credentials(username, password)
        self._warn_once(
            "sasl", "set_sasl_credentials() applies to list_topics(); producing keeps its login"
        )

    def __len__(self) -> int:
        """Messages produced whose delivery callback has not been served yet (0 once
        closed)."""
        if self._closed:
            return 0
        fast = self._fast
        with self._lock:
            if fast is None:
                return self._unreported
            # NOTE: len(rk) also counts librdkafka's queued error events; while resting
            # rk holds no message, and its events are not messages to report.
            held = len(fast.client.producer) if fast.holds else 0
            return self._unreported + fast.deferred + held

    def __bool__(self) -> bool:  # ``if producer:`` would be False whenever len() is 0
        return True

    # --- pass-through -------------------------------------------------------------------

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """Cluster metadata from a real confluent-kafka client on the same brokers."""
        self._check_open()
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(dict(self._config.admin))
        return self._admin.list_topics(topic=topic, timeout=timeout)

    def cluster_id(self, timeout: float = -1) -> str | None:
        """The cluster's id, from the same metadata client as :meth:`list_topics`."""
        cluster: str | None = self.list_topics(timeout=timeout).cluster_id
        return cluster

    # --- transactions: not wrapped (transactional.id is refused) ---------------------------

    def _no_transactions(self) -> None:
        self._check_open()
        # NOTE: librdkafka's answer for a producer without transactional.id, which every
        # wrapper producer is (the setting is refused at construction).
        raise KafkaException(
            KafkaError(
                KafkaError._NOT_CONFIGURED,
                "The Transactional API requires transactional.id to be configured",
            )
        )

    def init_transactions(self, timeout: float | None = None) -> None:
        """Raises ``KafkaException(_NOT_CONFIGURED)``: see :meth:`_no_transactions`."""
        self._no_transactions()

    def begin_transaction(self) -> None:
        """Raises ``KafkaException(_NOT_CONFIGURED)``."""
        self._no_transactions()

    def send_offsets_to_transaction(
        self, positions: object, group_metadata: object, timeout: float | None = None
    ) -> None:
        """Raises ``KafkaException(_NOT_CONFIGURED)``."""
        self._no_transactions()

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Raises ``KafkaException(_NOT_CONFIGURED)``."""
        self._no_transactions()

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Raises ``KafkaException(_NOT_CONFIGURED)``."""
        self._no_transactions()

    # --- msgsafe additions --------------------------------------------------------------

    def pending(self) -> int:
        """Messages waiting in the outbox to be forwarded."""
        return 0 if self._producer is None else self._producer.pending()

    def close(self, timeout: float = 30.0) -> bool:
        """Flush within ``timeout`` (callbacks served), then stop; what the outbox holds
        stays there for the next producer on the same outbox. Returns True, as
        confluent-kafka; calling it again does nothing."""
        if not self._closed:
            self.flush(timeout)
            with self._lock:
                self._closed = True
                if self._fast is not None:
                    self._fast.shut()  # produce() then takes the path that raises
            self._finalizer.detach()
            _close_quietly(self._producer, self._fast, timeout)
        return True

    @property
    def is_open(self) -> bool:
        """msgsafe addition: False once :meth:`close` ran (``with`` closes on leaving)."""
        return not self._closed

    def __repr__(self) -> str:
        target = self._producer.target if self._producer is not None else "(no brokers)"
        return f"<msgsafe.compat.confluent_kafka.Producer {target}>"

    # NOTE: a subclass whose __init__ does not call this one's (confluent-kafka's
    # test_uninitialized_producer_methods) gets a closed producer: its methods raise
    # RuntimeError("Producer has been closed") and len() is 0, as the real client's do.
    _closed = True
    _fast: KafkaFastPath | None = None
    _producer: _SafeProducer | None = None


#: Where the destination checks of _checked_for_fast run (one thread, made on use).
_CHECKS = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="msgsafe-compat-check")


def _guarantee(producer: _SafeProducer, topic: str) -> MsgsafeError | None:
    """The safe producer's check of ``topic``: None when it is admitted, else the
    refusal (UnsafeDestination) or the failure to check (TransientError)."""
    try:
        producer.guarantee(topic)
    except (UnsafeDestination, TransientError) as exc:
        return exc
    return None


#: Longest single wait in rk (poll, flush) between looks at the switch and the queue.
_FAST_SLICE_S = 0.1
#: Seconds between looks at reopening the fast path.
_BACK_EVERY_S = 0.5

# NOTE: imported last: the asyncio producer is built on Producer above.
from msgsafe.compat._confluent_aio import AIOProducer  # noqa: E402
from msgsafe.compat._confluent_serializing import (  # noqa: E402
    DeserializingConsumer,
    SerializingProducer,
)

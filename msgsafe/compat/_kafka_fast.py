"""The fast path of :mod:`msgsafe.compat.confluent_kafka`: a librdkafka client of its own.

While nothing is wrong, ``Producer.produce`` hands each message straight to the
librdkafka producer ("rk") of the wrapper's own
:class:`~msgsafe.adapters.kafka.client.KafkaClient`: exactly the Kafka adapter's settings for
the same URL and options (``acks=all``, idempotence, ``message.timeout.ms`` inside
``confirm_timeout``, TLS, credentials), its record headers and its error translation.
There is no poll thread: delivery reports are served only by the user's ``poll()`` /
``flush()``, on the caller's thread, as with the real client. Per message that is one
id, one header dict and one :class:`FastReport` (the delivery callable, which is also
the ``msg`` the callback gets), against an envelope, a receipt future, a transport
report and a wrapper report on the safe path (:class:`~msgsafe.Producer`).

:class:`KafkaFastPath` is a :class:`~msgsafe.fastpath.FastPath` (its states are that
class's: fast, switching, resting, held). What makes it keep the wrapper's promise is the
switch (:meth:`KafkaFastPath.leave`): on the first failure the safe Producer would store
(a :class:`~msgsafe.errors.TransientError` with an outbox), or when librdkafka says every
broker is down, new produces leave rk for the safe path, and everything rk still holds
is purged and moved to the outbox, in produce order, before any safe-path send can go
out. The fast path reopens only once the safe path holds no unreported message of the
wrapper and the outbox is empty (the wrapper checks that now and then, not per message).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

from msgsafe.adapters.kafka.client import KafkaClient
from msgsafe.compat._kafka_queue import Parked
from msgsafe.compat._kafka_report import (
    STATUS_HEADER,
    DeliveredMessage,
    RecordHeaders,
    kafka_error,
    record_headers,
)
from msgsafe.errors import TransientError
from msgsafe.fastpath import FastPath, store_refused
from msgsafe.message import MESSAGE_ID_HEADER, Envelope, Status
from msgsafe.ports import OutboxStore, SafePath

__all__ = ["FastReport", "KafkaFastPath"]

log = logging.getLogger("msgsafe.compat")

#: Seconds the wrapper's close gives rk to report what it purged.
_CLOSE_DRAIN_S = 5.0
#: Seconds more it waits when rk still holds purged messages after that (see close()).
_CLOSE_PURGED_WAIT_S = 60.0
#: Seconds after librdkafka's last "all brokers down" during which the path stays resting.
_DOWN_HOLD_S = 2.0
#: Topics the fast path remembers as checked (a set that does not grow without bound).
_TOPICS_MAX = 1024

_CONFIRMED = Status.CONFIRMED.value.encode()
_FAILED = b"failed"


class FastReport:
    """One message in rk: its delivery callable, and the ``msg`` its callback receives.

    One slotted object per message serves both (a ``functools.partial`` for the
    callable plus a wrapper for the message measured more). As ``msg`` it offers what
    :class:`~msgsafe.compat.confluent_kafka.DeliveredMessage` offers, from the real
    ``confluent_kafka.Message`` of the delivery report: ``partition()`` and
    ``offset()`` are where the broker put it.
    """

    __slots__ = ("_callback", "_error", "_fast", "_headers", "_msg", "seq")

    def __init__(self, fast: KafkaFastPath, callback: Any, seq: int, headers: Any) -> None:
        self._fast = fast
        self._callback = callback
        self.seq = seq
        #: As produced: ``{id header: id}`` (a dict of str is not tracked by the cyclic
        #: GC, a list is), or with the user's headers a list, the id header first.
        self._headers = headers
        self._msg: Any = None
        self._error: KafkaError | None = None

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        # librdkafka's delivery report, on the thread in rk.poll()/flush().
        self._msg = msg
        if err is None:
            callback = self._callback
            if callback is not None:
                try:
                    callback(None, self)
                except BaseException as exc:  # raised from poll()/flush() after rk returns
                    self._fast.raised.append(exc)
            return
        self._fast.failed_report(self, err)

    # --- what confluent_kafka.Message offers ---------------------------------------------

    def topic(self) -> str:
        return str(self._msg.topic())

    def value(self) -> bytes | None:
        return self._msg.value()  # type: ignore[no-any-return]

    def key(self) -> bytes | None:
        return self._msg.key()  # type: ignore[no-any-return]

    def headers(self) -> list[tuple[str, bytes | None]]:
        """The produced headers plus ``msgsafe-id`` and ``msgsafe-status`` (made on
        request: most callbacks never look)."""
        status = _CONFIRMED if self._error is None else _FAILED
        return [
            *self.user_headers(),
            (MESSAGE_ID_HEADER, self.message_id().encode()),
            (STATUS_HEADER, status),
        ]

    def user_headers(self) -> RecordHeaders:
        """The headers the user produced (without the id header)."""
        produced = self._headers
        return [] if type(produced) is dict else list(produced[1:])

    def partition(self) -> int:
        return self._msg.partition()  # type: ignore[no-any-return]

    def offset(self) -> int:
        return self._msg.offset()  # type: ignore[no-any-return]

    def error(self) -> KafkaError | None:
        return self._error

    def timestamp(self) -> tuple[int, int]:
        return self._msg.timestamp()  # type: ignore[no-any-return]

    def latency(self) -> float | None:
        return self._msg.latency()  # type: ignore[no-any-return]

    def leader_epoch(self) -> int | None:
        return self._msg.leader_epoch()  # type: ignore[no-any-return]

    def message_id(self) -> str:
        """The msgsafe id (UUIDv7) the message carries in its ``msgsafe-id`` header."""
        produced = self._headers
        return str(produced[MESSAGE_ID_HEADER] if type(produced) is dict else produced[0][1])

    def stored(self) -> bool:
        """False: a message of the fast path is confirmed or failed (a stored one's
        callback gets a ``DeliveredMessage``)."""
        return False

    def len(self) -> int:
        return len(self._msg.value() or b"")

    def __len__(self) -> int:
        return len(self._msg.value() or b"")

    def __repr__(self) -> str:
        status = "confirmed" if self._error is None else "failed"
        return f"DeliveredMessage(id={self.message_id()!r}, {status}, fast)"


class KafkaFastPath(FastPath):
    """The wrapper's fast path: its librdkafka client, the failures it reported, and the
    switch to the safe path (the states are :class:`~msgsafe.fastpath.FastPath`'s).

    ``lock`` is the wrapper's own lock: the wrapper reads :attr:`resting` and calls
    :attr:`produce` under it, so that no message enters rk once the switch began. This
    holds no reference to the wrapper (the wrapper's finalizer closes it).
    """

    def __init__(
        self,
        safe: SafePath,
        url: str,
        options: dict[str, Any],
        store: OutboxStore | None,
        lock: threading.Lock,
        on_error: Callable[[KafkaError], None] | None,
        logger: object | None = None,
        *,
        resting: bool = False,
    ) -> None:
        FastPath.__init__(self, safe, resting=resting)
        #: The client, never renewed here: after a fatal error the path stays resting.
        #: ``logger`` (confluent-kafka's setting) gets librdkafka's lines of the client.
        self.client = KafkaClient.for_url(url, options, on_error=self._on_error, logger=logger)
        #: rk's ``produce``, called positionally (see msgsafe.adapters.kafka.client.BY_KEY).
        self.produce = self.client.producer.produce
        self.target = self.client.target
        self.size_limit = self.client.size_limit
        self.store = store
        self.lock = lock
        self.seq = 0  #: produce order of the messages handed to rk (under lock)
        #: Messages rk reported failed that the outbox takes, not served yet.
        self.failures: list[FastReport] = []
        #: Messages out of rk whose callback is not served yet (failures, ready).
        self.deferred = 0
        #: (callback, err, msg) to serve from poll()/flush(): stored or failed messages.
        self.ready: deque[tuple[Any, KafkaError | None, Any]] = deque()
        #: Exceptions of user callbacks run inside rk.poll(), raised once it returned.
        self.raised: deque[BaseException] = deque()
        self.parked: list[Parked] = []
        #: Topics produce() sends to without looking at them again (see takes()).
        self.topics: set[str] = set()
        self.down = False  #: set by librdkafka's error events: switch at the next poll
        self.switches = 0  #: times the fast path was left (for tests and logs)
        self._listener = on_error

    # --- inside rk.poll(): record, never switch here ---------------------------------------

    def _on_error(self, err: KafkaError) -> None:
        # rk's error_cb (through the client), on the thread in rk.poll()/flush().
        if self.store is not None and (err.fatal() or err.code() == KafkaError._ALL_BROKERS_DOWN):
            # A fatal error: rk is done for, the path never reopens.
            self.hold(None if err.fatal() else _DOWN_HOLD_S)
            self.failed()
        if self._listener is not None:
            self._listener(err)

    def failed_report(self, report: FastReport, err: KafkaError) -> None:
        """A failed delivery report: kept for the outbox when the safe Producer would
        store it (served after the switch), otherwise its callback gets the
        ``KafkaError`` the safe path gives."""
        error = self.client.error(err, report.message_id())
        if self.store is not None and isinstance(error, TransientError):
            if err.fatal():
                self.hold(None)
            with self.lock:
                self.failures.append(report)
                self.deferred += 1
            return
        report._error = kafka_error(error)
        callback = report._callback
        if callback is not None:
            try:
                callback(report._error, report)
            except BaseException as exc:
                self.raised.append(exc)

    def failed(self) -> None:
        """The fast path failed: rk may hold messages, so it does not rest at once; the
        wrapper's next look (:attr:`wants_switch`) leaves it (:meth:`leave`)."""
        self.down = True

    def broke(self) -> None:
        """rk refused a produce with a fatal error: the path never reopens, and the next
        look leaves it."""
        self.hold(None)
        self.failed()

    # --- on the caller's thread, after rk.poll() returned -----------------------------------

    def takes(self, topic: str) -> bool:
        """Whether ``topic`` is one the fast path produces to as it is (a non-empty ASCII
        name: others take the safe path, which checks them as it always did); one
        that is goes to :attr:`topics`, which produce() looks up first."""
        if topic in self.topics:
            return True
        if not topic or not topic.isascii():
            return False
        if len(self.topics) < _TOPICS_MAX:
            self.topics.add(topic)
        return True

    @property
    def wants_switch(self) -> bool:
        return not self.resting and (bool(self.failures) or self.down)

    def leave(self, send_parked: Callable[[Parked], None]) -> None:
        """Leave the fast path: move every message rk holds to the outbox, then send what
        was produced meanwhile on the safe path (``send_parked``, in produce order).

        Per-key order, step by step:

        1. :meth:`~msgsafe.fastpath.FastPath.switch` under the wrapper's lock (resting
           and switching). ``rk.produce`` only runs under that lock after reading
           ``resting`` False, so from here on no message enters rk; new produces are
           parked (never blocked: a callback that produces, run by another thread's
           rk.poll() while rk is drained here, must not wait for the drain it is part
           of).
        2. ``purge(in_queue, in_flight)`` and polling until rk holds nothing: every
           message of rk is now confirmed or in :attr:`failures`. librdkafka counts a
           message until its delivery callback returned, so ``len(rk) == 0`` also means
           no other thread is still inside a callback that appends to it. A purged
           in-flight message may have been written: storing it may duplicate it (a
           known id), never lose it.
        3. The failures, sorted by produce sequence, go to the outbox in one put. For
           one key that is its produce order: within a partition librdkafka fails or
           purges a message together with every later one of the partition, so no
           later message of a stored key was confirmed.
        4. The parked produces go to the safe Producer in order, then
           :meth:`~msgsafe.fastpath.FastPath.switched` (under the lock, once nothing is
           parked). A safe-path send of a key with rows in the outbox queues behind
           them (``Producer._submit`` asks the store's ``has_key``), so nothing
           overtakes a stored message of its key.
        """
        with self.lock:
            if not self.switch():
                return
            self.switches += 1
        log.info("kafka wrapper to %s: switching to the outbox path", self.target)
        self.client.purge()
        self.client.drain(None)
        self._store_failures()
        while True:
            with self.lock:
                parked, self.parked = self.parked, []
                if not parked:
                    self.switched()
                    self.down = False
                    return
            for item in parked:
                send_parked(item)

    def _store_failures(self) -> None:
        """Put the failed messages in the outbox, in produce order
        (:func:`msgsafe.fastpath.store_refused`), and queue their callbacks: stored, or
        the error the wrapper maps from OutboxError."""
        with self.lock:
            failures, self.failures = self.failures, []
        if not failures:
            return
        failures.sort(key=_seq)
        stored = [(report, _envelope(report)) for report in failures]
        # A store's own error too: the callback gets it as _FS.
        error = store_refused(self.store, [envelope for _, envelope in stored])
        for report, envelope in stored:
            kerr = None if error is None else kafka_error(error)
            msg = DeliveredMessage(
                topic=envelope.destination,
                value=None if envelope.tombstone else envelope.body,
                key=envelope.key,
                headers=report.user_headers(),
                message_id=envelope.message_id,
                status=Status.STORED if error is None else None,
                error=kerr,
            )
            self.ready.append((report._callback, kerr, msg))

    def fail_local(self, item: Parked, err: KafkaError) -> None:
        """A produce parked during the switch that the safe path refused: its callback
        gets ``err`` from the next poll()/flush()."""
        topic, body, key_bytes, record, _, callback = item
        msg = DeliveredMessage(
            topic=topic,
            value=body,
            key=key_bytes,
            headers=record,
            message_id="",
            status=None,
            error=err,
        )
        with self.lock:
            self.deferred += 1
        self.ready.append((callback, err, msg))

    def serve_ready(self) -> int:
        """Run the queued callbacks of stored / failed messages; what a callback raises
        propagates (that one counts as served). Returns how many were served."""
        served = 0
        ready = self.ready
        try:
            while ready:
                try:
                    callback, err, msg = ready.popleft()
                except IndexError:  # another thread took the last one
                    break
                served += 1
                if callback is not None:
                    callback(err, msg)
        finally:
            if served:
                with self.lock:
                    self.deferred -= served
        return served

    def reraise(self) -> None:
        """Raise the first exception a callback raised inside rk.poll() (as the real
        client raises it from poll()/flush())."""
        if self.raised:
            try:
                exc = self.raised.popleft()
            except IndexError:  # another thread raised it
                return
            raise exc

    def close(self, timeout: float) -> None:
        """At close or collection: give rk ``timeout`` to deliver, then move what it
        still holds (and what failed unserved) to the outbox; no callbacks run."""
        client = self.client
        if len(client):
            client.drain(max(0.0, timeout))
            if len(client) and self.store is not None:
                client.purge()
                # NOTE: a purged client reports every message it held, but on a loaded
                # machine (hundreds of dropped producers closing at once) that can take
                # longer than _CLOSE_DRAIN_S; a message still held when the client is
                # released would be neither confirmed nor stored, so wait on, bounded.
                if client.drain(_CLOSE_DRAIN_S):
                    client.drain(_CLOSE_PURGED_WAIT_S)
            if len(client):
                log.error(
                    "kafka wrapper to %s closed with %d messages still in librdkafka: "
                    "neither confirmed nor stored",
                    self.target,
                    len(client),
                )
        self.raised.clear()
        self._store_failures()
        # At close no callback runs: messages the outbox refused are said here.
        refused = [(msg, err) for _, err, msg in self.ready if err is not None]
        if refused:
            log.error(
                "kafka wrapper to %s: %d messages not stored at close (%s), e.g. %s",
                self.target,
                len(refused),
                refused[0][1],
                [msg for msg, _ in refused[:3]],
            )
        self.ready.clear()


def _seq(report: FastReport) -> int:
    return report.seq


def _envelope(report: FastReport) -> Envelope:
    """The envelope of a failed message, as the safe path would have stored it: same
    id, value (None: a tombstone), key and record headers."""
    msg = report._msg
    user = report.user_headers()
    header_map = record_headers(user)[1] if user else None
    return Envelope.build(
        msg.topic(),
        msg.value(),
        key=msg.key(),
        headers=header_map or None,
        message_id=report.message_id(),
    )

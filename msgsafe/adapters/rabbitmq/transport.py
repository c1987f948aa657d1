"""Publishing: persistent, ``mandatory`` messages with pipelined publisher confirms.

:class:`RabbitTransport` is the caller side and the channel's life. Callers hand each
envelope (an ``SendItem``) or each run of a batch that fits the window (a ``BatchPart``) over
through ``incoming`` and wait on futures, callbacks or batch reports; the window
(``max_in_flight``) is counted here, under one condition. On the I/O thread, the
transport reacts to the channel (ready, lost, closed by the broker, blocked) and to
time (deadlines, the ``connect_timeout`` of an unreachable cluster), declares queues on
first use, and says when to flush.

The class was split in three where its parts have separate rules:

- the confirm ledger (:mod:`~msgsafe.adapters.rabbitmq._confirms`): what is pending and
  in flight, delivery tags, and settling every message exactly once (ack, nack,
  ``basic.return``, deadline), requeueing in tag order when a channel goes;
- the frame sender (:class:`~msgsafe.adapters.rabbitmq._confirms.FrameSender`): pending
  messages encoded (:mod:`~msgsafe.adapters.rabbitmq._wire`) and written to the
  connection, one call per flush, and put in flight on the ledger;
- this module: what callers see, and what the I/O thread does when the link changes.

Every item's deadline is its call time + ``confirm_timeout``. When the connection is
lost, everything in flight goes back to the front of ``pending`` and is resent, same
``message_id``, on the next host.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

import pika
from pika.channel import Channel
from pika.spec import Basic

from msgsafe.adapters._config import oversized, size_error
from msgsafe.adapters._reports import PUBLISH_CALLBACK, call_logged, report_failed
from msgsafe.adapters.rabbitmq._confirms import (
    BatchJob,
    BatchPart,
    ConfirmLedger,
    FrameSender,
    SendItem,
    fail_all,
    unroutable,
)
from msgsafe.adapters.rabbitmq._connection import IoThread, Link, log
from msgsafe.adapters.rabbitmq._errors import (
    channel_close_error,
    describe,
    frame_error,
    header_bytes,
    lost_error,
)
from msgsafe.adapters.rabbitmq._side import (
    ANSWER_KEEP_S,
    LOST,
    OK,
    QueueState,
    QueueStates,
    declare_failed_softly,
    node_down,
    run_declarations,
)
from msgsafe.adapters.rabbitmq._wire import fast_confirms, read_once
from msgsafe.adapters.rabbitmq.config import Destination, RabbitOptions, parse_destination
from msgsafe.adapters.rabbitmq.declarations import DECLARE_HEADER, decode, queues_of
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    ConfirmTimeout,
    ConnectError,
    ConnectionLost,
    InvalidMessage,
    MsgsafeError,
    Refused,
    Rejected,
)
from msgsafe.message import AMQP_PROPERTIES_HEADER, Batch, Envelope
from msgsafe.ports import BatchReport, PublishCallback, PublishFuture, TransportCapabilities

__all__ = ["RabbitTransport"]


def _report_one(report: BatchReport, index: int, error: MsgsafeError | None) -> None:
    """Message ``index`` of a batch sent on the per-message path: its outcome to ``report``."""
    if error is None:
        report.confirmed(1)
    else:
        report.failed(index, error)


_TICK_S = 0.1

#: reply code of a channel this side closed on purpose
_REPLY_SUCCESS = 200


@dataclass(slots=True)
class _Declare:
    queue: str
    done: bool = False
    running: bool = False
    error: MsgsafeError | None = None


@dataclass(slots=True)
class _Carried:
    """The declarations one set of messages carries (their DECLARE_HEADER value)."""

    done: bool = False
    running: bool = False
    #: Why they failed (a queue's node is down), until ``failed_until``.
    error: MsgsafeError | None = None
    failed_until: float = 0.0


#: Declaration sets remembered per transport (beyond: forgotten, declared again).
_MAX_CARRIED = 1000


class RabbitTransport:
    """A :class:`~msgsafe.ports.Transport` over pika's ``SelectConnection``; also a
    :class:`~msgsafe.ports.CallbackTransport` and a :class:`~msgsafe.ports.BatchTransport`.

    Contract, beyond the Protocol's: messages are persistent and ``mandatory``; the
    future resolves only on the broker's ``basic.ack`` with no ``basic.return`` before
    it. A message carrying declarations (``DECLARE_HEADER``, see
    :mod:`~msgsafe.adapters.rabbitmq.declarations`) is published after they were declared, on
    a side channel, once per set. A returned message fails with ``Unroutable`` when its
    queue does not exist (or none is bound) and with ``Refused`` (transient: kept and
    sent again) when its queue exists but its node is down; the broker is asked which
    (:mod:`~msgsafe.adapters.rabbitmq._side`). ``Unroutable`` and ``MessageTooLarge``,
    ``AuthenticationError`` and ``Rejected`` are permanent; ``Refused`` (nack, blocked
    connection, full window, a queue's node down), ``ConfirmTimeout``, ``ConnectionLost``
    and ``ConnectError`` are transient. An envelope whose connection
    drops is resent on the next host with the same ``message_id`` while its deadline
    allows. With no host reachable for ``connect_timeout`` the waiting futures fail with
    ``ConnectError`` (or ``ConnectionLost`` when a copy was already sent). All of this
    holds per message for ``publish_callback`` and ``publish_batch``.
    """

    #: publish_callback and publish_batch (see msgsafe.ports). No tombstones: an AMQP
    #: 0-9-1 body is bytes. ordered_rounds: everything goes out on one channel in the
    #: order it is handed over, across calls, and a lost channel's messages are sent
    #: again in delivery-tag order before anything handed over later. A nack or a
    #: ``basic.return`` fails one message while those behind it may be confirmed; the
    #: forwarder allows for that: it only claims its next round while a round is
    #: answered, publishes it once every answer of that round is in, and releases it
    #: unsent when one of them failed (msgsafe.outbox.forwarder).
    capabilities = TransportCapabilities(callback=True, batch=True, ordered_rounds=True)

    def __init__(self, url: BrokerUrl, options: RabbitOptions) -> None:
        if url.protocol != "rabbitmq":
            raise ConfigurationError(f"not an AMQP 0-9-1 URL: {url.scheme}://")
        self._url = url
        self._options = options
        self._target = url.redacted()
        self._size_limit = options.size_limit
        self._destinations: dict[str, Destination] = {}
        # Caller side: the window and the hand-over queue.
        # Entered as the lock itself on the hot paths (a C call; the condition's own
        # __enter__ is a Python frame more per send and per confirm).
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._outstanding = 0
        self._waiters = 0
        self._low_water = options.max_in_flight // 2
        self._batching = False
        self._unreleased = 0
        self._closed = False
        self._incoming: collections.deque[SendItem | BatchPart] = collections.deque()
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        # I/O-thread side.
        self._ledger = ConfirmLedger(self._settled, self._classify_return)
        self._sender = FrameSender(self._ledger, self._may_send)
        self._declares: dict[str, _Declare] = {}
        self._carried: dict[str, _Carried] = {}
        self._queues = QueueStates()
        #: Counts connections: a side channel's answer from an earlier one is ignored.
        self._generation = 0
        self._channel: Channel | None = None
        self._blocked = False
        self._recycling = False
        self._down_since: float | None = time.monotonic()
        self._fatal: MsgsafeError | None = None
        self._frame_max = options.frame_max
        self._stopped = threading.Event()
        self._io = IoThread(f"msgsafe-rabbitmq-publish {self._target}")
        self._link = Link(
            url,
            options,
            self._io.loop,
            on_ready=self._ready,
            on_lost=self._lost,
            on_fatal=self._fatal_error,
            on_channel_closed=self._channel_closed,
            on_blocked=self._set_blocked,
            on_closed=self._link_closed,
            on_down=self._fail_unreachable,
        )
        self._io.call(self._start)

    # --- caller side ----------------------------------------------------------------------

    @property
    def target(self) -> str:
        """The redacted URL (no credentials)."""
        return self._target

    @property
    def options(self) -> RabbitOptions:
        return self._options

    def publish(self, envelope: Envelope) -> Future[None]:
        """Send ``envelope``; the future resolves when the broker confirmed it.

        Waits (at most ``confirm_timeout``) while ``max_in_flight`` envelopes are
        outstanding; then the future fails with ``Refused``.
        """
        future = PublishFuture()
        # NOTE: a message on the wire cannot be taken back; the future is not cancellable.
        future.set_running_or_notify_cancel()
        self.publish_callback(envelope, future)
        return future

    def publish_callback(self, envelope: Envelope, callback: PublishCallback) -> None:
        """Send ``envelope``; ``callback`` learns the outcome once (``None``: confirmed),
        on this thread for an error found before sending, else on the I/O thread.
        Everything else as :meth:`publish`."""
        mid = envelope.message_id
        try:
            dest = self._destination(envelope.destination)
        except ConfigurationError as exc:
            call_logged(log, PUBLISH_CALLBACK, callback, exc)
            return
        error = self._check_size(envelope)
        if error is not None:
            call_logged(log, PUBLISH_CALLBACK, callback, error)
            return
        now = time.monotonic()
        timeout = self._options.confirm_timeout
        with self._lock:
            if self._closed:
                error = ClosedError("transport is closed", endpoint=self._target)
            elif self._outstanding >= self._options.max_in_flight and not self._wait_for_room(
                timeout
            ):
                error = Refused(
                    f"{self._options.max_in_flight} messages in flight for {timeout} s",
                    endpoint=self._target,
                    message_id=mid,
                )
            elif self._closed:
                error = ClosedError("transport is closed", endpoint=self._target)
            else:
                self._outstanding += 1
        if error is not None:
            call_logged(log, PUBLISH_CALLBACK, callback, error)
            return
        self._incoming.append(SendItem(envelope, dest, callback, now + timeout, now))
        self._wake()

    def publish_batch(self, batch: Batch, report: BatchReport) -> None:
        """Send every message of ``batch``; ``report`` learns each outcome once.

        The batch goes through the window in parts: each takes the room there is (or,
        with the window full, waits at most ``confirm_timeout`` for half of it) and
        crosses to the I/O thread as one item. A message too large fails alone; when
        no room comes within ``confirm_timeout`` the rest fail with ``Refused``.
        """
        if not len(batch):
            return
        if AMQP_PROPERTIES_HEADER in batch.headers or DECLARE_HEADER in batch.headers:
            # NOTE: a pika or Celery publisher's properties (msgsafe.compat) are its
            # message's own, published whole with the id in them (carried_properties);
            # a batch's frame template would send them as a text header instead. The
            # outbox forwards such messages in runs: each takes the per-message path.
            for index in range(len(batch)):
                self.publish_callback(batch.envelope(index), partial(_report_one, report, index))
            return
        try:
            dest = self._destination(batch.destination)
        except ConfigurationError as exc:
            fail_all(report, range(len(batch)), exc, batch.message_ids)
            return
        good = self._batch_sendable(batch, report)
        job = BatchJob(batch, dest, report)
        timeout = self._options.confirm_timeout
        window = self._options.max_in_flight
        total = len(good)
        sent = 0
        while sent < total:
            now = time.monotonic()
            with self._lock:
                want = min(total - sent, self._low_water or 1)
                if not self._closed and window - self._outstanding < want:
                    self._waiters += 1
                    try:
                        room = self._cond.wait_for(partial(self._has_room, want), timeout)
                    finally:
                        self._waiters -= 1
                    if not room:
                        rest = good[sent:]
                        fail_all(
                            report,
                            rest,
                            Refused(
                                f"{window} messages in flight for {timeout} s",
                                endpoint=self._target,
                            ),
                            batch.message_ids,
                        )
                        return
                if self._closed:
                    fail_all(
                        report,
                        good[sent:],
                        ClosedError("transport is closed", endpoint=self._target),
                        batch.message_ids,
                    )
                    return
                take = min(total - sent, window - self._outstanding)
                self._outstanding += take
            self._incoming.append(BatchPart(job, good[sent : sent + take], now + timeout))
            sent += take
            self._wake()

    def _has_room(self, want: int) -> bool:
        # Called with self._lock held.
        return self._options.max_in_flight - self._outstanding >= want or self._closed

    def _batch_sendable(self, batch: Batch, report: BatchReport) -> Sequence[int]:
        """Indexes of the messages of ``batch`` that may be sent; the others are reported
        failed with ``MessageTooLarge`` here."""
        count = len(batch)
        failed: dict[int, MsgsafeError] = dict(oversized(batch, self._size_limit, self._target))
        ids, keys = batch.message_ids, batch.keys
        longest_key = 0 if keys is None else max(len(k or b"") for k in keys)
        frame_max = self._frame_max
        most = header_bytes(max(map(len, ids)), longest_key, batch.headers)
        if frame_error(most, frame_max, endpoint=self._target, message_id=None):
            for index in range(count):
                key = None if keys is None else keys[index]
                size = header_bytes(len(ids[index]), len(key or b""), batch.headers)
                error = frame_error(size, frame_max, endpoint=self._target, message_id=ids[index])
                if error is not None and index not in failed:
                    failed[index] = error
        if not failed:
            return range(count)
        for index in sorted(failed):
            report_failed(report, index, failed[index])
        return [index for index in range(count) if index not in failed]

    def _wait_for_room(self, timeout: float) -> bool:
        # Called with self._lock held.
        self._waiters += 1
        try:
            return self._cond.wait_for(
                lambda: self._outstanding < self._options.max_in_flight or self._closed, timeout
            )
        finally:
            self._waiters -= 1

    def close(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for outstanding confirms, fail the rest with
        ``ConnectionLost``, disconnect and stop the I/O thread. Idempotent."""
        with self._lock:
            already = self._closed
            self._closed = True
            self._cond.notify_all()
            if not already:
                self._cond.wait_for(lambda: self._outstanding == 0, timeout)
        if self._io.in_thread():
            self._shutdown()
            return
        if self._io.call(self._shutdown):
            self._stopped.wait(max(5.0, self._options.connect_timeout))
        self._io.stop()

    def __enter__(self) -> RabbitTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close(self._options.confirm_timeout)

    def __repr__(self) -> str:
        return f"RabbitTransport({self._target!r})"

    def _destination(self, name: str) -> Destination:
        dest = self._destinations.get(name)
        if dest is None:
            dest = parse_destination(name)
            if len(self._destinations) < 10_000:
                self._destinations[name] = dest
        return dest

    def _check_size(self, envelope: Envelope) -> MsgsafeError | None:
        error = size_error(envelope, self._size_limit, self._target)
        if error is None:
            size = header_bytes(
                len(envelope.message_id), len(envelope.key or b""), envelope.headers
            )
            error = frame_error(
                size, self._frame_max, endpoint=self._target, message_id=envelope.message_id
            )
        return error

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        if not self._io.call(self._on_wake):
            self._drain_after_stop()

    def _drain_after_stop(self) -> None:
        while self._incoming:
            entry = self._incoming.popleft()
            self._ledger.fail(entry, ClosedError("transport is closed", endpoint=self._target))

    # --- I/O thread -----------------------------------------------------------------------

    def _start(self) -> None:
        self._link.start()
        self._io.loop.call_later(_TICK_S, self._tick)

    def _on_wake(self) -> None:
        with self._wake_lock:
            self._wake_pending = False
        self._flush()

    def _settled(self, count: int) -> None:
        if self._batching:
            self._unreleased += count
        else:
            self._release(count)

    def _release(self, count: int) -> None:
        """Give ``count`` window slots back.

        Publishers blocked on a full window are woken only once it is half empty: they
        then refill it in one go instead of trading the GIL with this thread per message.
        """
        if count <= 0:
            return
        with self._lock:
            self._outstanding -= count
            # NOTE: close() waits for 0 once _closed is set; nobody else waits for 0.
            if (self._waiters and self._outstanding <= self._low_water) or (
                self._closed and self._outstanding == 0
            ):
                self._cond.notify_all()

    def _fail_unreachable(self) -> None:
        """Every host failed its latest attempt: what waits fails now with ConnectError
        (the outbox is the faster home) instead of waiting out ``connect_timeout``."""
        ledger = self._ledger
        while self._incoming:
            ledger.pending.append(self._incoming.popleft())
        if ledger.pending and self._channel is None and self._link.all_failed:
            endpoint = self._link.endpoint
            ledger.expire_pending(
                time.monotonic(), True, partial(self._waiting_error, True, endpoint)
            )

    def _flush(self) -> None:
        ledger = self._ledger
        while self._incoming:
            ledger.pending.append(self._incoming.popleft())
        if self._channel is None and self._link.all_failed:
            self._fail_unreachable()
            return
        channel = self._channel
        if channel is None:
            if self._fatal is not None:
                while ledger.pending:
                    ledger.fail(ledger.pending.popleft(), self._fatal)
            return
        if self._blocked:
            return
        self._sender.flush(channel)

    def _may_send(
        self, channel: Channel, dest: Destination, entry: SendItem | BatchPart
    ) -> bool | MsgsafeError:
        """False while ``dest``'s queue (``declare=`` set) or the declarations ``entry``
        carries are being declared; the error of declarations that failed."""
        if isinstance(entry, SendItem):
            carried = entry.envelope.headers.get(DECLARE_HEADER)
            if carried is not None:
                verdict = self._declare_carried(channel, carried)
                if verdict is not True:
                    return verdict
        if self._options.declare is None or dest.queue is None:
            return True
        state = self._declares.get(dest.queue)
        if state is not None and state.done:
            return True
        self._declare(channel, dest.queue)
        return False  # NOTE: later items wait too, so per-key order holds

    def _declare(self, channel: Channel, queue: str) -> None:
        state = self._declares.setdefault(queue, _Declare(queue))
        if state.running:
            return
        state.running = True
        args = {"x-queue-type": self._options.declare}

        def done(_frame: Any) -> None:
            state.running = False
            state.done = True
            self._flush()

        channel.queue_declare(queue, durable=True, arguments=args, callback=done)

    def _declare_carried(self, channel: Channel, text: str) -> bool | MsgsafeError:
        """Whether the messages carrying declarations ``text`` may go: True once they
        were declared on this transport, False while they are being declared (started
        here), the error of a failure within the last second."""
        state = self._carried.get(text)
        if state is None:
            if len(self._carried) >= _MAX_CARRIED:
                self._carried = {k: v for k, v in self._carried.items() if v.running}
            state = self._carried[text] = _Carried()
        if state.done:
            return True
        if state.running:
            return False
        if state.error is not None and time.monotonic() < state.failed_until:
            return state.error
        try:
            declarations = decode(text)
        except InvalidMessage as exc:
            return exc
        state.running = True
        generation = self._generation
        endpoint = self._link.endpoint

        def done(code: int, reply: str) -> None:
            if generation != self._generation:
                return  # another connection: declared again on it
            state.running = False
            if code == OK:
                state.done, state.error = True, None
                for queue in queues_of(declarations):
                    self._queues.forget(queue)
            elif code == LOST:
                pass  # the connection went; pending messages wait for the next one
            elif node_down(code, reply):
                # NOTE: RabbitMQ answers a declare or bind of a classic queue whose home
                # node is down with 404 "home node ... is down or inaccessible": the
                # queue exists and comes back with its node. Transient.
                state.error = Refused(
                    f"declaring for this message failed: {reply}; kept and sent again "
                    "once the node is back",
                    endpoint=endpoint,
                )
                state.failed_until = time.monotonic() + ANSWER_KEEP_S
            else:
                # An entity that exists with other arguments (kombu's declare would
                # fail too), or a refusal: publish anyway, the broker's answer to the
                # message itself decides.
                log_at = log.warning if not declare_failed_softly(code) else log.info
                log_at("declaring %s: %s %s; publishing without it", declarations, code, reply)
                state.done = True
            self._flush()

        run_declarations(channel.connection, declarations, done)
        return False

    def _classify_return(
        self,
        destination: str,
        headers: Mapping[str, str],
        endpoint: str,
        message_id: str,
        settle: Callable[[MsgsafeError], None],
    ) -> None:
        """What a returned message fails with (see the class docstring): ``settle`` is
        called once the broker said whether its queue exists and runs."""
        dest = self._destination(destination)
        queues: tuple[str, ...] = ()
        if dest.queue is not None:
            queues = (dest.queue,)
        elif DECLARE_HEADER in headers:
            try:
                queues = queues_of(decode(headers[DECLARE_HEADER]))
            except InvalidMessage:
                queues = ()
        channel = self._channel
        if not queues:
            settle(unroutable(destination, endpoint, message_id))
            return
        if channel is None:
            settle(
                Refused(
                    f"returned by the broker (basic.return) for {destination!r}; the "
                    "connection went before it said why: kept and sent again",
                    endpoint=endpoint,
                    message_id=message_id,
                )
            )
            return
        answers: dict[str, tuple[QueueState, str]] = {}

        def answered(queue: str, state: QueueState, text: str) -> None:
            answers[queue] = (state, text)
            if len(answers) == len(queues):
                settle(
                    _return_error(
                        destination, dest.queue is not None, answers, endpoint, message_id
                    )
                )

        for queue in queues:
            self._queues.ask(channel.connection, queue, partial(answered, queue))

    def _ready(self, channel: Channel) -> None:
        self._generation += 1
        self._queues.reset()
        for carried in self._carried.values():
            carried.running = False
        self._channel = channel
        self._recycling = False
        self._ledger.new_channel()
        self._fatal = None
        self._down_since = None
        self._frame_max = min(self._options.frame_max, channel.connection.params.frame_max)
        for state in self._declares.values():
            state.running = False
        channel.add_on_return_callback(self._on_return)
        # Confirms straight from the frame reader (pika's callbacks when that cannot be),
        # one read of the socket per readable event.
        fast_confirms(channel, self._confirmed)
        read_once(channel.connection)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._confirming)

    def _confirming(self, _frame: Any) -> None:
        self._flush()

    def _on_return(
        self,
        _channel: Channel,
        method: Basic.Return,
        properties: pika.BasicProperties,
        _body: bytes,
    ) -> None:
        if properties.message_id:
            self._ledger.returned_message(properties.message_id)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        self._confirmed(method.delivery_tag, bool(method.multiple), isinstance(method, Basic.Nack))

    def _confirmed(self, tag: int, multiple: bool, nack: bool) -> None:
        """A ``basic.ack`` (``nack``: ``basic.nack``) for ``tag`` (``multiple``: and every
        tag before it)."""
        ledger = self._ledger
        # The endpoint names the broker in errors only: a nack, or an unroutable message.
        endpoint = self._link.endpoint if nack or ledger.returned else ""
        self._batching = True
        try:
            nacked = ledger.confirm(tag, multiple, nack, endpoint)
        finally:
            self._batching = False
            count, self._unreleased = self._unreleased, 0
            self._release(count)
        if nacked:
            self._recycle_channel()
        if self._ledger.pending or self._incoming:
            self._flush()

    def _recycle_channel(self) -> None:
        """Close the channel after a nack; the link opens a fresh one and the messages in
        flight on the old one are resent.

        NOTE: RabbitMQ 3.10 keeps nacking every publish on a channel whose quorum queue
        leader died, even after a new leader was elected; a new channel finds the leader.
        """
        channel = self._channel
        if channel is None or self._recycling or not channel.is_open:
            return
        self._recycling = True
        self._channel = None
        try:
            channel.close()
        except Exception as exc:
            log.debug("closing a nacking channel: %s", describe(exc))

    def _lost(self, reason: BaseException | None) -> None:
        self._generation += 1
        self._queues.reset()
        for carried in self._carried.values():
            carried.running = False
        self._channel = None
        self._down_since = time.monotonic()
        self._blocked = False
        self._ledger.requeue_in_flight()
        err = channel_close_error(
            getattr(reason, "reply_code", 0), getattr(reason, "reply_text", ""), self._link.endpoint
        )
        self._ledger.fail_culprits(*err)

    def _channel_closed(self, code: int, text: str) -> None:
        self._channel = None
        self._ledger.requeue_in_flight()
        error, exchange, size = channel_close_error(code, text, self._link.endpoint)
        for state in self._declares.values():
            if state.running and code != _REPLY_SUCCESS:
                state.running = False
                state.error = error or Rejected(
                    f"declaring queue {state.queue!r} failed: {code} {text}",
                    condition=text.split(" ", 1)[0] or str(code),
                    endpoint=self._link.endpoint,
                )
                self._ledger.fail_where(state.error, queue=state.queue)
                self._declares.pop(state.queue, None)
                return
        self._ledger.fail_culprits(error, exchange, size)

    def _fatal_error(self, error: MsgsafeError) -> None:
        self._fatal = error
        self._flush()

    def _set_blocked(self, blocked: bool) -> None:
        self._blocked = blocked
        if not blocked:
            self._flush()

    def _tick(self) -> None:
        if self._stopped.is_set():
            return
        now = time.monotonic()
        endpoint = self._link.endpoint
        ledger = self._ledger
        timeout = self._options.confirm_timeout
        ledger.expire_in_flight(
            now, ConfirmTimeout(f"no confirm within {timeout} s", endpoint=endpoint)
        )
        while self._incoming:
            ledger.pending.append(self._incoming.popleft())
        if ledger.pending:
            down = self._down_since
            connect_limit = self._options.connect_timeout
            # NOTE: once no host answered for connect_timeout, new envelopes fail at
            # the next tick instead of waiting again: the outbox is the faster home.
            unreachable = self._channel is None and down is not None and now - down >= connect_limit
            ledger.expire_pending(
                now, unreachable, partial(self._waiting_error, unreachable, endpoint)
            )
        self._io.loop.call_later(_TICK_S, self._tick)
        if ledger.pending and self._channel is not None:
            self._flush()

    def _waiting_error(self, unreachable: bool, endpoint: str, attempts: int) -> MsgsafeError:
        if self._fatal is not None:
            return self._fatal
        if attempts:
            return ConnectionLost(
                "connection lost before the confirm and no host took the resend in time",
                endpoint=endpoint,
            )
        if self._blocked:
            return Refused("the broker blocked the connection (resource alarm)", endpoint=endpoint)
        if unreachable or self._channel is None:
            cause = self._link.last_failure
            return ConnectError(
                f"no broker reachable ({cause})"
                if cause
                else f"no broker reachable within {self._options.connect_timeout} s",
                endpoint=self._target,
            )
        return ConfirmTimeout(
            f"not sent within {self._options.confirm_timeout} s", endpoint=endpoint
        )

    def _shutdown(self) -> None:
        ledger = self._ledger
        self._queues.reset()  # returned messages waiting for an answer: kept (transient)
        while self._incoming:
            ledger.pending.append(self._incoming.popleft())
        ledger.requeue_in_flight()
        for entry in list(ledger.pending):
            # NOTE: transient on purpose, also for never-sent envelopes: the layer above
            # stores them in the outbox instead of handing them back to the caller.
            ledger.fail(entry, lost_error(None, self._link.endpoint))
        ledger.pending.clear()
        self._channel = None
        self._link.close()

    def _link_closed(self) -> None:
        self._stopped.set()


def _return_error(
    destination: str,
    by_queue: bool,
    answers: Mapping[str, tuple[QueueState, str]],
    endpoint: str,
    message_id: str,
) -> MsgsafeError:
    """The error of a message returned for ``destination``, from what the broker answered
    about its queues (``by_queue``: the destination names the queue itself)."""
    for queue, (state, text) in answers.items():
        if state == "down":
            node = node_down(404, text) or "?"
            return Refused(
                f"queue {queue!r} exists but its home node {node} is down or inaccessible "
                "(basic.return, NO_ROUTE): kept and sent again once the node is back",
                endpoint=endpoint,
                message_id=message_id,
            )
    states = {state for state, _text in answers.values()}
    if states == {"missing"}:
        names = ", ".join(repr(q) for q in answers)
        return unroutable(destination, endpoint, message_id, why=f"no such queue {names}")
    if "unknown" in states or (by_queue and "exists" in states):
        # The broker did not say, or the queue runs again (its node came back since):
        # nothing says the message cannot be routed, so it is kept.
        return Refused(
            f"returned by the broker (basic.return) for {destination!r}; its queue "
            f"{'could not be asked' if 'unknown' in states else 'runs again'}: kept and "
            "sent again",
            endpoint=endpoint,
            message_id=message_id,
        )
    return unroutable(destination, endpoint, message_id)

"""The producer's fast path on Kafka: single sends straight into librdkafka while
nothing is wrong (:class:`msgsafe.ports.FastSender`).

On the safe way a single send is a receipt future, a transport report with its
watchdog entry, the settlement's per-key counts (a lock when it is handed over, another
when its report comes) and the flush count. Here it is one :class:`FastSend` — the
receipt future and librdkafka's delivery callable at once — handed to the same
librdkafka producer the transport's ``publish_callback`` and ``publish_batch`` use (so
single sends and batches of one key keep their order), under one lock, with a
confirmation that resolves it and counts it, nothing else.

That is safe only while nothing can fail into the outbox behind a message of the same
key: the per-key counts exist for that case. So the fast path leaves at the first sign of it
(:meth:`KafkaFastSender._leave`), as the confluent-kafka drop-in's fast path does. The
states are :class:`~msgsafe.fastpath.FastPath`'s, which this is:

1. :meth:`~msgsafe.fastpath.FastPath.switch` under the fast path's lock; every produce
   runs under that lock after reading ``resting`` False, so no message enters librdkafka
   for the fast path from here on, and
   new sends are parked (:meth:`KafkaFastSender.park`: the producer hands them over);
2. after a failure (or a lost broker, or a report overdue at ``confirm_timeout``)
   librdkafka's queue and what it has in flight are purged (an in-flight message may
   have been written: storing it may duplicate it, with its id, never lose it);
   without one (:meth:`KafkaFastSender.leave`) what it holds is left to be answered;
3. on the fast path's own thread, reports are served until every message the fast path handed
   over has one (bounded: one that never comes is stored as possibly delivered);
4. the failed messages go to the outbox in send order in one put. Within a partition
   librdkafka's idempotent producer fails or purges a message together with every later
   one of the partition, so no later message of a stored key was confirmed;
5. the parked sends go to the producer's safe way in order (``host.replay``), where a
   key with rows in the outbox queues behind them; then
   :meth:`~msgsafe.fastpath.FastPath.switched`: resting.

The producer reopens the fast path (:meth:`KafkaFastSender.reopen`) once its own bookkeeping has
nothing unsettled and the outbox is empty.
"""

from __future__ import annotations

import logging
import threading
import time
from _thread import RLock
from collections import deque
from collections.abc import Mapping
from concurrent.futures import InvalidStateError
from concurrent.futures._base import FINISHED, PENDING
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Message

from msgsafe._futures import LightFuture
from msgsafe.adapters._config import size_error
from msgsafe.adapters.kafka._wire import user_headers
from msgsafe.adapters.kafka.client import BY_KEY, ID_HEADER, NOW, Headers, message_headers
from msgsafe.errors import (
    ClosedError,
    ConfirmTimeout,
    MsgsafeError,
    Refused,
    TransientError,
)
from msgsafe.fastpath import FastPath
from msgsafe.message import (
    Envelope,
    Guarantee,
    Receipt,
    Status,
    new_envelope,
    new_receipt,
)
from msgsafe.ports import FastPathHost

if TYPE_CHECKING:
    from msgsafe.adapters.kafka._connection import ProducerLink

__all__ = ["KafkaFastSender", "FastSend"]

log = logging.getLogger("msgsafe.kafka")

_monotonic = time.monotonic
_FINISHED = FINISHED
_PENDING = PENDING
_CONFIRMED = Status.CONFIRMED
_STORED = Status.STORED
_UNKNOWN = Guarantee.UNKNOWN
_NO_HEADERS: Mapping[str, str] = {}

#: The fast path serves delivery reports on the sending thread every 256 sends (as the
#: transport's publish_callback does): no GIL ping-pong with the poll thread.
_INLINE_EVERY_MASK = 255
#: Seconds a send waits, at most, for room in librdkafka's full queue, as a share of
#: confirm_timeout (the transport's own bound).
_ROOM_WAIT_SHARE = 0.25
_ROOM_POLL_S = 0.01
#: Seconds of each flush() while the fast path waits for its reports.
_FLUSH_SLICE_S = 0.01
#: Seconds the leaving fast path serves reports, at most, after a purge (librdkafka answers
#: purged messages at once; a report that never comes is stored as possibly delivered).
_PURGED_DRAIN_S = 5.0


class FastSend(LightFuture[Receipt]):
    """One single send on the fast path: its receipt future, and librdkafka's delivery
    callable for it (one slotted object for both: the cyclic GC walks every container
    object while messages are in flight).

    For the same reason it holds no lock and no receipt of its own: its state is
    guarded by the fast path's :attr:`KafkaFastSender.send_mutex` (one ``RLock`` for all its
    sends), and its :class:`~msgsafe.message.Receipt` is made from its fields when asked
    for (``result()``, a callback's, ``asyncio.wrap_future``'s): each call returns an
    equal receipt, not the same object."""

    __slots__ = (
        "born",
        "fast",
        "guarantee",
        "headers",
        "key",
        "message_id",
        "seq",
        "status",
        "topic",
        "value",
    )

    def __init__(
        self,
        fast: KafkaFastSender,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Mapping[str, str] | None,
        message_id: str,
        born: float,
    ) -> None:
        # LightFuture.__init__, inlined: one frame fewer for every message.
        self._mutex = fast.send_mutex
        self._state = PENDING
        self.fast = fast
        self.topic = topic
        self.value = value
        self.key = key
        self.headers = headers
        self.message_id = message_id
        #: time.monotonic() when it was handed over (the watchdog's clock).
        self.born = born
        #: Its place among the fast path's sends (0: never handed to librdkafka).
        self.seq = 0

    @property
    def _result(self) -> Receipt | None:
        # What the stock Future's result() and repr() read once FINISHED.
        if self._state is not _FINISHED or self._exception is not None:
            return None
        return self._receipt()

    @_result.setter
    def _result(self, receipt: Receipt | None) -> None:
        # LightFuture.set_result, with the fast path's own receipt of this send (STORED):
        # kept as its parts, the id and destination being this send's.
        if receipt is None or receipt.message_id != self.message_id:
            raise ValueError(f"not a receipt of message {self.message_id}: {receipt!r}")
        self.status = receipt.status
        self.guarantee = receipt.guarantee

    def result(self, timeout: float | None = None) -> Receipt:
        if self._state is _FINISHED and self._exception is None:
            return self._receipt()
        return super().result(timeout)

    def _receipt(self) -> Receipt:
        # The outbox's guarantee on a STORED receipt only (see Receipt.store_guarantee).
        status = self.status
        kept = self.fast.store_guarantee if status is _STORED else None
        return new_receipt(self.message_id, status, self.topic, self.guarantee, kept)

    def cancel(self) -> bool:
        """Always False: the message is on its way (see ``Producer.send_async``)."""
        return False

    def __call__(self, err: KafkaError | None, _msg: Message) -> None:
        # librdkafka's delivery report, where reports are served (the poll thread, a
        # sender, the fast path's own thread); must never raise into librdkafka.
        fast = self.fast
        if err is None:
            guarantee = fast.guarantees.get(self.topic, _UNKNOWN)
            # LightFuture.set_result, inlined (one message, two frames fewer): the state
            # under the future's lock, then whoever waits and the callbacks.
            with self._mutex:
                if self._state is not _PENDING:
                    return  # stored by the fast path after its drain's bound: a known duplicate
                self.status = _CONFIRMED
                self.guarantee = guarantee
                self._state = _FINISHED
                if self._made_waiters or self._made_condition is not None:
                    self._wake_waiters()
            if self._made_callbacks:
                self._run_callbacks()
            fast.count_confirmed()
            return
        fast.failed_send(self, err)

    def envelope(self) -> Envelope:
        """The envelope the safe way would have stored: same id, value (None: a
        tombstone), key and headers."""
        age = _monotonic() - self.born
        value = self.value
        return new_envelope(
            self.topic,
            b"" if value is None else value,
            self.message_id,
            self.key,
            time.time() - age,
            self.headers or _NO_HEADERS,
            value is None,
        )


def _seq(send: FastSend) -> int:
    return send.seq


class KafkaFastSender(FastPath):
    """The Kafka transport's :class:`msgsafe.ports.FastSender` (see the module docstring),
    a :class:`~msgsafe.fastpath.FastPath` whose owner, the producer's settlement, decides
    when it reopens.

    ``lock`` orders every produce with the state: a send reads ``resting`` False and
    produces under it. :attr:`failures` and :attr:`parked` are changed under it too. What is
    settled is read from the sends themselves (:attr:`watch`): a report counts nothing.
    """

    def __init__(self, link: ProducerLink, host: FastPathHost, *, timeout: float, size_limit: int):
        FastPath.__init__(self, None)
        self.link = link
        self.host = host
        #: Whether the producer has an outbox for what the fast path cannot deliver.
        self.stores = host.stores
        self.guarantees = host.guarantees
        self.store_guarantee = host.store_guarantee
        self.count_confirmed = host.count_confirmed
        self.timeout = timeout
        self.size_limit = size_limit
        self.target = link.target
        self.lock = threading.Lock()
        #: The lock of every FastSend's state (each one's LightFuture._mutex): one, not
        #: one per message, which the cyclic GC would walk while it is in flight. Re-entrant:
        #: concurrent.futures.wait() holds the locks of all the futures it waits for.
        self.send_mutex = RLock()
        #: Set by shut(): sends raise ClosedError (the path rests for good, too).
        self.closed = False
        #: The link's KafkaClient (fixed; its producer is renewed after a fatal error).
        self._kafka = link.client
        #: Sends handed to librdkafka so far (each one's seq), under lock.
        self.sent = 0
        #: Handed-over sends that failed into the outbox, kept for the leave (under lock).
        self.failures: list[FastSend] = []
        #: What the producer parked while switching, for host.replay (under lock).
        self.parked: list[object] = []
        #: Handed-over sends in send order, until the watchdog sees them settled.
        self.watch: deque[FastSend] = deque()
        #: Whether the leave in progress (or the next) purges librdkafka first.
        self._purge = False
        #: Set while the fast path is not leaving.
        self._settled = threading.Event()
        self._settled.set()
        #: Times the fast path left (for tests and logs).
        self.leaves = 0

    # --- the producer's side ------------------------------------------------------------------

    def send(
        self,
        destination: str,
        body: bytes | None,
        key: bytes | None,
        headers: Mapping[str, str] | None,
        message_id: str,
        now: float,
    ) -> FastSend | None:
        """Hand one message to librdkafka; its receipt future, or None when the fast path
        rests (now). A message librdkafka refuses for good (too large, bad
        input) comes back as a future failed with that error. ``now``: the caller's
        ``time.monotonic()``."""
        link = self.link
        size = 0 if body is None else len(body)
        if key is not None:
            size += len(key)
        if headers or size > self.size_limit:
            envelope = new_envelope(
                destination, body or b"", message_id, key, 0.0, headers or _NO_HEADERS
            )
            too_large = size_error(envelope, self.size_limit, self.target)
            if too_large is not None:
                return self._refused(destination, body, key, headers, message_id, too_large)
        # ProducerLink.down, read with the caller's clock (no second clock read).
        if link.mismatch is not None or now < link.down_until:
            # Every broker is down (or speaks another protocol): not at message.timeout.ms.
            if not self.stores:
                return self._refused(
                    destination,
                    body,
                    key,
                    headers,
                    message_id,
                    link.unreachable(message_id, destination),
                )
            self._leave(purge=True)
            return None
        record: Headers = (
            {ID_HEADER: message_id}
            if not headers
            else message_headers(message_id, user_headers(headers))
        )
        send = FastSend(self, destination, body, key, headers, message_id, now)
        refused: Exception | None = None
        with self.lock:
            if self.resting:
                if self.closed:
                    raise ClosedError("producer is closed", message_id=message_id)
                return None
            try:
                self._kafka.producer.produce(
                    destination, body, key, BY_KEY, send, None, NOW, record
                )
            except (BufferError, KafkaException, TypeError, ValueError) as exc:
                refused = exc
            else:
                self.sent = seq = self.sent + 1
                send.seq = seq
                self.watch.append(send)
        if refused is not None:
            return self._produce_refused(send, record, refused)
        if not seq & _INLINE_EVERY_MASK:
            link.inline_at = now
            link.serve(0)
        return send

    def _produce_refused(
        self, send: FastSend, record: Headers, refused: Exception
    ) -> FastSend | None:
        """What becomes of a send librdkafka's produce() refused with ``refused``."""
        link = self.link
        if isinstance(refused, BufferError):
            # The local queue is full: serve reports (that makes room), bounded.
            deadline = _monotonic() + self.timeout * _ROOM_WAIT_SHARE
            while _monotonic() < deadline:
                link.serve(_ROOM_POLL_S)
                with self.lock:
                    if self.resting:
                        if self.closed:
                            raise ClosedError("producer is closed", message_id=send.message_id)
                        return None
                    try:
                        link.client.producer.produce(
                            send.topic, send.value, send.key, BY_KEY, send, None, NOW, record
                        )
                    except BufferError:
                        continue
                    except (KafkaException, TypeError, ValueError) as exc:
                        refused = exc
                        break
                    self.sent = send.seq = self.sent + 1
                    self.watch.append(send)
                    return send
            else:
                refused = Refused(
                    "local producer queue full (max_in_flight reached)",
                    endpoint=self.target,
                    message_id=send.message_id,
                )
        error = (
            refused
            if isinstance(refused, MsgsafeError)
            else link.produce_error(refused, send.message_id)
        )
        if isinstance(error, TransientError) and self.stores:
            # The safe way takes it to the outbox, behind what the fast path holds.
            self._leave(purge=not isinstance(error, Refused))
            return None
        return self._refused(send.topic, send.value, send.key, send.headers, send.message_id, error)

    def _refused(
        self,
        destination: str,
        body: bytes | None,
        key: bytes | None,
        headers: Mapping[str, str] | None,
        message_id: str,
        error: MsgsafeError,
    ) -> FastSend:
        """A receipt future failed with ``error`` for a message never handed over."""
        send = FastSend(self, destination, body, key, headers, message_id, _monotonic())
        send.set_exception(error)
        self.host.count_outcomes(1, error)
        return send

    def park(self, item: object) -> bool:
        """Keep ``item`` for host.replay while the fast path leaves; False otherwise.
        Raises ``ClosedError`` after :meth:`shut` (nothing new is replayed then)."""
        with self.lock:
            if self.closed:
                raise ClosedError("producer is closed")
            if not self.switching:
                return False
            self.parked.append(item)
            return True

    def leave(self) -> None:
        """Switch to the safe way without a failure: what librdkafka holds is answered,
        not purged."""
        self._leave(purge=False)

    def reopen(self) -> bool:
        """Open again (:meth:`msgsafe.fastpath.FastPath.reopen`) unless the brokers count
        as down (the host calls it under its own lock, with nothing of its own unsettled
        and nothing stored)."""
        link = self.link
        with self.lock:
            # A failure reported after its send was stored (past the drain's bound) is
            # settled already: only one still unsettled keeps the fast path off.
            self.failures = [send for send in self.failures if not send.done()]
            if self.closed or self.parked or self.failures or link.down:
                return False
            if not FastPath.reopen(self):
                return False
        log.debug("kafka fast path to %s: open again", self.target)
        return True

    def wait(self, timeout: float | None) -> bool:
        """Wait until every send handed over so far is settled and the fast path is not
        leaving, serving reports (and sending what lingers); False after ``timeout``."""
        deadline = None if timeout is None else _monotonic() + timeout
        target = self.sent
        while True:
            leaving = self.switching
            if not leaving and self._settled_upto(target):
                return True
            left = None if deadline is None else deadline - _monotonic()
            if left is not None and left <= 0:
                return False
            step = _FLUSH_SLICE_S if left is None else min(_FLUSH_SLICE_S, left)
            if leaving:
                self._settled.wait(step)
                continue
            try:
                self.link.client.producer.flush(step)
            except KafkaException as exc:
                self.link.on_error(exc.args[0])

    def _settled_upto(self, target: int, failed: set[int] | None = None) -> bool:
        """Whether every send handed over up to seq ``target`` is settled (or, with
        ``failed``, ids of sends reported failed, one of those)."""
        # NOTE: no counter on the way of a report: the watch holds every unsettled send
        # in seq order (the watchdog drops settled ones from its front). list() copies in
        # C while the watchdog may pop.
        for send in list(self.watch):
            if send.seq > target:
                return True
            if send._state is not _FINISHED and (failed is None or id(send) not in failed):
                return False
        return True

    def shut(self) -> None:
        """Refuse every send from now on (the producer is closing)."""
        with self.lock:
            self.closed = True
            FastPath.shut(self)

    def close(self, timeout: float | None) -> None:
        """After :meth:`shut`: give what the fast path holds ``timeout`` to be answered, then
        store (or fail, without an outbox) what is still unanswered."""
        if self.wait(timeout):
            return
        # Unsettled sends outside a leave: the path held them (a leave settles every one).
        if self._start_leave(purge=True):
            self._leave_now()
        else:
            self._settled.wait(_PURGED_DRAIN_S + self.timeout)

    # --- reports --------------------------------------------------------------------------

    def failed_send(self, send: FastSend, err: KafkaError) -> None:
        """A failed delivery report: kept for the outbox (and the fast path leaves) when the
        safe way would store it, otherwise its future fails with the error now."""
        if send.done():
            return  # already stored after the drain's bound
        error = self.link.delivery_error(err, send.message_id)
        if not self.stores or not isinstance(error, TransientError):
            self._fail(send, error)
            return
        with self.lock:
            self.failures.append(send)
        self._leave(purge=True)

    def _fail(self, send: FastSend, error: MsgsafeError) -> None:
        try:
            send.set_exception(error)
        except InvalidStateError:
            return
        self.host.count_outcomes(1, error)

    def expire(self, now: float) -> None:
        """The watchdog, on the poll thread: a send without a report at
        ``confirm_timeout`` makes the fast path leave (it is then stored as possibly
        delivered); without an outbox it fails with :class:`ConfirmTimeout`."""
        watch = self.watch
        timeout = self.timeout
        while watch:
            head = watch[0]
            # NOTE: the state read, not done(): this runs once per message sent.
            if head._state is _FINISHED:
                watch.popleft()
                continue
            if head.born + timeout > now:
                return
            if not self.stores:
                watch.popleft()
                self._fail(head, self._overdue(head))
                continue
            self._leave(purge=True)
            return

    def _overdue(self, send: FastSend) -> ConfirmTimeout:
        return ConfirmTimeout(
            f"no delivery report within confirm_timeout={self.timeout}s",
            endpoint=self.target,
            message_id=send.message_id,
        )

    # --- leaving ------------------------------------------------------------------------------

    def _leave(self, *, purge: bool) -> None:
        """Start the switch (see the module docstring) on the fast path's own thread:
        this may run inside librdkafka's poll, which must not wait for a drain."""
        if self._start_leave(purge=purge):
            threading.Thread(target=self._leave_now, name="msgsafe-kafka-fast", daemon=True).start()

    def _start_leave(self, *, purge: bool) -> bool:
        """Switch (True: the caller runs :meth:`_leave_now`), or, when the path holds
        nothing or is switching already, only note ``purge`` for the leave under way or
        the next."""
        with self.lock:
            if purge:
                self._purge = True
            if not self.switch():
                return False
            self._settled.clear()
            self.leaves += 1
        log.info("kafka fast path to %s: leaving for the safe way", self.target)
        return True

    def _leave_now(self) -> None:
        try:
            self._store_failures(self._drain())
        except Exception:  # the fast path must still end its leave: parked sends wait for it
            log.exception("kafka fast path to %s: leaving failed", self.target)
        finally:
            self._replay_parked()

    def _drain(self) -> bool:
        """Serve reports until every handed-over send has one; returns whether
        librdkafka was purged."""
        link = self.link
        purged = False
        bound = self.timeout
        deadline = _monotonic() + bound
        while True:
            with self.lock:
                target = self.sent
                failed = {id(send) for send in self.failures}
                purge = self._purge and not purged
            if purge:
                purged = True
                link.client.purge()
                deadline = min(deadline, _monotonic() + _PURGED_DRAIN_S)
            if self._settled_upto(target, failed) or _monotonic() >= deadline:
                return purged
            try:
                link.client.producer.flush(_FLUSH_SLICE_S)
            except KafkaException as exc:
                link.on_error(exc.args[0])

    def _store_failures(self, purged: bool) -> None:
        """The failed sends, and any still unanswered, to the outbox in send order."""
        with self.lock:
            failures, self.failures = self.failures, []
        kept = {id(send) for send in failures}
        # list(deque) copies in C: the watchdog may pop from it meanwhile.
        failures.extend(s for s in list(self.watch) if id(s) not in kept)
        # Settled ones stay out: confirmed meanwhile, or stored by an earlier leave.
        failures = [send for send in failures if not send.done()]
        if not failures:
            return
        failures.sort(key=_seq)
        if not self.stores:
            for send in failures:
                self._fail(send, self._overdue(send))
            return
        # The producer writes them (msgsafe.fastpath.store_refused): the fast path has no store.
        error = self.host.store_refused([send.envelope() for send in failures])
        guarantees = self.guarantees
        settled = 0
        for send in failures:
            try:
                if error is None:
                    send.set_result(
                        new_receipt(
                            send.message_id,
                            _STORED,
                            send.topic,
                            guarantees.get(send.topic, _UNKNOWN),
                            self.store_guarantee,
                        )
                    )
                else:
                    # NOTE: in doubt, every one: each was handed to librdkafka, which
                    # retries on its own and (through confluent-kafka) never says whether
                    # an earlier attempt was written: a message purged as queued may be a
                    # retry of one the broker holds (``msgsafe nemesis kafka``, seed
                    # 659090302: refused by a full outbox, received a second later).
                    send.set_exception(error.refusing(send.message_id, doubt=True))
            except InvalidStateError:
                continue  # confirmed meanwhile: the stored copy is a known duplicate
            settled += 1
        self.host.count_outcomes(settled, error)
        log.info(
            "kafka fast path to %s: %d unconfirmed sends %s",
            self.target,
            len(failures),
            "stored" if error is None else f"not stored ({error})",
        )
        if purged:
            # The broker refused a moment ago: the safe way stores for a while.
            self.host.pause()

    def _replay_parked(self) -> None:
        """Hand the parked sends to the safe way, in order, then end the switch."""
        while True:
            with self.lock:
                parked, self.parked = self.parked, []
                if not parked:
                    self.switched()
                    self._purge = False
                    self._settled.set()
                    return
            for item in parked:
                try:
                    self.host.replay(item)
                except Exception:  # replay settles its own sends; this is a bug
                    log.exception("kafka fast path to %s: a parked send failed", self.target)

    def __repr__(self) -> str:
        state = "switching" if self.switching else "resting" if self.resting else "open"
        return f"KafkaFastSender({self.target!r}, {state}, {self.sent} sent)"

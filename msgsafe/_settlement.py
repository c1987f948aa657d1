"""How every send of a :class:`~msgsafe.Producer` ends, and the way to the outbox.

Split from ``producer.py`` along the line between the caller's side and the
bookkeeping behind it: :class:`~msgsafe.Producer` validates input and routes each
message (to the transport, or behind the outbox barrier); :class:`Settlement` is the
:class:`~msgsafe._receipts.ReceiptOwner` every receipt reports to. It resolves receipts,
counts each send until it is settled (what ``flush()`` waits for), holds the per-key
barrier and the refusal pause in front of the outbox, and runs the thread that stores
detoured messages.

Two batching layers stand between a detoured message and the disk, on purpose:

- this module's writer thread batches the producer's detours (up to 1000 per
  :meth:`~msgsafe.ports.OutboxStore.put`). It exists for every ``OutboxStore``: the
  protocol's ``put`` is synchronous and may fsync, and the transport reports on the
  broker library's I/O thread (pika's ioloop, librdkafka's poll, proton's container),
  which must never wait for a disk; a PostgreSQL or user store has no group commit of
  its own, so the batch is the only thing that spares it one transaction per message.
- :class:`~msgsafe.outbox._writer.GroupCommitWriter` batches *callers* of one SQLite
  connection: this writer's puts, the forwarder's claims and deletes, other producers
  sharing the store (:meth:`~msgsafe.outbox.SqliteOutbox.shared`) and the CLI, merged
  into one transaction and one fsync.

With one producer on a SQLite outbox the second layer costs no hand-off: a ``put``
that finds the connection idle commits in this writer's thread
(:meth:`~msgsafe.outbox._writer.GroupCommitWriter.call`).
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial

from msgsafe._receipts import BatchPart, BatchSend, Send, StoreItem
from msgsafe.errors import MsgsafeError, OutboxError, TransientError
from msgsafe.message import Batch, Guarantee, Receipt, Status, new_receipt
from msgsafe.ports import OutboxStore
from msgsafe.telemetry.stats import OutcomeCounts

__all__ = ["Settlement"]

log = logging.getLogger("msgsafe.producer")

#: Seconds after a transient failure during which new sends go straight to the outbox
#: instead of to the broker (renewed by every further failure). One send per period
#: probes the broker; the forwarder's own backoff governs the rest.
_REFUSAL_PAUSE_S = 0.5

_CONFIRMED = Status.CONFIRMED
_UNKNOWN = Guarantee.UNKNOWN

#: Messages per outbox put at most.
_STORE_BATCH = 1000


class Settlement:
    """The producer's bookkeeping (see the module docstring). Thread-safe.

    ``lock`` guards the flush count and the key barrier (``detouring``); the producer
    shares it, so a send takes one lock, not two. ``tickets`` counts every send as it
    starts (``next()`` is atomic: sending takes no lock for it).
    """

    def __init__(self, store: OutboxStore | None, outcomes: OutcomeCounts | None = None) -> None:
        self.store = store
        #: How single sends ended, for Producer.stats() (see msgsafe.telemetry.stats).
        self.outcomes = outcomes or OutcomeCounts()
        self.lock = threading.Lock()
        self.tickets = itertools.count(1)
        self._spent = 0
        self._settled_total = 0
        #: The smallest settled count a wait() waits for (inf: nobody waits).
        self._wake_at = math.inf
        self._all_done = threading.Condition(self.lock)
        #: Keys with a message on its way to the outbox (the barrier before has_key is true).
        self.detouring: dict[bytes, int] = {}
        #: Keyed single sends handed to the transport and not answered yet, per key.
        self.in_transport: dict[bytes, int] = {}
        #: Messages bound for the outbox that wait for earlier sends of their key to leave
        #: the transport (see :meth:`hold`), per key.
        self._parked: dict[bytes, list[StoreItem]] = {}
        #: monotonic() until which new sends go straight to the outbox (0: not paused).
        self.refused_until = 0.0
        #: Each checked destination's guarantee, for its receipts (the producer's
        #: DestinationGate fills it; see msgsafe.checks.gate).
        self.guarantees: dict[str, Guarantee] = {}
        self._queue: queue.SimpleQueue[StoreItem | None] = queue.SimpleQueue()
        self._wake_forwarder: Callable[[], None] | None = None
        self._writer: threading.Thread | None = None

    # --- the outbox writer -----------------------------------------------------------------

    def start(self, wake_forwarder: Callable[[], None]) -> None:
        """Start the writer thread (only with a store); ``wake_forwarder`` runs after
        every successful put."""
        self._wake_forwarder = wake_forwarder
        self._writer = threading.Thread(
            target=self._store_loop, name="msgsafe-outbox-writer", daemon=True
        )
        self._writer.start()

    def stop(self, timeout: float | None) -> None:
        """Store what is queued, then end the writer thread (waits up to ``timeout``)."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout)

    def hold(self, item: StoreItem) -> None:
        """Queue ``item`` for the outbox; its key is already counted in ``detouring``.

        Per-key order: while an earlier message of the key is still in the transport
        (the broker may yet refuse it, and the outbox would then get it *after* this
        one), ``item`` is parked and queued once that message has left the transport —
        the case of every send made during the refusal pause right after an outage
        began, while the first sends of the outage were still waiting for their error.
        """
        key = item.envelope.key
        if key is None:
            self._queue.put(item)
            return
        with self.lock:
            if key in self.in_transport:
                self._parked.setdefault(key, []).append(item)
                return
            self._queue.put(item)

    def left_transport(self, key: bytes, *, detour: StoreItem | bool = False) -> None:
        """One keyed single send of ``key`` got its transport outcome. ``detour``: the
        message goes to the outbox — the item itself (queued here, in send order with
        what is parked), or True when the caller holds it next."""
        with self.lock:
            if detour is not False:
                self.detouring[key] = self.detouring.get(key, 0) + 1
            left = self.in_transport.get(key, 0) - 1
            parked = self._parked
            if left > 0:
                self.in_transport[key] = left
                if not isinstance(detour, bool):
                    # Earlier sends of this key may still fail: it waits in the park.
                    parked.setdefault(key, []).append(detour)
                return
            self.in_transport.pop(key, None)
            items = parked.pop(key, [])
            if not isinstance(detour, bool):
                items.append(detour)
            # Queued under the lock: a send of this key that finds the park empty
            # queues after these (SimpleQueue.put never blocks).
            items.sort(key=_send_order)
            for item in items:
                self._queue.put(item)

    def _store_loop(self) -> None:
        """The outbox writer: batches whatever is queued into one durable put."""
        store = self.store
        if store is None:  # pragma: no cover - thread only started with a store
            return
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < _STORE_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            error: OutboxError | None = None
            try:
                store.put([item.envelope for item in batch])
            except Exception as exc:  # the writer thread must never die
                error = _outbox_error(exc)
            self._settle_stored(batch, error)
            if error is None and self._wake_forwarder is not None:
                self._wake_forwarder()

    def _settle_stored(self, batch: list[StoreItem], error: OutboxError | None) -> None:
        """Resolve a batch the writer stored (or failed to): one lock for the whole
        batch's key barrier, one for the flush() count, none held while looping over
        unkeyed messages (senders would wait on it)."""
        self._arrived([item.envelope.key for item in batch if item.envelope.key is not None])
        settled = 0
        try:
            for item in batch:
                settled += item.stored(error)
        finally:
            self.outcomes.stored(settled, error)
            self.settled(settled)

    def _arrived(self, keys: list[bytes]) -> None:
        """Messages of ``keys`` (repeats counted) are in the store, or will never be: they
        leave the barrier's ``detouring`` count (has_key answers for them from now on)."""
        if not keys:
            return
        with self.lock:
            detouring = self.detouring
            for key in keys:
                left = detouring.get(key, 0) - 1
                if left > 0:
                    detouring[key] = left
                else:
                    detouring.pop(key, None)

    def store_batch(self, send: BatchSend, put: Callable[[Batch], Future[None]]) -> bool:
        """During the refusal pause: the whole batch to the store in one put of its
        columns (``put``: the store's ``put_batch_async``), with no transport attempt
        and no object per message. False when it must take the per-message way
        (:meth:`hold`) instead.

        Per-key order: only when no key of the batch has a message in the transport
        (the broker may yet refuse it, which would then be stored after this batch) or
        on its way to the outbox. The batch's keys count in ``detouring`` until the put
        is durable, and the put is queued under the lock that orders that count: a later
        send of one of these keys is held, and reaches the store after this batch.
        """
        batch = send.batch
        keys = [] if batch.keys is None else [key for key in batch.keys if key is not None]
        future: Future[None] | None = None
        error: OutboxError | None = None
        if not keys:
            # Unkeyed messages have no order to keep: no lock.
            try:
                future = put(batch)
            except Exception as exc:
                error = _outbox_error(exc)
        else:
            with self.lock:
                detouring, in_transport = self.detouring, self.in_transport
                if any(key in detouring or key in in_transport for key in set(keys)):
                    return False
                for key in keys:
                    detouring[key] = detouring.get(key, 0) + 1
                # NOTE: the rows are made under the lock (tens of µs per 1000 messages,
                # once per batch): queued after it, a held send of these keys could
                # reach the store's writer first.
                try:
                    future = put(batch)
                except Exception as exc:
                    error = _outbox_error(exc)
        if future is None:
            self._batch_stored(send, keys, error)
        else:
            # Outside the lock: the callback takes it, and runs here if the put is done.
            future.add_done_callback(partial(self._batch_put_done, send, keys))
        return True

    def _batch_put_done(self, send: BatchSend, keys: list[bytes], future: Future[None]) -> None:
        exc = future.exception()
        self._batch_stored(send, keys, None if exc is None else _outbox_error(exc))

    def _batch_stored(self, send: BatchSend, keys: list[bytes], error: OutboxError | None) -> None:
        self._arrived(keys)
        send.stored_all(error)
        if error is None and self._wake_forwarder is not None:
            self._wake_forwarder()

    # --- the barrier in front of the outbox ------------------------------------------------

    def paused(self) -> bool:
        """True while new sends should go straight to the outbox."""
        until = self.refused_until
        if time.monotonic() < until:
            return True
        if self.refused_until == until:
            # A failure in between may have renewed the pause: keep a newer value.
            self.refused_until = 0.0
        return False

    def held_by_barrier(self, keys: Sequence[bytes | None]) -> list[int]:
        """Indexes of the messages whose key has a message in (or on its way to) the
        outbox: they queue behind it (call under ``lock``)."""
        store = self.store
        detouring = self.detouring
        if store is None:
            return []
        barred = {
            key for key in set(keys) if key is not None and (key in detouring or store.has_key(key))
        }
        if not barred:
            return []
        return [i for i, key in enumerate(keys) if key in barred]

    def refuse_for_a_moment(self) -> None:
        """Send to the outbox for a short pause, as after a refusal (the broker could not
        be reached to check a destination)."""
        self.refused_until = time.monotonic() + _REFUSAL_PAUSE_S

    def to_outbox(self, item: StoreItem) -> None:
        """After a transient failure: pause sending, hold the item's key behind the
        barrier, and queue the item for the outbox writer."""
        self.refused_until = time.monotonic() + _REFUSAL_PAUSE_S
        key = item.envelope.key
        if key is not None:
            with self.lock:
                self.detouring[key] = self.detouring.get(key, 0) + 1
        self.hold(item)

    # --- ReceiptOwner ----------------------------------------------------------------------

    def published(self, send: Send, error: BaseException | None) -> None:
        """The transport's outcome for one message; runs on the adapter's I/O thread (or
        the caller's): no blocking work here."""
        envelope = send.envelope
        if error is None:
            # resolve(), inlined for the common outcome: one frame fewer per message.
            destination = envelope.destination
            receipt = new_receipt(
                envelope.message_id,
                _CONFIRMED,
                destination,
                self.guarantees.get(destination, _UNKNOWN),
            )
            try:
                send.set_result(receipt)
            finally:
                self.outcomes.resolved(receipt, None)
                self.settled(1)
            if envelope.key is not None and self.store is not None:
                self.left_transport(envelope.key)
            return
        key = envelope.key
        if isinstance(error, TransientError) and self.store is not None:
            log.debug("storing %s after %s", envelope.message_id, type(error).__name__)
            if key is None:
                self.to_outbox(send)
                return
            self.refused_until = time.monotonic() + _REFUSAL_PAUSE_S
            self.left_transport(key, detour=send)
            return
        if isinstance(error, MsgsafeError):
            error.message_id = error.message_id or envelope.message_id
        self.resolve(send, None, error)
        if key is not None and self.store is not None:
            self.left_transport(key)

    def detour(self, send: BatchSend, index: int, error: MsgsafeError) -> bool:
        """Message ``index`` of a batch failed with ``error``: the outbox takes it when
        the error is transient and there is an outbox (True), otherwise False."""
        if not isinstance(error, TransientError) or self.store is None:
            return False
        self.to_outbox(BatchPart(send, index))
        return True

    def resolve(
        self, send: Send, receipt: Receipt | None, error: BaseException | None = None
    ) -> None:
        """Resolve one receipt future, then count it settled for flush()."""
        try:
            if error is None:
                send.set_result(receipt)  # type: ignore[arg-type]
            else:
                send.set_exception(error)
        finally:
            self.outcomes.resolved(receipt, error)
            self.settled(1)

    # --- what flush() waits for ------------------------------------------------------------

    def settled(self, units: int) -> None:
        """``units`` sends (messages or batches) are finished: what flush() waits for."""
        if units:
            with self.lock:
                # settle_locked, inlined: this runs once for every message.
                self._settled_total += units
                if self._settled_total >= self._wake_at:
                    self._wake_at = math.inf
                    self._all_done.notify_all()

    def settle_locked(self, units: int) -> None:
        """:meth:`settled`, for a caller that holds ``lock``."""
        self._settled_total += units
        if self._settled_total >= self._wake_at:
            self._wake_at = math.inf
            self._all_done.notify_all()

    def wait(self, timeout: float | None) -> bool:
        """Wait until every send started so far is settled; False if ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            target = next(self.tickets) - 1 - self._spent
            self._spent += 1
            while self._settled_total < target:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._wake_at = min(self._wake_at, target)
                self._all_done.wait(left)
            return True


def _send_order(item: StoreItem) -> tuple[int, int]:
    return item.send_order()


def _outbox_error(exc: BaseException) -> OutboxError:
    """``exc`` from a store's put as the error its messages fail with."""
    if isinstance(exc, OutboxError):
        return exc
    return OutboxError(f"outbox write failed: {type(exc).__name__}: {exc}")

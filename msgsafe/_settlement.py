"""How every send of a :class:`~msgsafe.Producer` ends, and the way to the outbox.

Split from ``producer.py`` along the line between the caller's side and the
bookkeeping behind it: :class:`~msgsafe.Producer` validates input and carries out the
route each message gets here; :class:`Settlement` decides that route (:meth:`~Settlement.route`,
:meth:`~Settlement.route_batch`: to the transport, or behind the outbox barrier) and is
the :class:`~msgsafe._receipts.ReceiptOwner` every receipt reports to. It resolves
receipts, counts each send until it is settled (what ``flush()`` waits for), owns the
per-key order in front of the outbox (the barrier and the refusal pause; nothing outside
this class reads or writes their state) and runs the thread that stores detoured
messages.

Per-key order, the rule this class keeps: a keyed message never reaches the broker
before an earlier message of its key that waits in (or is on its way to) the outbox, and
the outbox receives each key's messages in send order, whatever order the transport's
errors come in. Three counts serve it, all under one lock: ``_detouring`` (messages of a
key on their way to the outbox, until the store holds them and ``has_key`` answers),
``_in_transport`` (keyed single sends handed to the transport and not answered yet) and
``_parked`` (messages bound for the outbox that wait for those to leave the transport).

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

import enum
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
from msgsafe.errors import (
    ClosedError,
    MessageIdReused,
    MsgsafeError,
    OutboxError,
    TransientError,
)
from msgsafe.message import Batch, Guarantee, Receipt, Status, new_receipt
from msgsafe.ports import FastSender, OutboxStore
from msgsafe.telemetry.stats import OutcomeCounts, count_value

__all__ = ["Route", "Settlement"]

log = logging.getLogger("msgsafe.producer")

#: Seconds after a transient failure during which new sends go straight to the outbox
#: instead of to the broker (renewed by every further failure). One send per period
#: probes the broker; the forwarder's own backoff governs the rest.
_REFUSAL_PAUSE_S = 0.5

_CONFIRMED = Status.CONFIRMED
_UNKNOWN = Guarantee.UNKNOWN

#: Messages per outbox put at most.
_STORE_BATCH = 1000
#: Seconds the outbox writer waits, at most, for a round as large as its last one.
#: Blocking senders each wait for the commit of their message, so the next round's
#: messages arrive one by one right after a commit: without the wait, a commit would
#: carry only those that came before the writer looked (half of 8 threads, measured),
#: and each commit costs one fdatasync whatever it carries.
_GATHER_S = 0.0005


class Route(enum.Enum):
    """What :meth:`Settlement.route` tells the producer to do with one send."""

    #: Hand it to the transport; nothing was counted for it.
    PUBLISH = "publish"
    #: Hand it to the transport; its key is counted in the transport until its outcome
    #: comes: if the hand-over raises instead, call ``left_transport(key)``.
    PUBLISH_COUNTED = "publish counted"
    #: Behind the barrier (its key waits in the outbox, or the refusal pause): call
    #: ``hold(send)``; its key is already counted on the way to the outbox.
    HOLD = "hold"
    #: A transactional send: the caller writes it into the store inside its transaction
    #: and resolves it (the barrier does not apply: see :meth:`Settlement.route`).
    TRANSACTION = "transaction"
    #: The producer is closed: the send is already settled; raise ``ClosedError``.
    CLOSED = "closed"
    #: The transport's fast path (msgsafe.ports.FastSender) takes single sends again, or is
    #: leaving: the send is not counted here; hand it to the fast path (or park it there).
    FAST = "fast"


# Module globals: read faster than Route.HOLD on every send.
_PUBLISH = Route.PUBLISH
_PUBLISH_COUNTED = Route.PUBLISH_COUNTED
_HOLD = Route.HOLD
_FAST = Route.FAST


class Settlement:
    """The producer's bookkeeping (see the module docstring). Thread-safe.

    ``_lock`` guards the flush count, the key barrier and the closed flag: one lock, so
    a send takes one lock, not two. ``_tickets`` counts every send as it starts
    (``next()`` is atomic: sending takes no lock for it).
    """

    def __init__(self, store: OutboxStore | None, outcomes: OutcomeCounts | None = None) -> None:
        self.store = store
        #: How single sends ended, for Producer.stats() (see msgsafe.telemetry.stats).
        self.outcomes = outcomes or OutcomeCounts()
        self._lock = threading.Lock()
        self._tickets = itertools.count(1)
        self._closed = False
        self._spent = 0
        self._settled_total = 0
        #: The smallest settled count a wait() waits for (inf: nobody waits).
        self._wake_at = math.inf
        self._all_done = threading.Condition(self._lock)
        #: Keys with a message on its way to the outbox (the barrier before has_key is true).
        self._detouring: dict[bytes, int] = {}
        #: Keyed single sends handed to the transport and not answered yet, per key.
        self._in_transport: dict[bytes, int] = {}
        #: Messages bound for the outbox that wait for earlier sends of their key to leave
        #: the transport (see :meth:`hold`), per key.
        self._parked: dict[bytes, list[StoreItem]] = {}
        #: monotonic() until which new sends go straight to the outbox (0: not paused).
        self._refused_until = 0.0
        #: Each checked destination's guarantee, for its receipts (the producer's
        #: DestinationGate fills it; see msgsafe.checks.gate).
        self.guarantees: dict[str, Guarantee] = {}
        #: What the outbox does with a STORED message, for its receipts (the producer
        #: sets it; see msgsafe.checks.store.store_guarantee).
        self.store_guarantee: Guarantee | None = None
        self._queue: queue.SimpleQueue[StoreItem | None] = queue.SimpleQueue()
        self._wake_forwarder: Callable[[], None] | None = None
        self._writer: threading.Thread | None = None
        #: How many messages the writer's last put carried (see _GATHER_S).
        self._last_round = 1
        #: The transport's fast path for single sends (msgsafe.ports.FastSender), when it has one:
        #: while it holds messages (FastSender.holds), keyed sends and keyed batches belong there
        #: (it keeps their order itself), and route()/route_batch() say so.
        self.fast: FastSender | None = None

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
        """Queue ``item`` for the outbox; its key is already counted on the way there (a
        :data:`Route.HOLD`, or an index :meth:`route_batch` returned).

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
        with self._lock:
            if key in self._in_transport:
                self._parked.setdefault(key, []).append(item)
                return
            self._queue.put(item)

    def left_transport(self, key: bytes, *, detour: StoreItem | bool = False) -> None:
        """One keyed single send of ``key`` counted in the transport (a
        :data:`Route.PUBLISH_COUNTED`) got its outcome, or never will (its hand-over
        raised). ``detour``: the message goes to the outbox — the item itself (queued
        here, in send order with what is parked), or True when the caller holds it next."""
        with self._lock:
            if detour is not False:
                self._detouring[key] = self._detouring.get(key, 0) + 1
            left = self._in_transport.get(key, 0) - 1
            parked = self._parked
            if left > 0:
                self._in_transport[key] = left
                if not isinstance(detour, bool):
                    # Earlier sends of this key may still fail: it waits in the park.
                    parked.setdefault(key, []).append(detour)
                return
            self._in_transport.pop(key, None)
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
            first = self._queue.get()
            if first is None:
                return
            self._store_round(store, first)
            # NOTE: no local may keep a settled send while get() waits, maybe for the
            # producer's whole life: a send holds its callbacks, and a wrapper's report
            # among them holds the wrapper, whose finalizer closes this producer.
            del first

    def _store_round(self, store: OutboxStore, first: StoreItem) -> None:
        """One durable put of ``first`` and whatever else is queued (up to _STORE_BATCH),
        waiting up to _GATHER_S for as many messages as the last put carried."""
        batch = [first]
        want = self._last_round
        deadline = 0.0
        while len(batch) < _STORE_BATCH:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                if len(batch) >= want:
                    break
                now = time.monotonic()
                if not deadline:
                    deadline = now + _GATHER_S
                if now >= deadline:
                    break
                try:
                    nxt = self._queue.get(timeout=deadline - now)
                except queue.Empty:
                    break
            if nxt is None:
                self._queue.put(None)
                break
            batch.append(nxt)
        self._last_round = len(batch)
        self._put(store, batch)

    def _put(self, store: OutboxStore, batch: list[StoreItem]) -> None:
        """One put of ``batch``, settled. An id of it stored as another message fails
        that message alone: the others are put again, one by one."""
        error: MsgsafeError | None = None
        try:
            store.put([item.envelope for item in batch])
        except MessageIdReused as exc:
            if len(batch) > 1:
                for item in batch:
                    self._put(store, [item])
                return
            error = exc
        except Exception as exc:  # the writer thread must never die
            error = OutboxError.of(exc)
        self._settle_stored(batch, error)
        if error is None and self._wake_forwarder is not None:
            self._wake_forwarder()

    def _settle_stored(self, batch: list[StoreItem], error: MsgsafeError | None) -> None:
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
        with self._lock:
            detouring = self._detouring
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
        on its way to the outbox. The batch's keys count in ``_detouring`` until the put
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
                error = OutboxError.of(exc)
        else:
            with self._lock:
                detouring, in_transport = self._detouring, self._in_transport
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
                    error = OutboxError.of(exc)
        if future is None:
            self._batch_stored(send, keys, error)
        else:
            # Outside the lock: the callback takes it, and runs here if the put is done.
            future.add_done_callback(partial(self._batch_put_done, send, keys))
        return True

    def _batch_put_done(self, send: BatchSend, keys: list[bytes], future: Future[None]) -> None:
        exc = future.exception()
        self._batch_stored(send, keys, None if exc is None else OutboxError.of(exc))

    def _batch_stored(self, send: BatchSend, keys: list[bytes], error: OutboxError | None) -> None:
        self._arrived(keys)
        send.stored_all(error)
        if error is None and self._wake_forwarder is not None:
            self._wake_forwarder()

    # --- the route of a send: the barrier in front of the outbox --------------------------

    def route(self, send: Send, *, transactional: bool = False, replayed: bool = False) -> Route:
        """Where ``send`` goes, decided as it starts; the producer carries it out.

        Takes the send's ticket (its place in send order and in what ``flush()`` waits
        for). Then: :data:`Route.CLOSED` after :meth:`close` (the send is settled here);
        :data:`Route.TRANSACTION` for a ``transactional`` send; :data:`Route.HOLD` during
        the refusal pause or while a message of its key is in or on its way to the
        outbox (sending it now would overtake that one); otherwise to the transport,
        :data:`Route.PUBLISH_COUNTED` when its key is counted there (what a later
        message of the key bound for the outbox waits for, see :meth:`hold`) and
        :data:`Route.PUBLISH` when there is nothing to count. A keyed send while the
        fast path holds messages (``holds``): :data:`Route.FAST` (not counted). ``replayed``: a send
        the fast path parked and hands over now (accepted before any close; the fast path waits
        for it).
        """
        # NOTE: no Python-level call inside the lock: the interpreter may hand the GIL to
        # another thread at one, and every sender would then queue on this lock. The pause
        # is read without it: it only spares a refusing broker. A send that misses a pause
        # begun meanwhile goes to the broker, and to the outbox if that refuses it
        # (published()); a key's order rests on the counts below, not on the pause.
        paused = not transactional and self._refused_until > 0.0 and self.paused()
        send.ticket = next(self._tickets)
        if self._closed and not replayed:
            # Counted, then settled: a close() that read the count does not wait for it.
            self.settled(1)
            return Route.CLOSED
        if transactional:
            # The store takes it whatever the barrier says (the caller's transaction
            # orders it), and nothing would release a barrier count taken for it: the
            # writer thread never sees it.
            return Route.TRANSACTION
        key = send.envelope.key
        store = self.store
        if key is None or store is None:
            # No lock: nothing is counted. An unkeyed message has no order to keep, and
            # without a store nothing waits anywhere (a failure fails the send).
            return _HOLD if paused else _PUBLISH
        # NOTE: a keyed send with a store always takes the lock, even when nothing of its
        # key waits and nothing is paused (the common case). It must count itself in
        # _in_transport — a message of its key that fails or is sent during a pause
        # later waits for that count (hold) — and a dict count cannot be raised by two
        # threads without a lock (get-then-set loses updates). The look at _detouring
        # must be under the same lock: a message of this key leaves _detouring only once
        # it is in the store, and only the lock orders that hand-over with this look.
        detouring = self._detouring
        fast = None if replayed else self.fast
        with self._lock:
            if fast is not None and fast.holds:
                # NOTE: read under the lock that orders it: the fast path reopens only under
                # it (reopen_fast_path), and a keyed send counted here while it is open could
                # fail into the outbox behind its key's later sends on the fast path.
                self._settled_now(1)
                return _FAST
            held = paused or key in detouring
            if held:
                detouring[key] = detouring.get(key, 0) + 1
            else:
                # Counted before has_key is asked: a message of this key bound for the
                # outbox waits until this one has left the transport.
                in_transport = self._in_transport
                in_transport[key] = in_transport.get(key, 0) + 1
        if held:
            return _HOLD
        # NOTE: asked after _detouring: a message of this key leaves _detouring only once
        # it is in the store, so one of the two questions sees it.
        if store.has_key(key):
            self.left_transport(key, detour=True)
            return _HOLD
        return _PUBLISH_COUNTED

    def route_batch(
        self,
        send: BatchSend,
        put_whole: Callable[[Batch], Future[None]] | None,
        *,
        replayed: bool = False,
    ) -> list[int] | Route | None:
        """Where each message of ``send.batch`` goes, decided as it starts; the producer
        carries it out. Takes the batch's ticket (as :meth:`route`).

        Raises :class:`ClosedError` after :meth:`close` (the batch is settled here).
        Returns None when the batch went to the store whole: during the refusal pause,
        through ``put_whole`` (the store's ``put_batch_async``), when no key of the batch
        has a message in the transport or on its way to the outbox. Otherwise the
        indexes of the messages to :meth:`hold` (as :class:`~msgsafe._receipts.BatchPart`;
        their keys are counted on the way to the outbox): every one during the pause,
        else those whose key has a message in or on its way to the outbox; the rest go
        to the transport. :data:`Route.FAST` (not counted) for a keyed batch while the
        fast path holds messages (``holds``); ``replayed`` as for :meth:`route`.
        """
        batch = send.batch
        store = self.store
        paused = store is not None and self._refused_until > 0.0 and self.paused()
        send.ticket = next(self._tickets)
        if self._closed and not replayed:
            self.settled(1)
            raise ClosedError("producer is closed")
        fast = None if replayed or batch.keys is None else self.fast
        if fast is not None:
            with self._lock:
                if fast.holds:
                    self._settled_now(1)
                    return _FAST
        if paused and put_whole is not None and self.store_batch(send, put_whole):
            return None
        keys = batch.keys
        if keys is None or store is None:
            # No lock, as for single sends: no key to count or to look up.
            return list(range(len(batch))) if paused else []
        with self._lock:
            # NOTE: has_key is asked under the lock here (a Python call, once per distinct
            # key of the batch): a batch is rarer than a send, and a key that arrives in
            # the store meanwhile must not slip between the two looks.
            held = list(range(len(batch))) if paused else self._held_by_barrier(store, keys)
            if held:
                detouring = self._detouring
                for index in held:
                    key = keys[index]
                    if key is not None:
                        detouring[key] = detouring.get(key, 0) + 1
        return held

    def _held_by_barrier(self, store: OutboxStore, keys: Sequence[bytes | None]) -> list[int]:
        """Indexes of the messages whose key has a message in (or on its way to) the
        outbox: they queue behind it (call under ``_lock``)."""
        detouring = self._detouring
        barred = {
            key for key in set(keys) if key is not None and (key in detouring or store.has_key(key))
        }
        if not barred:
            return []
        return [i for i, key in enumerate(keys) if key in barred]

    def reopen_fast_path(self, fast: FastSender) -> bool:
        """Have ``fast_path`` take single sends again (:meth:`~msgsafe.ports.FastSender.reopen`) if
        nothing here could be overtaken by them: the store holds nothing, no send is
        unsettled (a batch in the transport could still fail into the outbox), no key
        is on its way to the outbox or counted in the transport, no refusal pause.
        Under the lock keyed routes read the fast path's state under. True if it reopened."""
        store = self.store
        # NOTE: asked outside the lock (a read of the store); a row that arrives after
        # it comes from a send settled after it, which the count below sees unsettled,
        # or from another process, which the fast path's has_key catches per send.
        if store is not None and store.stats().depth:
            return False
        with self._lock:
            if self._closed or self._detouring or self._in_transport or self._parked:
                return False
            if self._refused_until > 0.0 and time.monotonic() < self._refused_until:
                return False
            issued = count_value(self._tickets) - 1 - self._spent
            if self._settled_total < issued:
                return False
            return fast.reopen()

    def paused(self) -> bool:
        """True while new sends go straight to the outbox (the refusal pause)."""
        until = self._refused_until
        if time.monotonic() < until:
            return True
        if self._refused_until == until:
            # A failure in between may have renewed the pause: keep a newer value.
            self._refused_until = 0.0
        return False

    def pause(self, seconds: float = _REFUSAL_PAUSE_S) -> None:
        """Send to the outbox for ``seconds`` from now (default: the short pause after a
        refusal, as when the broker could not be reached to check a destination); a
        later failure renews the pause from its own time. The fast path, if open, leaves:
        its sends ask for no pause (the pause is kept here, on the safe way)."""
        self._refused_until = time.monotonic() + seconds
        fast = self.fast
        if fast is not None and fast.holds and not fast.switching:
            fast.leave()

    def resume(self) -> None:
        """End the refusal pause now: the next send tries the broker again."""
        self._refused_until = 0.0

    def detouring_keys(self) -> frozenset[bytes]:
        """The keys with a message on its way to the outbox (not stored yet, nor failed)."""
        with self._lock:
            return frozenset(self._detouring)

    def to_outbox(self, item: StoreItem) -> None:
        """After a transient failure: pause sending, hold the item's key behind the
        barrier, and queue the item for the outbox writer."""
        self.pause()
        if type(item) is Send:
            item.held = True  # bound for the outbox now (what send()'s timeout reports)
        key = item.envelope.key
        if key is not None:
            with self._lock:
                self._detouring[key] = self._detouring.get(key, 0) + 1
        self.hold(item)

    # --- closing ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called: every new send is refused."""
        return self._closed

    def close(self) -> bool:
        """Refuse every send from now on (:data:`Route.CLOSED`); False when it already
        was closed (the caller's close is then a no-op)."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            return True

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
            if error.maybe_delivered:
                send.doubt = True  # an outbox that refuses it must say the broker may have it
            if key is None:
                self.to_outbox(send)
                return
            self.pause()
            send.held = True  # bound for the outbox now (what send()'s timeout reports)
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
        self.to_outbox(BatchPart(send, index, doubt=error.maybe_delivered))
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
            with self._lock:
                self._settled_now(units)

    def _settled_now(self, units: int) -> None:
        # settled(), under the lock already held.
        self._settled_total += units
        if self._settled_total >= self._wake_at:
            self._wake_at = math.inf
            self._all_done.notify_all()

    def wait(self, timeout: float | None) -> bool:
        """Wait until every send started so far is settled; False if ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            target = next(self._tickets) - 1 - self._spent
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

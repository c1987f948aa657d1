"""The producer: the one place where the promise is kept.

``send()`` returns a :class:`~msgsafe.Receipt` only when the message is safe — confirmed
by the broker, or committed to the local outbox — and otherwise raises a typed error
while the caller still owns the message. There is no third outcome.

This module is the caller's side: input checks, and carrying out the route of each
message (to the transport, or behind the outbox barrier). The route itself, and the
bookkeeping every receipt reports to — settling, the flush count, the per-key barrier,
the outbox writer — is :class:`msgsafe._settlement.Settlement`; the receipts are in
:mod:`msgsafe._receipts`. What the transport and the store offer beyond the required
methods is read once, from their declared capabilities (:mod:`msgsafe.ports`).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import TracebackType
from typing import Any, Self, cast

from msgsafe._observer import Observers, observing
from msgsafe._receipts import BatchPart, BatchSend, OneOfBatch, Send, SubsetReport
from msgsafe._recent_ids import RecentIds
from msgsafe._settlement import Route, Settlement
from msgsafe.adapters import destination_check, open_transport
from msgsafe.checks import inspector_for
from msgsafe.checks.gate import DestinationGate
from msgsafe.checks.store import admit_store
from msgsafe.endpoints import parse_url
from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    InvalidDestination,
    InvalidMessage,
    MsgsafeError,
    OutboxError,
    SendTimeout,
    StoreOutcomeUnknown,
    TransientError,
    UnsafeDestination,
)
from msgsafe.fastpath import store_refused
from msgsafe.message import (
    Batch,
    BatchReceipt,
    Envelope,
    Guarantee,
    Receipt,
    Status,
    new_message_id,
    new_receipt,
)
from msgsafe.outbox import Forwarder
from msgsafe.outbox.location import OutboxSpec, open_store
from msgsafe.ports import (
    BatchPutStore,
    BatchReport,
    BatchTransport,
    CallbackTransport,
    ErrorListener,
    ErrorListeningTransport,
    FastPathTransport,
    FastSender,
    HurryingTransport,
    OutboxStore,
    PublishCallback,
    TransactionalStore,
    Transport,
    store_capabilities,
    transport_capabilities,
)
from msgsafe.retry import RetryPolicy
from msgsafe.schemas import Serializer, Serializers
from msgsafe.telemetry.producer import ProducerTelemetry
from msgsafe.telemetry.stats import ProducerStats

log = logging.getLogger("msgsafe.producer")

__all__ = ["OutboxSpec", "Producer"]

# Module globals: read faster than Route.PUBLISH on every send.
_PUBLISH = Route.PUBLISH
_PUBLISH_COUNTED = Route.PUBLISH_COUNTED
_HOLD = Route.HOLD
_TRANSACTION = Route.TRANSACTION
_FAST = Route.FAST
_monotonic = time.monotonic

#: Seconds between two attempts, at most, to have the transport's fast path take single sends
#: again once it left (each asks the store for its depth).
_FAST_RETRY_S = 1.0


class Producer:
    """Publishes messages so that none that was accepted is ever lost.

    ``url`` selects the broker (see :func:`msgsafe.endpoints.parse_url`); ``outbox``
    is where messages go when the broker cannot take them: ``True`` (a SQLite file in
    the user's data directory, one per destination — scheme, hosts, virtual host — so
    editing options or the URL's spelling keeps it; see :mod:`msgsafe.outbox.location`),
    a path, an ``OutboxStore`` (e.g.
    ``msgsafe.outbox.PostgresOutbox``), or ``False`` to have ``send()`` raise instead.
    ``send_timeout`` bounds how long ``send()`` blocks; ``retry`` is the forwarder's
    backoff; ``telemetry=True`` adds OpenTelemetry spans and metrics (see
    :mod:`msgsafe.telemetry`; :meth:`stats` works without it); further keyword
    ``options`` go to the adapter, which refuses unknown ones.

    Before the first message to a destination (and every ``check_every`` seconds, in
    the background) the producer checks what the broker will do with a confirmed
    message there — the checks ``msgsafe doctor`` runs (:mod:`msgsafe.checks`) — and
    puts the answer on every receipt (``receipt.guarantee``). ``require`` is what the
    application needs: ``"durable"`` (default: a destination that a clean broker
    restart empties — a non-durable, exclusive or auto-delete queue, RabbitMQ's
    transient AMQP 1.0 queues — raises :class:`~msgsafe.errors.UnsafeDestination`
    before anything is sent; durable-only and unknown ones pass with one WARNING
    each), ``"replicated"`` (only destinations that survive a node's loss) or
    ``"any"``. The first send to a destination blocks for that check (one short
    connection); when it cannot reach the broker the message goes to the outbox, and
    the forwarder checks before it forwards (a destination below ``require`` then
    quarantines its messages).

    ``require`` governs the outbox too (:mod:`msgsafe.checks.store`): ``"durable"`` and
    ``"replicated"`` refuse here, with :class:`~msgsafe.errors.UnsafeOutbox`, a SQLite
    file on memory (``tmpfs``, ``ramfs``) or in a container's writable layer; ``"any"``
    accepts it. STORED receipts say what the store gives (``receipt.store_guarantee``).

    ``serializer`` and ``key_serializer`` turn each message's body and key into bytes,
    once, in ``send()``, before anything is sent or stored: confluent-kafka's
    ``serializer(obj, ctx)`` protocol, so its schema registry serializers work unchanged
    (see :mod:`msgsafe.schemas`; a failure is a :class:`~msgsafe.errors.SchemaError` and
    the caller still owns the message).

    ``forward=False``: the outbox is not forwarded in the background (another process
    does it: ``msgsafe outbox forward`` on a shared PostgreSQL outbox); :meth:`drain`
    still forwards on the caller's thread.

    Thread-safe: any number of threads may call ``send``/``send_async`` at once.
    """

    def __init__(
        self,
        url: str,
        *,
        outbox: OutboxSpec = True,
        send_timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        telemetry: bool = False,
        require: str = "durable",
        check_every: float = 300.0,
        forward: bool = True,
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
        **options: object,
    ) -> None:
        if send_timeout <= 0:
            raise ConfigurationError("send_timeout must be > 0")
        self._url = parse_url(url)
        #: The serializers (msgsafe.schemas), None without any: bodies and keys as given.
        self._serialize: Serializers | None = (
            Serializers(serializer, key_serializer)
            if serializer is not None or key_serializer is not None
            else None
        )
        self._gate = DestinationGate(
            inspector_for(self._url, options),
            require=require,
            refresh_s=check_every,
            endpoint=self._url.redacted(),
        )
        #: Destination -> when its check is due again (read on every send, no lock).
        self._admitted = self._gate.admitted
        self._send_timeout = send_timeout
        self._store: OutboxStore | None = None
        self._forwarder: Forwarder | None = None
        self._telemetry = ProducerTelemetry(self._url, otel=telemetry)
        # A fail-over or redirect is counted, and every destination checked again; a
        # broker reachable again after an outage ends the checks' and the forwarder's
        # waits (the forwarder joins these observers once it exists).
        self._observers = Observers(self._telemetry, self._gate)
        with observing(self._observers):
            self._transport: Transport = open_transport(self._url, options)
        #: The protocol's rules for names (each name checked once): a name no broker
        #: takes is refused before anything is sent or stored.
        self._check_name = destination_check(self._url.protocol)
        # What the transport declares (msgsafe.ports.TransportCapabilities), read once:
        # each seam below is bound when its flag promises it, None otherwise.
        transport = self._transport
        caps = transport_capabilities(transport)
        #: The transport's callback seam (no future per message besides the receipt).
        self._publish_callback: Callable[[Envelope, PublishCallback], None] | None = (
            cast(CallbackTransport, transport).publish_callback if caps.callback else None
        )
        #: The transport's batch seam (see msgsafe.ports.BatchTransport).
        self._publish_batch: Callable[[Batch, BatchReport], None] | None = (
            cast(BatchTransport, transport).publish_batch if caps.batch else None
        )
        #: The transport's way to skip its linger for a blocking send (HurryingTransport).
        self._hurry: Callable[[Future[Any], float], None] | None = (
            cast(HurryingTransport, transport).hurry if caps.hurry else None
        )
        #: The transport's connection events (ErrorListeningTransport).
        self._listen_errors: Callable[[ErrorListener | None], None] | None = (
            cast(ErrorListeningTransport, transport).listen_errors if caps.listen_errors else None
        )
        #: Whether the transport sends a null value (Kafka): tombstones are refused if not.
        self._tombstones = caps.tombstones
        #: The transport's fast path for single sends (msgsafe.ports.FastSender), opened below when
        #: it declares one and no span is made per message (OpenTelemetry takes the
        #: safe way, where each send's span is carried).
        self._fast: FastSender | None = None
        #: When the fast path, once left, may be asked to take single sends again.
        self._fast_retry_at = 0.0
        #: One single send accepted, for stats() (a C call).
        self._count_sent = self._telemetry.count_sent
        #: Remembers what each recent id named: an id reused for another message is
        #: refused (msgsafe._recent_ids).
        self._remember = RecentIds().remember
        try:
            self._store = open_store(outbox, self._url, options)
            self._settle = Settlement(self._store, self._telemetry.outcomes)
            self._settle.guarantees = self._gate.guarantees
            if self._store is not None:
                # The store meets require= too (UnsafeOutbox), and its receipts say how.
                self._settle.store_guarantee = admit_store(self._store, require)
            # What the store declares (msgsafe.ports.StoreCapabilities), read once.
            store_caps = store_capabilities(self._store)
            #: The store's put of a whole batch's columns (BatchPutStore: SqliteOutbox).
            self._put_batch_async: Callable[[Batch], Future[None]] | None = (
                cast(BatchPutStore, self._store).put_batch_async
                if store_caps.put_batch_async
                else None
            )
            #: The store's write inside the caller's transaction (TransactionalStore).
            self._put_in: Callable[[Any, list[Envelope]], None] | None = (
                cast(TransactionalStore, self._store).put_in if store_caps.transactional else None
            )
            store = self._store
            #: The key barrier's question to the store (False without one).
            self._has_key: Callable[[bytes], bool] = store.has_key if store is not None else _no_key
            if caps.fast_path and not self._telemetry.tracing:
                self._fast = cast(FastPathTransport, transport).open_fast_path(
                    _FastPathHost(self, self._settle)
                )
                self._settle.fast = self._fast
            if self._store is not None:
                # NOTE: fresh: a probe checks when it probes (its backoff paces it), not
                # a second after the last failed check.
                self._forwarder = Forwarder(
                    self._store,
                    self._transport,
                    policy=retry,
                    admit=self._admit_stored,
                    on_answered=self._settle.resume,
                )
                self._observers.add(self._forwarder)
                if forward:
                    self._forwarder.start()
                self._settle.start(self._forwarder.wake)
            self._telemetry.attach(self._store, self._forwarder)
        except BaseException:
            self._transport.close(0)
            if self._store is not None:
                self._store.close()
            raise

    # --- sending ---------------------------------------------------------------------------

    def send(
        self,
        destination: str,
        body: bytes | Any | None,
        *,
        key: str | bytes | Any | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
        transaction: Any = None,
    ) -> Receipt:
        """Send one message and block until it is safe.

        Returns a receipt with ``Status.CONFIRMED`` (the broker confirmed it) or
        ``Status.STORED`` (committed to the outbox, forwarded later). Raises
        :class:`~msgsafe.errors.InvalidMessage` / ``MessageTooLarge`` for bad input,
        :class:`~msgsafe.errors.PermanentError` when the broker refuses it for good,
        :class:`~msgsafe.errors.TransientError` when it could not be confirmed and there
        is no outbox, :class:`~msgsafe.errors.OutboxFull` when the outbox is at a bound,
        and :class:`~msgsafe.errors.SendTimeout` after ``send_timeout`` seconds. In these
        cases the caller still owns the message (resend it with the same ``message_id``
        to stay deduplicable). One error says the message *may* be safe:
        :class:`~msgsafe.errors.StoreOutcomeUnknown` — the outbox did not say whether
        it stored it (a commit that did not answer within the store's
        ``write_timeout``, or ``send_timeout`` passed while it was on its way there);
        resend with its ``message_id``, which the outbox stores once.

        ``message_id`` reused for a different message (another destination, key or
        body) within the producer's recent sends (:data:`msgsafe._recent_ids.WINDOW`
        at least) raises :class:`~msgsafe.errors.MessageIdReused` before anything is
        sent; so does the outbox's put while the first one waits there.

        ``transaction``: a PostgreSQL connection whose open transaction the message
        joins (the transactional outbox; needs a ``PostgresOutbox``); it is published
        after the caller commits and never if it rolls back.

        ``body=None`` sends a tombstone, on Kafka only: a record with a null value (not
        ``b""``), usually with a ``key`` (a compacted topic's delete). It is confirmed or
        stored like any message and stays a tombstone through the outbox. RabbitMQ and
        AMQP 1.0 messages have no null body: there ``send()`` raises ``InvalidMessage``
        before anything is sent.

        With a ``serializer`` (or ``key_serializer``) ``body`` (``key``) is the object it
        takes; a :class:`~msgsafe.errors.SchemaError` raises before anything is sent.
        """
        if self._serialize is not None:
            body, key = self._serialize(destination, body, key, headers, message_id)
        envelope = Envelope.build(
            destination, body, key=key, headers=headers, message_id=message_id
        )
        future, ended = self._tracked(envelope, transaction, waited=True)
        try:
            # The caller waits for this one message: a linger would only add latency.
            # Not for one that went straight to the outbox (an outage): the transport
            # holds nothing of it, and hurrying would wait out a flush of its own.
            held = type(future) is Send and future.held
            if self._hurry is not None and transaction is None and not held:
                self._hurry(future, self._send_timeout)
            return future.result(self._send_timeout)
        except FutureTimeout:
            # On its way into the outbox (queued, or a put in flight), it may yet be
            # stored and forwarded: not "not stored".
            raise self.timed_out(future, envelope) from None
        finally:
            if ended is not None:
                # The span's end, here once the caller is awake, not on the I/O thread
                # before it lets the caller run (or when the receipt resolves, if the
                # wait ended first: a timeout, an interrupt).
                future.add_done_callback(ended)

    def send_async(
        self,
        destination: str,
        body: bytes | Any | None,
        *,
        key: str | bytes | Any | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
        transaction: Any = None,
    ) -> Future[Receipt]:
        """Like :meth:`send` but returns at once with a future of the receipt.

        Invalid input raises here, before anything is sent; every other failure is the
        future's exception. The future cannot be cancelled (``cancel()`` returns False):
        the message is already on its way, and the receipt says where it ended.
        """
        if self._serialize is not None:
            body, key = self._serialize(destination, body, key, headers, message_id)
        fast = self._fast
        if (
            fast is not None
            and not fast.resting
            and type(body) is bytes
            and headers is None
            and message_id is None
            and transaction is None
            and type(destination) is str
        ):
            # NOTE: the fast path's common case, inline (every other case, and every send the
            # fast path does not take now, goes the whole way: Envelope.build, _fast_take):
            # a destination checked and not due, bytes, an ASCII or bytes key with
            # nothing of it in the outbox (a refusal pause makes the fast path leave: see
            # Settlement.pause). A frame here costs a tenth of what the raw client
            # spends on a message.
            due = self._admitted.get(destination)
            now = _monotonic()
            if due is not None and due >= now:
                if type(key) is str and key.isascii():
                    key = key.encode()
                if key is None or (type(key) is bytes and not self._has_key(key)):
                    fresh = new_message_id()
                    self._remember(fresh, destination, key, body)
                    future = fast.send(destination, body, key, None, fresh, now)
                    if future is not None:
                        self._count_sent()
                        return future
        envelope = Envelope.build(
            destination, body, key=key, headers=headers, message_id=message_id
        )
        return self._tracked(envelope, transaction)[0]

    def send_envelope(self, envelope: Envelope, *, check_id: bool = False) -> Future[Receipt]:
        """Send a prepared :class:`~msgsafe.message.Envelope` (its id kept): the hook for
        wrappers and sinks that derive ids themselves. Their ids say which messages are
        the same (the Spark sink's ``id_cols``): the producer's check of reused ids
        (see :meth:`send`) is left to them unless ``check_id``."""
        return self._tracked(envelope, None, checked=check_id)[0]

    def timed_out(self, future: Future[Receipt], envelope: Envelope) -> MsgsafeError:
        """The error of a wait for ``future`` (``envelope``'s receipt) that ended at
        ``send_timeout``: :class:`~msgsafe.errors.StoreOutcomeUnknown` naming the outbox
        when the message was on its way into it (it may yet be stored), otherwise
        :class:`~msgsafe.errors.SendTimeout`."""
        if type(future) is Send and future.held:
            return StoreOutcomeUnknown(
                f"the outbox did not answer within send_timeout={self._send_timeout}s",
                destination=envelope.destination,
                endpoint=repr(self._store),
                message_id=envelope.message_id,
            )
        return SendTimeout(
            f"not confirmed or stored within send_timeout={self._send_timeout}s",
            endpoint=self._url.redacted(),
            message_id=envelope.message_id,
        )

    def send_batch(
        self,
        destination: str,
        bodies: Iterable[bytes] | Iterable[Any],
        *,
        keys: Iterable[str | bytes | None] | Iterable[Any] | None = None,
        headers: Mapping[str, str] | None = None,
        message_ids: Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> BatchReceipt:
        """Send many messages to one destination and block until every one is safe.

        The same promise as :meth:`send`, message by message, at a fraction of the cost
        per message: the batch is handed to the adapter in one call and confirmations are
        counted, not resolved one future at a time. ``keys`` (one per body, or None) and
        ``message_ids`` (one per body; default fresh UUIDv7s) are optional columns;
        ``headers`` apply to every message. Messages with the same key keep their batch
        order, behind any of that key waiting in the outbox.

        Returns a :class:`~msgsafe.message.BatchReceipt` (ids in batch order, which were
        stored). Raises :class:`~msgsafe.errors.InvalidMessage` before anything is sent if
        any input is not acceptable; :class:`~msgsafe.errors.BatchFailed` when some
        messages were neither confirmed nor stored (its ``errors`` name them; the caller
        owns those, the rest are safe); :class:`~msgsafe.errors.SendTimeout` after
        ``timeout`` seconds (default ``send_timeout``; the batch goes on, and
        :meth:`flush` waits for it).
        """
        future = self.send_batch_async(
            destination, bodies, keys=keys, headers=headers, message_ids=message_ids
        )
        limit = self._send_timeout if timeout is None else timeout
        try:
            return future.result(limit)
        except FutureTimeout:
            raise SendTimeout(
                f"batch not confirmed or stored within {limit}s", endpoint=self._url.redacted()
            ) from None

    def send_batch_async(
        self,
        destination: str,
        bodies: Iterable[bytes] | Iterable[Any],
        *,
        keys: Iterable[str | bytes | None] | Iterable[Any] | None = None,
        headers: Mapping[str, str] | None = None,
        message_ids: Iterable[str] | None = None,
    ) -> Future[BatchReceipt]:
        """Like :meth:`send_batch` but returns at once with a future of the receipt.

        Invalid input raises here, before anything is sent; every other outcome is the
        future's (``BatchFailed`` for messages neither confirmed nor stored).
        """
        if self._serialize is not None:
            bodies, keys = self._serialized_batch(destination, bodies, keys, headers)
        batch = Batch.build(
            destination, bodies, keys=keys, headers=headers, message_ids=message_ids
        )
        return self.submit_batch(batch)

    def _serialized_batch(
        self,
        destination: str,
        bodies: Iterable[Any],
        keys: Iterable[Any] | None,
        headers: Mapping[str, str] | None,
    ) -> tuple[list[bytes], list[Any] | None]:
        """Each body and key of a batch through the serializers, before any is sent."""
        serialize = cast(Serializers, self._serialize)
        objects = list(bodies)
        key_list = list(keys) if keys is not None else None
        out_bodies: list[bytes] = []
        out_keys: list[Any] = []
        for index, obj in enumerate(objects):
            key = key_list[index] if key_list is not None and index < len(key_list) else None
            body, key = serialize(destination, obj, key, headers)
            out_bodies.append(body)
            out_keys.append(key)
        if key_list is not None and len(key_list) != len(objects):
            out_keys.extend(key_list[len(objects) :])  # Batch.build names the mismatch
        return out_bodies, out_keys if key_list is not None else None

    def serialized(
        self,
        destination: str,
        body: Any,
        key: Any = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
    ) -> tuple[Any, Any]:
        """``(body, key)`` through this producer's serializers (as given without any):
        for wrappers that build envelopes themselves (:meth:`send_envelope`). Raises a
        :class:`~msgsafe.errors.SchemaError`."""
        if self._serialize is None:
            return body, key
        return self._serialize(destination, body, key, headers, message_id)

    def submit_batch(self, batch: Batch) -> Future[BatchReceipt]:
        """Send a prepared :class:`~msgsafe.message.Batch` (its ids kept): the hook for
        sinks that build columns themselves."""
        due = self._admitted.get(batch.destination)
        if due is None or due < time.monotonic():
            self._admit(batch.destination, None)
        telemetry = self._telemetry
        batch, span = telemetry.start_batch(batch)
        future = self._submit_batch(batch)
        telemetry.track_batch(future, len(batch), span)
        return future

    def _submit_batch(self, batch: Batch) -> Future[BatchReceipt]:
        settle = self._settle
        send = BatchSend(settle, batch)
        if not len(batch):
            send.set_result(BatchReceipt(batch.destination, ()))
            return send
        fast = self._fast
        while True:
            if fast is not None and batch.keys is not None:
                # A keyed batch takes the safe way: the fast path leaves first (what it holds
                # is answered), and keeps the batch until then, in order with its sends.
                if not fast.resting:
                    fast.leave()
                    continue
                if fast.switching:
                    if fast.park(send):
                        return send
                    continue
            if self._route_batch(send):
                return send

    def _route_batch(self, send: BatchSend, *, replayed: bool = False) -> bool:
        """Route ``send`` and carry the route out; False when the fast path took single sends
        again meanwhile (nothing was done: :meth:`_submit_batch` goes round again)."""
        settle = self._settle
        batch = send.batch
        count = len(batch)
        # During the refusal pause the batch may go to the store whole (None here).
        held = settle.route_batch(send, self._put_batch_async, replayed=replayed)
        if held is _FAST:
            return False
        if held is None:
            return True
        held = cast(list[int], held)
        if not held:
            self._publish_batch_part(batch, send)
            return True
        for index in held:
            settle.hold(BatchPart(send, index))
        if len(held) < count:
            taken = set(held)
            rest = [i for i in range(count) if i not in taken]
            self._publish_batch_part(batch.select(rest), SubsetReport(send, rest))
        return True

    def hurry(self, receipt: Future[Any], timeout: float | None = None) -> None:
        """Wait until ``receipt`` (a future this producer returned) resolves or ``timeout``
        passes (default ``send_timeout``), having the adapter send what it holds now
        instead of after its batching delay (Kafka's ``linger.ms``). For a caller about
        to block on its last sends; never raises, never resolves anything itself. Returns
        at once on a transport that does not linger (``capabilities.hurry`` False)."""
        if self._hurry is not None:
            self._hurry(receipt, self._send_timeout if timeout is None else timeout)

    def listen_errors(self, listener: ErrorListener | None) -> bool:
        """Have ``listener`` told each connection event of the transport's client library
        as it happens (for Kafka, what confluent-kafka's ``error_cb`` gets; see
        :class:`~msgsafe.ports.ErrorListeningTransport`); ``None`` stops. It runs on the
        library's or a publisher's thread: it must not block, and what it raises is logged
        and dropped. Returns False, and does nothing, when the transport reports no such
        events (``capabilities.listen_errors`` False: RabbitMQ, AMQP 1.0, memory); the
        sends are not affected either way."""
        if self._listen_errors is None:
            return False
        self._listen_errors(listener)
        return True

    def _publish_batch_part(self, batch: Batch, report: BatchSend | SubsetReport) -> None:
        if self._publish_batch is not None:
            self._publish_batch(batch, report)
            return
        callback = self._publish_callback
        for index in range(len(batch)):
            one = OneOfBatch(report, index)
            if callback is not None:
                callback(batch.envelope(index), one)
            else:
                self._transport.publish(batch.envelope(index)).add_done_callback(
                    lambda f, one=one: one(_error_of(f))  # type: ignore[misc]
                )

    def _tracked(
        self,
        envelope: Envelope,
        transaction: Any,
        *,
        waited: bool = False,
        checked: bool = True,
    ) -> tuple[Future[Receipt], Callable[[Future[Receipt]], None] | None]:
        """Submit ``envelope`` with its telemetry. With ``waited`` (a blocking send) and
        OpenTelemetry on, also what ends its span: the caller hands it to the future
        once it stops waiting (see :meth:`ProducerTelemetry.track`). ``checked``: its
        id is refused when it named another message recently (msgsafe._recent_ids)."""
        if envelope.tombstone and not self._tombstones:
            raise InvalidMessage(
                f"{self._url.protocol} messages have no null body: a tombstone"
                " (body=None) is for Kafka only; send b'' for an empty message",
                message_id=envelope.message_id,
            )
        if checked:
            body = None if envelope.tombstone else envelope.body
            self._remember(envelope.message_id, envelope.destination, envelope.key, body)
        due = self._admitted.get(envelope.destination)
        if due is None or due < time.monotonic():
            self._admit(envelope.destination, envelope.message_id, transaction)
        telemetry = self._telemetry
        if not telemetry.tracing:
            future = self._submit(envelope, transaction)
            telemetry.sent_one()  # the outcome is counted by the settlement
            return future, None
        traced, span = telemetry.start(envelope)
        future = self._submit(traced, transaction)
        return future, telemetry.track(future, span, waited=waited)

    def _admit(self, destination: str, message_id: str | None, transaction: Any = None) -> None:
        """Check ``destination`` against ``require`` (see :mod:`msgsafe.checks.gate`).

        Raises :class:`UnsafeDestination` when it is below the requirement. When the check
        could not reach the broker, nothing may be sent there unchecked: with an outbox,
        sending pauses as after a refusal (the message is stored; the forwarder checks
        before it forwards); without one, the error reaches the caller.
        """
        self._check_open()
        try:
            self._check_name(destination)
            self._gate.admit(destination)
        except (InvalidDestination, UnsafeDestination) as exc:
            raise exc.with_id(message_id) from None
        except TransientError as exc:
            if transaction is not None:
                return  # a transactional send only goes to the store
            if self._store is None:
                raise exc.with_id(message_id) from None
            self._settle.pause()

    def _admit_stored(self, destination: str) -> object:
        """The forwarder's check before it forwards to ``destination``: the name (a stored
        name the protocol refuses, from a file older than the check, is quarantined),
        then the gate, fresh (a probe checks when it probes, paced by its backoff)."""
        self._check_name(destination)
        return self._gate.admit(destination, fresh=True)

    def _submit(self, envelope: Envelope, transaction: Any) -> Future[Receipt]:
        settle = self._settle
        if transaction is not None and self._put_in is None:
            if settle.closed:
                raise ClosedError("producer is closed", message_id=envelope.message_id)
            raise ConfigurationError(
                "send(transaction=...) needs a transactional outbox (msgsafe.outbox.PostgresOutbox)"
            )
        fast = self._fast
        if fast is not None and transaction is None:
            taken = self._fast_take(fast, envelope)
            if taken is not None:
                return taken
        result = Send(settle, envelope)
        # The settlement decides (per-key order, the refusal pause, closing); this carries
        # it out.
        route = settle.route(result, transactional=transaction is not None)
        if route is _FAST:
            # The fast path took single sends again meanwhile (or is leaving): to it.
            return self._submit(envelope, transaction)
        self._carry_out(route, result, transaction)
        return result

    def _fast_take(self, fast: FastSender, envelope: Envelope) -> Future[Receipt] | None:
        """Hand ``envelope`` to the transport's fast path (:class:`msgsafe.ports.FastSender`): its
        receipt future, or None when it takes the safe way.

        While the fast path is open it takes the message unless its key has rows in the
        outbox: then the fast path leaves first (what it holds is answered before anything of
        the key goes the safe way; a refusal pause makes it leave as it starts). While
        it leaves, the message is parked there and replayed in order (:meth:`_replay`).
        Once it left, now and then (:data:`_FAST_RETRY_S`) the settlement is asked to
        reopen it.
        """
        settle = self._settle
        while True:
            if not fast.resting:
                key = envelope.key
                if key is not None and self._has_key(key):
                    fast.leave()
                    continue
                future = fast.send(
                    envelope.destination,
                    None if envelope.tombstone else envelope.body,
                    key,
                    envelope.headers or None,
                    envelope.message_id,
                    _monotonic(),
                )
                if future is not None:
                    return future
            elif fast.switching:
                send = Send(settle, envelope)
                if fast.park(send):
                    return send
            else:
                now = _monotonic()
                if now < self._fast_retry_at or settle.closed:
                    return None
                self._fast_retry_at = now + _FAST_RETRY_S
                if not settle.reopen_fast_path(fast):
                    return None

    def _replay(self, item: object) -> None:
        """Send what the fast path parked while it left (a single send or a keyed batch) the
        safe way, now that it holds nothing; its receipt reports every outcome."""
        if isinstance(item, BatchSend):
            try:
                self._route_batch(item, replayed=True)
            except BaseException as exc:
                # No caller to raise to: the batch's future must still resolve.
                if not item.done() and not item.fail_unrouted(_as_msgsafe(exc)):
                    log.exception("a replayed batch failed part way through its route")
            return
        send = cast(Send, item)
        try:
            self._carry_out(self._settle.route(send, replayed=True), send, None)
        except BaseException as exc:
            if not send.done():
                self._settle.resolve(send, None, _as_msgsafe(exc))

    def _carry_out(self, route: Route, result: Send, transaction: Any) -> None:
        """Carry out the settlement's ``route`` for ``result``. The common routes first."""
        settle = self._settle
        envelope = result.envelope
        if route is _PUBLISH:
            self._publish_one(envelope, result)
        elif route is _PUBLISH_COUNTED:
            try:
                self._publish_one(envelope, result)
            except BaseException:
                # No outcome will come for it: its key must not wait behind it.
                settle.left_transport(cast(bytes, envelope.key))  # counted: it has one
                raise
        elif route is _HOLD:
            # NOTE: an earlier message of this key waits in the outbox (sending this one
            # now would overtake it: per-key order), or the broker refused a moment ago
            # (sending would only hammer it): it queues behind, in the outbox.
            result.held = True
            settle.hold(result)
        elif route is _TRANSACTION:
            self._put_in_transaction(transaction, result)
        else:
            raise ClosedError("producer is closed", message_id=envelope.message_id)

    def _publish_one(self, envelope: Envelope, result: Send) -> None:
        if self._publish_callback is not None:
            self._publish_callback(envelope, result)
        else:
            self._transport.publish(envelope).add_done_callback(result.transport_done)

    def _put_in_transaction(self, connection: Any, result: Send) -> None:
        # _submit refused the transaction when the store declares no put_in.
        put_in = cast(Callable[[Any, list[Envelope]], None], self._put_in)
        envelope = result.envelope
        try:
            put_in(connection, [envelope])
        except MsgsafeError as exc:
            self._settle.resolve(result, None, exc)
        except BaseException:
            # Not a msgsafe error (e.g. the driver's): it reaches the caller of send()
            # directly, the future is never returned, and flush() must not wait for it.
            self._settle.settled(1)
            raise
        else:
            self._settle.resolve(
                result,
                new_receipt(
                    envelope.message_id,
                    Status.STORED,
                    envelope.destination,
                    self._gate.guarantees.get(envelope.destination, Guarantee.UNKNOWN),
                    self._settle.store_guarantee,
                ),
            )
            # Rows appear when the caller commits: the store's NOTIFY wakes the forwarder
            # then (where it declares notify), its poll otherwise; wake() only hints.
            if self._forwarder is not None:
                self._forwarder.wake()

    # --- outbox -----------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every ``send_async`` so far is settled (confirmed, stored or
        failed). Returns False if ``timeout`` passed first."""
        fast = self._fast
        if fast is None:
            return self._settle.wait(timeout)
        # The fast path first: what it parked while leaving joins the settlement's count.
        deadline = None if timeout is None else _monotonic() + timeout
        if not fast.wait(timeout):
            return False
        return self._settle.wait(None if deadline is None else max(0.0, deadline - _monotonic()))

    def drain(self, timeout: float | None = None) -> int:
        """Forward the outbox now, for up to ``timeout`` seconds; returns how many remain."""
        self._check_open()
        self.flush(timeout)
        if self._forwarder is None:
            return 0
        return self._forwarder.drain(timeout)

    def pending(self) -> int:
        """How many messages wait in the outbox."""
        if self._store is None:
            return 0
        if self._forwarder is not None:
            return self._forwarder.pending()
        return self._store.stats().depth

    def stats(self) -> ProducerStats:
        """What this producer did since it was created, and its outbox now: sent,
        confirmed, stored, failed (by error type), in flight, drained, outbox depth and
        oldest age, fail-overs and redirects, confirm latency. Works without
        OpenTelemetry; cheap enough to poll (one outbox query)."""
        return self._telemetry.stats()

    @property
    def outbox(self) -> OutboxStore | None:
        """The outbox store, or None when disabled."""
        return self._store

    @property
    def target(self) -> str:
        """The broker URL without credentials."""
        return self._url.redacted()

    def guarantee(self, destination: str) -> Guarantee:
        """What ``destination`` does with a confirmed message, checked now if it never was
        (see the class docstring); raises :class:`UnsafeDestination` when it is below
        ``require``, a :class:`TransientError` when the broker cannot be reached."""
        self._check_open()
        return self._gate.admit(destination)

    # --- lifecycle --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._settle.closed:
            raise ClosedError("producer is closed")

    def close(self, timeout: float | None = 30.0) -> None:
        """Wait up to ``timeout`` for sends in flight, stop the forwarder, disconnect.
        Messages still in the outbox stay there for the next producer. Idempotent."""
        if not self._settle.close():
            return
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if self._fast is not None:
            self._fast.shut()
        self.flush(left())
        if self._fast is not None:
            # What the fast path still holds goes to the outbox while the writer still runs.
            self._fast.close(left())
        if self._forwarder is not None:
            self._forwarder.stop(left())
        self._settle.stop(left())
        self._transport.close(left())
        if self._store is not None:
            self._store.close()
        self._telemetry.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._settle.closed else "open"
        return f"Producer({self._url.redacted()!r}, {state})"


class _FastPathHost:
    """What the transport's fast path needs of a producer (:class:`msgsafe.ports.FastPathHost`).

    Holds the producer weakly: the fast path lives on the transport's threads, which must not
    keep a producer nobody closed alive.
    """

    __slots__ = (
        "_outcomes",
        "_producer",
        "_store",
        "count_confirmed",
        "guarantees",
        "pause",
        "store_guarantee",
        "stores",
    )

    def __init__(self, producer: Producer, settle: Settlement) -> None:
        self._producer = weakref.ref(producer)
        self._outcomes = settle.outcomes
        self._store = producer.outbox
        self.stores = self._store is not None
        self.guarantees = settle.guarantees
        self.store_guarantee = settle.store_guarantee
        self.count_confirmed = settle.outcomes.count_confirmed
        self.pause = settle.pause

    def count_outcomes(self, units: int, error: BaseException | None) -> None:
        self._outcomes.stored(units, error)

    def store_refused(self, envelopes: Sequence[Envelope]) -> OutboxError | None:
        return store_refused(self._store, envelopes)

    def replay(self, item: object) -> None:
        producer = self._producer()
        if producer is not None:
            producer._replay(item)


def _no_key(_key: bytes) -> bool:
    return False


def _as_msgsafe(exc: BaseException) -> MsgsafeError:
    """``exc`` itself, or a MsgsafeError that names it (a receipt fails with these)."""
    if isinstance(exc, MsgsafeError):
        return exc
    return MsgsafeError(f"{type(exc).__name__}: {exc}")


def _error_of(future: Future[None]) -> MsgsafeError | None:
    exc = future.exception()
    return None if exc is None else _as_msgsafe(exc)

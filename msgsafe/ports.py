"""The seams of msgsafe, as Protocols, and what each implementation declares.

Everything above a seam depends on these Protocols, never on pika, confluent_kafka or
proton types. A new adapter is this module plus one folder under ``msgsafe/adapters/``
(the shape every folder has is in :mod:`msgsafe.adapters`); a new outbox store is this
module plus one class.

An adapter must implement:

- :class:`Transport` (publishing): ``target``, ``publish``, ``close`` and
  ``capabilities``, a :class:`TransportCapabilities` record;
- :class:`Receiver` (consuming): ``subscribe``, ``receive``, ``close``.

and may offer, each behind a flag of its record that promises it:

- ``callback``: :class:`CallbackTransport`, the same publishing with a callback instead
  of a future per message;
- ``batch``: :class:`BatchTransport`, many messages to one destination in one call with
  one :class:`BatchReport`;
- ``hurry``: :class:`HurryingTransport`, which stops batching-by-waiting for a caller
  blocked on one message;
- ``listen_errors``: :class:`ErrorListeningTransport`, the client library's connection
  events as they happen;
- ``fast_path``: :class:`FastPathTransport`, a :class:`FastSender` that takes single sends
  straight to the client library while nothing is wrong, and steps aside (to the producer's
  per-key bookkeeping) at the first sign of trouble;

and declare two properties of its wire: ``tombstones`` (an envelope with a null body is
sent as one) and ``ordered_rounds`` (order per key holds across calls and
reconnects). An outbox store implements :class:`OutboxStore` and declares a
:class:`StoreCapabilities` record the same way (``claim_rows``, ``put_batch_async``,
``transactional``, ``release``, ``pending``, ``notify``), and the longest lease it grants
(``lease_s``) where it caps leases. An inbox implements :class:`InboxStore` and may
declare an :class:`InboxCapabilities` record (``batch``: :class:`BatchInboxStore`).

Capabilities are declared, not probed: the producer, the forwarder and the CLI read the
record once, when they are built, and call what it promises without looking for it
(``tests/unit/test_capabilities_declared.py`` keeps it so). :func:`transport_capabilities`,
:func:`store_capabilities` and :func:`inbox_capabilities` are the one place that looks:
an implementation written before the records existed, which has no ``capabilities``,
declares nothing optional. A
flag set to True is a promise the contract suite (``tests/contract/``) holds every
adapter and store to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeGuard, TypeVar, runtime_checkable

from msgsafe._futures import LightFuture
from msgsafe.errors import MsgsafeError, OutboxError
from msgsafe.message import Batch, Delivery, Envelope

__all__ = [
    "AttemptCounter",
    "BatchPutStore",
    "BatchReport",
    "BatchTransport",
    "CallbackTransport",
    "CountingStore",
    "ErrorListener",
    "ErrorListeningTransport",
    "HurryingTransport",
    "BatchInboxStore",
    "InboxCapabilities",
    "InboxStore",
    "FastSender",
    "FastPathHost",
    "FastPathTransport",
    "NotifyingStore",
    "OutboxStats",
    "OutboxStore",
    "Processed",
    "ProcessedBatch",
    "PublishCallback",
    "PublishFuture",
    "Receiver",
    "ReleasingStore",
    "RenewingStore",
    "RowClaimingStore",
    "SafePath",
    "StoreCapabilities",
    "TransactionalStore",
    "Transport",
    "TransportCapabilities",
    "inbox_capabilities",
    "is_outbox_store",
    "store_capabilities",
    "transport_capabilities",
]

log = logging.getLogger("msgsafe.transport")

#: What :meth:`CallbackTransport.publish_callback` reports to, once per envelope:
#: ``None`` when the broker confirmed it, otherwise the error.
PublishCallback = Callable[[MsgsafeError | None], None]

#: What :meth:`ErrorListeningTransport.listen_errors` tells, once per event: the client
#: library's own error object (for Kafka, a ``confluent_kafka.KafkaError``).
ErrorListener = Callable[[Any], object]


@dataclass(frozen=True, slots=True)
class TransportCapabilities:
    """What a :class:`Transport` offers beyond ``publish``, declared once.

    Every flag defaults to False: ``TransportCapabilities()`` is the minimal transport,
    which the layers above drive through ``publish`` alone. A flag set to True is a
    promise: the method it names exists and keeps the contract of its Protocol, or the
    wire property holds, for the transport's whole life (the record is read once, when
    the producer or forwarder is built). The contract suite checks each promise.
    """

    #: A :class:`CallbackTransport`: ``publish_callback(envelope, callback)`` keeps every
    #: rule of ``publish`` and calls ``callback`` exactly once. The producer then holds
    #: no future per message besides the receipt.
    callback: bool = False
    #: A :class:`BatchTransport`: ``publish_batch(batch, report)`` reports every message
    #: of the batch exactly once (confirmed by count, failed by index). The producer's
    #: ``send_batch`` and the forwarder's rounds then go out as batches.
    batch: bool = False
    #: A :class:`HurryingTransport`: ``hurry(done, timeout)`` sends what the transport
    #: lingers on until ``done`` resolves. A blocking ``send`` then skips the linger.
    hurry: bool = False
    #: An envelope marked ``tombstone`` is sent with a null body (a Kafka record with a
    #: null value, not an empty one, as any consumer of the topic reads it). False: the
    #: producer refuses a tombstone with :class:`~msgsafe.errors.InvalidMessage` before
    #: anything is sent.
    tombstones: bool = False
    #: What is handed over later reaches the broker later on each key's ordered channel,
    #: across calls, also after a reconnect (what was unanswered goes again first): one
    #: Kafka idempotent producer, one RabbitMQ channel, one AMQP 1.0 link. The outbox
    #: forwarder may then claim its next round while the last is answered, with a store
    #: that declares ``claim_rows``; it publishes that round only once every answer of
    #: the last is in, and releases it unsent after any failure
    #: (:mod:`msgsafe.outbox.forwarder`). Without it, rounds never overlap.
    ordered_rounds: bool = False
    #: An :class:`ErrorListeningTransport`: ``listen_errors(listener)`` reports the client
    #: library's connection events (``Producer.listen_errors`` forwards to it).
    listen_errors: bool = False
    #: A :class:`FastPathTransport`: ``open_fast_path(host)`` gives the producer a
    #: :class:`FastSender` for its single sends (see there). Only where the wire keeps
    #: each key's order across a failure the fast path can see (Kafka with idempotence).
    fast_path: bool = False

    def publish_only(self) -> TransportCapabilities:
        """The record of a wrapper that forwards only ``publish`` to a transport declaring
        this one: the properties of the wire hold through it (``tombstones``,
        ``ordered_rounds``: the wrapper publishes what it is handed, in that order), no
        optional method does."""
        return TransportCapabilities(tombstones=self.tombstones, ordered_rounds=self.ordered_rounds)


@dataclass(frozen=True, slots=True)
class StoreCapabilities:
    """What an :class:`OutboxStore` offers beyond its required methods, declared once.

    As for :class:`TransportCapabilities`: all False is the minimal store, and each True
    is a promise that the named method exists and keeps the contract of its Protocol.
    """

    #: A :class:`RowClaimingStore`: ``claim_rows(limit=, lease_s=, follow=)`` claims as
    #: ``claim`` does, without an envelope object per row, and can continue keys whose
    #: earlier rows the caller holds in flight. With a transport's ``ordered_rounds``, the
    #: forwarder overlaps its rounds.
    claim_rows: bool = False
    #: A :class:`BatchPutStore`: ``put_batch_async(batch)`` stores every message of a
    #: :class:`~msgsafe.message.Batch` as ``put`` stores its envelopes (each key's in
    #: batch order), all or none, and returns a future resolved once durable. During the
    #: refusal pause the producer then stores a batch whole.
    put_batch_async: bool = False
    #: A :class:`TransactionalStore`: ``put_in(connection, envelopes)`` writes through the
    #: caller's connection inside its open transaction (``send(transaction=...)``).
    transactional: bool = False
    #: A :class:`ReleasingStore`: ``release(items, retry_at=)`` is ``failed(id, error=,
    #: retry_at=)`` for many leased messages in one write.
    release: bool = False
    #: A :class:`CountingStore`: ``pending()`` is ``stats().depth``, cheap enough to ask
    #: in a loop (``drain`` asks after every round).
    pending: bool = False
    #: A :class:`NotifyingStore`: ``listen(wake)`` calls ``wake()`` whenever rows are put
    #: by any process sharing the store (PostgreSQL's LISTEN/NOTIFY). A started
    #: forwarder then listens, so that another process's put is forwarded at once rather
    #: than at its next poll.
    notify: bool = False
    #: A :class:`RenewingStore`: ``renew(ids, lease_s=)`` extends a claim's lease when
    #: the claimer still holds every row of it, and says so; a claim another claimer
    #: took over after its lease ran out is given up. Its settling (``delivered``,
    #: ``failed``, ``release``) touches only rows the claimer still holds. A forwarder
    #: renews a claim before publishing it when the claim has grown old (it was paused).
    renew: bool = False
    #: The longest lease, in seconds, that the store grants a claim (None: the lease the
    #: claimer asks for). A store shared by many processes caps it, so that a dead
    #: forwarder's rows come back soon; a forwarder of such a store times its rounds by
    #: the shorter of its own lease and this one.
    lease_s: float | None = None


_NO_TRANSPORT_CAPABILITIES = TransportCapabilities()
_NO_STORE_CAPABILITIES = StoreCapabilities()


@runtime_checkable
class Transport(Protocol):
    """The publishing half of an adapter. Owns its connection(s) and I/O thread.

    Contract:

    - All methods are thread-safe and never block on the network except ``close``.
    - ``publish`` pipelines: many envelopes may be in flight at once, bounded by the
      adapter's window (``publish`` then waits for room, at most the adapter's
      ``confirm_timeout``, and fails the future with :class:`~msgsafe.errors.Refused`).
    - The returned future resolves with ``None`` only when the broker gave its strongest
      acknowledgement for that envelope (publisher confirm of a persistent, mandatory
      message; Kafka ``acks=all`` delivery report; AMQP 1.0 ``accepted``).
    - Otherwise it fails with a :class:`~msgsafe.errors.MsgsafeError`:
      :class:`~msgsafe.errors.TransientError` (``maybe_delivered`` tells whether the
      broker may hold it) or :class:`~msgsafe.errors.PermanentError`. Never a
      third-party exception, never silently dropped.
    - An adapter may retry internally across fail-over (same envelope, same id) but must
      resolve every future within ``confirm_timeout`` of the call.
    - Envelopes with the same ``key`` reach the broker in ``publish`` call order
      while the connection holds.
    - ``close`` is idempotent: it waits up to ``timeout`` for outstanding confirms, then
      fails the rest with :class:`~msgsafe.errors.ConnectionLost` and releases resources.
    - ``capabilities`` declares what else it offers (:class:`TransportCapabilities`);
      nobody looks for a method it does not declare.
    """

    @property
    def target(self) -> str:
        """The redacted URL this transport publishes to (no credentials)."""
        ...

    @property
    def capabilities(self) -> TransportCapabilities:
        """What this transport offers beyond ``publish``; an equal record every time."""
        ...

    def publish(self, envelope: Envelope) -> Future[None]:
        """Send ``envelope``; the future resolves when the broker confirmed it."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Flush outstanding confirms for up to ``timeout`` seconds, then disconnect."""
        ...


@runtime_checkable
class CallbackTransport(Transport, Protocol):
    """A transport that can also report to a callback instead of a future
    (``capabilities.callback``).

    ``publish_callback(envelope, callback)`` keeps every rule of ``publish`` and calls
    ``callback`` exactly once: with ``None`` when the broker confirmed the envelope,
    or with the :class:`~msgsafe.errors.MsgsafeError` the future would have failed
    with. The call may come before ``publish_callback`` returns (on the caller's
    thread) or later on any thread where the adapter serves confirms, so the callback
    must be quick and must not block; an exception it raises is logged and dropped.

    It exists for the per-message cost: a ``Future`` is several objects and a lock,
    and the producer already holds one future per message (the receipt). Callers
    that only know :class:`Transport` use ``publish``.
    """

    def publish_callback(self, envelope: Envelope, callback: PublishCallback) -> None:
        """Send ``envelope``; ``callback`` learns the outcome, exactly once."""
        ...


@runtime_checkable
class HurryingTransport(Transport, Protocol):
    """A transport that batches by waiting (Kafka's ``linger.ms``) and can stop waiting
    for a caller that blocks on one message (``capabilities.hurry``).

    ``hurry(done, timeout)`` returns once ``done`` is resolved or ``timeout`` seconds
    passed, sending what the transport holds without lingering meanwhile; it never
    resolves ``done`` itself and never raises. A blocking ``send`` gains nothing from
    the linger (nothing else of its own will join the batch) and would pay it per call.
    """

    def hurry(self, done: Future[Any], timeout: float) -> None:
        """Send without lingering until ``done`` resolves or ``timeout`` passes."""
        ...


class BatchReport(Protocol):
    """What :meth:`BatchTransport.publish_batch` reports to.

    For a batch of ``n`` messages the adapter calls ``confirmed(k)`` for messages the
    broker confirmed (``k`` at a time, in any grouping) and ``failed(i, error)`` for
    message ``i`` that it could not confirm, so that the counts and the failures add
    up to exactly ``n``: every message is reported once. Calls may come before
    ``publish_batch`` returns or later on any thread where the adapter serves confirms;
    they must be quick and must not block.
    """

    def confirmed(self, count: int) -> None:
        """``count`` more messages of the batch were confirmed by the broker."""
        ...

    def failed(self, index: int, error: MsgsafeError) -> None:
        """Message ``index`` was not confirmed: ``error`` says why (as ``publish``'s
        future would: transient with ``maybe_delivered``, or permanent)."""
        ...


@runtime_checkable
class BatchTransport(Transport, Protocol):
    """A transport that can publish a :class:`~msgsafe.message.Batch` in one call
    (``capabilities.batch``).

    Every rule of ``publish`` holds for each message of the batch (same confirmation,
    same error classes, same ``confirm_timeout``, per-key order in index order); the
    difference is cost: no future and no envelope object per message. A message that
    is too large or otherwise unacceptable fails alone (``report.failed``), the others
    go on.
    """

    def publish_batch(self, batch: Batch, report: BatchReport) -> None:
        """Send every message of ``batch``; ``report`` learns each outcome once."""
        ...


@runtime_checkable
class ErrorListeningTransport(Transport, Protocol):
    """A transport that reports its client library's connection events
    (``capabilities.listen_errors``).

    ``listen_errors(listener)`` has ``listener`` told each global error event of the
    client library (for Kafka, what confluent-kafka's ``error_cb`` gets: ``_TRANSPORT``,
    ``_ALL_BROKERS_DOWN``, ``_AUTHENTICATION``, ...) as it happens, before the transport
    acts on it; ``None`` stops. It runs on the library's or a publisher's thread: it must
    not block, and what it raises is logged and dropped. The events change nothing the
    transport promises: messages still fail or are confirmed as ``publish`` says.
    """

    def listen_errors(self, listener: ErrorListener | None) -> None:
        """Tell ``listener`` each connection event from now on; ``None`` stops."""
        ...


class SafePath(Protocol):
    """What a fast path (:class:`msgsafe.fastpath.FastPath`) needs of the safe path behind
    it, msgsafe's :class:`~msgsafe.Producer`: its destination check, and its backlog."""

    def guarantee(self, destination: str) -> Any:
        """What ``destination`` does with a confirmed message (checked once, cached by the
        fast path); raises the safe path's refusal or its ``TransientError``."""
        ...

    def pending(self) -> int:
        """How many messages wait in the outbox (0: none a fast send could overtake)."""
        ...


class FastPathHost(Protocol):
    """What a :class:`FastSender` needs from the producer that opened it."""

    @property
    def stores(self) -> bool:
        """Whether an outbox takes what the fast path cannot deliver (False: failures are the
        caller's errors, nothing is stored). The fast path never holds the store itself."""
        ...

    def store_refused(self, envelopes: Sequence[Envelope]) -> OutboxError | None:
        """Write ``envelopes`` (the fast path's undelivered sends, in send order) to the outbox
        in one put (:func:`msgsafe.fastpath.store_refused`); None when stored, otherwise
        the error each of them fails with."""
        ...

    @property
    def guarantees(self) -> Mapping[str, Any]:
        """Each checked destination's guarantee, for the receipts."""
        ...

    @property
    def store_guarantee(self) -> Any:
        """The outbox's guarantee, for STORED receipts (None without an outbox)."""
        ...

    def count_confirmed(self) -> object:
        """One send confirmed (cheap: called once per message, on the I/O thread)."""
        ...

    def count_outcomes(self, units: int, error: BaseException | None) -> None:
        """``units`` sends ended without a confirm: stored (``error`` None), or failed."""
        ...

    def replay(self, item: object) -> None:
        """Send ``item`` (what :meth:`FastSender.park` took) the safe way, as if it were sent
        now: called in park order, once every message the fast path held is settled."""
        ...

    def pause(self) -> None:
        """Start the refusal pause: the broker refused a moment ago."""
        ...


@runtime_checkable
class FastSender(Protocol):
    """Single sends straight to the client library while nothing is wrong
    (``capabilities.fast_path``); the producer's way while it is not :attr:`resting`.
    Its states are :class:`msgsafe.fastpath.FastPath`'s (open, switching, resting).

    The contract, for per-key order and the promise:

    - :meth:`send` hands a message over and returns its receipt future, or None when
      the fast path rests (now): the caller then parks it or takes the safe way.
    - Every failure the outbox takes (a transient error with a store), every sign that
      the brokers are down, and :meth:`leave` make the fast path switch (resting and
      :attr:`switching`): new sends are parked (:meth:`park`), what the client library
      holds is settled (failures purge the rest: it may have been written, so it may
      come twice, with its id), the failed messages go to the store in send order in
      one put, then the parked items go to ``host.replay`` in park order, then it
      rests, switching and :attr:`holds` False. No message of a stored key was
      confirmed after it (the wire's order guarantee).
    - :meth:`reopen` (resting to open) is the host's to call, only while nothing of
      its own is unsettled and the store holds nothing.
    """

    #: Sends take the safe way (switching, resting, or shut).
    resting: bool
    #: The fast path empties what it holds: sends are parked.
    switching: bool
    #: It may hold messages of its own (open, or switching): keyed sends belong to it.
    holds: bool

    def send(
        self,
        destination: str,
        body: bytes | None,
        key: bytes | None,
        headers: Mapping[str, str] | None,
        message_id: str,
        now: float,
    ) -> Future[Any] | None:
        """Hand one message over (``body`` None: a tombstone) at ``now`` (the caller's
        ``time.monotonic()``, read once per send); its receipt future, or None when the
        fast path rests. Raises ``ClosedError`` after :meth:`shut`."""
        ...

    def park(self, item: object) -> bool:
        """Keep ``item`` for ``host.replay`` while switching; False in another state.
        Raises ``ClosedError`` after :meth:`shut`."""
        ...

    def leave(self) -> None:
        """Switch without a failure (the host has a send the fast path cannot take)."""
        ...

    def reopen(self) -> bool:
        """Resting to open, unless the fast path itself sees trouble (call under
        the host's own lock, with nothing of the host's unsettled)."""
        ...

    def wait(self, timeout: float | None) -> bool:
        """Wait until every send handed over so far is settled and the fast path is not
        leaving; False if ``timeout`` passed first."""
        ...

    def shut(self) -> None:
        """Refuse every send from now on."""
        ...

    def close(self, timeout: float | None) -> None:
        """Give what the fast path holds ``timeout`` to settle, then store the rest."""
        ...


@runtime_checkable
class FastPathTransport(Transport, Protocol):
    """A transport that offers the producer a :class:`FastSender` (``capabilities.fast_path``)."""

    def open_fast_path(self, host: FastPathHost) -> FastSender:
        """A new fast path over this transport's connection (the same ordered channel its
        ``publish_callback`` and ``publish_batch`` use)."""
        ...


class PublishFuture(LightFuture[None]):
    """The future ``publish`` returns, and the callback that resolves it: adapters
    built on ``publish_callback`` hand this object over as the callback."""

    __slots__ = ()

    def __call__(self, error: MsgsafeError | None) -> None:
        try:
            if error is None:
                self.set_result(None)
            else:
                self.set_exception(error)
        except InvalidStateError:
            # Only a caller's cancel() gets here first; the outcome has no reader left.
            log.debug("publish outcome after cancel: %r", error)


@runtime_checkable
class Receiver(Protocol):
    """The consuming half of an adapter.

    Contract: ``subscribe`` may be called before the first ``receive``; ``receive``
    blocks up to ``timeout`` (None: until at least one message) and returns at most
    ``max_messages`` deliveries, each settled through its own ``ack``/``nack``
    (at-least-once: an unsettled delivery is redelivered after a crash or fail-over).
    Deliveries carry ``message_id`` from the native id field or the ``msgsafe-id`` header.
    Thread-safe; ``close`` is idempotent and requeues what was not settled.

    A delivery settles with every :class:`~msgsafe.message.Outcome`, the same on every
    receiver (no flag to declare): ``REQUEUE`` (``nack()``) gives back a message that was
    tried and failed, and raises the broker's delivery count where it keeps one;
    ``RELEASE`` (``release()``) gives back a message that was not tried (prefetched,
    peeked, not started before a stop) and raises no count where the protocol can say so
    (AMQP 1.0 ``released``); elsewhere it is ``REQUEUE``. What ``close`` gives back
    unread it releases.
    """

    def subscribe(self, destination: str) -> None:
        """Start consuming from ``destination`` (a queue, topic or address)."""
        ...

    def receive(self, *, max_messages: int, timeout: float | None) -> list[Delivery]:
        """Up to ``max_messages`` deliveries, waiting at most ``timeout`` seconds."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Stop consuming; unsettled deliveries go back to the broker."""
        ...


@runtime_checkable
class AttemptCounter(Protocol):
    """The consumer's own count of deliveries per message id, for brokers that keep none
    (Kafka, RabbitMQ classic queues, the memory broker): what ``Delivery.attempt`` says
    there.

    Contract: :meth:`delivered` counts one more delivery of ``message_id`` and returns
    which attempt it is (1 the first time; at least 2 when the broker marked it
    ``redelivered``, as an earlier delivery happened that the counter may not know of);
    :meth:`retried` sets the count after a retry the consumer made itself; :meth:`forget`
    drops a message settled for good. Thread-safe. The in-memory implementation
    (:class:`~msgsafe.dedup.AttemptMemory`) counts within one process; a durable one
    counts across restarts.
    """

    def delivered(self, message_id: str, *, redelivered: bool) -> int:
        """Count one delivery of ``message_id``; the attempt it is (1 on the first)."""
        ...

    def retried(self, message_id: str, attempt: int) -> None:
        """``message_id`` is being tried for the ``attempt``-th time, in this process."""
        ...

    def forget(self, message_id: str) -> None:
        """``message_id`` was settled for good (acknowledged, rejected, dead-lettered)."""
        ...


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """A snapshot of an outbox."""

    depth: int  #: messages waiting to be forwarded (claimed or not)
    bytes: int  #: their payload bytes
    oldest_age_s: float | None  #: age of the oldest waiting message, None when empty
    quarantined: int  #: messages moved aside after a permanent error
    #: True once the store's file is no longer at its path (removed, replaced): the
    #: messages counted are lost if the process ends before they are forwarded.
    gone: bool = False
    #: True when ``depth`` and ``bytes`` are estimates, not counts: a PostgreSQL outbox
    #: counts up to 100,000 waiting rows and estimates beyond (see
    #: :meth:`msgsafe.outbox.postgres.PostgresOutbox.stats`).
    estimated: bool = False


@runtime_checkable
class OutboxStore(Protocol):
    """Durable storage of envelopes that the broker could not take yet.

    Contract:

    - ``put`` returns only when the envelopes are durable (fsync'd); it raises
      :class:`~msgsafe.errors.OutboxFull` on a bound or a full disk and then stores
      none of them. Thread-safe; concurrent puts may share one fsync (group commit).
    - ``claim`` leases up to ``limit`` ready envelopes for ``lease_s`` seconds, oldest
      first, and never two of the same key out of order: for each key it returns a
      prefix of that key's queue, and nothing of a key whose head is leased or waiting
      for ``retry_at``. A lease that expires (the claimer died) makes them ready again.
    - ``delivered`` removes envelopes for good; ``failed`` releases one with a
      ``retry_at`` (epoch seconds), or quarantines it when ``retry_at`` is None.
    - ``has_key`` answers whether any envelope of ``key`` waits (the ordering barrier).
    - ``capabilities`` declares what else it offers (:class:`StoreCapabilities`).
    """

    @property
    def capabilities(self) -> StoreCapabilities:
        """What this store offers beyond the required methods; an equal record every time."""
        ...

    def put(self, envelopes: Sequence[Envelope]) -> None:
        """Store ``envelopes`` durably, all or none."""
        ...

    def claim(self, *, limit: int, lease_s: float) -> list[Envelope]:
        """Lease up to ``limit`` ready envelopes, per-key order kept."""
        ...

    def delivered(self, ids: Sequence[str]) -> None:
        """Remove envelopes the broker confirmed."""
        ...

    def failed(self, message_id: str, *, error: str, retry_at: float | None) -> None:
        """Release a leased envelope for a later retry, or quarantine it (``retry_at=None``)."""
        ...

    def has_key(self, key: bytes) -> bool:
        """True while any envelope of ``key`` waits in the store."""
        ...

    def stats(self) -> OutboxStats:
        """Depth, bytes, oldest age and quarantined count."""
        ...

    def close(self) -> None:
        """Release the file and locks. Idempotent."""
        ...


@runtime_checkable
class RowClaimingStore(OutboxStore, Protocol):
    """A store whose claim needs no envelope per row and can follow keys
    (``capabilities.claim_rows``).

    ``claim_rows(limit=, lease_s=, follow=)`` keeps every rule of ``claim`` and returns
    a sequence of envelopes (which may be read column by column, see
    :class:`~msgsafe.outbox._rows.ClaimedRows`). ``follow`` maps a key to how many of its
    rows the caller holds in flight: for such a key the claim continues after them
    instead of stopping at the leased head (see :mod:`msgsafe.outbox._claims`).
    """

    def claim_rows(
        self, *, limit: int, lease_s: float, follow: Mapping[bytes, int] | None = None
    ) -> Sequence[Envelope]:
        """Lease up to ``limit`` ready envelopes, per-key order kept, following ``follow``."""
        ...


@runtime_checkable
class BatchPutStore(OutboxStore, Protocol):
    """A store that takes a whole :class:`~msgsafe.message.Batch` in one put
    (``capabilities.put_batch_async``).

    ``put_batch_async(batch)`` stores ``batch.envelope(i)`` for every ``i``, each key's
    messages in batch order (the store may keep a key's messages together, ahead of a
    later key's: only per-key order is promised), all or none, with ``put``'s bounds,
    and returns at once; the future resolves once every message is durable, or fails
    with the error ``put`` would have raised.
    """

    def put_batch_async(self, batch: Batch) -> Future[None]:
        """Store every message of ``batch`` durably; the future says when (or why not)."""
        ...


@runtime_checkable
class TransactionalStore(OutboxStore, Protocol):
    """A store that writes inside the caller's transaction (``capabilities.transactional``).

    ``put_in(connection, envelopes)`` writes the rows through ``connection`` and commits
    nothing: they exist, and are forwarded, only if the caller's transaction commits.
    It raises :class:`~msgsafe.errors.OutboxError` (or ``OutboxFull``) when it cannot.
    """

    def put_in(self, connection: Any, envelopes: Sequence[Envelope]) -> None:
        """Write ``envelopes`` through ``connection`` inside its open transaction."""
        ...


@runtime_checkable
class ReleasingStore(OutboxStore, Protocol):
    """A store that releases many leased envelopes in one write (``capabilities.release``).

    ``release(items, retry_at=)`` is ``failed(id, error=text, retry_at=retry_at)`` for
    every ``(id, text)`` of ``items``: each is ready again at ``retry_at``.
    """

    def release(self, items: Sequence[tuple[str, str]], *, retry_at: float) -> None:
        """Release the leased envelopes ``(id, error)`` until ``retry_at``."""
        ...


@runtime_checkable
class RenewingStore(OutboxStore, Protocol):
    """A store whose leases carry an epoch (``capabilities.renew``): each claim gets a
    new one, written on its rows, and a row is settled (deleted, released, quarantined)
    only while it still carries the epoch of the claim that leased it here.

    ``renew(ids, lease_s=)``: when every one of ``ids`` (rows of claims made through
    this store) still carries its claim's epoch, their lease runs ``lease_s`` from now
    and it returns True. Otherwise another claimer took some over after the lease ran
    out: the store gives up the claim (the rows it still holds are ready again at once,
    the others are left to their new holder), logs it once at WARNING and returns
    False; the caller must send none of them.
    """

    def renew(self, ids: Sequence[str], *, lease_s: float) -> bool:
        """True once the lease of ``ids`` is extended; False when it was lost."""
        ...


@runtime_checkable
class CountingStore(OutboxStore, Protocol):
    """A store that counts what waits cheaply (``capabilities.pending``).

    ``pending()`` equals ``stats().depth`` (quarantined messages not counted) without
    the rest of the snapshot's cost.
    """

    def pending(self) -> int:
        """How many envelopes wait in the store."""
        ...


@runtime_checkable
class NotifyingStore(OutboxStore, Protocol):
    """A store that tells when rows were put, by this process or any other sharing it
    (``capabilities.notify``).

    ``listen(wake)`` has ``wake()`` called after every committed put (and replay) into the
    store, from a thread of the store's own, until the store is closed; and once each
    time it (re)starts listening, since rows may have come while it was not. ``wake``
    must be quick and must not block (a hint: the caller looks at the store itself). A
    wake-up lost to a broken connection is made up by that reconnect call; callers still
    poll for what no put announces (leases that ran out).
    """

    def listen(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` after each committed put into the store, until :meth:`close`."""
        ...


# --- the inbox: a consumer's record of the messages it handled ------------------------------

#: What an inbox's ``work`` returns.
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Processed(Generic[R]):
    """What :meth:`InboxStore.process` did: ``ran`` True when ``work`` ran and committed
    with the message id (``value`` is what it returned); False when the id was recorded
    already and ``work`` was not called (``value`` None)."""

    ran: bool
    value: R | None = None


@runtime_checkable
class InboxStore(Protocol):
    """Message ids a consumer has handled, recorded in the handler's own database in the
    same transaction as the handler's writes (:mod:`msgsafe.inbox`).

    Contract:

    - ``process(id, work, source=, attempt=)`` opens a transaction on the inbox's
      database, records ``id`` (with ``source``, ``attempt`` and the time), calls
      ``work(tx)`` — ``tx`` a DB-API connection inside that open transaction, which
      ``work`` writes its effects through and must neither commit nor roll back — and
      commits both at once. It returns ``Processed(ran=True, value=work's answer)`` once
      the commit is known to have happened, and ``Processed(ran=False)`` without calling
      ``work`` when ``id`` is recorded already. If ``work`` raises, the transaction is
      rolled back (the id is not recorded, none of ``work``'s writes are kept) and the
      exception propagates unchanged. Concurrent calls for one id, from threads,
      processes or a fleet of hosts on one database: exactly one runs ``work`` to a
      commit, the others return ``ran=False`` (if that one rolls back, another runs).
      ``work`` may run more than once for one call when the database connection is lost
      before the commit (each earlier run was rolled back with it): like a redelivery,
      it must not do what it cannot undo outside ``tx``.
    - ``handled(ids)``: the ids of ``ids`` recorded (one query).
    - ``record_attempt(id, source=)``: for brokers that count no redeliveries (Kafka,
      classic queues), a durable counter per id not yet handled: incremented and
      committed in a transaction of its own; returns the new count (1 the first time);
      survives restarts; the count is dropped when ``id`` is processed.
    - ``prune(older_than_s=)`` deletes records (and attempt counters) older than that;
      returns how many. Keep ids at least as long as a producer may redeliver them
      (the outbox's longest wait plus the broker's retention): an id pruned sooner is
      handled again if it comes back.
    - The database's errors are :class:`~msgsafe.errors.InboxError` (never with
      credentials); :class:`~msgsafe.errors.InboxUnavailable` when it took no writes
      in time. Thread-safe; ``close`` is idempotent, a call after it raises
      :class:`~msgsafe.errors.ClosedError`.
    """

    def process(
        self, message_id: str, work: Callable[[Any], R], *, source: str, attempt: int = 1
    ) -> Processed[R]:
        """Run ``work(tx)`` and record ``message_id`` in one transaction, once per id."""
        ...

    def handled(self, message_ids: Sequence[str]) -> set[str]:
        """Which of ``message_ids`` are recorded."""
        ...

    def record_attempt(self, message_id: str, *, source: str) -> int:
        """Count one more attempt at an unhandled ``message_id``, durably; the new count."""
        ...

    def prune(self, *, older_than_s: float) -> int:
        """Delete records older than ``older_than_s`` seconds; how many."""
        ...

    def close(self) -> None:
        """Close the inbox's connections. Idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class ProcessedBatch(Generic[R]):
    """What :meth:`BatchInboxStore.process_batch` did: ``fresh``, the indexes (in the
    order given) of the ids it recorded, whose messages ``work`` handled and committed
    with them (``value`` is what it returned); the others were recorded already, and
    ``work`` was not called when none is fresh (``value`` None)."""

    fresh: tuple[int, ...]
    value: R | None = None


@dataclass(frozen=True, slots=True)
class InboxCapabilities:
    """What an :class:`InboxStore` offers beyond its required methods, declared once as
    :class:`StoreCapabilities` is for outbox stores (all False: the minimal inbox)."""

    #: A :class:`BatchInboxStore`: ``process_batch`` records many ids with one
    #: ``work(fresh, tx)`` in one transaction, and ``record_attempts`` counts the attempts
    #: of many unhandled ids in one statement. ``Consumer.run(batch=...)`` needs it.
    batch: bool = False


@runtime_checkable
class BatchInboxStore(InboxStore, Protocol):
    """An inbox that handles a run of messages in one transaction
    (``capabilities.batch``).

    - ``process_batch(records, work)``: ``records`` are ``(id, source, attempt)``;
      opens one transaction, records every id not recorded yet (an id recorded already,
      or twice in ``records``, is fresh once at most), calls ``work(fresh, tx)`` with
      the indexes of the fresh ones in ``records`` order, and commits the records and
      ``work``'s writes at once — ``process``'s contract for each id, the transaction
      shared. No fresh id: ``work`` is not called. ``work`` raising rolls back every
      record of the call and propagates unchanged.
    - ``record_attempts(items)``: ``items`` are ``(id, source)``, the ids distinct; for
      each id not recorded as handled, ``record_attempt``'s durable count incremented,
      all in one committed statement. Returns the new counts of those ids; a handled id
      is absent (and not counted): ``handled`` and ``record_attempt`` in one round trip.
    """

    def process_batch(
        self, records: Sequence[tuple[str, str, int]], work: Callable[[list[int], Any], R]
    ) -> ProcessedBatch[R]:
        """Record the ids of ``records`` not recorded yet and run ``work`` for them in one
        transaction."""
        ...

    def record_attempts(self, items: Sequence[tuple[str, str]]) -> dict[str, int]:
        """Count one more attempt at each unhandled id of ``items``; their new counts."""
        ...


# --- the one place that looks -------------------------------------------------------------


def transport_capabilities(transport: object) -> TransportCapabilities:
    """What ``transport`` declares: its ``capabilities``, or the minimal record
    (``TransportCapabilities()``) when it has none — an implementation written before the
    records existed is driven through ``publish`` alone. Raises :class:`TypeError` when
    ``capabilities`` is something other than a :class:`TransportCapabilities`.

    The one place of the package that looks at a transport for what it offers (kombu's
    ``implements``): the layers above call this once and trust the answer.
    """
    declared = getattr(transport, "capabilities", None)
    if declared is None:
        return _NO_TRANSPORT_CAPABILITIES
    if not isinstance(declared, TransportCapabilities):
        raise TypeError(
            f"{type(transport).__name__}.capabilities must be a TransportCapabilities,"
            f" not {type(declared).__name__}"
        )
    return declared


def store_capabilities(store: object) -> StoreCapabilities:
    """What ``store`` declares: its ``capabilities``, or the minimal record
    (``StoreCapabilities()``) when it has none. As :func:`transport_capabilities`, the
    one place that looks."""
    declared = getattr(store, "capabilities", None)
    if declared is None:
        return _NO_STORE_CAPABILITIES
    if not isinstance(declared, StoreCapabilities):
        raise TypeError(
            f"{type(store).__name__}.capabilities must be a StoreCapabilities,"
            f" not {type(declared).__name__}"
        )
    return declared


#: The methods every OutboxStore has (``capabilities`` may be missing, see below).
_STORE_METHODS = ("put", "claim", "delivered", "failed", "has_key", "stats", "close")


def is_outbox_store(obj: object) -> TypeGuard[OutboxStore]:
    """True when ``obj`` can serve as the producer's outbox: it has every required method
    of :class:`OutboxStore`. Unlike ``isinstance(obj, OutboxStore)`` it does not ask for
    ``capabilities``: a store written before the records existed still serves, declaring
    nothing optional (:func:`store_capabilities`)."""
    return isinstance(obj, OutboxStore) or all(
        callable(getattr(obj, name, None)) for name in _STORE_METHODS
    )


_NO_INBOX_CAPABILITIES = InboxCapabilities()


def inbox_capabilities(inbox: object) -> InboxCapabilities:
    """What ``inbox`` declares: its ``capabilities``, or the minimal record
    (``InboxCapabilities()``) when it has none (an :class:`InboxStore` need not have
    one). As :func:`store_capabilities`, the one place that looks."""
    declared = getattr(inbox, "capabilities", None)
    if declared is None:
        return _NO_INBOX_CAPABILITIES
    if not isinstance(declared, InboxCapabilities):
        raise TypeError(
            f"{type(inbox).__name__}.capabilities must be an InboxCapabilities,"
            f" not {type(declared).__name__}"
        )
    return declared

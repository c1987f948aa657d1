"""The two seams of msgsafe, as Protocols.

Everything above a seam depends on these Protocols, never on pika, confluent_kafka or
proton types. An adapter implements :class:`Transport` (publishing) and
:class:`Receiver` (consuming); an outbox store implements :class:`OutboxStore`. An
adapter may also implement :class:`CallbackTransport`, the same publishing with a
callback instead of a future per message, and :class:`BatchTransport`, many messages
to one destination in one call with one report object, and :class:`HurryingTransport`,
which stops batching-by-waiting for a caller blocked on one message; the producer uses
each when it is there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from msgsafe._futures import LightFuture
from msgsafe.errors import MsgsafeError
from msgsafe.message import Batch, Delivery, Envelope

__all__ = [
    "BatchReport",
    "BatchTransport",
    "CallbackTransport",
    "HurryingTransport",
    "OutboxStats",
    "OutboxStore",
    "PublishCallback",
    "PublishFuture",
    "Receiver",
    "Transport",
]

log = logging.getLogger("msgsafe.transport")

#: What :meth:`CallbackTransport.publish_callback` reports to, once per envelope:
#: ``None`` when the broker confirmed it, otherwise the error.
PublishCallback = Callable[[MsgsafeError | None], None]


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
    """

    @property
    def target(self) -> str:
        """The redacted URL this transport publishes to (no credentials)."""
        ...

    def publish(self, envelope: Envelope) -> Future[None]:
        """Send ``envelope``; the future resolves when the broker confirmed it."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Flush outstanding confirms for up to ``timeout`` seconds, then disconnect."""
        ...


@runtime_checkable
class CallbackTransport(Transport, Protocol):
    """A transport that can also report to a callback instead of a future.

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
    for a caller that blocks on one message.

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
    """A transport that can publish a :class:`~msgsafe.message.Batch` in one call.

    Every rule of ``publish`` holds for each message of the batch (same confirmation,
    same error classes, same ``confirm_timeout``, per-key order in index order); the
    difference is cost: no future and no envelope object per message. A message that
    is too large or otherwise unacceptable fails alone (``report.failed``), the others
    go on.
    """

    def publish_batch(self, batch: Batch, report: BatchReport) -> None:
        """Send every message of ``batch``; ``report`` learns each outcome once."""
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


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """A snapshot of an outbox."""

    depth: int  #: messages waiting to be forwarded (claimed or not)
    bytes: int  #: their payload bytes
    oldest_age_s: float | None  #: age of the oldest waiting message, None when empty
    quarantined: int  #: messages moved aside after a permanent error


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
    """

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

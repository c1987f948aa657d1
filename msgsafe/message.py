"""Shared message vocabulary: what is sent, what comes back, what is received. No I/O.

Message ids are made in :mod:`msgsafe.message_ids`; :func:`new_message_id` and
:func:`new_message_ids` are importable from here too.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from msgsafe.errors import ClosedError, InvalidMessage, MsgsafeError
from msgsafe.message_ids import new_message_id, new_message_ids
from msgsafe.schemas import KEY, VALUE, Deserializer, Deserializers

__all__ = [
    "AMQP_PROPERTIES_HEADER",
    "MESSAGE_ID_HEADER",
    "RECORD_HEADERS_HEADER",
    "Batch",
    "BatchReceipt",
    "Delivery",
    "Envelope",
    "Guarantee",
    "Outcome",
    "Receipt",
    "Status",
    "new_message_id",
    "new_message_ids",
    "validate_body",
]

#: Header that carries the message id on every protocol, next to the native id field.
MESSAGE_ID_HEADER = "msgsafe-id"

#: Header holding a message's complete AMQP 0-9-1 basic properties as pika encodes them
#: (base64), set by ``msgsafe.compat.pika``: the RabbitMQ adapter publishes them in place
#: of the header (id, persistence and key still its own), so every field and header value
#: type a pika publisher set survives msgsafe's text headers and the outbox.
AMQP_PROPERTIES_HEADER = "msgsafe-amqp-properties"

#: Header holding a Kafka record's complete header list (JSON of ``[name, base64 or
#: null]`` pairs), set by ``msgsafe.compat.confluent_kafka``: the Kafka adapter writes the
#: list in its place, so repeated names, ``None`` and non-UTF-8 values survive.
RECORD_HEADERS_HEADER = "msgsafe-record-headers"


class Status(enum.Enum):
    """How a message was made safe."""

    #: The broker confirmed it with its strongest acknowledgement.
    CONFIRMED = "confirmed"
    #: The broker could not take it; it is committed to the local outbox and will be forwarded.
    STORED = "stored"


class Guarantee(enum.Enum):
    """What the destination does with a confirmed message: the strongest of these that
    the producer could verify for it (see :mod:`msgsafe.checks`). Ordered by
    :meth:`rank`: ``NONE`` < ``UNKNOWN`` < ``DURABLE`` < ``REPLICATED``.

    The same scale rates the outbox store for a stored message
    (:attr:`Receipt.store_guarantee`): ``NONE`` for a file on memory (``tmpfs``,
    ``ramfs``) or in a container's writable layer, ``DURABLE`` on a disk, ``UNKNOWN``
    where the producer cannot tell (see :func:`msgsafe.checks.store.store_guarantee`)."""

    #: Lost by a clean restart of the broker, or never kept at all: a non-durable,
    #: exclusive or auto-delete queue, a transient queue a broker creates on first use,
    #: an address that accepts and drops what nothing is bound to.
    NONE = "none"
    #: The broker could not say (a route whose bindings are invisible, a broker without
    #: the API that tells). Never taken for safe.
    UNKNOWN = "unknown"
    #: On disk on one node: kept by its clean restart or crash, lost with that node's
    #: disk (a classic durable queue; a Kafka topic with one replica,
    #: ``min.insync.replicas=1`` or unclean leader election).
    DURABLE = "durable"
    #: On a quorum of nodes before it is confirmed: kept when one node is lost (a quorum
    #: queue with members on several nodes; Kafka replication >= 2 with
    #: ``min.insync.replicas >= 2`` and no unclean election).
    REPLICATED = "replicated"

    @property
    def rank(self) -> int:
        """Order of strength: NONE 0, UNKNOWN 1, DURABLE 2, REPLICATED 3."""
        return _GUARANTEE_RANK[self]


_GUARANTEE_RANK = {
    Guarantee.NONE: 0,
    Guarantee.UNKNOWN: 1,
    Guarantee.DURABLE: 2,
    Guarantee.REPLICATED: 3,
}


class Outcome(enum.Enum):
    """How a consumer settles a delivery."""

    ACCEPT = "accept"  #: processed; remove it
    REQUEUE = "requeue"  #: not processed; deliver again (possibly elsewhere)
    REJECT = "reject"  #: never deliver again (dead-letter where the broker is set up for it)
    #: not tried: deliver again without counting a failed attempt, where the broker counts
    #: (AMQP 1.0 ``released``); a receiver whose broker has no such give-back requeues it
    RELEASE = "release"


@dataclass(frozen=True, slots=True)
class Receipt:
    """Proof that a message is safe: confirmed by the broker or stored in the outbox.

    ``guarantee`` is what the destination does with it once the broker has it, as the
    producer last checked (:class:`Guarantee`; ``UNKNOWN`` before any check, e.g. a
    message stored while the broker could not be reached). ``store_guarantee`` is what
    the outbox does with a STORED message until it is forwarded (``NONE``: a store on
    memory or a container's writable layer, which only ``require="any"`` accepts;
    ``DURABLE``: a file on a disk); None on a CONFIRMED receipt."""

    message_id: str
    status: Status
    destination: str
    guarantee: Guarantee = Guarantee.UNKNOWN
    store_guarantee: Guarantee | None = None


def _slot_setters(cls: type, *names: str) -> tuple[Callable[[object, object], None], ...]:
    """The slot descriptors' setters of a frozen slots dataclass, in ``names`` order."""
    return tuple(vars(cls)[name].__set__ for name in names)


_new_object = object.__new__
(
    _set_receipt_id,
    _set_receipt_status,
    _set_receipt_destination,
    _set_receipt_guarantee,
    _set_receipt_store_guarantee,
) = _slot_setters(Receipt, "message_id", "status", "destination", "guarantee", "store_guarantee")


def new_receipt(
    message_id: str,
    status: Status,
    destination: str,
    guarantee: Guarantee = Guarantee.UNKNOWN,
    store_guarantee: Guarantee | None = None,
) -> Receipt:
    """``Receipt(message_id, status, destination, guarantee, store_guarantee)`` for the
    per-message paths.

    NOTE: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``; setting the slots through their descriptors builds the same
    object in about half the time, which every stored or confirmed message pays.
    """
    receipt = _new_object(Receipt)
    _set_receipt_id(receipt, message_id)
    _set_receipt_status(receipt, status)
    _set_receipt_destination(receipt, destination)
    _set_receipt_guarantee(receipt, guarantee)
    _set_receipt_store_guarantee(receipt, store_guarantee)
    return receipt


@dataclass(frozen=True, slots=True)
class BatchReceipt:
    """Proof that the messages of a batch are safe: ``message_ids`` lists them in batch
    order; those in ``stored_ids`` are in the outbox (:attr:`Status.STORED`), every
    other one was confirmed by the broker (:attr:`Status.CONFIRMED`). ``guarantee`` is
    the destination's, ``store_guarantee`` the outbox's for the stored ones (None when
    none was stored), as on :class:`Receipt`."""

    destination: str
    message_ids: Sequence[str]
    stored_ids: frozenset[str] = frozenset()
    guarantee: Guarantee = Guarantee.UNKNOWN
    store_guarantee: Guarantee | None = None

    def __len__(self) -> int:
        return len(self.message_ids)

    @property
    def confirmed(self) -> int:
        """How many messages the broker confirmed."""
        return len(self.message_ids) - len(self.stored_ids)

    @property
    def stored(self) -> int:
        """How many messages went to the outbox."""
        return len(self.stored_ids)

    def status(self, message_id: str) -> Status:
        """How message ``message_id`` of this receipt was made safe."""
        return Status.STORED if message_id in self.stored_ids else Status.CONFIRMED

    def receipts(self) -> list[Receipt]:
        """One :class:`Receipt` per message, in batch order."""
        stored, dest, guarantee = self.stored_ids, self.destination, self.guarantee
        kept = self.store_guarantee
        return [
            Receipt(mid, Status.STORED, dest, guarantee, kept)
            if mid in stored
            else Receipt(mid, Status.CONFIRMED, dest, guarantee)
            for mid in self.message_ids
        ]

    def __repr__(self) -> str:
        """Destination, counts, guarantee and the first :data:`_REPR_IDS` ids (then
        ``...``): a batch can hold 100,000 ids, which a full repr would all print."""
        shown = ", ".join(repr(mid) for mid in self.message_ids[:_REPR_IDS])
        more = ", ..." if len(self.message_ids) > _REPR_IDS else ""
        return (
            f"BatchReceipt(destination={self.destination!r}, len={len(self)}, "
            f"confirmed={self.confirmed}, stored={self.stored}, "
            f"guarantee={self.guarantee}, message_ids=[{shown}{more}])"
        )


#: How many ids ``repr(BatchReceipt)`` shows.
_REPR_IDS = 3


def validate_body(body: object) -> bytes:
    """Return ``body`` as bytes, or raise :class:`InvalidMessage` for anything else.

    ``bytearray`` and ``memoryview`` are copied to ``bytes``; ``str`` is refused on
    purpose: the encoding is the caller's decision, not ours.
    """
    if isinstance(body, bytes):
        return body
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    raise InvalidMessage(f"message body must be bytes, not {type(body).__name__}; encode it first")


#: The headers of every envelope without any: read-only, so one object serves all.
NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def _encodable(text: str, what: str) -> str:
    """``text``, when UTF-8 can carry it (every wire format and the outbox store text as
    UTF-8); InvalidMessage for a lone surrogate, which would fail later, after accept."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidMessage(f"{what} is not valid Unicode (a lone surrogate)") from None
    return text


def _freeze_headers(headers: Mapping[str, str] | None) -> Mapping[str, str]:
    if not headers:
        return NO_HEADERS
    # NOTE: a dict skips ``isinstance`` against the Mapping ABC, and an ASCII header the
    # call that encodes it: both cost more than the rest of its way to the wire.
    if type(headers) is not dict and not isinstance(headers, Mapping):
        raise InvalidMessage(
            f"headers must be a mapping of str to str, not {type(headers).__name__}"
        )
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessage("headers must be a mapping of str to str")
        if not (name.isascii() and value.isascii()):
            _encodable(name + value, "a header")
    return MappingProxyType(dict(headers))


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message with everything needed to deliver it, from the first attempt to the last.

    Immutable: the same envelope (and so the same ``message_id``) is what every retry,
    outbox detour and fail-over resend carries. ``tombstone`` marks a Kafka record
    with a null value (a delete in a compacted topic): ``body`` is then ``b""``, and
    only a transport that can send a null value takes it (see ``Producer.send``).
    """

    destination: str
    body: bytes
    message_id: str = field(default_factory=new_message_id)
    key: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: NO_HEADERS)
    created_at: float = field(default_factory=time.time)
    tombstone: bool = False

    @classmethod
    def build(
        cls,
        destination: str,
        body: object,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
    ) -> Envelope:
        """Validate user input and build an envelope; raises :class:`InvalidMessage`.
        ``body=None`` builds a tombstone (a null value, not ``b""``)."""
        if (
            type(body) is bytes
            and message_id is None
            and type(destination) is str
            and destination
            and destination.isascii()
        ):
            # The common case, on every message's path: nothing to convert or check
            # beyond the key and the headers (a traced application's ``traceparent``).
            if key is not None and type(key) is not bytes:
                key = _key_bytes(key)
            frozen = _freeze_headers(headers) if headers else NO_HEADERS
            if cls is Envelope:
                return new_envelope(destination, body, new_message_id(), key, time.time(), frozen)
            return cls(destination, body, new_message_id(), key, frozen, time.time())
        if not isinstance(destination, str) or not destination:
            raise InvalidMessage("destination must be a non-empty string")
        _encodable(destination, "the destination")
        data = b"" if body is None else validate_body(body)
        key = _key_bytes(key)
        if message_id is not None and (not isinstance(message_id, str) or not message_id):
            raise InvalidMessage("message_id must be a non-empty string")
        if message_id is not None:
            _encodable(message_id, "message_id")
        return cls(
            destination=destination,
            body=data,
            message_id=message_id or new_message_id(),
            key=key,
            headers=_freeze_headers(headers),
            tombstone=body is None,
        )

    @property
    def size(self) -> int:
        """Approximate bytes on the wire: body, key and headers."""
        size = len(self.body)
        if self.key is not None:
            size += len(self.key)
        if self.headers:
            for name, value in self.headers.items():  # a loop: a generator costs more
                size += len(name) + len(value)
        return size


(
    _set_destination,
    _set_body,
    _set_message_id,
    _set_key,
    _set_headers,
    _set_created_at,
    _set_tombstone,
) = _slot_setters(
    Envelope, "destination", "body", "message_id", "key", "headers", "created_at", "tombstone"
)


def new_envelope(
    destination: str,
    body: bytes,
    message_id: str,
    key: bytes | None,
    created_at: float,
    headers: Mapping[str, str] = NO_HEADERS,
    tombstone: bool = False,
) -> Envelope:
    """An envelope from values already checked, ``headers`` read-only (see
    :func:`new_receipt` for why it does not call ``Envelope(...)``)."""
    envelope = _new_object(Envelope)
    _set_destination(envelope, destination)
    _set_body(envelope, body)
    _set_message_id(envelope, message_id)
    _set_key(envelope, key)
    _set_headers(envelope, headers)
    _set_created_at(envelope, created_at)
    _set_tombstone(envelope, tombstone)
    return envelope


def _key_bytes(key: object) -> bytes | None:
    """A message key as bytes (``str`` is UTF-8 encoded); raises InvalidMessage."""
    if key is None or type(key) is bytes:
        return key
    if isinstance(key, str):
        return _encodable(key, "the key").encode()
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise InvalidMessage(f"key must be str or bytes, not {type(key).__name__}")


def _batch_keys(keys: Iterable[str | bytes | None], count: int) -> list[bytes | None]:
    out = [_key_bytes(key) for key in keys]
    if len(out) != count:
        raise InvalidMessage(f"{len(out)} keys for {count} bodies: give one key per body")
    return out


@dataclass(frozen=True, slots=True)
class Batch:
    """Many messages to one destination, held column by column.

    The batch path exists for the per-message cost: an :class:`Envelope` is a Python
    object per message, a batch is a few lists. ``bodies[i]``, ``message_ids[i]`` and
    ``keys[i]`` (when ``keys`` is not None) describe message ``i``; ``headers`` apply
    to every message. :meth:`envelope` gives message ``i`` as an envelope with the same
    id, which is what the outbox stores when message ``i`` takes a detour.
    """

    destination: str
    bodies: Sequence[bytes]
    message_ids: Sequence[str]
    keys: Sequence[bytes | None] | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: NO_HEADERS)
    created_at: float = field(default_factory=time.time)

    @classmethod
    def build(
        cls,
        destination: str,
        bodies: Iterable[object],
        *,
        keys: Iterable[str | bytes | None] | None = None,
        headers: Mapping[str, str] | None = None,
        message_ids: Iterable[str] | None = None,
    ) -> Batch:
        """Validate user input and build a batch; raises :class:`InvalidMessage` before
        anything is sent if any body, key or id is not acceptable."""
        if not isinstance(destination, str) or not destination:
            raise InvalidMessage("destination must be a non-empty string")
        _encodable(destination, "the destination")
        if isinstance(bodies, (bytes, bytearray, memoryview, str)):
            raise InvalidMessage("bodies must be an iterable of bytes, not a single body")
        body_list = list(bodies)
        for index, body in enumerate(body_list):
            if type(body) is not bytes:
                try:
                    body_list[index] = validate_body(body)
                except InvalidMessage as exc:
                    raise InvalidMessage(f"message {index}: {exc}") from None
        count = len(body_list)
        key_list = None if keys is None else _batch_keys(keys, count)
        if message_ids is None:
            id_list = new_message_ids(count)
        else:
            id_list = list(message_ids)
            if len(id_list) != count:
                raise InvalidMessage(
                    f"{len(id_list)} message ids for {count} bodies: give one id per body"
                )
            for message_id in id_list:
                if not isinstance(message_id, str) or not message_id:
                    raise InvalidMessage("message ids must be non-empty strings")
                _encodable(message_id, "a message id")
        checked: list[bytes] = body_list  # type: ignore[assignment]  # every item checked above
        return cls(destination, checked, id_list, key_list, _freeze_headers(headers))

    def __len__(self) -> int:
        return len(self.bodies)

    def key(self, index: int) -> bytes | None:
        """The key of message ``index``."""
        return None if self.keys is None else self.keys[index]

    def envelope(self, index: int) -> Envelope:
        """Message ``index`` as an envelope (same id, body, key, headers and age)."""
        return Envelope(
            self.destination,
            self.bodies[index],
            self.message_ids[index],
            self.key(index),
            self.headers,
            self.created_at,
        )

    def select(self, indexes: Sequence[int]) -> Batch:
        """The messages at ``indexes``, in that order, as a batch of their own."""
        bodies, ids = self.bodies, self.message_ids
        keys = None if self.keys is None else [self.keys[i] for i in indexes]
        return Batch(
            self.destination,
            [bodies[i] for i in indexes],
            [ids[i] for i in indexes],
            keys,
            self.headers,
            self.created_at,
        )


SettleFn = Callable[[Outcome], None]


#: Not deserialized yet (a value may be None).
UNSET: Any = object()


class Delivery:
    """A received message. Settle it exactly once with :meth:`ack` or :meth:`nack`.

    Settling is thread-safe; a second settle raises :class:`ClosedError` so a delivery
    is never acknowledged twice.

    ``attempt`` is which delivery of the message this is, 1 on the first. Where the
    broker counts deliveries (a RabbitMQ quorum queue's ``x-delivery-count``, AMQP 1.0's
    ``delivery-count``) the receiver passes its count and ``attempt_from_broker`` is
    True: it holds across restarts. Elsewhere the consumer counts (see
    :class:`~msgsafe.ports.AttemptCounter`); until it does, a redelivery is attempt 2 at
    least. ``Consumer.run`` raises it once per retry of its own.

    ``body`` and ``key`` are the bytes received; :attr:`value` and :attr:`key_value` are
    what the consumer's ``deserializer`` and ``key_deserializer`` make of them (see
    :mod:`msgsafe.schemas`).
    """

    __slots__ = (
        "_after",
        "_key_value",
        "_lock",
        "_settle",
        "_settled",
        "_value",
        "attempt",
        "attempt_from_broker",
        "body",
        "deserializers",
        "destination",
        "headers",
        "key",
        "message_id",
        "redelivered",
    )

    def __init__(
        self,
        *,
        body: bytes,
        destination: str,
        message_id: str | None,
        settle: SettleFn,
        key: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        redelivered: bool = False,
        attempt: int | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        self.body = body
        self.destination = destination
        self.message_id = message_id
        self.key = key
        self.headers: Mapping[str, str] = MappingProxyType(dict(headers)) if headers else NO_HEADERS
        self.redelivered = redelivered
        #: True when ``attempt`` is the broker's own count (see the class docstring).
        self.attempt_from_broker = attempt is not None
        #: Which delivery of the message this is, 1 on the first.
        self.attempt: int = attempt if attempt is not None else (2 if redelivered else 1)
        self._settle = settle
        self._settled: Outcome | None = None
        # NOTE: a receiver passes one lock for all its deliveries: the exactly-once check
        # holds it for two bytecodes, and a lock made per message cost more than that.
        self._lock = lock if lock is not None else threading.Lock()
        #: Called with (delivery, outcome) once the receiver took the outcome: the
        #: consumer's counters and dedup window (see :meth:`observe`).
        self._after: Callable[[Delivery, Outcome], None] | None = None
        #: The consumer's deserializers (set by the consumer), None without any.
        self.deserializers: Deserializers | None = None
        self._value: Any = UNSET
        self._key_value: Any = UNSET

    def observe(self, after: Callable[[Delivery, Outcome], None]) -> None:
        """Have ``after(delivery, outcome)`` called once this delivery was settled (after
        the receiver took the outcome; not when settling raised). One observer: the
        consumer that handed the delivery out."""
        self._after = after

    def _wrap_settle(self, wrap: Callable[[SettleFn], SettleFn]) -> None:
        """Have the receiver's settling go through ``wrap(settle)`` from now on (the
        telemetry's span end); :meth:`settle` keeps its exactly-once check."""
        self._settle = wrap(self._settle)

    @property
    def value(self) -> Any:
        """The body through the consumer's ``deserializer``, run on first use and kept
        (the body itself without one). Raises a :class:`~msgsafe.errors.SchemaError`
        when it does not decode (``body`` still holds the bytes)."""
        found = self._value
        if found is UNSET:
            decode = self.deserializers
            found = self._value = self._decode(decode.value if decode else None, self.body, VALUE)
        return found

    @property
    def key_value(self) -> Any:
        """The key through the consumer's ``key_deserializer``, as :attr:`value`."""
        found = self._key_value
        if found is UNSET:
            decode = self.deserializers
            found = self._key_value = self._decode(decode.key if decode else None, self.key, KEY)
        return found

    def _decode(self, deserializer: Deserializer | None, data: bytes | None, field: str) -> Any:
        return Deserializers.run(
            deserializer, data, self.destination, field, self.headers, self.message_id
        )

    @property
    def settled(self) -> Outcome | None:
        """The outcome given, or None while unsettled."""
        return self._settled

    def settle(self, outcome: Outcome) -> None:
        """Settle with an explicit outcome."""
        with self._lock:
            if self._settled is not None:
                raise ClosedError(
                    f"delivery already settled ({self._settled.value})", message_id=self.message_id
                )
            self._settled = outcome
        self._settle(outcome)
        after = self._after
        if after is not None:
            after(self, outcome)

    def ack(self) -> None:
        """The message was processed: remove it from the broker."""
        self.settle(Outcome.ACCEPT)

    @classmethod
    def _ack_run(cls, deliveries: list[Delivery]) -> list[tuple[Delivery, MsgsafeError]]:
        """Acknowledge each of ``deliveries`` (handed out by one consumer); those that
        could not be, with the error :meth:`ack` raised. A receiver's class may take its
        lock once for the run rather than once a delivery."""
        failed: list[tuple[Delivery, MsgsafeError]] = []
        for delivery in deliveries:
            try:
                delivery.ack()
            except MsgsafeError as exc:
                failed.append((delivery, exc))
        return failed

    def nack(self, requeue: bool = True) -> None:
        """The message was not processed: redeliver it, or (``requeue=False``) reject it."""
        self.settle(Outcome.REQUEUE if requeue else Outcome.REJECT)

    def release(self) -> None:
        """The message was not tried: redeliver it without counting a failed attempt.

        For a delivery held and given back unread (prefetched, peeked, not started before
        a stop). Where the broker counts deliveries (AMQP 1.0) a :meth:`nack` raises
        the count, and so the next ``attempt``, as a failure; this does not. Brokers
        without such a give-back (AMQP 0-9-1, Kafka) requeue it as :meth:`nack` does."""
        self.settle(Outcome.RELEASE)

    def __repr__(self) -> str:
        return (
            f"Delivery(destination={self.destination!r}, message_id={self.message_id!r}, "
            f"size={len(self.body)}, redelivered={self.redelivered}, attempt={self.attempt})"
        )

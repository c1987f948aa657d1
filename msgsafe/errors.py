"""The msgsafe error tree.

Every error a caller can see is one of these; adapters translate their library's
exceptions at the boundary (``raise X from exc``) so nothing third-party leaks out.

The tree answers one question first: *could the broker have acted?*

- :class:`TransientError` — worth retrying or storing in the outbox.
  :attr:`TransientError.maybe_delivered` says whether the broker may already hold the
  message (a retry can then duplicate, never lose; the duplicate carries the same id).
- :class:`PermanentError` — retrying will not help; the caller must act.

All errors pickle (they cross process boundaries in Spark) and carry context:
the endpoint (never with credentials) and the message id where one applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self, TypeVar

__all__ = [
    "AuthenticationError",
    "BatchFailed",
    "CertificateError",
    "ClosedError",
    "ConfigurationError",
    "ConfirmTimeout",
    "ConnectError",
    "ConnectionLost",
    "InboxError",
    "InboxUnavailable",
    "InvalidDestination",
    "InvalidMessage",
    "MessageIdReused",
    "MessageTooLarge",
    "MissingExtra",
    "MsgsafeError",
    "OutboxCorrupt",
    "OutboxError",
    "OutboxFull",
    "OutboxGone",
    "OutboxLocked",
    "OutboxLoginReadOnly",
    "OutboxLoginRefused",
    "OutboxPoolingUnsupported",
    "PermanentError",
    "ProtocolMismatch",
    "Refused",
    "Rejected",
    "SchemaError",
    "SchemaIncompatible",
    "SchemaRegistryUnavailable",
    "SendTimeout",
    "SerializationFailed",
    "StoreOutcomeUnknown",
    "TransientError",
    "Unroutable",
    "UnsafeDestination",
    "UnsafeOutbox",
]


class MsgsafeError(Exception):
    """Base of every error msgsafe raises."""

    def __init__(
        self,
        message: str = "",
        *,
        endpoint: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.endpoint = endpoint
        self.message_id = message_id

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only context must survive pickling (Spark ships errors between processes).
        return (
            _rebuild,
            (type(self), self.message, self.endpoint, self.message_id, self._extra()),
        )

    def _extra(self) -> dict[str, object]:
        return {}

    def with_id(self, message_id: str | None) -> Self:
        """A copy of this error that names ``message_id``, every other field kept.

        One error often stands for many messages (a nack, a lost connection, a refused
        login); each future or report gets its own copy, so that each names its message
        and one exception object does not collect the tracebacks of every waiter. The
        copy is made the way pickling rebuilds an error: the same fields, no traceback.
        """
        return _rebuild(type(self), self.message, self.endpoint, message_id, self._extra())

    def refusing(self, message_id: str | None, *, doubt: bool) -> Self:
        """:meth:`with_id` for a message the outbox was to take after a transport
        failure; ``doubt``: that send ended without an answer, so the broker may hold the
        message (:class:`OutboxFull` then says so; other errors do not change)."""
        return self.with_id(message_id)

    def __str__(self) -> str:
        parts = [self.message] if self.message else []
        if self.endpoint:
            parts.append(f"endpoint={self.endpoint}")
        if self.message_id:
            parts.append(f"message_id={self.message_id}")
        return " | ".join(parts) if parts else type(self).__name__


_E = TypeVar("_E", bound=MsgsafeError)


def _rebuild(
    cls: type[_E],
    message: str,
    endpoint: str | None,
    message_id: str | None,
    extra: dict[str, object],
) -> _E:
    err = cls.__new__(cls)
    MsgsafeError.__init__(err, message, endpoint=endpoint, message_id=message_id)
    for name, value in extra.items():
        setattr(err, name, value)
    return err


# --- configuration -------------------------------------------------------------------


class ConfigurationError(MsgsafeError, ValueError):
    """Bad URL, unknown scheme or option, invalid value: fix the configuration."""


class MissingExtra(ConfigurationError, ImportError):
    """The adapter's optional dependency is not installed; the message names the extra."""

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(
            f"the {extra!r} adapter needs the {module!r} package: pip install 'msgsafe[{extra}]'"
        )
        self.extra = extra
        self.module = module

    def _extra(self) -> dict[str, object]:
        return {"extra": self.extra, "module": self.module}


class UnsafeOutbox(ConfigurationError):
    """The outbox keeps STORED messages less safely than the producer's ``require=`` asks
    (a file on memory or a container's writable layer): no producer was made. ``store``
    names it, ``fix`` what to change; ``require="any"`` opts out."""

    def __init__(
        self,
        message: str = "",
        *,
        store: str | None = None,
        fix: str | None = None,
        endpoint: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message, endpoint=endpoint, message_id=message_id)
        self.store = store
        self.fix = fix

    def _extra(self) -> dict[str, object]:
        return {"store": self.store, "fix": self.fix}


# --- transient: retry or store ---------------------------------------------------------


class TransientError(MsgsafeError):
    """The broker could not take the message now; retrying or storing it is safe."""

    #: True when the broker may already hold the message (a retry may duplicate it).
    maybe_delivered: bool = False


class ConnectError(TransientError):
    """No broker could be reached; nothing was sent."""


class ConnectionLost(TransientError):
    """The connection dropped after sending and before the confirm: possible duplicate."""

    maybe_delivered = True


class ConfirmTimeout(TransientError):
    """The broker did not confirm in time: possible duplicate."""

    maybe_delivered = True


class Refused(TransientError):
    """The broker refused for now (nack, not enough replicas, blocked, released)."""


# --- permanent: the caller must act ----------------------------------------------------


class PermanentError(MsgsafeError):
    """Retrying will not help; the caller still owns the message and must act."""


class AuthenticationError(PermanentError):
    """The broker refused the credentials or the virtual host."""


class CertificateError(AuthenticationError):
    """The broker's TLS certificate failed verification (untrusted CA, wrong host name,
    expired): no retry can fix it, the certificate or the client's trust must change."""


class ProtocolMismatch(PermanentError):
    """The peer speaks another protocol (or TLS/plain) than the URL; the text says what to use."""


class InvalidMessage(PermanentError, TypeError):
    """The message itself is malformed (body not bytes, bad header or key type)."""


class InvalidDestination(InvalidMessage, ConfigurationError):
    """The destination's name breaks its protocol's rules (an AMQP 0-9-1 queue name over
    255 bytes, a Kafka topic with a space...): no broker of that protocol takes it, now or
    later. Raised by ``send()`` before anything is sent or stored; a stored message with
    such a name (an outbox file older than the check) is quarantined when forwarded. Also
    a :class:`ConfigurationError`, which receivers raise for such a name."""


class MessageIdReused(InvalidMessage):
    """The id was used for a different message: reuse an id only to resend the same one."""


class MessageTooLarge(PermanentError):
    """The message is larger than the broker or the configuration allows."""


class Unroutable(PermanentError):
    """The broker has nowhere to put the message (no queue bound, unknown topic)."""


class UnsafeDestination(PermanentError):
    """The destination keeps confirmed messages less safely than the producer's
    ``require=`` asks (a non-durable queue, one Kafka replica...): nothing was sent.
    ``destination``, ``guarantee`` (what it gives), ``required`` and ``fix`` say which
    setting to change; ``require="any"`` opts out."""

    def __init__(
        self,
        message: str = "",
        *,
        destination: str | None = None,
        guarantee: str | None = None,
        required: str | None = None,
        fix: str | None = None,
        endpoint: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message, endpoint=endpoint, message_id=message_id)
        self.destination = destination
        self.guarantee = guarantee
        self.required = required
        self.fix = fix

    def _extra(self) -> dict[str, object]:
        return {
            "destination": self.destination,
            "guarantee": self.guarantee,
            "required": self.required,
            "fix": self.fix,
        }


class Rejected(PermanentError):
    """The broker rejected the message; ``condition`` carries the broker's reason."""

    def __init__(
        self,
        message: str = "",
        *,
        condition: str | None = None,
        endpoint: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message, endpoint=endpoint, message_id=message_id)
        self.condition = condition

    def _extra(self) -> dict[str, object]:
        return {"condition": self.condition}


# --- outbox ------------------------------------------------------------------------------


class OutboxError(MsgsafeError):
    """The local outbox could not store or read a message."""

    @classmethod
    def of(cls, exc: BaseException) -> OutboxError:
        """What a store's put raised, as the error its messages fail with: itself when
        it is an OutboxError, otherwise one that names it."""
        if isinstance(exc, OutboxError):
            return exc
        return OutboxError(f"outbox write failed: {type(exc).__name__}: {exc}")


class OutboxFull(OutboxError):
    """The outbox reached a bound (rows, bytes, age, or the disk): the message was not stored.

    :attr:`maybe_delivered` is True when the message went to the outbox after a send to
    the broker that ended without an answer (a confirm that timed out, a connection lost
    after the send): the broker may hold it all the same, and deliver it later.
    """

    #: True when the broker may hold the message (see the class doc).
    maybe_delivered: bool = False

    def _extra(self) -> dict[str, object]:
        return {"maybe_delivered": True} if self.maybe_delivered else {}

    def refusing(self, message_id: str | None, *, doubt: bool) -> Self:
        own = self.with_id(message_id)
        own.maybe_delivered = own.maybe_delivered or doubt
        return own


class OutboxCorrupt(OutboxError):
    """The outbox file is damaged or is not an msgsafe outbox; it was left untouched."""


class OutboxLocked(OutboxError):
    """Another process holds the outbox file."""


class OutboxGone(OutboxError):
    """The outbox file is no longer at its path (removed, or replaced): nothing is stored
    in it any more; ``at_risk`` messages it holds are lost if this process ends first."""

    def __init__(
        self,
        message: str = "",
        *,
        path: str | None = None,
        at_risk: int | None = None,
        endpoint: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message, endpoint=endpoint, message_id=message_id)
        self.path = path
        self.at_risk = at_risk

    def _extra(self) -> dict[str, object]:
        return {"path": self.path, "at_risk": self.at_risk}


class OutboxLoginRefused(OutboxError, AuthenticationError):
    """The outbox's database refused the login (wrong user or password): nothing was stored."""


class OutboxLoginReadOnly(OutboxError, PermanentError):
    """The outbox's login can only read (default_transaction_read_only=on): nothing stored."""


class OutboxPoolingUnsupported(OutboxError, ConfigurationError):
    """The store's pooler drops what the outbox needs (pool_mode=statement): nothing stored."""


class StoreOutcomeUnknown(OutboxError, TransientError):
    """The store did not say whether it committed the message: retry with the same message_id."""

    #: The message may be stored, and then will be forwarded.
    maybe_delivered = True

    def __init__(
        self,
        message: str = "",
        *,
        destination: str | None = None,
        destinations: Mapping[str, str] | None = None,
        endpoint: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message, endpoint=endpoint, message_id=message_id)
        self.destination = destination
        #: Each message's destination by id, for a put of several (see :meth:`with_id`).
        self.destinations: dict[str, str] = dict(destinations or {})

    def _extra(self) -> dict[str, object]:
        return {"destination": self.destination, "destinations": self.destinations}

    def with_id(self, message_id: str | None) -> Self:
        """A copy naming ``message_id`` and, when this error knew it, its destination."""
        err = super().with_id(message_id)
        if message_id is not None and message_id in self.destinations:
            err.destination = self.destinations[message_id]
            err.destinations = {}
        return err

    def __str__(self) -> str:
        retry = (
            f"retry with message_id={self.message_id}"
            if self.message_id
            else "retry each message with its message_id"
        )
        parts = [f"{self.message}: may have been stored; {retry}" if self.message else retry]
        if self.destination:
            parts.append(f"destination={self.destination}")
        if self.endpoint:
            parts.append(f"endpoint={self.endpoint}")
        return " | ".join(parts)


# --- lifecycle ---------------------------------------------------------------------------


class ClosedError(MsgsafeError):
    """The producer or consumer was used after close()."""


class SendTimeout(TransientError, TimeoutError):
    """send() could neither confirm nor store the message within its timeout."""

    maybe_delivered = True


class BatchFailed(MsgsafeError):
    """Some messages of a batch were neither confirmed nor stored: ``errors`` maps each
    of their ids to its error (the caller still owns those messages); ``receipt`` is
    the :class:`~msgsafe.message.BatchReceipt` of the others, which are safe."""

    def __init__(
        self,
        message: str = "",
        *,
        errors: Mapping[str, MsgsafeError] | None = None,
        receipt: object = None,
        endpoint: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message, endpoint=endpoint, message_id=message_id)
        self.errors: dict[str, MsgsafeError] = dict(errors or {})
        self.receipt = receipt

    def _extra(self) -> dict[str, object]:
        return {"errors": self.errors, "receipt": self.receipt}


# --- inbox -------------------------------------------------------------------------------


class InboxError(MsgsafeError):
    """The inbox could not record or look up a message id; nothing of that call was kept."""


class InboxUnavailable(InboxError):
    """The inbox's database took no writes within the inbox's timeout (down, read-only,
    busy, or failing over): nothing was recorded, the message is to be handled again."""


# --- schemas -----------------------------------------------------------------------------


class SchemaError(MsgsafeError):
    """A serializer or the schema registry behind it could not turn a message into its
    bytes (or its bytes back): nothing was sent or stored (see :mod:`msgsafe.schemas`)."""

    def __init__(
        self,
        message: str = "",
        *,
        subject: str | None = None,
        endpoint: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message, endpoint=endpoint, message_id=message_id)
        self.subject = subject

    def _extra(self) -> dict[str, object]:
        return {"subject": self.subject}


class SchemaRegistryUnavailable(SchemaError, TransientError):
    """The schema registry did not answer and the serializer had no cached schema for
    the subject: nothing was sent or stored, the caller still owns the message."""


class SchemaIncompatible(SchemaError, PermanentError):
    """The registry refused the schema (HTTP 409): it breaks the subject's compatibility
    rule. ``subject`` and ``rule`` (e.g. ``BACKWARD``; None when unknown) name them."""

    def __init__(
        self,
        message: str = "",
        *,
        subject: str | None = None,
        rule: str | None = None,
        endpoint: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message, subject=subject, endpoint=endpoint, message_id=message_id)
        self.rule = rule

    def _extra(self) -> dict[str, object]:
        return {"subject": self.subject, "rule": self.rule}


class SerializationFailed(SchemaError, PermanentError):
    """The serializer refused the object (it does not match the schema), the registry
    refused the request for good (unknown subject, invalid schema), or received bytes
    do not decode: retrying the same message will not help."""

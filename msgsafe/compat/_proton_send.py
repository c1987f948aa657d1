"""How :mod:`msgsafe.compat.proton` translates: proton URLs to one msgsafe ``amqp10://``
URL, a proton ``Message`` to an envelope, a msgsafe error to the exception
``proton.utils.BlockingSender.send`` raises, and the deadline of one send (confirmed,
or stored, within ``timeout``). Pure translation and one blocking wait; no classes of
the wrapper's own.

What an envelope carries of a proton ``Message`` (msgsafe's AMQP 1.0 adapter sends a
durable message with a message-id, text application properties and one data section):
the body (``bytes``, or ``str`` as UTF-8), the id (``msg.id``, a new UUIDv7 when None)
and the application properties (``msg.properties``; numbers and booleans as their text,
UTF-8 bytes as text). Any other field set on the message (subject, content type,
correlation id, reply-to, TTL, priority, annotations) is not carried: one
:class:`~msgsafe.compat.CompatWarning` per field and sender says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from msgsafe.errors import MissingExtra

try:
    import proton
    from proton.utils import SendException
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("amqp10", "python-qpid-proton") from exc

from msgsafe.compat._common import header_text
from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    InvalidMessage,
    PermanentError,
)
from msgsafe.fastpath import store_refused
from msgsafe.message import Envelope, Receipt, Status, new_message_id, new_receipt
from msgsafe.producer import Producer

__all__ = [
    "UNCARRIED",
    "envelope_of",
    "msgsafe_url",
    "send_error",
    "send_within",
    "set_fields",
]

log = logging.getLogger("msgsafe.compat.proton")

#: Fields of a proton ``Message`` msgsafe does not carry (checked per send).
UNCARRIED = (
    "subject",
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "reply_to_group_id",
    "group_id",
    "user_id",
    "annotations",
    "instructions",
)
#: Defaults of the header fields that are not carried either (a field at its default
#: is not reported).
_HEADER_DEFAULTS = {
    "ttl": 0.0,
    "priority": 4,
    "first_acquirer": False,
    "delivery_count": 0,
    "expiry_time": 0.0,
    "creation_time": 0.0,
}
#: Share of the deadline kept for the outbox write, and its bounds in seconds.
_RESERVE_SHARE = 0.2
_RESERVE_MIN_S = 0.005
_RESERVE_MAX_S = 1.0


def msgsafe_url(
    urls: Sequence[str | proton.Url], *, user: str | None = None, password: str | None = None
) -> tuple[str, dict[str, Any]]:
    """One ``amqp10://`` (``amqp10s://`` for ``amqps``) URL naming every host of
    ``urls`` in order. Credentials come from ``user``/``password`` or the first URL that
    has them; every URL must agree on TLS. Raises :class:`ConfigurationError`."""
    if not urls:
        raise ConfigurationError("at least one URL is needed")
    hosts: list[str] = []
    tls: bool | None = None
    for raw in urls:
        text = str(raw)
        # proton's Url: "host", "host:port" and "amqp[s]://user:pass@host:port/path".
        url = urlsplit(text if "://" in text else f"amqp://{text}")
        if url.scheme not in ("amqp", "amqps"):
            raise ConfigurationError(f"unsupported scheme {url.scheme!r}: amqp:// or amqps://")
        secure = url.scheme == "amqps"
        if tls is not None and secure != tls:
            raise ConfigurationError("every URL must agree on TLS (amqp:// or amqps://)")
        tls = secure
        user = user or (unquote(url.username) if url.username else None)
        password = password or (unquote(url.password) if url.password else None)
        host = url.hostname or "localhost"
        if ":" in host:
            host = f"[{host}]"  # an IPv6 literal
        entry = f"{host}:{url.port or (5671 if secure else 5672)}"
        if entry not in hosts:
            hosts.append(entry)
    userinfo = ""
    if user:
        userinfo = f"{quote(user, safe='')}:{quote(password or '', safe='')}@"
    scheme = "amqp10s" if tls else "amqp10"
    return f"{scheme}://{userinfo}{','.join(hosts)}", {}


def set_fields(message: proton.Message) -> list[str]:
    """The fields set on ``message`` that msgsafe does not carry."""
    # NOTE: proton reports an unset content type or encoding as symbol('None').
    found = [
        name for name in UNCARRIED if getattr(message, name, None) not in (None, "", b"", "None")
    ]
    found += [
        name for name, default in _HEADER_DEFAULTS.items() if getattr(message, name) != default
    ]
    return found


def envelope_of(address: str | None, message: proton.Message) -> Envelope:
    """``message`` as msgsafe sends it to ``address`` (the sender's, else the
    message's). Raises ``TypeError`` (msgsafe's ``InvalidMessage``) for a body that is
    not bytes or text, a property that is neither text, a number nor UTF-8 bytes, and
    ``ValueError`` when there is no address."""
    destination = address or message.address
    if not destination:
        raise ValueError("no address: the sender has none and neither has the message")
    body = message.body
    if body is None:
        data = b""
    elif isinstance(body, str):
        data = body.encode("utf-8")
    elif isinstance(body, (bytes, bytearray, memoryview)):
        data = bytes(body)
    else:
        raise InvalidMessage(
            f"a {type(body).__name__} body: msgsafe sends one data section; "
            "encode the body to bytes (or str) first"
        )
    properties: dict[Any, Any] = message.properties or {}
    headers = {str(k): header_text(str(k), v) for k, v in properties.items()}
    native = message.id
    return Envelope.build(
        destination,
        data,
        headers=headers,
        message_id=str(native) if native is not None else new_message_id(),
    )


def send_error(exc: BaseException) -> Exception:
    """The proton exception for a msgsafe error: ``ClosedError`` ->
    ``ConnectionException``; a message the broker refused for good (rejected, unknown
    address, too large) -> ``SendException(REJECTED)``; one neither confirmed nor stored
    (no outbox, outbox full) -> ``SendException(RELEASED)``."""
    if isinstance(exc, ClosedError):
        return proton.ConnectionException(str(exc))
    if isinstance(exc, PermanentError):
        return SendException(proton.Delivery.REJECTED)
    return SendException(proton.Delivery.RELEASED)


def send_within(producer: Producer, envelope: Envelope, timeout: float | None) -> Receipt:
    """Send ``envelope``; return once it is confirmed, or stored in the outbox when no
    confirm came by ``timeout`` (None: wait for the producer's own outcome). Raises the
    msgsafe error of a message that failed for good, and ``proton.Timeout`` when there
    is no outbox to store it in."""
    future: Future[Receipt] = producer.send_envelope(envelope)
    outbox = producer.outbox
    if timeout is None:
        return future.result()
    reserve = min(_RESERVE_MAX_S, max(_RESERVE_MIN_S, timeout * _RESERVE_SHARE))
    try:
        return future.result(max(0.0, timeout - reserve) if outbox is not None else timeout)
    except FutureTimeout:
        if outbox is None:
            raise proton.Timeout(f"not confirmed within {timeout} s") from None
    log.debug("no confirm for %s in time: storing it", envelope.message_id)
    if (error := store_refused(outbox, [envelope])) is not None:
        raise error
    return new_receipt(envelope.message_id, Status.STORED, envelope.destination)

"""Translation of pika's exceptions and AMQP close codes into :mod:`msgsafe.errors`.

Classification answers "could the broker have acted?": a connection that never opened
is :class:`ConnectError` (nothing was sent); a connection or channel lost with messages
in flight is :class:`ConnectionLost` (possible duplicates); credentials and virtual-host
refusals are :class:`AuthenticationError` (permanent: retrying will not help).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping

from pika import exceptions as pe

from msgsafe.adapters import _peer
from msgsafe.adapters._peer import PROBE_S
from msgsafe.errors import (
    AuthenticationError,
    CertificateError,
    ConnectError,
    ConnectionLost,
    MessageTooLarge,
    MsgsafeError,
    PermanentError,
    ProtocolMismatch,
    Rejected,
    TransientError,
    Unroutable,
)

__all__ = [
    "ACCESS_REFUSED",
    "FRAME_ERROR",
    "NOT_ALLOWED",
    "NOT_FOUND",
    "PRECONDITION_FAILED",
    "cause",
    "channel_close_error",
    "describe",
    "frame_error",
    "header_bytes",
    "lost_error",
    "PROBE_S",
    "identify_peer",
    "open_error",
]

# AMQP 0-9-1 reply codes RabbitMQ uses when it closes a connection or a channel.
ACCESS_REFUSED = 403
NOT_FOUND = 404
PRECONDITION_FAILED = 406
NOT_ALLOWED = 530
FRAME_ERROR = 501

_AUTH_CODES = {ACCESS_REFUSED, NOT_ALLOWED}
_AUTH_WORDS = ("ACCESS_REFUSED", "NOT_ALLOWED", "vhost", "login was refused")
_TOO_LARGE = re.compile(r"message size (\d+) is larger than configured max size")
_EXCHANGE = re.compile(r"exchange '([^']*)'")


def describe(exc: BaseException) -> str:
    """A short, credential-free description of a pika exception for error messages.

    NOTE: pika's messages never carry the password, but a broker's reply text could echo
    a user name; that is not a secret, the password is.
    """
    return f"{type(exc).__name__}: {exc!r}"[:300]


def _flatten(exc: BaseException) -> list[BaseException]:
    """The exception and those it wraps (pika's connection workflow nests them)."""
    seen: list[BaseException] = []
    stack = [exc]
    while stack and len(seen) < 20:
        item = stack.pop()
        if any(item is s for s in seen):
            continue
        seen.append(item)
        stack.extend(getattr(item, "exceptions", ()) or ())
        inner = getattr(item, "exception", None)  # pika's connector errors keep it here
        if isinstance(inner, BaseException):
            stack.append(inner)
        stack.extend(a for a in item.args if isinstance(a, BaseException))
        if item.__cause__ is not None:
            stack.append(item.__cause__)
    return seen


def open_error(exc: BaseException, endpoint: str, *, tls: bool = False) -> MsgsafeError:
    """The error for a connection attempt that failed before it opened (``tls``: the
    attempt was a TLS one)."""
    for item in _flatten(exc):
        if _dropped_in_handshake(item):
            return ConnectError(
                f"connection dropped during the handshake: {describe(item)}", endpoint=endpoint
            )
        if isinstance(item, pe.ProbableAccessDeniedError):
            return AuthenticationError(
                "the broker refused access to the virtual host (unknown vhost or no permission)",
                endpoint=endpoint,
            )
        if isinstance(item, (pe.ProbableAuthenticationError, pe.AuthenticationError)):
            return AuthenticationError("the broker refused the credentials", endpoint=endpoint)
        if isinstance(item, pe.ConnectionClosed) and item.reply_code in _AUTH_CODES:
            return AuthenticationError(
                f"the broker refused the connection ({item.reply_code} {item.reply_text})",
                endpoint=endpoint,
            )
    items = _flatten(exc)
    told = " ".join(repr(i) for i in items)
    refused = _peer.client_certificate_refused(told)
    if refused is not None:
        return CertificateError(refused, endpoint=endpoint)
    silent = "Timeout during AMQP handshake" in told or "Timeout while setting up AMQP" in told
    if silent or any(isinstance(item, pe.IncompatibleProtocolError) for item in items):
        # NOTE: pika's guess for "closed before connection.start", or a peer that took
        # the connection and said nothing (a Kafka broker does that): ask the peer.
        spoken = identify_peer(endpoint, kafka_only=silent)
        if spoken == "TLS" and tls:
            # NOTE: a TLS 1.3 server that requires a client certificate sends its alert
            # after the handshake; when the socket's EOF reaches pika before the alert
            # does, all that is left is a TLS peer that ended the session at once.
            return CertificateError(
                "the broker ended the TLS session right after the handshake: it "
                "requires a client certificate it trusts (tls_cert_file=, tls_key_file=)",
                endpoint=endpoint,
            )
        if spoken is not None:
            return ProtocolMismatch(
                f"this port speaks {spoken}, not AMQP 0-9-1: {_ADVICE[spoken]}",
                endpoint=endpoint,
            )
    for item in items:
        if isinstance(item, ssl.SSLCertVerificationError):
            return CertificateError(
                f"the broker's TLS certificate failed verification: {item.verify_message}",
                endpoint=endpoint,
            )
    text = " ".join(repr(i) for i in _flatten(exc))
    if "WRONG_VERSION_NUMBER" in text:
        return ProtocolMismatch(
            f"{_peer.PLAIN_NOT_TLS}: use amqp:// (or the broker's TLS port)", endpoint=endpoint
        )
    if any(word in text for word in _AUTH_WORDS):
        return AuthenticationError(
            "the broker refused the credentials or the virtual host", endpoint=endpoint
        )
    return ConnectError(f"could not connect: {cause(exc)}", endpoint=endpoint)


_ADVICE = {
    "AMQP 1.0": "use amqp10:// (or the broker's AMQP 0-9-1 port)",
    "Kafka": "use kafka:// (or the broker's AMQP port)",
    "TLS": "use amqps://",
}


def identify_peer(endpoint: str, *, kafka_only: bool = False) -> str | None:
    """What a peer that dropped our AMQP 0-9-1 header speaks ("AMQP 1.0", "Kafka",
    "TLS"), asked in at most two short exchanges; None when it cannot be told.

    ``kafka_only``: the peer already stayed silent to the header; only ask Kafka's
    question (at most ``PROBE_S``, which the adapter keeps inside connect_timeout).
    """
    spoken = _peer.identify_peer(
        endpoint, header=None if kafka_only else _peer.AMQP091_HEADER, kafka=True
    )
    return None if spoken == "AMQP 0-9-1" else spoken


def cause(exc: BaseException) -> str:
    """One short phrase for why a connection attempt failed (refused, timed out, ...).

    pika nests the socket error three levels deep in its connection workflow; a log line
    or a CLI answer names the innermost cause, not pika's chain of wrappers.
    """
    items = _flatten(exc)
    for item in items:
        if isinstance(item, ConnectionRefusedError):
            return "connection refused"
        if isinstance(item, TimeoutError) or "Timeout" in type(item).__name__:
            return "timed out"
        if isinstance(item, OSError) and item.strerror:
            return item.strerror.lower()
    # NOTE: pika keeps the socket error in the text of its connector errors, not as a cause.
    text = " ".join(repr(i) for i in items)
    if "ConnectionRefusedError" in text:
        return "connection refused"
    if "Timeout" in text or "timed out" in text:
        return "timed out"
    for item in items:
        if isinstance(item, pe.StreamLostError):
            return "the peer closed the connection during the handshake"
    return type(items[-1] if items else exc).__name__


def _dropped_in_handshake(item: BaseException) -> bool:
    """True for pika's *guess* of a refusal that was really a dropped connection.

    NOTE: pika names any loss of the connection after start-ok a "probable authentication
    error" (after tune-ok, "probable access denied"). A real refusal arrives as the
    broker's connection.close (403 / 530, pika's ``ConnectionClosedByBroker``); a stream
    lost at that stage is a node booting, stopping or pausing (pause_minority), or the
    network resetting the connection, and is as transient as any failed connect.
    """
    probable = (pe.ProbableAuthenticationError, pe.ProbableAccessDeniedError)
    return isinstance(item, probable) and "StreamLostError" in str(item)


def lost_error(exc: BaseException | None, endpoint: str) -> TransientError:
    """The error for messages in flight on a connection that closed."""
    detail = describe(exc) if exc is not None else "closed"
    return ConnectionLost(f"connection lost before the confirm: {detail}", endpoint=endpoint)


def channel_close_error(
    reply_code: int, reply_text: str, endpoint: str
) -> tuple[PermanentError | None, str | None, int | None]:
    """Classify a channel (or connection) closed by the broker.

    Returns ``(error, exchange, size)``: the permanent error to give the messages that
    caused it, and what identifies them — the missing ``exchange`` name, or the body
    ``size`` the broker found too large. ``(None, None, None)`` when the close is not
    caused by particular messages (they are then resent).
    """
    match = _EXCHANGE.search(reply_text)
    if reply_code == NOT_FOUND and match:
        return (
            Unroutable(f"no such exchange: {match.group(1)!r}", endpoint=endpoint),
            match.group(1),
            None,
        )
    if reply_code == ACCESS_REFUSED and match:
        return (
            Rejected(
                f"the broker refused access: {reply_text}",
                condition="ACCESS_REFUSED",
                endpoint=endpoint,
            ),
            match.group(1),
            None,
        )
    if reply_code == PRECONDITION_FAILED:
        match = _TOO_LARGE.search(reply_text)
        if match:
            return (
                MessageTooLarge(
                    f"the broker refused the message size: {reply_text}", endpoint=endpoint
                ),
                None,
                int(match.group(1)),
            )
    if reply_code == FRAME_ERROR:
        return (
            MessageTooLarge(
                f"the broker refused an oversize frame: {reply_text}", endpoint=endpoint
            ),
            None,
            None,
        )
    if reply_code in (PRECONDITION_FAILED, ACCESS_REFUSED, NOT_FOUND):
        return (
            Rejected(
                f"the broker closed the channel: {reply_code} {reply_text}",
                condition=reply_text.split(" ", 1)[0] or str(reply_code),
                endpoint=endpoint,
            ),
            None,
            None,
        )
    return None, None, None


#: Bytes kept free in a frame for the content header's fixed fields.
_HEADER_FRAME_RESERVE = 512


def header_bytes(id_length: int, key_length: int, headers: Mapping[str, str]) -> int:
    """About the size of a message's content-header frame: the id twice (property and
    header), the key, the user headers and the fixed fields."""
    size = 2 * id_length + key_length + 64
    if headers:
        for name, value in headers.items():  # a loop: a generator costs more
            size += len(name) + len(value) + 8
    return size


def frame_error(
    size: int, frame_max: int, *, endpoint: str, message_id: str | None
) -> MessageTooLarge | None:
    """The error for a content header of about ``size`` bytes (:func:`header_bytes`)
    that does not fit one frame, else None.

    NOTE: AMQP 0-9-1 carries all properties in one content-header frame; RabbitMQ
    closes the whole connection (501 FRAME_ERROR) when it exceeds frame_max, which would
    take every other message in flight down with it.
    """
    limit = frame_max - _HEADER_FRAME_RESERVE
    if size <= limit:
        return None
    return MessageTooLarge(
        f"headers of about {size} bytes exceed the frame limit of {limit}",
        endpoint=endpoint,
        message_id=message_id,
    )

"""Translate proton conditions and outcomes into msgsafe errors, classified.

AMQP 1.0 reports trouble as a *condition* (a symbol and a description) on a delivery
outcome, a link detach, a connection close or a transport error. Each maps to exactly
one msgsafe error, transient (retry / outbox) or permanent (the caller acts).
"""

from __future__ import annotations

from typing import Any

from msgsafe.adapters import _peer
from msgsafe.errors import (
    AuthenticationError,
    CertificateError,
    ConnectError,
    ConnectionLost,
    MessageTooLarge,
    MsgsafeError,
    ProtocolMismatch,
    Refused,
    Rejected,
    Unroutable,
)

__all__ = [
    "AUTH_CONDITIONS",
    "TimedOut",
    "certificate_error",
    "condition_text",
    "connection_error",
    "detach_error",
    "failure_cause",
    "is_not_found",
    "protocol_mismatch",
    "rejected_error",
    "unfixable",
]

#: Conditions that mean the credentials (or the vhost) were refused.
AUTH_CONDITIONS = frozenset(
    {"amqp:unauthorized-access", "amqp:security:unauthorized-access", "amqp:not-allowed"}
)
_NOT_FOUND = frozenset({"amqp:not-found", "amqp:resource-deleted"})
_TOO_LARGE = frozenset({"amqp:link:message-size-exceeded"})


def condition_text(condition: Any) -> str | None:
    """``name: description`` of a proton ``Condition`` (None for no condition)."""
    if condition is None:
        return None
    name = str(condition.name or "")
    description = str(condition.description or "")
    return f"{name}: {description}" if description else name or None


def _name(condition: Any) -> str:
    return str(condition.name) if condition is not None and condition.name else ""


def is_not_found(condition: Any) -> bool:
    """True for ``amqp:not-found`` / ``amqp:resource-deleted``: no such address."""
    return _name(condition) in _NOT_FOUND


def rejected_error(condition: Any, *, endpoint: str, message_id: str) -> MsgsafeError:
    """The error for a ``rejected`` outcome: permanent, carrying the broker's condition."""
    text = condition_text(condition)
    if _name(condition) in _TOO_LARGE:
        return MessageTooLarge(
            f"the broker rejected the message as too large ({text})",
            endpoint=endpoint,
            message_id=message_id,
        )
    return Rejected(
        f"the broker rejected the message ({text or 'no condition given'})",
        condition=text,
        endpoint=endpoint,
        message_id=message_id,
    )


def detach_error(condition: Any, *, endpoint: str, message_id: str, sent: bool) -> MsgsafeError:
    """The error for a send link the broker detached.

    ``amqp:not-found`` on a message never transferred is :class:`Unroutable` (the
    address does not exist); anything else is transient: :class:`ConnectionLost` when
    the message was transferred (the broker may hold it), :class:`Refused` when not.
    """
    text = condition_text(condition) or "no condition given"
    if not sent and _name(condition) in _NOT_FOUND:
        return Unroutable(
            f"the broker has no such address ({text})", endpoint=endpoint, message_id=message_id
        )
    if sent:
        return ConnectionLost(
            f"the broker detached the link before settling ({text})",
            endpoint=endpoint,
            message_id=message_id,
        )
    return Refused(
        f"the broker detached the link ({text})", endpoint=endpoint, message_id=message_id
    )


def connection_error(condition: Any, *, endpoint: str) -> MsgsafeError:
    """The error a connection or transport condition means for pending work."""
    text = condition_text(condition) or "connection closed"
    if _name(condition) in AUTH_CONDITIONS:
        return AuthenticationError(f"the broker refused the login ({text})", endpoint=endpoint)
    return ConnectError(f"could not connect ({text})", endpoint=endpoint)


class TimedOut:
    """The condition of an attempt that got no open frame within ``connect_timeout``, or
    of a connection whose peer never answered a link's attach (``description`` says
    which link)."""

    name = "timed out"

    def __init__(self, description: str | None = None) -> None:
        self.description = description


def protocol_mismatch(
    condition: Any, target: str, endpoint: str | None = None
) -> ProtocolMismatch | None:
    """The peer answered our protocol header with another protocol's (proton quotes the
    bytes it got), or closed without a header and answers Kafka's question at
    ``endpoint``: retrying will not help, the URL or the broker must change."""
    text = str(getattr(condition, "description", None) or "")
    # NOTE: a Kafka broker closes the connection on an AMQP header without sending a byte
    # of its own; only its port, asked Kafka's question, tells what it is.
    if (
        endpoint is not None
        and "no protocol header found" in text
        and _peer.identify_peer(endpoint, header=None, kafka=True) == "Kafka"
    ):
        return ProtocolMismatch(
            "this port speaks Kafka, not AMQP 1.0: use kafka://", endpoint=target
        )
    if r"Unknown protocol ['AMQP\x00\x00\x09\x01'" in text:
        return ProtocolMismatch(
            "this port speaks AMQP 0-9-1, not AMQP 1.0: use amqp:// or enable the broker's "
            "AMQP 1.0 support (RabbitMQ 3.x: rabbitmq-plugins enable rabbitmq_amqp1_0)",
            endpoint=target,
        )
    if "wrong version number" in text:
        return ProtocolMismatch(
            f"{_peer.PLAIN_NOT_TLS}: use amqp10:// (or the broker's TLS port)", endpoint=target
        )
    if "SSL/TLS connection" in text or r"Unknown protocol ['\x15\x03" in text:
        # NOTE: proton quotes the first bytes of the peer's TLS alert as "Unknown protocol".
        return ProtocolMismatch(
            "this port speaks TLS: use amqp10s:// (or the broker's plain AMQP 1.0 port)",
            endpoint=target,
        )
    return None


def certificate_error(condition: Any, target: str) -> CertificateError | None:
    """The peer's TLS certificate failed verification (proton: "certificate verify
    failed", whatever the reason: untrusted CA, wrong host name, expired), or the peer
    refused ours (a TLS alert: none given, or one it does not trust)."""
    text = str(getattr(condition, "description", None) or "")
    refused = _peer.client_certificate_refused(text)
    if refused is not None:
        return CertificateError(refused, endpoint=target)
    if "certificate verify failed" not in text:
        return None
    return CertificateError(
        "the broker's TLS certificate failed verification (untrusted CA, wrong host name "
        "or expired; give tls_ca_file= the CA that signed it, and a host name it names)",
        endpoint=target,
    )


def unfixable(
    condition: Any, target: str, endpoint: object | None
) -> ProtocolMismatch | CertificateError | None:
    """What no retry can fix about the peer at ``endpoint``: its protocol, or its
    certificate (None when the failure may pass)."""
    where = None if endpoint is None else str(endpoint)
    return certificate_error(condition, target) or protocol_mismatch(condition, target, where)


def failure_cause(condition: Any) -> str:
    """Why an attempt failed, in a few words: a socket error proton reports under its
    own condition name (``proton.pythonio``) is given by its description alone."""
    if condition is not None and str(condition.name or "").startswith("proton."):
        return str(condition.description or "disconnected").lower()
    return condition_text(condition) or "disconnected"

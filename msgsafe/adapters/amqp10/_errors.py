"""Translate proton conditions and outcomes into msgsafe errors, classified.

AMQP 1.0 reports trouble as a *condition* (a symbol and a description) on a delivery
outcome, a link detach, a connection close or a transport error. Each maps to exactly
one msgsafe error, transient (retry / outbox) or permanent (the caller acts).
"""

from __future__ import annotations

from typing import Any

from msgsafe.errors import (
    AuthenticationError,
    ConnectError,
    ConnectionLost,
    MessageTooLarge,
    MsgsafeError,
    Refused,
    Rejected,
    Unroutable,
)

__all__ = [
    "AUTH_CONDITIONS",
    "condition_text",
    "connection_error",
    "detach_error",
    "is_not_found",
    "rejected_error",
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

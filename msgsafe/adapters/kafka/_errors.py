"""librdkafka errors translated into msgsafe errors, classified by "could the broker have
acted?". Nothing from confluent_kafka leaves the adapter."""

from __future__ import annotations

from confluent_kafka import KafkaError

from msgsafe.adapters import _peer
from msgsafe.errors import (
    AuthenticationError,
    ConfirmTimeout,
    ConnectError,
    ConnectionLost,
    MessageTooLarge,
    MsgsafeError,
    Refused,
    Rejected,
    Unroutable,
)

__all__ = ["PRODUCER_STATE", "RefusedAfterAppend", "certificate_refusal", "translate"]


class RefusedAfterAppend(Refused):
    """NOT_ENOUGH_REPLICAS_AFTER_APPEND: the leader wrote it, too few replicas followed."""

    # NOTE: Kafka appends to the leader's log before it checks min.insync.replicas here,
    # so the message may surface later: a retry may duplicate it.
    maybe_delivered = True


_E = KafkaError

#: Never reached a broker (or the broker said "not now" before writing): safe to resend.
_REFUSED = frozenset(
    {
        _E.NOT_ENOUGH_REPLICAS,
        _E.NOT_LEADER_FOR_PARTITION,
        _E.LEADER_NOT_AVAILABLE,
        _E.KAFKA_STORAGE_ERROR,
        _E.THROTTLING_QUOTA_EXCEEDED,
        _E._QUEUE_FULL,
        _E._PURGE_QUEUE,
    }
)
#: The broker lost or refused the idempotent producer's identity (e.g. a restarted broker
#: that forgot the producer id): the message was not written; the producer is recreated.
PRODUCER_STATE = frozenset(
    {
        _E.PRODUCER_FENCED,
        _E.INVALID_PRODUCER_EPOCH,
        _E.UNKNOWN_PRODUCER_ID,
        _E.OUT_OF_ORDER_SEQUENCE_NUMBER,
        _E.INVALID_PRODUCER_ID_MAPPING,
    }
)
_TIMEOUT = frozenset({_E._MSG_TIMED_OUT, _E._TIMED_OUT, _E.REQUEST_TIMED_OUT})
_CONNECT = frozenset({_E._ALL_BROKERS_DOWN, _E._RESOLVE})
_LOST = frozenset({_E._TRANSPORT, _E.NETWORK_EXCEPTION, _E._PURGE_INFLIGHT, _E._FATAL, _E._DESTROY})
_TOO_LARGE = frozenset({_E.MSG_SIZE_TOO_LARGE, _E.RECORD_LIST_TOO_LARGE})
_UNROUTABLE = frozenset({_E.UNKNOWN_TOPIC_OR_PART, _E._UNKNOWN_TOPIC, _E._UNKNOWN_PARTITION})
_AUTH = frozenset(
    {
        _E.TOPIC_AUTHORIZATION_FAILED,
        _E.CLUSTER_AUTHORIZATION_FAILED,
        _E.GROUP_AUTHORIZATION_FAILED,
        _E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        _E.SASL_AUTHENTICATION_FAILED,
        _E._AUTHENTICATION,
    }
)


def translate(error: KafkaError, *, endpoint: str, message_id: str | None = None) -> MsgsafeError:
    """The msgsafe error for a librdkafka error (delivery report, produce, commit)."""
    code = error.code()
    text = f"kafka {error.name()}: {error.str()}"
    if code in _REFUSED or code in PRODUCER_STATE:
        return Refused(text, endpoint=endpoint, message_id=message_id)
    if code == _E.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
        return RefusedAfterAppend(text, endpoint=endpoint, message_id=message_id)
    if code in _TIMEOUT:
        return ConfirmTimeout(text, endpoint=endpoint, message_id=message_id)
    if code in _CONNECT:
        return ConnectError(text, endpoint=endpoint, message_id=message_id)
    if code in _LOST:
        return ConnectionLost(text, endpoint=endpoint, message_id=message_id)
    if code in _TOO_LARGE:
        return MessageTooLarge(text, endpoint=endpoint, message_id=message_id)
    if code in _UNROUTABLE:
        return Unroutable(text, endpoint=endpoint, message_id=message_id)
    if code in _AUTH:
        return AuthenticationError(text, endpoint=endpoint, message_id=message_id)
    if error.retriable() and not error.fatal():
        # Retriable means the broker did not act on it, by librdkafka's own judgement.
        return Refused(text, endpoint=endpoint, message_id=message_id)
    if error.fatal():
        # A fatal producer error (idempotence state lost) says nothing about this
        # message: the broker may hold it.
        return ConnectionLost(text, endpoint=endpoint, message_id=message_id)
    return Rejected(text, condition=error.name(), endpoint=endpoint, message_id=message_id)


def certificate_refusal(text: str) -> str | None:
    """What a CertificateError should say when librdkafka's error ``text`` shows a TLS
    certificate problem no retry can fix — the broker refused ours, or its own failed
    verification — else None."""
    refused = _peer.client_certificate_refused(text)
    if refused is not None or "certificate verify failed" not in text:
        return refused
    # NOTE: librdkafka names the reason after the colon (self-signed certificate, hostname
    # mismatch, certificate has expired, ...), or only its generic advice to install CA
    # certificates, which misleads for a wrong host name.
    reason = text.split("certificate verify failed", 1)[1].strip(" :").split("(after ")[0]
    if not reason.strip() or "could not be verified" in reason:
        reason = "untrusted CA, a host name it does not name, or expired"
    return (
        f"the broker's TLS certificate failed verification ({reason.strip()}): give "
        "tls_ca_file= the CA that signed it and connect by a host name it lists"
    )

"""What a consumer of ``memory://`` sees of an envelope: the same fields a network
adapter's wire carries, without the bytes.

Headers are the envelope's plus the ``msgsafe-id`` header
(:data:`~msgsafe.message.MESSAGE_ID_HEADER`), as a RabbitMQ or Kafka consumer reads
them, so a test against the memory broker sees what production will.
"""

from __future__ import annotations

from msgsafe.message import MESSAGE_ID_HEADER, Delivery, Envelope, SettleFn

__all__ = ["delivery_of"]


def delivery_of(
    envelope: Envelope, destination: str, *, redelivered: bool, settle: SettleFn
) -> Delivery:
    """``envelope`` as it is delivered from ``destination``."""
    headers = dict(envelope.headers)
    headers[MESSAGE_ID_HEADER] = envelope.message_id
    return Delivery(
        body=envelope.body,
        destination=destination,
        message_id=envelope.message_id,
        key=envelope.key,
        headers=headers,
        redelivered=redelivered,
        settle=settle,
    )

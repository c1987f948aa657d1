"""The dead-letter message: the original's key and body, its headers, and headers that
say where it came from, after how many attempts, why and when."""

from __future__ import annotations

import datetime

from msgsafe.message import MESSAGE_ID_HEADER, Delivery

__all__ = [
    "DEAD_LETTER_HEADERS",
    "DLQ_AT",
    "DLQ_ATTEMPTS",
    "DLQ_ERROR",
    "DLQ_ERROR_TYPE",
    "DLQ_MESSAGE_ID",
    "DLQ_SOURCE",
    "ERROR_TEXT_LIMIT",
    "dead_letter_headers",
]

DLQ_SOURCE = "x-msgsafe-dlq-source"  #: the destination the message was consumed from
DLQ_ATTEMPTS = "x-msgsafe-dlq-attempts"  #: how many times its handler ran (the last attempt)
DLQ_ERROR_TYPE = "x-msgsafe-dlq-error-type"  #: the last error's type, ``module.Name``
DLQ_ERROR = "x-msgsafe-dlq-error"  #: the last error's text, at most ERROR_TEXT_LIMIT chars
DLQ_AT = "x-msgsafe-dlq-at"  #: when it was dead-lettered, ISO-8601 in UTC
DLQ_MESSAGE_ID = "x-msgsafe-dlq-message-id"  #: the original message id

#: Every header a dead letter gets, in the order above.
DEAD_LETTER_HEADERS = (DLQ_SOURCE, DLQ_ATTEMPTS, DLQ_ERROR_TYPE, DLQ_ERROR, DLQ_AT, DLQ_MESSAGE_ID)

#: The error text is cut to this many characters: a header, not a log.
ERROR_TEXT_LIMIT = 1000

# NOTE: the message id header is the producer's own for the dead letter (its own id),
# and ``x-delivery-count`` is a RabbitMQ quorum queue's count for the original: carried
# over, it would say the dead letter was delivered before.
_NOT_CARRIED = frozenset({MESSAGE_ID_HEADER, "x-delivery-count", *DEAD_LETTER_HEADERS})


def _type_name(error: BaseException) -> str:
    kind = type(error)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def dead_letter_headers(
    delivery: Delivery, error: BaseException, *, at: datetime.datetime | None = None
) -> dict[str, str]:
    """The headers of ``delivery``'s dead letter: its own (but its message id and
    delivery count) and :data:`DEAD_LETTER_HEADERS`, ``at`` (default: now) in UTC."""
    when = at if at is not None else datetime.datetime.now(datetime.UTC)
    text = str(error)
    if len(text) > ERROR_TEXT_LIMIT:
        text = text[: ERROR_TEXT_LIMIT - 1] + "…"
    headers: dict[str, str] = {
        name: value for name, value in delivery.headers.items() if name not in _NOT_CARRIED
    }
    headers[DLQ_SOURCE] = delivery.destination
    headers[DLQ_ATTEMPTS] = str(delivery.attempt)
    headers[DLQ_ERROR_TYPE] = _type_name(error)
    headers[DLQ_ERROR] = text
    headers[DLQ_AT] = when.astimezone(datetime.UTC).isoformat()
    if delivery.message_id is not None:
        headers[DLQ_MESSAGE_ID] = delivery.message_id
    return headers

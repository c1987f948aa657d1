"""msgsafe: publish and consume through RabbitMQ, Kafka and AMQP 1.0 with one promise —
a message that ``send()`` accepted is never lost.

``send()`` returns a :class:`Receipt` only when the message is safe: confirmed by the
broker (:attr:`Status.CONFIRMED`) or committed to the local outbox and forwarded later
(:attr:`Status.STORED`). Otherwise it raises a typed :mod:`msgsafe.errors` error and the
caller still owns the message.
"""

from __future__ import annotations

import logging

from msgsafe import errors
from msgsafe.aio import AsyncConsumer, AsyncDelivery, AsyncProducer
from msgsafe.consumer import Consumer
from msgsafe.consuming.batching import BatchPolicy
from msgsafe.errors import MsgsafeError
from msgsafe.message import (
    Delivery,
    Envelope,
    Guarantee,
    Outcome,
    Receipt,
    Status,
    new_message_id,
)
from msgsafe.producer import Producer
from msgsafe.retry import RetryPolicy

#: The public name of a message as the producer builds it.
Message = Envelope

__all__ = [
    "AsyncConsumer",
    "AsyncDelivery",
    "AsyncProducer",
    "BatchPolicy",
    "Consumer",
    "Delivery",
    "Envelope",
    "Guarantee",
    "Message",
    "MsgsafeError",
    "Outcome",
    "Producer",
    "Receipt",
    "RetryPolicy",
    "Status",
    "__version__",
    "errors",
    "new_message_id",
]

__version__ = "0.1.0"

# A library does not decide where its records go: without a handler configured by the
# application, nothing reaches stderr (no "last resort" printing). The client libraries
# underneath (pika, proton) log every failed reconnect with their own nested exception
# text; msgsafe reports the same events once, in its own words, so their records stay
# out of the application's handlers unless it asks for them:
# ``logging.getLogger("pika").propagate = True``. librdkafka's are off (log_level 0);
# with a ``debug`` setting they reach the "msgsafe.librdkafka" logger, never stderr.
logging.getLogger("msgsafe").addHandler(logging.NullHandler())
for _name in ("pika", "proton"):
    logging.getLogger(_name).addHandler(logging.NullHandler())
    logging.getLogger(_name).propagate = False
del _name

"""``confluent_kafka`` with msgsafe's :class:`Producer`; every other name is the original.

``from msgsafe.compat.confluent_kafka import Producer`` (or ``from msgsafe.compat import
confluent_kafka``) in place of the confluent-kafka import is the whole migration.
"""

from __future__ import annotations

# NOTE: absolute imports of the real library: this module shares its last name with it.
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
    admin,
    libversion,
    version,
)

from msgsafe.sdk.compat.confluent_kafka import (
    OFFSET_INVALID,
    STATUS_HEADER,
    DeliveredMessage,
    Producer,
)

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "STATUS_HEADER",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "Consumer",
    "DeliveredMessage",
    "KafkaError",
    "KafkaException",
    "Message",
    "Producer",
    "TopicPartition",
    "admin",
    "libversion",
    "version",
]

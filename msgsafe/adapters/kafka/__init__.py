"""``kafka://`` and ``kafka+ssl://``: the Kafka adapter (confluent-kafka / librdkafka).

Publishing uses ``acks=all`` with the idempotent producer, on a
:class:`~msgsafe.adapters.kafka.client.KafkaClient` (which the confluent-kafka drop-in and
the Spark sink use too); consuming commits offsets only after the application
acknowledged. The broker side completes the chain: topics with replication factor 3 or
more, ``min.insync.replicas=2`` and ``unclean.leader.election.enable=false``.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgsafe.errors import MissingExtra

try:
    import confluent_kafka  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise MissingExtra("kafka", "confluent-kafka") from exc

from msgsafe.adapters._config import build_config
from msgsafe.adapters.kafka._errors import certificate_refusal
from msgsafe.adapters.kafka.client import KafkaClient
from msgsafe.adapters.kafka.config import KafkaOptions, check_destination
from msgsafe.adapters.kafka.positions import start_group_at_beginning
from msgsafe.adapters.kafka.receiver import KafkaReceiver
from msgsafe.adapters.kafka.transport import KafkaTransport
from msgsafe.endpoints import BrokerUrl

__all__ = [
    "KafkaClient",
    "KafkaOptions",
    "KafkaReceiver",
    "KafkaTransport",
    "certificate_refusal",
    "check_destination",
    "open_receiver",
    "open_transport",
    "start_group_at_beginning",
]


def open_transport(url: BrokerUrl, options: Mapping[str, object]) -> KafkaTransport:
    """A producer for ``url``; connects lazily, so it opens even while brokers are down."""
    return KafkaTransport(url, build_config(KafkaOptions, url, options))


def open_receiver(
    url: BrokerUrl, options: Mapping[str, object], *, group: str | None = None
) -> KafkaReceiver:
    """A consumer-group member for ``url``; ``group`` None makes a private group."""
    return KafkaReceiver(url, build_config(KafkaOptions, url, options), group)

"""Admin calls on any Kafka-protocol cluster, by bootstrap address: metadata, create a
topic, partition leaders and in-sync replicas.

Shared by the launchers of :mod:`msgsafe.cluster` that speak Kafka (``kafka``, ``tansu``)
and by tests; it needs confluent-kafka (``pip install 'msgsafe[kafka]'``). Every wait
polls against a deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgsafe.cluster._process import wait_for
from msgsafe.cluster.base import ClusterError

__all__ = [
    "confluent",
    "create_topic",
    "elect_preferred",
    "metadata",
    "partitions",
    "wait_in_sync",
]

_KAFKA_HINT = "pip install 'msgsafe[kafka]' (confluent-kafka)"


def confluent() -> Any:
    """The ``confluent_kafka`` module; :class:`ClusterError` naming the extra when missing."""
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError as exc:
        raise ClusterError(f"this needs confluent-kafka: {_KAFKA_HINT}") from exc
    return confluent_kafka


def metadata(bootstrap: str, timeout: float = 2.0) -> Any:
    """Cluster metadata (``ClusterMetadata``) through ``bootstrap``, or None when no
    broker answered within ``timeout``. A fresh client each call, so the answer comes
    from a process that runs now, not from a connection to one that was replaced."""
    ck = confluent()
    admin = ck.admin.AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        return admin.list_topics(timeout=timeout)
    except ck.KafkaException:
        return None


def partitions(bootstrap: str, topic: str, timeout: float = 5.0) -> dict[int, Any]:
    """``{partition: PartitionMetadata}`` of ``topic`` (leader, replicas, isrs)."""
    meta = metadata(bootstrap, timeout)
    entry = meta.topics.get(topic) if meta is not None else None
    if entry is None or entry.error is not None:
        raise ClusterError(f"no metadata for topic {topic!r}")
    return dict(entry.partitions)


def create_topic(
    bootstrap: str,
    name: str,
    partitions_: int,
    replication: int,
    config: Mapping[str, str] | None = None,
    *,
    timeout: float = 30.0,
) -> None:
    """Create ``name`` (an existing topic is kept as it is) and wait until every
    partition has a leader."""
    ck = confluent()
    admin = ck.admin.AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    topic = ck.admin.NewTopic(name, partitions_, replication, config=dict(config or {}))
    future = admin.create_topics([topic], request_timeout=timeout)[name]
    try:
        future.result(timeout)
    except ck.KafkaException as exc:
        if exc.args[0].code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
            raise ClusterError(f"could not create topic {name!r}: {exc}") from exc

    def led() -> bool:
        meta = metadata(bootstrap)
        entry = meta.topics.get(name) if meta is not None else None
        if entry is None or entry.error is not None or len(entry.partitions) < partitions_:
            return False
        return all(p.leader >= 0 for p in entry.partitions.values())

    wait_for(led, timeout, f"every partition of {name!r} to have a leader", interval=0.1)


def wait_in_sync(bootstrap: str, topic: str, timeout: float = 60.0) -> None:
    """Wait until every replica of every partition of ``topic`` is in sync and every
    partition has a leader."""

    def in_sync() -> bool:
        try:
            parts = partitions(bootstrap, topic)
        except ClusterError:
            return False
        return bool(parts) and all(
            p.leader >= 0 and sorted(p.isrs) == sorted(p.replicas) for p in parts.values()
        )

    wait_for(in_sync, timeout, f"every replica of {topic!r} in sync", interval=0.2)


def elect_preferred(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, str]:
    """A preferred leader election of every partition of ``topic`` (what
    ``kafka-leader-election.sh --election-type PREFERRED`` asks): each partition's first
    replica becomes its leader if it is in sync. Returns ``{partition: error}`` for the
    partitions not moved, the election not needed (already led by it) left out."""
    ck = confluent()
    admin = ck.admin.AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    wanted = [ck.TopicPartition(topic, p) for p in partitions(bootstrap, topic)]
    # NOTE: no request_timeout/operation_timeout: confluent-kafka 2.16's elect_leaders
    # fails on any keyword argument (its C call's keyword list is one short, a
    # SystemError or TypeError); the future's own timeout bounds the wait instead.
    future = admin.elect_leaders(ck.ElectionType.PREFERRED, wanted)
    try:
        results = future.result(timeout)
    except ck.KafkaException as exc:
        raise ClusterError(f"preferred leader election of {topic!r} failed: {exc}") from exc
    refused: dict[int, str] = {}
    for part, error in results.items():
        if error is not None and error.code() != ck.KafkaError.ELECTION_NOT_NEEDED:
            refused[part.partition] = error.str()
    return refused

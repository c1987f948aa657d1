"""Where a checking consumer's new group starts reading a topic.

Tools that produce a run and read it back (``msgsafe verify``, ``msgsafe demo``) must
not miss a record of their run, and reading more than needed only costs time. So
their groups start every partition at offset 0, committed explicitly, rather than
trusting ListOffsets: some Kafka-protocol brokers answer it wrongly (seen with tansu
0.6: a high watermark of 1 on a partition holding 200 records, and after a broker
restart an "earliest" offset past records still in the log, so that a new group
relying on ``auto.offset.reset`` skipped whole partitions). Where retention removed
offset 0, the broker answers OFFSET_OUT_OF_RANGE and ``auto.offset.reset=earliest``
moves the group to the first record kept.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from msgsafe.adapters._config import build_config
from msgsafe.adapters.kafka.config import KafkaOptions, consumer_settings
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ConnectError

__all__ = ["start_group_at_beginning"]


def _partitions(consumer: Any, topic: str, timeout: float) -> list[int]:
    """The topic's partitions; [] when no broker knew the topic within ``timeout``.

    Asks again until the deadline: a broker that just restarted may not know a topic
    the others do (tansu learns topics late), and librdkafka asks one broker at a time.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        metadata = consumer.list_topics(topic, timeout=max(left, 0.1))
        entry = metadata.topics.get(topic)
        if entry is not None and entry.error is None and entry.partitions:
            return sorted(entry.partitions)
        if left <= 0:
            return []
        time.sleep(min(0.2, left))  # polling the metadata with a deadline


#: Commit errors of a coordinator that is moving or loading (a broker just restarted):
#: asked again until the deadline.
_COORDINATOR_BUSY = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
    }
)


def _commit_at_zero(consumer: Any, topic: str, partitions: list[int], deadline: float) -> None:
    offsets = [TopicPartition(topic, p, 0) for p in partitions]
    while True:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
            return
        except KafkaException as exc:
            error = exc.args[0]
            busy = error.code() in _COORDINATOR_BUSY or error.retriable()
            left = deadline - time.monotonic()
            if not busy or left <= 0:
                raise
            time.sleep(min(0.2, left))  # polling the coordinator with a deadline


def start_group_at_beginning(
    url: BrokerUrl, topic: str, group: str, *, timeout: float = 30.0
) -> None:
    """Commit offset 0 on every partition of ``topic`` as the position of ``group``,
    which must have no live member.

    Raises :class:`ConnectError` when the topic's partitions or the commit could not be
    had within ``timeout`` seconds.
    """
    settings = consumer_settings(url, build_config(KafkaOptions, url, {}), group)
    settings["log_level"] = 0  # refused connections end in the ConnectError below
    consumer = Consumer(settings)
    try:
        partitions = _partitions(consumer, topic, timeout)
        if not partitions:
            raise ConnectError(f"no partitions of topic {topic!r} in the cluster's metadata")
        _commit_at_zero(consumer, topic, partitions, time.monotonic() + timeout)
    except KafkaException as exc:
        raise ConnectError(
            f"could not set where group {group!r} starts on {topic!r}: {exc.args[0]}"
        ) from None
    finally:
        consumer.close()

"""Each Kafka topic setting the failure stories name is on the receipt, or refused per
``require=``, on the session's real 3-node Apache Kafka cluster: one replica,
``min.insync.replicas=1`` and unclean leader election each acknowledge ``acks=all``
writes that one broker's loss (or an unclean election) discards, so they are
``durable``, not ``replicated``; an auto-created topic gets the broker defaults."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from msgsafe import Guarantee, Producer, Status
from msgsafe.errors import UnsafeDestination
from msgsafe.message import new_message_id
from tests.support.kafka_lab import LabKafka

pytestmark = pytest.mark.integration

#: name, replication, topic config, the guarantee, the setting the report names.
SETTINGS = [
    ("rf1", 1, {}, Guarantee.DURABLE, "replication factor"),
    ("minisr1", 3, {"min.insync.replicas": "1"}, Guarantee.DURABLE, "min.insync.replicas"),
    (
        "unclean",
        3,
        {"unclean.leader.election.enable": "true"},
        Guarantee.DURABLE,
        "unclean.leader.election.enable",
    ),
    ("safe", 3, {"min.insync.replicas": "2"}, Guarantee.REPLICATED, ""),
]


@pytest.mark.parametrize(
    ("label", "replication", "config", "guarantee", "setting"),
    SETTINGS,
    ids=[s[0] for s in SETTINGS],
)
def test_each_topic_setting_is_on_the_receipt_or_refused(
    kafka_cluster: LabKafka,
    label: str,
    replication: int,
    config: dict[str, str],
    guarantee: Guarantee,
    setting: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = f"check-{label}-{new_message_id()}"
    kafka_cluster.create_topic(topic, partitions=1, replication=replication, config=config)
    caplog.set_level(logging.WARNING, logger="msgsafe.checks")
    with Producer(kafka_cluster.url, outbox=False) as producer:
        receipts = [producer.send(topic, b"x") for _ in range(5)]
        batch = producer.send_batch(topic, [b"y"] * 20)
    assert {r.status for r in receipts} == {Status.CONFIRMED}
    assert {r.guarantee for r in receipts} == {guarantee}
    assert batch.guarantee is guarantee
    warnings = [r.getMessage() for r in caplog.records if r.name == "msgsafe.checks"]
    if guarantee is Guarantee.REPLICATED:
        assert warnings == []
    else:
        # One WARNING for the destination, naming the setting; not one per message.
        assert len(warnings) == 1 and setting in warnings[0], warnings

    with Producer(kafka_cluster.url, outbox=False, require="replicated") as strict:
        if guarantee is Guarantee.REPLICATED:
            assert strict.send(topic, b"z").guarantee is Guarantee.REPLICATED
        else:
            with pytest.raises(UnsafeDestination) as caught:
                strict.send(topic, b"z")
            error = caught.value
            assert (error.guarantee, error.required) == ("durable", "replicated")
            assert setting in str(error) and error.fix, error


def test_refused_sends_put_nothing_on_the_topic(kafka_cluster: LabKafka) -> None:
    topic = f"check-refused-{new_message_id()}"
    kafka_cluster.create_topic(topic, partitions=1, replication=1)
    with Producer(kafka_cluster.url, outbox=False, require="replicated") as producer:
        for _ in range(5):
            with pytest.raises(UnsafeDestination):
                producer.send(topic, b"x")
        with pytest.raises(UnsafeDestination):
            producer.send_batch(topic, [b"x"] * 10)
    assert _watermarks(kafka_cluster, topic) == 0


def test_an_auto_created_topic_gets_the_broker_defaults(kafka_cluster: LabKafka) -> None:
    """The cluster's defaults are replication 3, ``min.insync.replicas=2``, no unclean
    election: a topic the first send creates is replicated, and the check itself does
    not create it."""
    topic = f"check-auto-{new_message_id()}"
    with Producer(kafka_cluster.url, outbox=False, require="replicated") as producer:
        assert producer.guarantee(topic) is Guarantee.REPLICATED
        receipt = producer.send(topic, b"x")
    assert receipt.status is Status.CONFIRMED and receipt.guarantee is Guarantee.REPLICATED


def test_the_confluent_kafka_drop_in_checks_before_its_direct_lane(
    kafka_cluster: LabKafka, tmp_path: Path
) -> None:
    """The drop-in's fast path produces through librdkafka itself: it asks the same
    check first, so a one-replica topic under ``msgsafe.require=replicated`` raises
    KafkaException(POLICY_VIOLATION) from produce() and nothing reaches the topic."""
    from confluent_kafka import KafkaError, KafkaException

    from msgsafe.compat.confluent_kafka import Producer as DropIn

    topic = f"check-dropin-{new_message_id()}"
    kafka_cluster.create_topic(topic, partitions=1, replication=1)
    strict = DropIn(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "msgsafe.require": "replicated",
            "msgsafe.outbox": str(tmp_path / "strict.db"),
        }
    )
    with pytest.raises(KafkaException) as caught:
        strict.produce(topic, b"x")
    assert caught.value.args[0].code() == KafkaError.POLICY_VIOLATION
    assert "min.insync.replicas" in caught.value.args[0].str() or "replication" in str(caught.value)
    assert strict.flush(10) == 0
    delivered: list[object] = []
    relaxed = DropIn(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "msgsafe.outbox": str(tmp_path / "relaxed.db"),
        }
    )
    relaxed.produce(topic, b"y", on_delivery=lambda err, msg: delivered.append(err))
    assert relaxed.flush(30) == 0
    assert delivered == [None]
    assert _watermarks(kafka_cluster, topic) == 1


def _watermarks(kafka_cluster: LabKafka, topic: str) -> int:
    """How many records partition 0 of ``topic`` holds."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": topic})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    return int(high - low)

"""The Kafka adapter against the session's Apache Kafka: round trip, headers, keys, typed
errors."""

from __future__ import annotations

import collections
import time

import pytest

from msgsafe.adapters.kafka import KafkaOptions, open_receiver, open_transport
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError, MessageTooLarge, Unroutable
from msgsafe.message import Envelope
from tests.support.kafka_ledger import start_group_at_zero

pytestmark = pytest.mark.integration

FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}


def test_round_trip_carries_id_headers_and_key(
    kafka_cluster: KafkaCluster, kafka_topic: str
) -> None:
    transport = open_transport(parse_url(kafka_cluster.url), {})
    envelopes = [
        Envelope.build(kafka_topic, f"m{i}".encode(), key=f"k{i % 4}", headers={"n": str(i)})
        for i in range(200)
    ]
    try:
        futures = [transport.publish(env) for env in envelopes]
        for future in futures:
            assert future.result(15) is None
    finally:
        transport.close()

    start_group_at_zero(kafka_cluster.url, kafka_topic, f"rt-{kafka_topic}")
    receiver = open_receiver(parse_url(kafka_cluster.url), FAST_GROUP, group=f"rt-{kafka_topic}")
    got = []
    try:
        receiver.subscribe(kafka_topic)
        deadline = time.monotonic() + 60
        while len(got) < len(envelopes) and time.monotonic() < deadline:
            for delivery in receiver.receive(max_messages=500, timeout=0.5):
                got.append(delivery)
                delivery.ack()
    finally:
        receiver.close()
    by_id = {d.message_id: d for d in got}
    assert set(by_id) == {e.message_id for e in envelopes}
    for env in envelopes:
        delivery = by_id[env.message_id]
        assert delivery.body == env.body
        assert delivery.key == env.key
        assert dict(delivery.headers) == dict(env.headers)
    # The key decides the partition: all messages of a key arrive in send order.
    order: dict[bytes | None, list[int]] = collections.defaultdict(list)
    for delivery in got:
        order[delivery.key].append(int(delivery.headers["n"]))
    for key, numbers in order.items():
        assert numbers == sorted(numbers), key


def test_committed_offsets_are_not_redelivered(
    kafka_cluster: KafkaCluster, kafka_topic: str
) -> None:
    transport = open_transport(parse_url(kafka_cluster.url), {})
    try:
        for future in [transport.publish(Envelope.build(kafka_topic, b"x")) for _ in range(30)]:
            future.result(15)
    finally:
        transport.close()
    url = parse_url(kafka_cluster.url)
    start_group_at_zero(kafka_cluster.url, kafka_topic, f"g-{kafka_topic}")
    first = open_receiver(url, FAST_GROUP, group=f"g-{kafka_topic}")
    acked: list[str | None] = []
    try:
        first.subscribe(kafka_topic)
        deadline = time.monotonic() + 60
        while len(acked) < 20 and time.monotonic() < deadline:
            for delivery in first.receive(max_messages=20 - len(acked), timeout=0.5):
                acked.append(delivery.message_id)
                delivery.ack()
    finally:
        first.close()
    second = open_receiver(url, FAST_GROUP, group=f"g-{kafka_topic}")
    rest: list[str | None] = []
    try:
        second.subscribe(kafka_topic)
        deadline = time.monotonic() + 60
        while len(rest) < 10 and time.monotonic() < deadline:
            for delivery in second.receive(max_messages=100, timeout=0.5):
                rest.append(delivery.message_id)
                delivery.ack()
        rest.extend(d.message_id for d in second.receive(max_messages=100, timeout=1.0))
    finally:
        second.close()
    print(f"first consumer acked {len(acked)}, second got {len(rest)}")
    assert len(acked) == 20
    assert len(rest) == 10
    assert not set(acked) & set(rest)


def test_requeue_delivers_again(kafka_cluster: KafkaCluster, kafka_topic: str) -> None:
    transport = open_transport(parse_url(kafka_cluster.url), {})
    try:
        transport.publish(Envelope.build(kafka_topic, b"once", key="k")).result(15)
    finally:
        transport.close()
    start_group_at_zero(kafka_cluster.url, kafka_topic, f"rq-{kafka_topic}")
    receiver = open_receiver(parse_url(kafka_cluster.url), FAST_GROUP, group=f"rq-{kafka_topic}")
    try:
        receiver.subscribe(kafka_topic)
        seen = []
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            for delivery in receiver.receive(max_messages=10, timeout=0.5):
                seen.append(delivery)
                if len(seen) == 1:
                    delivery.nack(requeue=True)
                else:
                    delivery.ack()
    finally:
        receiver.close()
    assert len(seen) == 2
    assert seen[0].message_id == seen[1].message_id
    assert not seen[0].redelivered and seen[1].redelivered


def test_too_large_is_permanent(kafka_cluster: KafkaCluster, kafka_topic: str) -> None:
    url = parse_url(kafka_cluster.url)
    transport = open_transport(url, {"max_message_size": 1000})
    try:
        with pytest.raises(MessageTooLarge):
            transport.publish(Envelope.build(kafka_topic, b"x" * 2000)).result(5)
    finally:
        transport.close()
    # librdkafka's own limit, below ours: the same typed error.
    transport = open_transport(url, {"librdkafka": {"message.max.bytes": "1500"}})
    try:
        with pytest.raises(MessageTooLarge):
            transport.publish(Envelope.build(kafka_topic, b"x" * 5000)).result(5)
    finally:
        transport.close()


def test_unknown_topic_without_auto_create_is_unroutable(kafka_cluster: KafkaCluster) -> None:
    transport = open_transport(
        parse_url(kafka_cluster.url),
        {"confirm_timeout": 4, "librdkafka": {"allow.auto.create.topics": "false"}},
    )
    try:
        started = time.monotonic()
        with pytest.raises(Unroutable):
            transport.publish(Envelope.build("no-such-topic", b"x")).result(10)
        assert time.monotonic() - started < 4.5
    finally:
        transport.close()


def test_unsafe_settings_are_refused() -> None:
    url = parse_url("kafka://127.0.0.1:1")
    for options in (
        {"acks": "1"},
        {"enable_idempotence": False},
        {"librdkafka": {"acks": "1"}},
        {"librdkafka": {"enable.idempotence": "false"}},
        {"librdkafka": {"enable.auto.commit": "true"}},
        {"librdkafka": {"bootstrap.servers": "elsewhere:9092"}},
        {"librdkafka": "acks=1"},
        {"no_such_option": 1},
    ):
        with pytest.raises(ConfigurationError):
            open_transport(url, options)
    with pytest.raises(ConfigurationError):  # librdkafka's own check, translated
        open_transport(url, {"acks": "1", "allow_unsafe": True})
    unsafe = open_transport(url, {"acks": "1", "enable_idempotence": False, "allow_unsafe": True})
    unsafe.close()


def test_defaults_keep_the_promise() -> None:
    from msgsafe.adapters.kafka.config import consumer_settings, producer_settings

    url = parse_url("kafka://127.0.0.1:1,127.0.0.1:2")
    options = KafkaOptions(confirm_timeout=10)
    producer = producer_settings(url, options)
    assert producer["acks"] == "all"
    assert producer["enable.idempotence"] is True
    assert producer["message.timeout.ms"] == 8800
    assert producer["reconnect.backoff.max.ms"] == 1000
    assert producer["bootstrap.servers"] == "127.0.0.1:1,127.0.0.1:2"
    consumer = consumer_settings(url, options, "g")
    assert consumer["enable.auto.commit"] is False
    assert consumer["enable.auto.offset.store"] is False


def test_a_session_timeout_the_broker_refuses_is_a_configuration_error(
    kafka_cluster: KafkaCluster, kafka_topic: str
) -> None:
    # The cluster accepts session timeouts from 1 s up: 500 ms is refused at JoinGroup,
    # which librdkafka would retry forever while the receiver gets nothing.
    receiver = open_receiver(
        parse_url(kafka_cluster.url),
        {"session_timeout_ms": 500, "heartbeat_interval_ms": 100},
        group=f"short-{kafka_topic}",
    )
    try:
        receiver.subscribe(kafka_topic)
        started = time.monotonic()
        with pytest.raises(ConfigurationError, match="session"):
            while time.monotonic() - started < 30:
                receiver.receive(max_messages=10, timeout=0.5)
        print(f"\nrefused session timeout raised after {time.monotonic() - started:.1f}s")
    finally:
        receiver.close()

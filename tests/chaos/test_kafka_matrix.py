"""The fault matrix for Kafka: a producer sending keyed messages to the session's Apache
Kafka cluster through one fault proxy per node (each node advertises its proxy, so every
byte between client and brokers goes through one) while one fault is injected, held and
healed; then drain, consume, and check the ledger: lost = 0, duplicates only of known
ids, and per-key order on the consumer side.

Process faults hit the node leading partition 0 of the cell's topic (kill -9, SIGSTOP:
a fail-over to an in-sync follower), or every node (all brokers down).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.kafka import KafkaCluster
from tests.chaos._matrix import (
    RETRY,
    Consume,
    Fault,
    consume_with,
    disk_full_fault,
    proxy_faults,
    run_cell,
    stored_during_fault,
)
from tests.fixtures.chaos import ChaosKafka

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SEND_TIMEOUT = 5.0
OPTIONS: dict[str, object] = {"connect_timeout": 1.0, "confirm_timeout": 3.0}
#: 64 keys in all. NOTE: after a fault the forwarder sends one message per key per
#: confirm round trip (per-key order), and new sends of a key with rows in the outbox
#: queue behind them: more keys drain in parallel; the order check covers every key.
KEYS_PER_THREAD = 16


def _topic(cluster: KafkaCluster) -> str:
    name = f"chaos-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(name, partitions=3)
    return name


def _cell(
    kafka: ChaosKafka, fault: Fault, outbox: Path, require: str = "durable", **kw: object
) -> None:
    topic = _topic(kafka.cluster)
    kafka.topic = topic
    before = _upstream_bytes(kafka)
    with msgsafe.Producer(
        kafka.url,
        outbox=outbox,
        send_timeout=SEND_TIMEOUT,
        retry=RETRY,
        require=require,
        **OPTIONS,
    ) as producer:
        run_cell(
            "kafka",
            fault,
            producer,
            topic,
            _consume_and_count(kafka, topic),
            send_timeout=SEND_TIMEOUT,
            check_order=True,
            keys_per_thread=KEYS_PER_THREAD,
            **kw,  # type: ignore[arg-type]
        )
    after = _upstream_bytes(kafka)
    # The producer's bytes went through the proxies, not around them.
    assert after - before > 10_000, (before, after)


def _upstream_bytes(kafka: ChaosKafka) -> int:
    return sum(proxy.stats().bytes_upstream for proxy in kafka.proxies)


@pytest.mark.parametrize("name", ["black-hole", "reset", "latency 2 s", "bandwidth 10 KB/s"])
def test_proxy_fault(name: str, chaos_rep: int, chaos_kafka: ChaosKafka, tmp_path: Path) -> None:
    fault = proxy_faults(chaos_kafka.proxies)[name]
    _cell(chaos_kafka, fault, tmp_path / "outbox.db")


def test_kill9(chaos_rep: int, chaos_kafka: ChaosKafka, tmp_path: Path) -> None:
    fault = Fault("kill -9 (leader)", chaos_kafka.kill, chaos_kafka.heal, 3.0)
    _cell(chaos_kafka, fault, tmp_path / "outbox.db")


def test_sigstop(chaos_rep: int, chaos_kafka: ChaosKafka, tmp_path: Path) -> None:
    fault = Fault("SIGSTOP (leader)", chaos_kafka.pause, chaos_kafka.heal, 12.0)
    _cell(chaos_kafka, fault, tmp_path / "outbox.db")


def test_all_brokers_down(chaos_rep: int, chaos_kafka: ChaosKafka, tmp_path: Path) -> None:
    # Down well past confirm_timeout, so sends must end STORED.
    fault = Fault(
        "all brokers down",
        chaos_kafka.kill_all,
        chaos_kafka.heal,
        10.0,
        expect=stored_during_fault,
    )
    _cell(chaos_kafka, fault, tmp_path / "outbox.db")


def test_outbox_disk_full(chaos_rep: int, chaos_kafka: ChaosKafka, small_disk: Path) -> None:
    fault = disk_full_fault(chaos_kafka.proxies, small_disk, leave=100_000)
    # The outbox is on a small tmpfs (a real full disk): memory, which the default
    # require= refuses; accepted here on purpose.
    _cell(chaos_kafka, fault, small_disk / "outbox.db", require="any", body_size=512)


def _consume_and_count(kafka: ChaosKafka, topic: str) -> Consume:
    """Consume the topic; when ids are missing, say whether they are in the log at all
    (the sum of the partitions' high watermarks against what was read)."""
    inner = consume_with(
        kafka.direct_url,
        topic,
        group=f"chaos-{uuid.uuid4().hex[:8]}",
        options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 500},
    )

    def consume(expected: set[str]) -> list[tuple[str, bytes]]:
        arrivals = inner(expected)
        missing = expected - {mid for mid, _ in arrivals}
        if missing:
            print(
                f"{len(missing)} ids not read; the log holds {_log_size(kafka, topic)} "
                f"records, {len(arrivals)} were read"
            )
        return arrivals

    return consume


def _log_size(kafka: ChaosKafka, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.cluster.bootstrap,
            "group.id": f"wm-{uuid.uuid4().hex}",
            "log_level": 0,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10)
        total = 0
        for partition in meta.topics[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            total += high - low
        return total
    finally:
        consumer.close()

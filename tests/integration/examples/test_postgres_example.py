"""examples/transactional_outbox.py against the suite's PostgreSQL, on the in-process
broker (the example checks what was published) and on real Kafka brokers (this test
consumes the topic)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.kafka import KafkaCluster
from tests.support.commands import run_example

pytestmark = pytest.mark.integration


def test_transactional_outbox_on_memory(postgres_conninfo: str, tmp_path: Path) -> None:
    result = run_example(
        "transactional_outbox.py", home=tmp_path, env={"DATABASE_URL": postgres_conninfo}
    )
    assert result.code == 0, result.stderr
    lines = result.lines()
    assert re.fullmatch(r"committed o-\w+: receipt STORED [0-9a-f-]{36}", lines[0])
    assert re.fullmatch(r"rolled back o-\w+: order o-\w+: amount must be positive", lines[1])
    assert lines[2:] == [
        "pending after drain: 0",
        "orders saved: True (committed) · False (rolled back)",
        "published for the committed order: 1",
        "published for the rolled-back order: 0",
    ]


def test_transactional_outbox_on_kafka(
    postgres_conninfo: str, kafka_cluster: KafkaCluster, kafka_url: str, tmp_path: Path
) -> None:
    kafka_cluster.create_topic("order-placed", partitions=3)
    result = run_example(
        "transactional_outbox.py",
        kafka_url,
        home=tmp_path,
        env={"DATABASE_URL": postgres_conninfo},
    )
    assert result.code == 0, result.stderr
    good = re.search(r"^committed (o-\w+):", result.stdout, re.MULTILINE)
    bad = re.search(r"^rolled back (o-\w+):", result.stdout, re.MULTILINE)
    assert good is not None and bad is not None
    assert "pending after drain: 0" in result.lines()

    # Read the whole topic: the committed order's event exactly once (dedup on), the
    # rolled-back one never. Other runs of this test in the session add other orders.
    bodies: list[str] = []
    group = f"tx-check-{time.monotonic_ns()}"
    with msgsafe.Consumer(kafka_url, group=group, dedup=True) as consumer:
        consumer.subscribe("order-placed")
        deadline = time.monotonic() + 60
        quiet_until = None
        while time.monotonic() < deadline:
            batch = consumer.poll(max_messages=100, timeout=0.5)
            for delivery in batch:
                bodies.append(delivery.body.decode())
                delivery.ack()
            if any(good.group(1) in b for b in bodies):
                # Seen it: read on for 2 s more so a wrongly published one would show.
                quiet_until = quiet_until or time.monotonic() + 2
                if time.monotonic() > quiet_until:
                    break
    print(f"read {len(bodies)} order events from the topic")
    assert sum(good.group(1) in b for b in bodies) == 1
    assert not any(bad.group(1) in b for b in bodies)

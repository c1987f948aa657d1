"""Tombstones through the outbox: stored while no broker answers, forwarded to the real
Kafka cluster later, consumed as a null value (and ``b""`` still as ``b""``).

Stored through the confluent-kafka wrapper and through ``msgsafe.Producer.send(topic,
None)``; a later wrapper on the same outbox file forwards them (the outbox does not care
which broker list a row was stored for)."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import msgsafe
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat import confluent_kafka
from msgsafe.message import MESSAGE_ID_HEADER
from tests.support.kafka_ledger import earliest_consumer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _nowhere() -> str:
    """A loopback address nobody listens on: every broker of it is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def _consume(cluster: KafkaCluster, topic: str, ids: set[str]) -> dict[str, Any]:
    """Value by msgsafe id of every record of ``topic`` until all ``ids`` arrived (60 s),
    with every id seen more than once listed under ``"dups"``."""
    consumer = earliest_consumer(cluster.bootstrap, "tomb")
    consumer.subscribe([topic])
    values: dict[str, Any] = {}
    dups: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while not ids <= values.keys() and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            [message_id] = [v.decode() for k, v in msg.headers() or [] if k == MESSAGE_ID_HEADER]
            if message_id in values:
                dups.append(message_id)
            values[message_id] = msg.value()
    finally:
        consumer.close()
    return {"values": values, "dups": dups}


def test_a_stored_tombstone_arrives_as_a_null_value(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    topic = f"tomb-{uuid.uuid4().hex[:12]}"
    kafka_cluster.create_topic(topic, partitions=3)
    outbox = tmp_path / "outbox.sqlite3"
    reports: list[Any] = []
    down = confluent_kafka.Producer(
        {
            "bootstrap.servers": _nowhere(),
            "message.timeout.ms": 3000,
            "msgsafe.outbox": str(outbox),
        }
    )
    down.produce(topic, None, key=b"deleted", on_delivery=lambda e, m: reports.append((e, m)))
    down.produce(topic, b"", key=b"empty", on_delivery=lambda e, m: reports.append((e, m)))
    # NOTE: flush() also gives the outbox what is left of its timeout to forward (no
    # broker answers here), and close() flushes again: short timeouts keep this quick.
    assert down.flush(8) == 0
    down.close(0)
    assert [(err, msg.stored(), msg.value()) for err, msg in reports] == [
        (None, True, None),
        (None, True, b""),
    ]
    expected = {msg.message_id(): msg.value() for _, msg in reports}

    with msgsafe.Producer(f"kafka://{_nowhere()}", outbox=outbox, confirm_timeout=3.0) as native:
        receipt = native.send(topic, None, key="deleted-too")
        assert receipt.status is msgsafe.Status.STORED
        expected[receipt.message_id] = None
        assert native.pending() == 3

    up = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_cluster.bootstrap, "msgsafe.outbox": str(outbox)}
    )
    deadline = time.monotonic() + 60
    while up.pending() and time.monotonic() < deadline:
        up.flush(2)  # forwards what the outbox holds while time is left
    left = up.pending()
    up.close()
    assert left == 0, f"{left} still in the outbox after 60 s"

    seen = _consume(kafka_cluster, topic, set(expected))
    lost = set(expected) - seen["values"].keys()
    print(f"\ntombstones: sent={len(expected)} lost={len(lost)} dups={len(seen['dups'])}")
    assert not lost
    assert set(seen["dups"]) <= set(expected)
    assert {i: seen["values"][i] for i in expected} == expected

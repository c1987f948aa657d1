"""Reading Kafka back for the reliability tests: what a topic holds, counted per id (the
ledger the counts go into is :mod:`tests.support.ledger`)."""

from __future__ import annotations

import collections
import collections.abc
import time
import uuid
from typing import Any

import confluent_kafka

from msgsafe.adapters.kafka import open_receiver
from msgsafe.adapters.kafka.positions import start_group_at_beginning
from msgsafe.endpoints import parse_url
from msgsafe.message import Delivery, Envelope, new_message_id
from msgsafe.ports import Transport


def consume_until(
    url: str,
    topic: str,
    expected: set[str],
    *,
    deadline_s: float,
    group: str | None = None,
    on_delivery: collections.abc.Callable[[Delivery], None] | None = None,
) -> collections.Counter[str]:
    """Read ``topic`` from the start until every id in ``expected`` was seen (or the
    deadline), acknowledging each delivery; returns how often each id arrived."""
    received: collections.Counter[str] = collections.Counter()
    group = group or f"check-{new_message_id()}"
    start_group_at_zero(url, topic, group)
    receiver = open_receiver(
        parse_url(url), {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}, group=group
    )
    try:
        receiver.subscribe(topic)
        deadline = time.monotonic() + deadline_s
        missing = set(expected)
        # Keep reading briefly after the last expected id to count trailing duplicates.
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            batch = receiver.receive(max_messages=5000, timeout=0.5)
            for delivery in batch:
                if delivery.message_id is not None:
                    received[delivery.message_id] += 1
                    missing.discard(delivery.message_id)
                if on_delivery is not None:
                    on_delivery(delivery)
                delivery.ack()
            if not missing:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if not batch and time.monotonic() >= quiet_until:
                    break
    finally:
        receiver.close()
    return received


def earliest_consumer(bootstrap: str, group_prefix: str) -> Any:
    """A raw confluent-kafka consumer in a new group that reads from the earliest offset
    and commits nothing: what a checking test uses to see records as any client does."""
    return confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{group_prefix}-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )


def start_group_at_zero(url: str, topic: str, group: str) -> None:
    """Start a checking group at offset 0 of every partition (committed before it joins,
    so it reads the whole topic whatever ``auto.offset.reset`` says)."""
    start_group_at_beginning(parse_url(url), topic, group)


def read_log(
    url: str,
    topic: str,
    expected: set[str],
    *,
    deadline_s: float,
    on_id: collections.abc.Callable[[str], None] | None = None,
    idle_s: float = 15.0,
) -> collections.Counter[str]:
    """Read every partition of ``topic`` from offset 0 by explicit assignment (no group,
    no ListOffsets) until every id in ``expected`` was seen, the deadline passed, or —
    once something was read — nothing more arrived for ``idle_s`` (the log is written
    before it is read, so a reader that has gone quiet that long is at its end and the
    ids still missing are not in it); returns how often each id is in the log. ``on_id``
    sees ids in log order per partition.

    NOTE: this checks what the log holds, independent of any group's committed offsets.
    """
    from confluent_kafka import Consumer, TopicPartition

    bootstrap = url.split("://", 1)[1]
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{new_message_id()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "log_level": 0,
        }
    )
    received: collections.Counter[str] = collections.Counter()
    try:
        meta = consumer.list_topics(topic, timeout=10)
        partitions = sorted(meta.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        missing = set(expected)
        deadline = time.monotonic() + deadline_s
        quiet_until: float | None = None
        last_record: float | None = None
        while time.monotonic() < deadline:
            batch = consumer.consume(5000, 0.5)
            if batch:
                last_record = time.monotonic()
            elif last_record is not None and time.monotonic() - last_record >= idle_s:
                break
            for msg in batch:
                if msg.error() is not None:
                    continue
                for name, value in msg.headers() or []:
                    if name == "msgsafe-id" and isinstance(value, bytes):
                        message_id = value.decode()
                        received[message_id] += 1
                        missing.discard(message_id)
                        if on_id is not None:
                            on_id(message_id)
                        break
            if not missing:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if not batch and time.monotonic() >= quiet_until:
                    break
    finally:
        consumer.close()
    return received


def warm_up(transport: Transport, topic: str, *, deadline_s: float = 30.0) -> None:
    """Publish until one message to ``topic`` is confirmed, within ``deadline_s``.

    NOTE: a fresh client's start (connection, metadata, idempotent producer id) can take
    longer than a test's short ``confirm_timeout``; the warm-up is setup, not the
    behaviour under test.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        error = transport.publish(Envelope.build(topic, b"warm-up")).exception(deadline_s)
        if error is None:
            return
        assert time.monotonic() < deadline, f"no warm-up message confirmed: {error}"

"""The legacy confluent-kafka script, unchanged and with only its import line changed,
against the session's Apache Kafka cluster, whose node leading partition 0 is SIGKILLed
mid-run and restarted a few seconds later.

The script runs with ``acks=1`` (as written by its users): the unmodified run may lose
what the killed leader had acknowledged alone; the wrapped run (msgsafe's producer under
the same API, acks=all and the outbox) must lose nothing.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

import msgsafe
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat._kafka_config import translate_config
from tests.integration.compat.legacy import (
    HERE,
    Run,
    event_id,
    run_script,
    script_env,
    wrap,
)
from tests.support.kafka_lab import heal

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SCRIPT = HERE / "legacy_kafka_producer.py"
COUNT = 3000
OLD_IMPORT = "from confluent_kafka import Producer"
NEW_IMPORT = "from msgsafe.compat.confluent_kafka import Producer"


def _kill(cluster: KafkaCluster, topic: str, killed: list[int]) -> Callable[[int], str]:
    def kill(_pid: int) -> str:
        node = cluster.leader_of(topic, 0)
        cluster.kill(node)
        killed.append(node)
        return f"kafka node {node} (leader of {topic}/0)"

    return kill


def _read_pass(
    bootstrap: str, topic: str, want: set[int], *, idle_s: float, limit: float
) -> Counter[int]:
    """One read of ``topic`` from the beginning, until every id in ``want`` was seen (then
    one quiet second for trailing duplicates), nothing new came for ``idle_s``, or the
    monotonic time ``limit``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"count-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        partitions = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        received: Counter[int] = Counter()
        now = time.monotonic()
        last_new, all_seen_at = now, None
        while now < limit and now - last_new < idle_s:
            if all_seen_at is not None and now - all_seen_at > 1.0:
                break
            msg = consumer.poll(0.2)
            now = time.monotonic()
            if msg is None or msg.error() is not None:
                continue
            received[event_id(msg.value())] += 1
            last_new = now
            if all_seen_at is None and want <= received.keys():
                all_seen_at = now
        return received
    finally:
        consumer.close()


def _received(
    cluster: KafkaCluster, topic: str, want: set[int], *, passes: int = 3, limit_s: float = 60.0
) -> Counter[int]:
    """Every event in ``topic``: read passes from the beginning until every id in ``want``
    was seen, at most ``passes`` of them; each id counts as often as the pass that saw it
    most often.

    NOTE: a pass ends on an idle gap; right after a node's restart a fetch from it can
    stall for seconds while it catches up, so another pass follows while ids the script
    was told are safe are missing.
    """
    limit = time.monotonic() + limit_s
    received: Counter[int] = Counter()
    for _ in range(passes):
        seen = _read_pass(cluster.bootstrap, topic, want, idle_s=5.0, limit=limit)
        for event, count in seen.items():
            received[event] = max(received[event], count)
        if want <= received.keys() or time.monotonic() >= limit:
            break
    return received


def _forward_leftovers(data_dir: Path, bootstrap: str) -> int:
    """Forward what the wrapped script left in its outbox (the next producer's job)."""
    left = 0
    for path in data_dir.glob("**/outbox/*.sqlite3"):
        url = translate_config({"bootstrap.servers": bootstrap}).url
        with msgsafe.Producer(url, outbox=str(path)) as p:
            left += p.pending()
            assert p.drain(30) == 0, "the outbox could not forward its messages"
    return left


def test_legacy_kafka_producer_loses_nothing_once_wrapped(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    runs = []
    for label, script in (
        ("unmodified", SCRIPT),
        ("wrapped", wrap(SCRIPT, OLD_IMPORT, NEW_IMPORT, tmp_path / "wrapped_kafka_producer.py")),
    ):
        heal(kafka)
        topic = f"legacy-{label}-{uuid.uuid4().hex[:8]}"
        kafka.create_topic(topic, partitions=3)
        data_dir = tmp_path / f"data-{label}"
        killed: list[int] = []
        run = run_script(
            Run(label, COUNT),
            script,
            [kafka.bootstrap, topic, str(COUNT)],
            env=script_env(data_dir),
            log=tmp_path / f"{label}.stderr",
            kill=_kill(kafka, topic, killed),
            restart=lambda killed=killed: kafka.restart(killed[-1]),
        )
        if label == "wrapped":
            run.left_in_outbox = _forward_leftovers(data_dir, kafka.bootstrap)
        run.received = _received(kafka, topic, set(run.acknowledged))
        print(run.summary())
        runs.append(run)

    wrapped = runs[-1]
    assert wrapped.killed, "no broker was killed during the wrapped run"
    assert wrapped.returncode == 0, wrapped.stderr_tail
    assert not wrapped.lost, f"lost {len(wrapped.lost)}: {sorted(wrapped.lost)[:20]}"
    assert not wrapped.silently_lost and not wrapped.failed
    assert not wrapped.unknown  # duplicates, if any, carry known ids

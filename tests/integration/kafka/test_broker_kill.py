"""Issue 5 acceptance: 50k messages while the brokers leading the topic's partitions are
SIGKILLed mid-stream, one after the other, and restarted. lost = 0; duplicates only of
known ids.

The check reads the log itself (explicit assignment from offset 0), through every node.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.kafka import KafkaCluster
from tests.support.kafka_ledger import read_log
from tests.support.ledger import Ledger

pytestmark = pytest.mark.integration

N = 50_000
WINDOW = 5_000


def test_50k_messages_with_broker_killed_mid_stream(
    kafka: KafkaCluster, kafka_topic: str, tmp_path: Path
) -> None:
    ledger = Ledger()
    futures: list[Future[msgsafe.Receipt]] = []
    # The leader of partition 0 dies first, then (once the first is back and in sync)
    # the leader of partition 1 as it is then: two fail-overs mid-stream.
    killed: list[int] = []

    def kill_leader(partition: int) -> None:
        node = kafka.leader_of(kafka_topic, partition)
        killed.append(node)
        kafka.kill(node)

    def restart_last() -> None:
        kafka.restart(killed[-1])
        kafka.wait_in_sync(kafka_topic)

    faults = {
        10_000: lambda: kill_leader(0),
        20_000: restart_last,
        30_000: lambda: kill_leader(1),
        40_000: restart_last,
    }
    started = time.monotonic()
    with msgsafe.Producer(
        kafka.url,
        outbox=tmp_path / "outbox.db",
        send_timeout=60,
        confirm_timeout=10,
    ) as producer:
        for i in range(N):
            fault = faults.get(i)
            if fault is not None:
                fault()
            if i >= WINDOW:
                # A bounded window keeps traffic flowing across each kill.
                futures[i - WINDOW].exception(60)
            message_id = msgsafe.new_message_id()
            ledger.sent.add(message_id)
            futures.append(
                producer.send_async(
                    kafka_topic, b"%07d" % i, key=f"k{i % 64}", message_id=message_id
                )
            )
        assert producer.flush(120)
        send_s = time.monotonic() - started
        for future in futures:
            exc = future.exception()
            if exc is not None:
                ledger.failures[type(exc).__name__] += 1
                continue
            receipt = future.result()
            ledger.add_receipt(receipt.message_id, receipt.status)
        assert producer.drain(120) == 0, "outbox did not drain"
        assert producer.pending() == 0

    ledger.received.update(read_log(kafka.url, kafka_topic, ledger.receipted, deadline_s=120))
    print(
        f"\n{ledger.report('kafka broker kill')} killed nodes {killed} send+confirm {send_s:.1f}s"
    )
    assert not ledger.failures, ledger.report("kafka broker kill")
    assert len(ledger.receipted) == N
    assert not ledger.lost, f"{len(ledger.lost)} receipted messages never arrived"
    assert not ledger.unknown

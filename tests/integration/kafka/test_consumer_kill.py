"""Issue 5 acceptance: a consumer killed with SIGKILL mid-batch, then restarted in the
same group: nothing lost; redeliveries counted."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from msgsafe.adapters.kafka import open_transport
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope
from tests.support.kafka_ledger import start_group_at_zero
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

N = 20_000
CRASH_AFTER = N // 3 + 77
ROOT = Path(__file__).resolve().parents[3]


def _lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    # A SIGKILL can cut the last line short: only complete lines count.
    text = path.read_text()
    return [line.split()[0] for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _start(url: str, topic: str, group: str, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.kafka._consumer_child",
            url,
            topic,
            group,
            str(out),
            *extra,
        ],
        cwd=ROOT,
        env=env,
    )


def test_consumer_killed_mid_batch_loses_nothing(
    kafka_cluster: KafkaCluster, kafka_topic: str, tmp_path: Path
) -> None:
    transport = open_transport(parse_url(kafka_cluster.url), {})
    sent: list[str] = []
    try:
        envelopes = [Envelope.build(kafka_topic, b"x" * 100, key=f"k{i % 32}") for i in range(N)]
        futures = [transport.publish(env) for env in envelopes]
        for env, future in zip(envelopes, futures, strict=True):
            future.result(30)
            sent.append(env.message_id)
    finally:
        transport.close()

    group = f"g-{kafka_topic}"
    start_group_at_zero(kafka_cluster.url, kafka_topic, group)
    first_out, second_out = tmp_path / "first.txt", tmp_path / "second.txt"
    url = kafka_cluster.url
    # The child kills itself with SIGKILL in the middle of a 200-message batch.
    first = _start(url, kafka_topic, group, first_out, str(CRASH_AFTER))
    try:
        assert first.wait(120) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    killed_after = len(_lines(first_out))

    second = _start(url, kafka_topic, group, second_out)
    try:
        everything = set(sent)
        wait_until(
            lambda: everything <= set(_lines(first_out)) | set(_lines(second_out)),
            120,
            "every message to be consumed",
        )
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait(10)

    first_ids, second_ids = _lines(first_out), _lines(second_out)
    counts = collections.Counter(first_ids + second_ids)
    lost = set(sent) - set(counts)
    redelivered = sum(c - 1 for c in counts.values() if c > 1)
    flagged = sum(1 for line in second_out.read_text().splitlines() if line.endswith(" 1"))
    print(
        f"\n[kafka consumer kill] sent={len(sent)} first_run={len(first_ids)} "
        f"(killed after {killed_after}) second_run={len(second_ids)} unique={len(counts)} "
        f"lost={len(lost)} redelivered={redelivered} flagged_redelivered={flagged}"
    )
    assert not lost
    assert killed_after == CRASH_AFTER
    # The acks of the batch cut short were never committed: those come again.
    assert redelivered >= CRASH_AFTER % 200
    assert set(counts) <= set(sent)

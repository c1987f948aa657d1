"""Crash safety of the wrappers, counted: a child process publishes through a wrapper
and is killed with SIGKILL at random points; every message the child was told is safe
is in the broker or in the outbox file (lost 0), and nothing else is there.

- pika: "told" is ``basic_publish`` returning. The queue holds at most 150 messages and
  refuses the rest (``reject-publish``: the broker nacks them), so later messages go to
  the outbox: both ways a message is made safe are on the line when the kill lands.
- confluent-kafka: "told" is a delivery callback with ``err=None`` (``produce()``
  returning promises nothing, with either client).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import confluent_kafka
import pika
import pytest

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.outbox.sqlite import SqliteOutbox
from tests.integration.compat.differential import rabbit_params
from tests.integration.compat.legacy import script_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HERE = Path(__file__).parent
#: Messages a child would publish if not killed, and the RabbitMQ queue's bound.
COUNT = 400
QUEUE_MAX = 150
#: Kills per client (each at a fresh random point) and the seconds one run may take.
KILLS = 3
RUN_TIMEOUT_S = 60.0


def _outbox_bodies(path: Path) -> list[bytes]:
    if not path.exists():
        return []
    outbox = SqliteOutbox(path)
    try:
        waiting = [e.envelope.body for e in outbox.list(limit=10 * COUNT)]
        quarantined = [e.envelope.body for e in outbox.quarantined(limit=10 * COUNT)]
    finally:
        outbox.close()
    return waiting + quarantined


def _run_until_killed(args: list[str], outbox: Path, kill_after: int) -> set[bytes]:
    """Start the child, SIGKILL it once it printed ``kill_after`` lines; the bodies it
    was told are safe (every line it printed before dying)."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=script_env(outbox.parent),
    )
    assert proc.stdout is not None
    told: set[bytes] = set()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        for line in proc.stdout:
            told.add(line.split()[1].encode())
            if len(told) >= kill_after:
                os.kill(proc.pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline, f"only {len(told)} reported in time"
        # Lines written before the kill are still in the pipe: those were told too.
        told.update(line.split()[1].encode() for line in proc.stdout)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, f"the child ended by itself ({proc.returncode})"
    return told


def _count_kills(
    tmp_path: Path,
    label: str,
    start: Callable[[int, Path], set[bytes]],
    in_broker: Callable[[], list[bytes]],
) -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    sent = {f"crash-{i}".encode() for i in range(COUNT)}
    for run in range(KILLS):
        outbox = tmp_path / f"{label}{run}" / "outbox.sqlite3"
        outbox.parent.mkdir()
        kill_after = rng.randint(20, COUNT - 50)
        told = start(kill_after, outbox)
        broker = in_broker()
        stored = _outbox_bodies(outbox)
        found = set(broker) | set(stored)
        lost = told - found
        duplicates = len(broker) + len(stored) - len(found)
        unknown = found - sent
        print(
            f"\n{label} crash run {run} (seed {seed}): killed after {kill_after} told, "
            f"told={len(told)} in_broker={len(broker)} in_outbox={len(stored)} "
            f"lost={len(lost)} duplicates={duplicates} unknown={len(unknown)}"
        )
        assert lost == set(), f"seed {seed}: told safe but nowhere: {sorted(lost)[:10]}"
        assert unknown == set()


def test_pika_sigkill_at_random_points_loses_nothing_whose_publish_returned(
    rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    ports = ",".join(str(rabbit_cluster.port(i)) for i in range(rabbit_cluster.size))
    queue = [""]

    def start(kill_after: int, outbox: Path) -> set[bytes]:
        queue[0] = f"crash-{uuid.uuid4().hex[:10]}"
        setup = pika.BlockingConnection(rabbit_params(rabbit_cluster))
        args = {"x-max-length": QUEUE_MAX, "x-overflow": "reject-publish"}
        setup.channel().queue_declare(queue[0], durable=True, arguments=args)
        setup.close()
        child = [str(HERE / "crash_publisher.py"), ports, queue[0], str(outbox), str(COUNT)]
        return _run_until_killed(child, outbox, kill_after)

    def in_broker() -> list[bytes]:
        conn = pika.BlockingConnection(rabbit_params(rabbit_cluster))
        ch = conn.channel()
        bodies: list[bytes] = []
        while (got := ch.basic_get(queue[0], auto_ack=True))[0] is not None:
            bodies.append(got[2])
        ch.queue_delete(queue[0])
        conn.close()
        assert len(bodies) <= QUEUE_MAX
        return bodies

    _count_kills(tmp_path, "pika", start, in_broker)


def test_kafka_sigkill_at_random_points_loses_nothing_reported_safe(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    topic = [""]

    def start(kill_after: int, outbox: Path) -> set[bytes]:
        topic[0] = f"crash-{uuid.uuid4().hex[:10]}"
        kafka_cluster.create_topic(topic[0], partitions=3)
        child = [
            str(HERE / "crash_producer_kafka.py"),
            kafka_cluster.bootstrap,
            topic[0],
            str(outbox),
            str(COUNT),
        ]
        return _run_until_killed(child, outbox, kill_after)

    def in_broker() -> list[bytes]:
        return _read_topic(kafka_cluster, topic[0], partitions=3)

    _count_kills(tmp_path, "kafka", start, in_broker)


def _read_topic(cluster: KafkaCluster, topic: str, *, partitions: int) -> list[bytes]:
    """Every value in ``topic``: each partition read from offset 0 by assignment up to
    its high watermark (asked again until the leader answers)."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"crash-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    deadline = time.monotonic() + 60
    try:
        ends: dict[int, int] = {}
        for partition in range(partitions):
            tp = confluent_kafka.TopicPartition(topic, partition)
            while (high := consumer.get_watermark_offsets(tp, timeout=5, cached=False)[1]) < 0:
                assert time.monotonic() < deadline, f"no watermark for {topic}[{partition}]"
            ends[partition] = high
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in ends if ends[p]])
        values: list[bytes] = []
        left = dict(ends)
        while any(left.values()):
            assert time.monotonic() < deadline, f"records left to read: {left}"
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
                left[msg.partition()] = ends[msg.partition()] - 1 - msg.offset()
    finally:
        consumer.close()
    return values

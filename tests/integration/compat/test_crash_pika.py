"""Crash safety of msgsafe.compat.pika, counted: a child process publishes through the
wrapper and is killed with SIGKILL at random points; every message whose
``basic_publish`` returned is in the broker or in the outbox file (lost 0), and nothing
else is there (duplicates only of known ids).

The queue holds at most 150 messages and refuses the rest (``reject-publish``: the
broker nacks them), so a run's later messages go to the outbox: both ways a message is
made safe are on the line when the kill lands.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pika
import pytest

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.outbox.sqlite import SqliteOutbox
from tests.integration.compat.differential import rabbit_params
from tests.integration.compat.legacy import script_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CHILD = Path(__file__).with_name("crash_publisher.py")
#: Messages a child would publish if not killed, and the queue's bound.
COUNT = 400
QUEUE_MAX = 150
#: Kills per test run (each at a fresh random point) and the seconds one run may take.
KILLS = 3
RUN_TIMEOUT_S = 60.0


def _queue_ids(cluster: RabbitCluster, queue: str) -> list[str]:
    conn = pika.BlockingConnection(rabbit_params(cluster))
    ch = conn.channel()
    ids: list[str] = []
    while (got := ch.basic_get(queue, auto_ack=True))[0] is not None:
        ids.append(got[1].message_id)
    ch.queue_delete(queue)
    conn.close()
    return ids


def _outbox_ids(path: Path) -> list[str]:
    if not path.exists():
        return []
    outbox = SqliteOutbox(path)
    try:
        waiting = [e.envelope.message_id for e in outbox.list(limit=10 * COUNT)]
        quarantined = [e.envelope.message_id for e in outbox.quarantined(limit=10 * COUNT)]
    finally:
        outbox.close()
    return waiting + quarantined


def _run_until_killed(
    cluster: RabbitCluster, queue: str, outbox: Path, kill_after: int
) -> set[str]:
    """Start the child, SIGKILL it once ``kill_after`` publishes returned; the ids whose
    publish returned (every line it printed before dying)."""
    ports = ",".join(str(cluster.port(i)) for i in range(cluster.size))
    env = script_env(outbox.parent)
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), ports, queue, str(outbox), str(COUNT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    returned: set[str] = set()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        for line in proc.stdout:
            returned.add(f"crash-{line.split()[1]}")
            if len(returned) >= kill_after:
                os.kill(proc.pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline, f"only {len(returned)} publishes in time"
        # Lines written before the kill are still in the pipe: they returned too.
        returned.update(f"crash-{line.split()[1]}" for line in proc.stdout)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, f"the child ended by itself ({proc.returncode})"
    return returned


def test_sigkill_at_random_points_loses_nothing_whose_publish_returned(
    rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    sent = {f"crash-{i}" for i in range(COUNT)}
    for run in range(KILLS):
        queue = f"crash-{uuid.uuid4().hex[:10]}"
        setup = pika.BlockingConnection(rabbit_params(rabbit_cluster))
        setup.channel().queue_declare(
            queue,
            durable=True,
            arguments={"x-max-length": QUEUE_MAX, "x-overflow": "reject-publish"},
        )
        setup.close()
        outbox = tmp_path / f"run{run}" / "outbox.sqlite3"
        outbox.parent.mkdir()
        kill_after = rng.randint(20, COUNT - 50)
        returned = _run_until_killed(rabbit_cluster, queue, outbox, kill_after)
        in_broker = _queue_ids(rabbit_cluster, queue)
        in_outbox = _outbox_ids(outbox)
        found = set(in_broker) | set(in_outbox)
        lost = returned - found
        duplicates = len(in_broker) + len(in_outbox) - len(found)
        unknown = found - sent
        print(
            f"\ncrash run {run} (seed {seed}): killed after {kill_after} returned, "
            f"returned={len(returned)} in_broker={len(in_broker)} in_outbox={len(in_outbox)} "
            f"lost={len(lost)} duplicates={duplicates} unknown={len(unknown)}"
        )
        assert lost == set(), f"seed {seed}: returned but nowhere: {sorted(lost)[:10]}"
        assert unknown == set()
        assert len(in_broker) <= QUEUE_MAX

"""Exactly-once effects through ``Consumer.run(inbox=...)`` on the real cluster, counted.

1,000 keyed messages on a quorum queue (2% poison that always raises, 5% failing on
their first attempt). A consumer service (``_inbox_consumer``: four workers, a SQLite
inbox, retries, a dead-letter queue) writes one effect row per message through the
inbox's transaction; it is SIGKILLed three times mid-run and started again, and a broker
node is killed under the last one. Then: every non-poison message's effect applied
exactly once, no poison message with an effect, every poison message on the dead-letter
queue with its attempts, per-key order of effects kept, and SIGTERM ends the service
with exit 0 within its deadline, leaving nothing in the queue.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import uuid
from pathlib import Path

import pytest

from msgsafe import Consumer
from msgsafe.cluster.rabbitmq import RabbitCluster
from tests.integration.compat.legacy import script_env
from tests.support.inbox_story import check_effects, read_dead_letters, send, start_consumer
from tests.support.rabbit_queues import declare_quorum
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(600)]

COUNT = 1000
KEYS = 40
#: Effect rows at which the running service is SIGKILLed (and started again).
KILL_AT = (150, 400, 650)


def _effects(db: Path) -> list[tuple[str, str, bytes]]:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute("SELECT message_id, key, body FROM effects ORDER BY rowid").fetchall()


def _count(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        return int(conn.execute("SELECT count(*) FROM effects").fetchone()[0])


def test_effects_once_through_kills_of_the_consumer_and_a_node(
    rabbit: RabbitCluster, tmp_path: Path
) -> None:
    url = rabbit.cluster_url()
    queue = declare_quorum(rabbit.node_url(0), f"inbox-{uuid.uuid4().hex[:8]}")
    dlq = declare_quorum(rabbit.node_url(0), f"inbox-dlq-{uuid.uuid4().hex[:8]}")
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE effects (message_id TEXT, key TEXT, body BLOB, pid INTEGER)")
    sent = send(url, queue, COUNT, KEYS)
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(n: int) -> subprocess.Popen[bytes]:
        return start_consumer(
            url,
            queue,
            dlq,
            f"sqlite://{db}",
            tmp_path / "dead-letters.sqlite3",
            logs / f"consumer-{n}.log",
            script_env(tmp_path),
        )

    def log_of(n: int) -> str:
        return (logs / f"consumer-{n}.log").read_text()[-3000:]

    def kill_at(n: int, threshold: int) -> None:
        """Start service ``n``, SIGKILL it once ``threshold`` effects are committed."""
        child = start(n)
        try:
            wait_until(
                lambda: child.poll() is not None or _count(db) >= threshold,
                120,
                f"{threshold} effects before kill {n + 1}",
                diagnose=lambda: log_of(n),
            )
            assert child.poll() is None, log_of(n)
        finally:
            child.kill()
            child.wait(30)

    for n, threshold in enumerate(KILL_AT):
        kill_at(n, threshold)
    rabbit.kill(1)  # the last service meets a node down too

    final = start(len(KILL_AT))
    try:
        done = sent.to_apply
        wait_until(
            lambda: final.poll() is not None or len({e[0] for e in _effects(db)}) >= done,
            240,
            "every non-poison message's effect",
            diagnose=lambda: log_of(len(KILL_AT)),
        )
        rabbit.restart(1)
        dead = read_dead_letters(url, dlq, sent)
        final.send_signal(signal.SIGTERM)
        assert final.wait(40) == 0, log_of(len(KILL_AT))
    finally:
        if final.poll() is None:
            final.kill()
            final.wait(30)

    summary, by_key = check_effects(sent, _effects(db), dead)
    print(summary)
    # Per-key order: each key's effects in the order its messages were sent.
    out_of_order = {k: seq for k, seq in by_key.items() if seq != sorted(seq)}
    assert out_of_order == {}
    with Consumer(url).subscribe(queue) as again:
        assert again.poll(2.0, max_messages=10) == []  # nothing left unacknowledged

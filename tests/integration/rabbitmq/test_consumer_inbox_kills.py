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
import sys
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from msgsafe import Consumer, Producer
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.consuming.dead_letter import DLQ_ATTEMPTS, DLQ_MESSAGE_ID
from tests.integration.compat.legacy import REPO, script_env
from tests.integration.rabbitmq._inbox_consumer import MAX_ATTEMPTS
from tests.support.rabbit_queues import declare_quorum
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(600)]

COUNT = 1000
KEYS = 40
#: Effect rows at which the running service is SIGKILLed (and started again).
KILL_AT = (150, 400, 650)


def _kind(i: int) -> str:
    return "poison" if i % 50 == 7 else "flaky" if i % 20 == 3 else "ok"


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
        conn.execute("CREATE TABLE effects (message_id TEXT, key TEXT, body BLOB)")
    with Producer(url, outbox=False) as producer:
        ids = [
            producer.send(queue, f"{_kind(i)}:{i}".encode(), key=f"k{i % KEYS}").message_id
            for i in range(COUNT)
        ]
    kind_of = {message_id: _kind(i) for i, message_id in enumerate(ids)}
    poison = {m for m, k in kind_of.items() if k == "poison"}
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(n: int) -> subprocess.Popen[bytes]:
        with (logs / f"consumer-{n}.log").open("wb") as out:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.rabbitmq._inbox_consumer",
                    url,
                    queue,
                    dlq,
                    str(db),
                    str(tmp_path / "dead-letters.sqlite3"),
                ],
                cwd=REPO,
                env=script_env(tmp_path),
                stdout=out,
                stderr=subprocess.STDOUT,
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
        done = len(ids) - len(poison)
        wait_until(
            lambda: final.poll() is not None or len({e[0] for e in _effects(db)}) >= done,
            240,
            "every non-poison message's effect",
            diagnose=lambda: log_of(len(KILL_AT)),
        )
        rabbit.restart(1)
        dead: list[tuple[str, int]] = []
        with Consumer(url).subscribe(dlq) as reader:
            wait_until(
                lambda: (
                    dead.extend(
                        (d.headers[DLQ_MESSAGE_ID], int(d.headers[DLQ_ATTEMPTS]))
                        for d in reader.poll(0.5, max_messages=100)
                    )
                    or {m for m, _ in dead} >= poison
                ),
                120,
                "every poison message on the dead-letter queue",
                diagnose=lambda: f"{len({m for m, _ in dead})} of {len(poison)}",
            )
        final.send_signal(signal.SIGTERM)
        assert final.wait(40) == 0, log_of(len(KILL_AT))
    finally:
        if final.poll() is None:
            final.kill()
            final.wait(30)

    effects = _effects(db)
    per_id = Counter(e[0] for e in effects)
    applied_twice = {m: n for m, n in per_id.items() if n > 1}
    missing = set(ids) - poison - set(per_id)
    poisoned = poison & set(per_id)
    unknown = set(per_id) - set(ids)
    dead_ids = Counter(m for m, _ in dead)
    print(
        f"sent={len(ids)} effects={len(effects)} applied_twice={len(applied_twice)} "
        f"missing={len(missing)} poison_with_effect={len(poisoned)} "
        f"dead_lettered={len(dead_ids)} dead_letter_copies={sum(dead_ids.values())}"
    )
    assert applied_twice == {}
    assert missing == set()
    assert poisoned == set()
    assert unknown == set()
    assert set(dead_ids) == poison  # every poison message there; copies carry its id
    assert all(attempts >= MAX_ATTEMPTS for _, attempts in dead)
    # Per-key order: each key's effects in the order its messages were sent.
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, key, body in effects:
        by_key[key].append(int(body.split(b":")[1]))
    out_of_order = {k: seq for k, seq in by_key.items() if seq != sorted(seq)}
    assert out_of_order == {}
    with Consumer(url).subscribe(queue) as again:
        assert again.poll(2.0, max_messages=10) == []  # nothing left unacknowledged

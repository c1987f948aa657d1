"""Exactly-once effects for a fleet of consumers sharing one PostgreSQL inbox, counted,
through a consumer SIGKILLed and the PostgreSQL primary SIGKILLed and its standby
promoted.

2,000 keyed messages on a quorum queue of the 3-node RabbitMQ cluster (2% poison that
always raises, 5% failing on their first attempt). Two consumer processes of one group
(``tests.support.inbox_consumer``: four workers each, retries, a dead-letter queue) compete for the
queue and share one inbox on the PostgreSQL primary + synchronous standby pair; each
handler writes one effect row per message through the inbox's ``tx`` into the same
database. Consumer A is SIGKILLed once 500 effects are committed and started again at
once (a supervisor would); once 1,000 are, and the new A has committed some, the
primary is SIGKILLed and the standby promoted, under both consumers. Both reach the new
primary through the one URL they were given: libpq's host list (``h0,h1``) with
``target_session_attrs=read-write`` (the pair's URL; the inbox adds it when missing, as
the outbox does), which keeps the host that takes writes. Then SIGTERM ends both with exit 0.

Asserted: every non-poison message's effect applied exactly once (none twice, none
missing), no poison message with an effect, every poison message on the dead-letter
queue with its attempts, every consumer process applied effects, both running ones
committed effects on the new primary after the promotion, nothing left in the queue.

Why RabbitMQ and not a Kafka group: competing consumers on one quorum queue are "one
group" too, and the cluster costs this 2-core machine a third of a 3-node Kafka
cluster's CPU. The price is order: RabbitMQ hands a queue's messages to its consumers
round-robin, so one key's messages are handled by both processes at once, and a killed
consumer's unacknowledged messages are redelivered after later ones of their key. Per-key
order across the two processes is therefore **not** asserted (nothing in RabbitMQ
promises it; a Kafka group would, per partition); the number of keys whose effects came
out of send order is printed. Each process keeps one key's deliveries in arrival order
(``Consumer.run``'s lanes: tests/unit), and the single-consumer story
(tests/integration/rabbitmq/test_consumer_inbox_kills.py) asserts per-key order.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from tests.support.inbox_story import InboxStory
from tests.support.rabbit_queues import declare_quorum
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(900)]

COUNT = 2000
KEYS = 100
#: Committed effects at which consumer A is SIGKILLed (and started again), then at
#: which the PostgreSQL primary is SIGKILLed and the standby promoted.
KILL_CONSUMER_AT = 500
KILL_PRIMARY_AT = 1000
#: The two services' numbers: A (killed and started again) and B.
A, B = 0, 1


@dataclass
class FleetStory(InboxStory):
    """The inbox story with its inbox and effects on the PostgreSQL pair at ``pg_url``."""

    pg_url: str = ""
    table: str = ""

    @property
    def inbox(self) -> str:
        return f"{self.pg_url}&table={self.table}"

    def outbox(self, n: int) -> Path:
        # One per process: two run at once (a killed one's is forwarded by its successor).
        return self.dir / f"dead-letters-{n}.sqlite3"

    def effects_with_pids(self) -> list[tuple[str, str, bytes, int]]:
        """Every committed effect row, in commit order near enough (the sequence)."""
        with psycopg.connect(self.pg_url, connect_timeout=10) as conn:
            rows = conn.execute("SELECT message_id, key, body, pid FROM effects ORDER BY seq")
            return [(m, k, bytes(b), p) for m, k, b, p in rows.fetchall()]

    def effects(self) -> list[tuple[str, str, bytes]]:
        return [(m, k, b) for m, k, b, _ in self.effects_with_pids()]

    def applied(self) -> int:
        with psycopg.connect(self.pg_url, connect_timeout=10) as conn:
            row = conn.execute("SELECT count(DISTINCT message_id) FROM effects").fetchone()
        assert row is not None
        return int(row[0])

    def applied_by(self, pids: list[int]) -> Counter[int]:
        """Effects committed by each process of ``pids`` so far."""
        with psycopg.connect(self.pg_url, connect_timeout=10) as conn:
            rows = conn.execute(
                "SELECT pid, count(*) FROM effects WHERE pid = ANY(%s) GROUP BY pid", (pids,)
            ).fetchall()
        return Counter({int(p): int(n) for p, n in rows})


@pytest.fixture
def effects_table(pg_pair: PostgresCluster) -> Iterator[None]:
    """An empty ``effects`` table on the pair, where the handlers write."""
    with psycopg.connect(pg_pair.url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS effects")
        conn.execute(
            "CREATE TABLE effects (seq bigserial, message_id text NOT NULL, key text,"
            " body bytea, pid integer)"
        )
    yield


def test_two_consumers_one_killed_and_a_database_failover_apply_effects_once(
    rabbit_cluster: RabbitCluster,
    pg_pair: PostgresCluster,
    effects_table: None,
    tmp_path: Path,
) -> None:
    rabbit = rabbit_cluster
    story = FleetStory(
        url=rabbit.cluster_url(),
        queue=declare_quorum(rabbit.node_url(0), f"inbox-fleet-{uuid.uuid4().hex[:8]}"),
        dlq=declare_quorum(rabbit.node_url(0), f"inbox-fleet-dlq-{uuid.uuid4().hex[:8]}"),
        dir=tmp_path,
        count=COUNT,
        keys=KEYS,
        pg_url=pg_pair.url,
        table=f"inbox_{uuid.uuid4().hex[:10]}",
    )
    assert "," in story.inbox.split("@", 1)[1].split("/", 1)[0]  # both hosts named
    story.send()
    done = len(story.ids) - len(story.poison)
    children: dict[int, subprocess.Popen[bytes]] = {}
    pids: list[int] = []

    def start(n: int) -> None:
        children[n] = child = story.start(n)
        pids.append(child.pid)

    def logs_tail() -> str:
        return "\n".join(f"--- {n}\n{story.log_of(n)[-2000:]}" for n in children)

    def reach(threshold: int, what: str, working: tuple[int, ...] = ()) -> int:
        """Wait until ``threshold`` effects are committed, both consumers running, and
        each process of ``working`` has committed some (it is connected and busy)."""
        seen = [0]

        def reached() -> bool:
            assert all(c.poll() is None for c in children.values()), logs_tail()
            seen[0] = story.applied()
            if seen[0] < threshold:
                return False
            busy = story.applied_by(list(working))
            return all(busy[p] > 0 for p in working)

        wait_until(reached, 240, what, diagnose=logs_tail)
        return seen[0]

    try:
        start(A)
        start(B)
        at_kill = reach(KILL_CONSUMER_AT, f"{KILL_CONSUMER_AT} effects before the kill of A")
        children[A].kill()
        children[A].wait(30)
        retries_before = story.log_path(A).read_text().count(" retried: ")
        start(A)  # started again, as a supervisor would (its log appended)
        # The restarted A must be connected and working when the primary dies (under
        # load its start-up can outlast B's next 500 effects): the fail-over then
        # strikes both processes' connections.
        at_failover = reach(
            KILL_PRIMARY_AT,
            f"{KILL_PRIMARY_AT} effects, some by the restarted A, before the fail-over",
            working=(pids[-1], children[B].pid),
        )
        pg_pair.kill(0)
        pg_pair.promote(1)
        assert pg_pair.primary == 1
        at_promotion = story.applied_by([pids[-1], children[B].pid])
        # Both faults struck mid-run: work was left for after each.
        assert at_kill < done and at_failover < done, (at_kill, at_failover)
        reach(done, "every non-poison message's effect")
        # Both consumers went on through the same URL, on the new primary: each
        # committed effects there after the promotion.
        survivors = [pids[-1], children[B].pid]
        after = story.applied_by(survivors)
        assert all(after[p] > at_promotion[p] for p in survivors), (
            at_promotion,
            after,
            logs_tail(),
        )
        # How they met it, printed: calls made again on a new connection. Not asserted:
        # a connection lost during COMMIT is settled by looking the transaction up
        # (a warning, no retry line), and the next call simply connects anew.
        met = {
            A: story.log_path(A).read_text().count(" retried: ") - retries_before,
            B: story.log_path(B).read_text().count(" retried: "),
        }
        dead = story.read_dead_letters(120)
        for child in children.values():
            child.send_signal(signal.SIGTERM)
        codes = {n: child.wait(60) for n, child in children.items()}
        assert codes == {A: 0, B: 0}, logs_tail()
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait(30)

    tally = story.tally(dead)
    by_pid = Counter(e[3] for e in story.effects_with_pids())
    print(
        f"{tally.line()} at_kill={at_kill} at_failover={at_failover}"
        f" effects_per_process={[by_pid[p] for p in pids]} inbox_retries={met}"
        f" keys_out_of_send_order={len(tally.out_of_order)}/{tally.keys} (not asserted: see above)"
    )
    # Tally.check less per-key order, which competing consumers do not promise.
    assert tally.applied_twice == {}
    assert tally.missing == set()
    assert tally.poison_with_effect == set()
    assert tally.unknown == set()
    assert tally.dead_lettered == tally.poison
    assert tally.attempts_below_max == 0
    assert all(by_pid[p] > 0 for p in pids), (pids, by_pid)  # every process took part
    assert story.left_in_queue() == 0  # nothing left unacknowledged

"""The PostgreSQL inbox on the real primary + synchronous standby pair, counted: the
id and the handler's writes commit together once per id — through crashes of the
consumer, two processes racing on the same ids, and a fail-over in the middle of a run;
a database that takes no writes is a typed error without the password."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from msgsafe.cluster._process import free_ports
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.errors import InboxError, InboxUnavailable
from msgsafe.inbox import InboxStore, PostgresInbox, Processed, open_inbox
from tests.integration.inbox._child import die, race
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def url(pg_pair: PostgresCluster) -> Iterator[str]:
    """The pair's URL naming an inbox table of this test's own, with an empty
    ``effects`` table where handlers write."""
    table = f"inbox_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_pair.url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS effects")
        conn.execute("CREATE TABLE effects (message_id text NOT NULL, pid integer)")
    yield f"{pg_pair.url}&table={table}"


def effects(pair: PostgresCluster) -> list[str]:
    """Every committed effect row's message id (on the current primary)."""
    with psycopg.connect(pair.url, connect_timeout=10) as conn:
        return sorted(r[0] for r in conn.execute("SELECT message_id FROM effects").fetchall())


def write_effect(message_id: str) -> Any:
    def work(tx: psycopg.Connection[Any]) -> str:
        tx.execute("INSERT INTO effects (message_id) VALUES (%s)", (message_id,))
        return f"done {message_id}"

    return work


def test_work_and_the_id_commit_together_once(pg_pair: PostgresCluster, url: str) -> None:
    inbox = open_inbox(url)
    try:
        assert isinstance(inbox, PostgresInbox) and isinstance(inbox, InboxStore)
        assert f":{pg_pair.password}@" not in repr(inbox)
        assert inbox.process("m1", write_effect("m1"), source="orders") == Processed(
            ran=True, value="done m1"
        )
        calls: list[str] = []
        assert inbox.process("m1", lambda tx: calls.append("x"), source="orders").ran is False
        assert calls == []

        boom = RuntimeError("handler failed")

        def fails(tx: psycopg.Connection[Any]) -> None:
            tx.execute("INSERT INTO effects (message_id) VALUES ('m2')")
            raise boom

        with pytest.raises(RuntimeError) as caught:
            inbox.process("m2", fails, source="orders")
        assert caught.value is boom
        assert effects(pg_pair) == ["m1"] and inbox.handled(["m1", "m2", "m3"]) == {"m1"}

        # A database error of work's own is work's: it propagates, untranslated.
        def bad_sql(tx: psycopg.Connection[Any]) -> None:
            tx.execute("INSERT INTO no_such_table VALUES (1)")

        with pytest.raises(psycopg.errors.UndefinedTable):
            inbox.process("m2", bad_sql, source="orders")
        assert inbox.process("m2", write_effect("m2"), source="orders", attempt=3).ran

        def swallows(tx: psycopg.Connection[Any]) -> None:
            with contextlib.suppress(psycopg.Error):
                tx.execute("INSERT INTO no_such_table VALUES (1)")

        with pytest.raises(InboxError, match="must only write through tx"):
            inbox.process("m3", swallows, source="orders")
        assert effects(pg_pair) == ["m1", "m2"] and inbox.handled(["m3"]) == set()

        assert [inbox.record_attempt("m9", source="orders") for _ in range(3)] == [1, 2, 3]
    finally:
        inbox.close()
    inbox = open_inbox(url)  # a restart
    try:
        assert inbox.record_attempt("m9", source="orders") == 4
        assert inbox.prune(older_than_s=3600) == 0
        assert inbox.prune(older_than_s=0) == 2
        assert inbox.handled(["m1", "m2"]) == set()
    finally:
        inbox.close()


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_crash_inside_work_applies_nothing(pg_pair: PostgresCluster, url: str, how: str) -> None:
    open_inbox(url).close()
    assert die(url, "die-in-work", "m1", how) != 0
    inbox = open_inbox(url)
    try:
        # The server rolls back the dead client's transaction (at once, or when it
        # notices the connection gone): the id is then free to be handled again.
        assert inbox.process("m1", write_effect("m1"), source="q", attempt=2).ran
        assert effects(pg_pair) == ["m1"]
    finally:
        inbox.close()


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_crash_after_the_commit_before_the_ack_is_not_applied_again(
    pg_pair: PostgresCluster, url: str, how: str
) -> None:
    die(url, "die-after-commit", "m1", how)
    inbox = open_inbox(url)
    try:
        assert inbox.handled(["m1"]) == {"m1"} and effects(pg_pair) == ["m1"]
        assert inbox.process("m1", write_effect("m1"), source="q").ran is False
        assert effects(pg_pair) == ["m1"]
    finally:
        inbox.close()


def test_two_processes_racing_on_500_ids_apply_each_once(
    pg_pair: PostgresCluster, url: str
) -> None:
    open_inbox(url).close()
    ran = race(url, 0, 500)
    wanted = sorted(f"m{n}" for n in range(500))
    assert effects(pg_pair) == wanted  # 500 rows, one per id
    assert sorted(ran[0] + ran[1]) == wanted
    print(f"process 1 ran {len(ran[0])}, process 2 ran {len(ran[1])}")


def test_a_database_that_takes_no_writes_is_a_typed_error(pg_pair: PostgresCluster) -> None:
    standby = pg_pair.node_url(1)
    secret = f"pw{uuid.uuid4().hex}"
    dead = f"postgresql://app:{secret}@127.0.0.1:{free_ports(1)[0]}/db"
    for unwritable in (
        f"{standby}?target_session_attrs=any&write_timeout=2",  # read-only: refused
        f"{standby}?write_timeout=2",  # libpq finds no read-write host
        f"{dead}?write_timeout=2&connect_timeout=1",  # nothing listens
    ):
        with pytest.raises(InboxUnavailable) as caught:
            open_inbox(unwritable)
        text = f"{caught.value} {caught.value.__cause__}"
        assert f":{pg_pair.password}@" not in text and secret not in text, text
        assert caught.value.endpoint is not None and "127.0.0.1" in caught.value.endpoint


def test_a_failover_during_300_calls_applies_each_id_once(
    pg_pair: PostgresCluster, url: str
) -> None:
    """The primary SIGKILLed while a handler's transaction is open (the 51st message's
    work holds it until the kill), then the standby promoted; the calls after it meet
    the fail-over. Every effect once, none missing."""
    # A call keeps trying through the fail-over for as long as a promotion may take on
    # a loaded machine.
    inbox = open_inbox(f"{url}&write_timeout=110")
    ran: dict[str, int] = {}
    calls: dict[str, int] = {}
    failures: list[tuple[str, BaseException]] = []
    in_work = threading.Event()
    killed = threading.Event()
    done = threading.Event()

    def work_for(message_id: str) -> Any:
        def work(tx: psycopg.Connection[Any]) -> None:
            calls[message_id] = calls.get(message_id, 0) + 1
            tx.execute("INSERT INTO effects (message_id) VALUES (%s)", (message_id,))
            if message_id == "m50" and not killed.is_set():
                in_work.set()
                killed.wait(120)  # the primary dies under this open transaction

        return work

    def consume() -> None:
        for n in range(300):
            message_id = f"m{n}"
            while True:  # what a consumer does: a failed call is a redelivery
                try:
                    result = inbox.process(message_id, work_for(message_id), source="q")
                except Exception as exc:  # counted: the test prints them
                    failures.append((message_id, exc))
                    continue
                ran[message_id] = ran.get(message_id, 0) + int(result.ran)
                break
        done.set()

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        wait_until(in_work.is_set, 120, "the 51st message's work under way")
        pg_pair.kill(0)
        killed.set()
        pg_pair.promote(1)
        wait_until(done.is_set, 240, "300 messages handled")
    finally:
        killed.set()
        done.wait(240)
        inbox.close()
    wanted = sorted(f"m{n}" for n in range(300))
    applied = effects(pg_pair)
    print(
        f"work calls {sum(calls.values())} for 300 ids (m50: {calls['m50']}); failures"
        f" retried: {len(failures)} {failures[:3]};"
        f" ran=False: {sum(1 for v in ran.values() if v == 0)}"
    )
    assert applied == wanted  # each id's effect exactly once: none twice, none missing
    assert sorted(ran) == wanted and all(v <= 1 for v in ran.values())
    assert calls["m50"] >= 2  # its first run died with the primary, rolled back
    with psycopg.connect(pg_pair.url) as conn:
        table = url.rsplit("table=", 1)[1]
        recorded = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert recorded == (300,)

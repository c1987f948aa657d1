"""The SQLite inbox: one transaction for the message id and the handler's writes, once
per id — counted, with real processes dying at every crash point and racing."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    InboxError,
    InboxUnavailable,
    InvalidMessage,
)
from msgsafe.inbox import InboxStore, Processed, SqliteInbox, open_inbox, parse_sqlite_url
from msgsafe.ports import BatchInboxStore, ProcessedBatch, inbox_capabilities
from tests.integration.inbox._child import die, race


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A user's database with an ``effects`` table, where handlers write."""
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE effects (message_id TEXT NOT NULL, pid INTEGER)")
    return path


@pytest.fixture
def inbox(db: Path) -> Any:
    store = SqliteInbox(db)
    yield store
    store.close()


def effects(db: Path) -> list[str]:
    """Every effect row's message id (a fresh connection: what is committed)."""
    conn = sqlite3.connect(db)
    try:
        return sorted(r[0] for r in conn.execute("SELECT message_id FROM effects"))
    finally:
        conn.close()


def write_effect(message_id: str) -> Any:
    def work(tx: sqlite3.Connection) -> str:
        tx.execute("INSERT INTO effects (message_id) VALUES (?)", (message_id,))
        return f"done {message_id}"

    return work


def test_work_and_the_id_commit_together_once(inbox: SqliteInbox, db: Path) -> None:
    assert isinstance(inbox, InboxStore)
    assert inbox.process("m1", write_effect("m1"), source="orders") == Processed(
        ran=True, value="done m1"
    )
    calls: list[str] = []

    def must_not_run(tx: sqlite3.Connection) -> None:
        calls.append("ran")

    assert inbox.process("m1", must_not_run, source="orders") == Processed(ran=False)
    assert calls == []
    assert effects(db) == ["m1"]
    conn = sqlite3.connect(db)
    row = conn.execute("SELECT source, attempt FROM msgsafe_inbox WHERE message_id='m1'").fetchone()
    conn.close()
    assert row == ("orders", 1)


def test_work_that_raises_keeps_nothing(inbox: SqliteInbox, db: Path) -> None:
    boom = RuntimeError("handler failed")

    def fails(tx: sqlite3.Connection) -> None:
        tx.execute("INSERT INTO effects (message_id) VALUES ('m1')")
        raise boom

    with pytest.raises(RuntimeError) as caught:
        inbox.process("m1", fails, source="q")
    assert caught.value is boom
    assert effects(db) == [] and inbox.handled(["m1"]) == set()
    # Redelivered: handled again, applied once.
    assert inbox.process("m1", write_effect("m1"), source="q", attempt=2).ran
    assert effects(db) == ["m1"]


def test_handled_answers_for_many_ids(inbox: SqliteInbox) -> None:
    for n in range(0, 1500, 3):
        inbox.process(f"m{n}", lambda tx: None, source="q")
    asked = [f"m{n}" for n in range(1500)] + ['it\'s "quoted"']
    assert inbox.handled(asked) == {f"m{n}" for n in range(0, 1500, 3)}
    assert inbox.handled([]) == set()


def test_attempts_count_durably_until_handled(db: Path) -> None:
    store = SqliteInbox(db)
    assert [store.record_attempt("m1", source="q") for _ in range(3)] == [1, 2, 3]
    assert store.record_attempt("m2", source="q") == 1
    store.close()
    store = SqliteInbox(db)  # a restart
    try:
        assert store.record_attempt("m1", source="q") == 4
        assert store.process("m1", write_effect("m1"), source="q", attempt=4).ran
        # Handled: its counter went with the same commit.
        assert store.record_attempt("m1", source="q") == 1
    finally:
        store.close()


def test_prune_forgets_ids_older_than_asked(db: Path) -> None:
    now = [1000.0]
    store = SqliteInbox(db, clock=lambda: now[0])
    try:
        store.process("old", lambda tx: None, source="q")
        store.record_attempt("stuck", source="q")
        now[0] = 2000.0
        store.process("new", lambda tx: None, source="q")
        assert store.prune(older_than_s=500) == 1
        assert store.handled(["old", "new"]) == {"new"}
        assert store.record_attempt("stuck", source="q") == 1  # its counter went too
        assert store.prune(older_than_s=5000) == 0
        with pytest.raises(ConfigurationError):
            store.prune(older_than_s=-1)
    finally:
        store.close()


def test_threads_on_one_store_run_each_id_once(inbox: SqliteInbox, db: Path) -> None:
    ran: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def worker() -> None:
        start.wait()
        for n in range(100):
            if inbox.process(f"m{n}", write_effect(f"m{n}"), source="q").ran:
                with lock:
                    ran.append(f"m{n}")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(ran) == effects(db) == sorted(f"m{n}" for n in range(100))


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_crash_inside_work_applies_nothing(db: Path, how: str) -> None:
    url = f"sqlite://{db}"
    assert die(url, "die-in-work", "m1", how) != 0
    store = open_inbox(url)
    try:
        assert store.handled(["m1"]) == set() and effects(db) == []
        assert store.process("m1", write_effect("m1"), source="q", attempt=2).ran
        assert effects(db) == ["m1"]
    finally:
        store.close()


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_crash_after_the_commit_before_the_ack_is_not_applied_again(db: Path, how: str) -> None:
    url = f"sqlite://{db}"
    die(url, "die-after-commit", "m1", how)
    store = open_inbox(url)
    calls: list[str] = []
    try:
        assert store.handled(["m1"]) == {"m1"} and effects(db) == ["m1"]
        assert store.process("m1", lambda tx: calls.append("ran"), source="q").ran is False
        assert calls == [] and effects(db) == ["m1"]
    finally:
        store.close()


def test_two_processes_racing_on_200_ids_apply_each_once(db: Path) -> None:
    url = f"sqlite://{db}"
    open_inbox(url).close()  # the tables, before the race
    ran = race(url, 0, 200)
    wanted = sorted(f"m{n}" for n in range(200))
    assert effects(db) == wanted  # 200 rows, one per id
    assert sorted(ran[0] + ran[1]) == wanted
    print(f"process 1 ran {len(ran[0])}, process 2 ran {len(ran[1])}")


def test_work_must_not_end_the_transaction(inbox: SqliteInbox, db: Path) -> None:
    def commits(tx: sqlite3.Connection) -> None:
        tx.execute("COMMIT")

    with pytest.raises(InboxError, match="must only write through tx") as caught:
        inbox.process("m1", commits, source="q")
    assert caught.value.message_id == "m1"


def test_a_writer_that_waits_too_long_gets_a_typed_error(db: Path) -> None:
    store = SqliteInbox(db, busy_timeout=0.2)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(InboxUnavailable):
            store.process("m1", write_effect("m1"), source="q")
        holder.execute("ROLLBACK")
        assert store.process("m1", write_effect("m1"), source="q").ran
    finally:
        holder.close()
        store.close()


def test_a_newer_schema_is_refused(db: Path) -> None:
    SqliteInbox(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO msgsafe_inbox_schema (version) VALUES (99)")
    with pytest.raises(InboxError, match="schema version 99"):
        SqliteInbox(db)


def test_bad_input_is_typed(inbox: SqliteInbox, tmp_path: Path) -> None:
    with pytest.raises(InvalidMessage):
        inbox.process("", lambda tx: None, source="q")
    with pytest.raises(InvalidMessage):
        inbox.record_attempt(None, source="q")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        SqliteInbox(tmp_path / "x.db", table="Robert'); DROP TABLE students;--")
    inbox.close()
    inbox.close()
    with pytest.raises(ClosedError):
        inbox.process("m1", lambda tx: None, source="q")


@pytest.mark.parametrize(
    ("url", "path", "table", "busy"),
    [
        ("sqlite:///data/app.db", "/data/app.db", None, None),
        ("sqlite:////data/app.db", "/data/app.db", None, None),  # SQLAlchemy's absolute
        ("sqlite:///data/my%20app.db?table=t1&busy_timeout=2", "/data/my app.db", "t1", 2.0),
    ],
)
def test_sqlite_urls(url: str, path: str, table: str | None, busy: float | None) -> None:
    assert parse_sqlite_url(url) == (path, table, busy)


def test_a_relative_sqlite_url_is_resolved_when_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_inbox("sqlite:app.db?table=billing_inbox")
    try:
        assert isinstance(store, SqliteInbox)
        assert (store.path, store.table) == (str(tmp_path / "app.db"), "billing_inbox")
    finally:
        store.close()


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://host/app.db",
        "sqlite:",
        "sqlite:///app.db?lease=3",
        "sqlite:///app.db?busy_timeout=0",
        "redis://localhost/0",
    ],
)
def test_bad_inbox_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        open_inbox(url)


# --- batches (capabilities.batch) -----------------------------------------------------------


def test_a_batch_records_its_new_ids_with_one_work_and_skips_the_recorded(
    inbox: SqliteInbox, db: Path
) -> None:
    assert isinstance(inbox, BatchInboxStore) and inbox_capabilities(inbox).batch
    inbox.process("m1", write_effect("m1"), source="q")
    records = [("m0", "q", 1), ("m1", "q", 1), ("m2", "q", 3), ("m2", "q", 3), ("m3", "q", 1)]

    def work(fresh: list[int], tx: sqlite3.Connection) -> list[int]:
        for index in fresh:
            tx.execute("INSERT INTO effects (message_id) VALUES (?)", (records[index][0],))
        return fresh

    # m1 was recorded before; the second m2 is the first's copy.
    assert inbox.process_batch(records, work) == ProcessedBatch((0, 2, 4), [0, 2, 4])
    assert effects(db) == ["m0", "m1", "m2", "m3"]
    assert inbox.handled([f"m{n}" for n in range(5)]) == {"m0", "m1", "m2", "m3"}
    with sqlite3.connect(db) as conn:
        attempts = dict(conn.execute("SELECT message_id, attempt FROM msgsafe_inbox"))
    assert attempts == {"m0": 1, "m1": 1, "m2": 3, "m3": 1}

    def must_not_run(fresh: list[int], tx: Any) -> None:
        raise AssertionError("every id is recorded: work must not run")

    assert inbox.process_batch(records[:3], must_not_run) == ProcessedBatch(())
    assert inbox.process_batch([], must_not_run) == ProcessedBatch(())


def test_a_batch_whose_work_raises_leaves_no_record_and_no_effect(
    inbox: SqliteInbox, db: Path
) -> None:
    inbox.record_attempts([("m1", "q"), ("m2", "q")])

    def work(fresh: list[int], tx: sqlite3.Connection) -> None:
        tx.execute("INSERT INTO effects (message_id) VALUES ('m1')")
        raise ValueError("the second message is poison")

    with pytest.raises(ValueError, match="poison"):
        inbox.process_batch([("m1", "q", 1), ("m2", "q", 1)], work)
    assert effects(db) == [] and inbox.handled(["m1", "m2"]) == set()
    # The counters stay with the rollback: 2 now, not 1 again.
    assert inbox.record_attempts([("m1", "q"), ("m2", "q")]) == {"m1": 2, "m2": 2}
    assert inbox.process_batch([("m2", "q", 2)], lambda fresh, tx: None).fresh == (0,)
    # m2 handled: its counter went with the commit, and it is counted no more.
    assert inbox.record_attempts([("m1", "q"), ("m2", "q")]) == {"m1": 3}


def test_record_attempts_counts_the_unhandled_ids_in_one_statement(inbox: SqliteInbox) -> None:
    inbox.process("done", lambda tx: None, source="q")
    assert inbox.record_attempts([("a", "q"), ("done", "q"), ("b", "q")]) == {"a": 1, "b": 1}
    assert inbox.record_attempts([("a", "q")]) == {"a": 2}
    assert inbox.record_attempts([("done", "q")]) == {}
    # record_attempt alone does not look at the handled ids (it is pinned above).
    assert inbox.record_attempt("a", source="q") == 3
    assert inbox.record_attempts([]) == {}
    with pytest.raises(InvalidMessage):
        inbox.record_attempts([("", "q")])


def test_new_id_tables_are_keyed_and_old_rowid_ones_still_work(tmp_path: Path) -> None:
    # New tables keep their rows in the primary key's B-tree (fewer pages a commit);
    # tables an earlier version made as rowid tables are used as they are.
    new = tmp_path / "new.db"
    SqliteInbox(new).close()
    with sqlite3.connect(new) as conn:
        made = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
    assert made["msgsafe_inbox"].endswith("WITHOUT ROWID")
    assert made["msgsafe_inbox_attempts"].endswith("WITHOUT ROWID")

    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:
        conn.execute(
            "CREATE TABLE msgsafe_inbox (message_id text PRIMARY KEY, source text NOT NULL,"
            " attempt integer NOT NULL, handled_at REAL NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE msgsafe_inbox_attempts (message_id text PRIMARY KEY,"
            " source text NOT NULL, attempts integer NOT NULL, updated_at REAL NOT NULL)"
        )
    store = SqliteInbox(old)
    try:
        assert store.record_attempt("m1", source="q") == 1
        assert store.process("m1", lambda tx: 1, source="q", attempt=2) == Processed(True, 1)
        assert store.process("m1", lambda tx: 2, source="q") == Processed(ran=False)
        assert store.handled(["m1", "m2"]) == {"m1"}
        assert store.record_attempt("m2", source="q") == 1
    finally:
        store.close()
    with sqlite3.connect(old) as conn:
        assert (
            "WITHOUT ROWID"
            not in conn.execute(
                "SELECT sql FROM sqlite_master WHERE name = 'msgsafe_inbox'"
            ).fetchone()[0]
        )
        assert conn.execute("SELECT message_id FROM msgsafe_inbox_attempts").fetchall() == [("m2",)]

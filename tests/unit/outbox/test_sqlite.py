"""The SQLite outbox store: durability contract, claims and per-key order, bounds,
quarantine, restart, and the producer's ``outbox=`` argument."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from msgsafe.endpoints import parse_url
from msgsafe.errors import ClosedError, ConfigurationError, MessageIdReused, OutboxFull
from msgsafe.message import Batch, Envelope
from msgsafe.outbox import SqliteOutbox, default_path, open_store
from msgsafe.outbox._rows import batch_rows, envelope_rows
from msgsafe.outbox._schema import SCHEMA_VERSION
from msgsafe.ports import OutboxStore
from tests.support.clock import Clock


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[SqliteOutbox]:
    s = SqliteOutbox(tmp_path / "outbox.db", target="amqp://user:secret@h1:5672/", clock=clock)
    yield s
    s.close()


def env(key: str | None = None, body: bytes = b"x" * 100, **headers: str) -> Envelope:
    return Envelope.build("q", body, key=key, headers=headers or None)


def test_implements_the_protocol(store: SqliteOutbox) -> None:
    assert isinstance(store, OutboxStore)


def test_rows_hold_the_whole_envelope_and_the_target_without_credentials(
    store: SqliteOutbox,
) -> None:
    original = Envelope.build("orders", b"\x00\xffbody", key="k1", headers={"a": "1", "b": "é"})
    store.put([original])
    [entry] = store.list()
    assert entry.envelope == original
    assert entry.target == "amqp://h1:5672"
    assert "secret" not in repr(store)
    [claimed] = store.claim(limit=10, lease_s=30)
    assert claimed == original


def test_a_tombstone_stays_a_tombstone_and_an_empty_body_stays_empty(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    tombstone = Envelope.build("t", None, key="k", headers={"h": "1"})
    bare = Envelope.build("t", None, key="k")
    empty = Envelope.build("t", b"", key="k")
    assert (tombstone.tombstone, bare.tombstone, empty.tombstone) == (True, True, False)
    s = SqliteOutbox(path)
    s.put([tombstone, bare, empty])
    s.close()
    s = SqliteOutbox(path)  # read back from the file, not from memory
    try:
        assert [e.envelope for e in s.list()] == [tombstone, bare, empty]
        assert s.claim(limit=10, lease_s=30) == [tombstone, bare, empty]
    finally:
        s.close()


def test_salvage_copies_a_tombstone_as_a_tombstone(tmp_path: Path) -> None:
    from msgsafe.outbox.salvage import salvage

    path, copy = tmp_path / "o.db", tmp_path / "copy.db"
    sent = [Envelope.build("t", None, key="k", headers={"h": "1"}), env("k")]
    s = SqliteOutbox(path)
    s.put(sent)
    s.close()
    salvage(path, copy)
    s = SqliteOutbox(copy)
    try:
        assert s.claim(limit=10, lease_s=30) == sent
    finally:
        s.close()


def test_rows_written_before_the_tombstone_mark_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    SqliteOutbox(path).close()
    conn = sqlite3.connect(path)
    # Rows as every earlier version wrote them: headers an object or NULL, body b"".
    conn.executemany(
        "INSERT INTO outbox (id, target, destination, key, headers, body, created_at, size)"
        " VALUES (?, '', 't', ?, ?, ?, 1.0, ?)",
        [("old-1", b"k", '{"a":"1"}', b"", 3), ("old-2", None, None, b"v", 1)],
    )
    conn.commit()
    conn.close()
    s = SqliteOutbox(path)
    try:
        got = s.claim(limit=10, lease_s=30)
        assert [(e.message_id, e.body, dict(e.headers), e.tombstone) for e in got] == [
            ("old-1", b"", {"a": "1"}, False),
            ("old-2", b"v", {}, False),
        ]
    finally:
        s.close()


def test_put_is_durable_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    sent = [env() for _ in range(50)]
    s = SqliteOutbox(path)
    s.put(sent)
    s.close()
    s = SqliteOutbox(path)
    try:
        assert s.stats().depth == 50
        got = s.claim(limit=100, lease_s=30)
        assert [e.message_id for e in got] == [e.message_id for e in sent]
    finally:
        s.close()


def test_claim_leases_and_expired_leases_come_back(store: SqliteOutbox, clock: Clock) -> None:
    store.put([env() for _ in range(3)])
    first = store.claim(limit=10, lease_s=5)
    assert len(first) == 3
    assert store.claim(limit=10, lease_s=5) == []
    clock.now += 6
    again = store.claim(limit=10, lease_s=5)
    assert [e.message_id for e in again] == [e.message_id for e in first]


def test_claim_keeps_per_key_order(store: SqliteOutbox, clock: Clock) -> None:
    a1, b1, a2, n1, b2, a3 = env("a"), env("b"), env("a"), env(), env("b"), env("a")
    store.put([a1, b1, a2, n1, b2, a3])
    got = store.claim(limit=2, lease_s=30)
    assert [e.message_id for e in got] == [a1.message_id, b1.message_id]
    # a2 and b2 wait behind their leased heads; the keyless one does not.
    got = store.claim(limit=10, lease_s=30)
    assert [e.message_id for e in got] == [n1.message_id]
    # a1 fails for later: a2, a3 stay blocked; b1 delivered: b2 is next.
    store.failed(a1.message_id, error="refused", retry_at=clock.now + 10)
    store.delivered([b1.message_id, n1.message_id])
    got = store.claim(limit=10, lease_s=30)
    assert [e.message_id for e in got] == [b2.message_id]
    clock.now += 11
    store.delivered([b2.message_id])
    got = store.claim(limit=10, lease_s=30)
    assert [e.message_id for e in got] == [a1.message_id, a2.message_id, a3.message_id]


def test_failed_without_retry_quarantines_and_replay_brings_it_back(store: SqliteOutbox) -> None:
    a1, a2 = env("a"), env("a")
    store.put([a1, a2])
    store.claim(limit=1, lease_s=30)
    store.failed(a1.message_id, error="Rejected: bad", retry_at=None)
    stats = store.stats()
    assert (stats.depth, stats.quarantined) == (1, 1)
    [q] = store.quarantined()
    assert q.envelope == a1 and q.error == "Rejected: bad" and q.attempts == 1
    # The poison message is out of the way: the key continues.
    assert [e.message_id for e in store.claim(limit=5, lease_s=30)] == [a2.message_id]
    store.delivered([a2.message_id])
    assert not store.has_key(b"a")
    assert store.replay("all") == 1
    assert store.has_key(b"a")
    assert [e.message_id for e in store.claim(limit=5, lease_s=30)] == [a1.message_id]
    store.failed(a1.message_id, error="again", retry_at=None)
    assert store.purge("all") == 1
    assert store.stats().quarantined == 0 and store.stats().depth == 0


def test_has_key_follows_puts_deliveries_and_restart(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    s = SqliteOutbox(path)
    e1, e2 = env("k"), env("k")
    assert not s.has_key(b"k")
    s.put([e1, e2])
    assert s.has_key(b"k")
    s.delivered([e1.message_id])
    assert s.has_key(b"k")
    s.close()
    s = SqliteOutbox(path)
    assert s.has_key(b"k")
    s.delivered([e2.message_id])
    assert not s.has_key(b"k")
    s.close()


def test_repeated_put_of_the_same_id_keeps_one_copy(store: SqliteOutbox) -> None:
    e1 = env("k")
    store.put([e1])
    store.put([e1, env("k")])
    assert store.stats().depth == 2
    store.delivered([e1.message_id])
    assert store.has_key(b"k")


@pytest.mark.parametrize("bound", ["rows", "bytes"])
def test_bounds_raise_outbox_full_and_store_nothing_of_that_put(tmp_path: Path, bound: str) -> None:
    limits = {"max_rows": 10} if bound == "rows" else {"max_bytes": 1000}
    s = SqliteOutbox(tmp_path / "o.db", **limits)  # type: ignore[arg-type]
    try:
        s.put([env() for _ in range(8)])  # 8 rows, 808 bytes
        with pytest.raises(OutboxFull):
            s.put([env() for _ in range(3)])
        assert s.stats().depth == 8
        s.put([env()])
        assert s.stats().depth == 9
    finally:
        s.close()


def test_age_bound_refuses_new_puts_and_keeps_old_ones(tmp_path: Path, clock: Clock) -> None:
    s = SqliteOutbox(tmp_path / "o.db", max_age_s=60, clock=clock)
    try:
        old = Envelope("q", b"x", created_at=clock.now)
        s.put([old])
        clock.now += 61
        with pytest.raises(OutboxFull, match="max_age_s"):
            s.put([env()])
        assert s.stats().depth == 1
        s.delivered([old.message_id])
        s.put([env()])
    finally:
        s.close()


def test_concurrent_puts_share_commits_and_lose_nothing(store: SqliteOutbox) -> None:
    sent: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(200):
            e = env()
            store.put([e])
            with lock:
                sent.append(e.message_id)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = {e.message_id for e in store.claim(limit=10_000, lease_s=30)}
    assert got == set(sent) and len(sent) == 800


def test_stats_and_pending(store: SqliteOutbox, clock: Clock) -> None:
    assert store.stats().oldest_age_s is None
    store.put([Envelope("q", b"abc", created_at=clock.now - 5)])
    stats = store.stats()
    assert stats.depth == 1 and stats.bytes == 3 and stats.oldest_age_s == pytest.approx(5)
    assert store.pending() == 1


def test_closed_store_refuses(tmp_path: Path) -> None:
    s = SqliteOutbox(tmp_path / "o.db")
    s.close()
    s.close()
    with pytest.raises(ClosedError):
        s.put([env()])


def test_file_is_wal_with_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    SqliteOutbox(path).close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    finally:
        conn.close()


def test_open_store_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    url = parse_url("amqp://user:pw@h1:5672,h2:5672/%2F")
    assert open_store(False, url) is None
    assert open_store(None, url) is None
    default = open_store(True, url)
    try:
        assert isinstance(default, SqliteOutbox)
        assert default.path == default_path(url)
        assert str(default.path).startswith(str(tmp_path / "data"))
        assert "pw" not in default.path.name and "user" not in default.path.name
        # A password change keeps the same file: it is keyed without credentials.
        assert default_path(parse_url("amqp://other:x@h1:5672,h2:5672/%2F")) == default.path
        assert default.target == url.redacted()
    finally:
        if default is not None:
            default.close()
    explicit = open_store(str(tmp_path / "x.db"), url)
    assert isinstance(explicit, SqliteOutbox)
    assert open_store(explicit, url) is explicit
    explicit.close()
    with pytest.raises(ConfigurationError):
        open_store(42, url)  # type: ignore[arg-type]


def test_open_store_shares_one_file_within_the_process(tmp_path: Path) -> None:
    url = parse_url("memory://shared")
    first = open_store(tmp_path / "s.db", url)
    second = open_store(str(tmp_path / "s.db"), url)
    assert isinstance(first, SqliteOutbox) and first is second
    first.put([env()])
    first.close()  # the other user still has it open
    assert second.stats().depth == 1
    second.close()
    with pytest.raises(ClosedError):
        second.put([env()])
    third = open_store(tmp_path / "s.db", url)  # a fresh store once all users closed
    assert third is not first and third is not None
    assert third.stats().depth == 1
    third.close()


def test_a_read_never_fails_because_a_write_of_its_group_did(tmp_path: Path) -> None:
    from msgsafe.outbox._writer import GroupCommitWriter, HandlerResult

    conn = sqlite3.connect(tmp_path / "w.db", isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.execute("INSERT INTO t VALUES (7)")

    def full_disk(conn: sqlite3.Connection, payloads: list[object]) -> HandlerResult[object]:
        raise sqlite3.OperationalError("database or disk is full")

    def read(conn: sqlite3.Connection, payloads: list[object]) -> HandlerResult[object]:
        (value,) = conn.execute("SELECT x FROM t").fetchone()
        return HandlerResult([value] * len(payloads))

    writer = GroupCommitWriter(conn, lambda exc: OutboxFull(str(exc)))
    # Queued before the thread starts, so both land in one group.
    write = writer.submit(full_disk, None)
    reading = writer.submit(read, None, read_only=True)
    writer.start()
    try:
        with pytest.raises(OutboxFull):
            write.result(timeout=10)
        assert reading.result(timeout=10) == 7
    finally:
        writer.close(10)
        conn.close()


def test_blocking_and_queued_puts_mix_from_many_threads(store: SqliteOutbox) -> None:
    # Blocking puts run in the caller's thread when the writer is idle and queue behind
    # it otherwise; async puts always queue. Every one must be stored exactly once.
    futures: list[Future[None]] = []
    ids: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(40):
            batch = [env(key=f"k{n}", h=str(i)), env()]
            with lock:
                ids.extend(e.message_id for e in batch)
            if i % 3:
                store.put(batch)
            else:
                future = store.put_async(batch)
                with lock:
                    futures.append(future)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in futures:
        f.result()
    assert store.pending() == len(ids) == 6 * 40 * 2
    listed = [e.envelope for e in store.list(limit=len(ids))]
    assert sorted(e.message_id for e in listed) == sorted(ids)
    for n in range(6):
        mine = [e.headers["h"] for e in listed if e.key == f"k{n}".encode()]
        assert mine == [str(i) for i in range(40)]  # one thread's puts keep their order
    assert store.has_key(b"k0")


def test_a_claim_writes_nothing_to_the_file_and_its_lease_runs_out(
    store: SqliteOutbox, clock: Clock
) -> None:
    """Leases are held in memory: claiming commits nothing (no WAL frame, no fsync); a
    held row and the rest of its key are not claimed twice until settled or expired."""
    a1, a2, b1 = env("a"), env("a"), env("b")
    store.put([a1, a2, b1])
    wal = Path(f"{store.path}-wal")
    before = wal.stat().st_size
    got = store.claim(limit=1, lease_s=30)
    assert [e.message_id for e in got] == [a1.message_id]
    assert [e.message_id for e in store.claim(limit=10, lease_s=30)] == [b1.message_id]
    assert store.claim(limit=10, lease_s=30) == []
    assert wal.stat().st_size == before
    store.release([(b1.message_id, "Refused: later")], retry_at=clock.now + 5)
    assert store.claim(limit=10, lease_s=30) == []  # b waits for its retry time
    clock.now += 31  # a1's lease ran out: a1 and a2 are claimable again, in order
    assert [e.message_id for e in store.claim(limit=10, lease_s=30)] == [
        a1.message_id,
        a2.message_id,
        b1.message_id,
    ]


@pytest.mark.parametrize("selection", ["ids", "all"])
def test_purging_a_leased_row_ends_its_lease_and_frees_its_key(
    store: SqliteOutbox, selection: str
) -> None:
    """A purged row's lease goes with it: the rest of its key is claimable at once, not
    when the lease would have run out (the clock does not move here)."""
    a1, a2 = env("a"), env("a")
    store.put([a1])
    assert [e.message_id for e in store.claim(limit=10, lease_s=30)] == [a1.message_id]
    ids = [a1.message_id] if selection == "ids" else "all"
    assert store.purge(ids, waiting=True) == 1
    store.put([a2])
    assert [e.message_id for e in store.claim(limit=10, lease_s=30)] == [a2.message_id]
    store.delivered([a2.message_id])
    assert store.stats().depth == 0 and not store.has_key(b"a")


@pytest.mark.parametrize("keyed", [False, True])
def test_a_batch_put_stores_the_messages_of_its_envelopes(store: SqliteOutbox, keyed: bool) -> None:
    """put_batch_async stores from a batch's columns the very messages put() stores of
    its envelopes (ids, keys, headers, ages, sizes), each key's in batch order (as
    blocks: tests/unit/outbox/test_blocks.py), and counts them alike."""
    keys = [None if i % 2 else f"k{i % 5}" for i in range(40)] if keyed else None
    batch = Batch.build("q", [b"x" * i for i in range(40)], keys=keys, headers={"h": "v"})
    envelopes = [batch.envelope(i) for i in range(len(batch))]
    rows, plain = batch_rows(batch, "t"), envelope_rows(envelopes, "t")
    assert (rows.count, rows.size, rows.keys) == (plain.count, plain.size, plain.keys)
    store.put_batch_async(batch).result(10)
    listed = [e.envelope for e in store.list(limit=100)]
    assert sorted(listed, key=envelopes.index) == envelopes
    for key in {e.key for e in envelopes}:
        assert [e for e in listed if e.key == key] == [e for e in envelopes if e.key == key]
    stats = store.stats()
    assert (stats.depth, stats.bytes) == (40, sum(e.size for e in envelopes))
    assert store.has_key(b"k0") is keyed


def test_a_shared_store_opened_while_its_last_user_closes_it_waits_for_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file of a store its last user is closing is still locked: shared() for the
    same path waits until it is released, instead of failing with OutboxLocked."""
    path = tmp_path / "o.sqlite3"
    first = SqliteOutbox.shared(path)
    gate = threading.Event()
    in_close = threading.Event()
    finish = first._writer.close

    def slow_close() -> None:
        in_close.set()
        assert gate.wait(10)
        finish()

    monkeypatch.setattr(first._writer, "close", slow_close)
    closer = threading.Thread(target=first.close)
    closer.start()
    assert in_close.wait(10)
    opened: list[SqliteOutbox | BaseException] = []

    def open_again() -> None:
        try:
            opened.append(SqliteOutbox.shared(path))
        except BaseException as exc:
            opened.append(exc)

    opener = threading.Thread(target=open_again)
    opener.start()
    opener.join(0.3)
    assert opened == []  # waiting for the file, not failing
    gate.set()
    closer.join(10)
    opener.join(10)
    [second] = opened
    assert isinstance(second, SqliteOutbox) and second is not first, second
    second.put([Envelope.build("q", b"x")])
    assert second.pending() == 1
    second.close()


@pytest.mark.parametrize("change", ["body", "key", "destination"])
def test_an_id_reused_for_another_message_is_refused_and_its_put_stores_nothing(
    store: SqliteOutbox, change: str
) -> None:
    """As the PostgreSQL store: an id is the message; reusing it for another one would
    leave the second reported stored and never sent."""
    first = env("k", body=b"one")
    store.put([first])
    changed = {"body": b"two", "key": b"k2", "destination": "q2"}[change]
    other = dataclasses.replace(first, **{change: changed})
    fresh = env("k")
    with pytest.raises(MessageIdReused, match=first.message_id):
        store.put([fresh, other])
    assert store.stats().depth == 1, "the refused put left a row"
    store.put([fresh, first])  # the same message again: kept once, no error
    assert [e.message_id for e in store.claim(limit=10, lease_s=30)] == [
        first.message_id,
        fresh.message_id,
    ]


def test_a_refused_put_does_not_take_others_committed_with_it(store: SqliteOutbox) -> None:
    first = env("k", body=b"one")
    store.put([first])
    others = [env("k") for _ in range(20)]
    futures = [store.put_async([e]) for e in others[:10]]
    refused = store.put_async([dataclasses.replace(first, body=b"two")])
    futures += [store.put_async([e]) for e in others[10:]]
    for future in futures:
        future.result(10)
    with pytest.raises(MessageIdReused):
        refused.result(10)
    assert store.stats().depth == 21
    claimed = store.claim(limit=100, lease_s=30)
    assert [e.message_id for e in claimed] == [first.message_id] + [e.message_id for e in others]
    assert claimed[0].body == b"one"

"""Blocks: a stored batch's messages of one key kept as one row of the SQLite outbox
(msgsafe/outbox/_blocks.py), read and removed whole, split only when one member needs
handling on its own. Every test counts messages by id: none lost, none duplicated,
each key in batch order."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from msgsafe.message import Batch, Envelope
from msgsafe.outbox import SqliteOutbox
from msgsafe.outbox._blocks import BLOCK_MEMBERS, BlockError, pack, unpack
from msgsafe.outbox._schema import _MIGRATIONS, APPLICATION_ID
from msgsafe.outbox._writer import HandlerResult
from msgsafe.outbox.salvage import salvage
from tests.support.clock import Clock

KEYS = [b"k0", b"k1", b"k2", b"k3"]


def keyed_batch(count: int, keys: list[bytes] = KEYS) -> Batch:
    return Batch.build(
        "q",
        [b"m%d" % i for i in range(count)],
        keys=[keys[i % len(keys)] for i in range(count)],
        headers={"h": "v"},
    )


def file_rows(store: SqliteOutbox) -> list[tuple[Any, ...]]:
    """``(seq, count, block is not NULL)`` of every row in the file, in seq order."""

    def read(conn: sqlite3.Connection, payloads: list[Any]) -> HandlerResult[object]:
        rows = conn.execute("SELECT seq, count, block IS NOT NULL FROM outbox ORDER BY seq")
        return HandlerResult([rows.fetchall()] * len(payloads))

    rows: list[tuple[Any, ...]] = store._read(read, None)
    return rows


def per_key(ids: list[str], batch: Batch) -> dict[bytes | None, list[str]]:
    keys = dict(zip(batch.message_ids, batch.keys or [None] * len(batch), strict=True))
    out: dict[bytes | None, list[str]] = {}
    for message_id in ids:
        out.setdefault(keys[message_id], []).append(message_id)
    return out


def claimed_ids(store: SqliteOutbox, limit: int = 100_000) -> list[str]:
    return [e.message_id for e in store.claim(limit=limit, lease_s=30)]


def test_packing_round_trips_and_refuses_damage() -> None:
    ids = ["a", "b-2", "c3"]
    bodies = [b"", b"\x00\n" * 5, b"x" * 70_000]
    block = pack(ids, bodies)
    assert unpack(block) == (ids, bodies)
    for damaged in (block[:-1], block + b"x", b"MSB2" + block[4:], block[:6], b""):
        with pytest.raises(BlockError):
            unpack(damaged)


def test_a_batch_of_four_keys_is_four_rows_and_drains_whole(store: SqliteOutbox) -> None:
    batch = keyed_batch(1000)
    store.put_batch_async(batch).result(10)
    rows = file_rows(store)
    assert [(count, is_block) for _, count, is_block in rows] == [(250, 1)] * 4
    assert store.pending() == store.stats().depth == 1000
    assert all(store.has_key(k) for k in KEYS)
    listed = [e.envelope.message_id for e in store.list(limit=10_000)]
    assert sorted(listed) == sorted(batch.message_ids)
    assert per_key(listed, batch) == per_key(list(batch.message_ids), batch)
    claimed = store.claim(limit=10_000, lease_s=30)
    assert [e.message_id for e in claimed] == listed
    sent = dict(zip(batch.message_ids, batch.bodies, strict=True))
    assert all(sent[e.message_id] == e.body and e.key is not None for e in claimed)
    assert all(e.headers == {"h": "v"} for e in claimed)
    store.delivered([e.message_id for e in claimed])
    assert file_rows(store) == [] and store.pending() == 0 and store.stats().bytes == 0
    assert not any(store.has_key(k) for k in KEYS)


def test_a_claim_takes_a_block_whole(store: SqliteOutbox) -> None:
    batch = keyed_batch(600, keys=[b"a"])
    store.put_batch_async(batch).result(10)
    assert claimed_ids(store, limit=10) == list(batch.message_ids)
    assert claimed_ids(store, limit=10) == []  # held: nothing of the key is claimable


def test_blocks_are_at_most_block_members_long(store: SqliteOutbox) -> None:
    batch = keyed_batch(2 * BLOCK_MEMBERS + 1, keys=[b"a"])
    store.put_batch_async(batch).result(10)
    assert [count for _, count, _ in file_rows(store)] == [BLOCK_MEMBERS, BLOCK_MEMBERS, 1]
    assert claimed_ids(store) == list(batch.message_ids)


def test_rows_and_blocks_of_one_key_keep_put_order(store: SqliteOutbox) -> None:
    first = Envelope.build("q", b"first", key="a")
    batch = keyed_batch(10, keys=[b"a"])
    last = Envelope.build("q", b"last", key="a")
    store.put([first])
    store.put_batch_async(batch).result(10)
    store.put([last])
    expected = [first.message_id, *batch.message_ids, last.message_id]
    assert [e.envelope.message_id for e in store.list()] == expected
    assert claimed_ids(store) == expected


def test_a_partly_confirmed_block_is_split_and_the_rest_waits_in_order(
    store: SqliteOutbox, clock: Clock
) -> None:
    batch = keyed_batch(20, keys=[b"a"])
    store.put_batch_async(batch).result(10)
    ids = claimed_ids(store)
    store.delivered(ids[:7])
    rest = ids[7:]
    assert [count for _, count, _ in file_rows(store)] == [1] * 13  # rows now
    assert store.pending() == 13
    store.release([(i, "nack") for i in rest], retry_at=clock.now + 5)
    assert claimed_ids(store) == []
    clock.now += 6
    assert claimed_ids(store) == rest
    store.delivered(rest)
    assert store.pending() == 0 and store.stats().bytes == 0 and not store.has_key(b"a")


def test_a_retried_member_holds_its_key_and_a_quarantined_one_leaves_alone(
    store: SqliteOutbox, clock: Clock
) -> None:
    batch = keyed_batch(10, keys=[b"a"])
    store.put_batch_async(batch).result(10)
    ids = claimed_ids(store)
    store.failed(ids[3], error="poison", retry_at=None)
    assert store.stats().quarantined == 1 and store.pending() == 9
    assert [q.envelope.message_id for q in store.quarantined()] == [ids[3]]
    store.failed(ids[5], error="busy", retry_at=clock.now + 5)
    store.delivered(ids[:3] + ids[4:5])
    store.release([(i, "behind") for i in ids[6:]], retry_at=clock.now)
    assert claimed_ids(store) == []  # ids[5] waits, and the key behind it
    clock.now += 6
    assert claimed_ids(store) == ids[5:]
    assert store.pending() == 5


def test_a_lease_that_runs_out_gives_the_block_again(store: SqliteOutbox, clock: Clock) -> None:
    batch = keyed_batch(8, keys=[b"a"])
    store.put_batch_async(batch).result(10)
    assert claimed_ids(store) == list(batch.message_ids)
    clock.now += 31
    assert claimed_ids(store) == list(batch.message_ids)
    store.delivered(list(batch.message_ids))
    assert store.pending() == 0 and file_rows(store) == []


def test_operators_find_purge_and_count_members(store: SqliteOutbox) -> None:
    batch = keyed_batch(40)
    store.put_batch_async(batch).result(10)
    member = batch.message_ids[17]
    assert store.locate([member, "nope"]) == {member: "waiting"}
    assert store.destinations() == [("q", 40)]
    page = store.list(limit=5, offset=12)
    listed = [e.envelope.message_id for e in store.list(limit=100)]
    assert [e.envelope.message_id for e in page] == listed[12:17]
    assert store.purge([member], waiting=True) == 1
    assert store.locate([member]) == {}
    assert store.pending() == 39
    assert store.purge("all", waiting=True) == 39
    assert store.pending() == 0 and store.stats().bytes == 0 and file_rows(store) == []


def test_blocks_survive_a_reopen(tmp_path: Path, clock: Clock) -> None:
    batch = keyed_batch(100)
    store = SqliteOutbox(tmp_path / "o.db", clock=clock)
    store.put_batch_async(batch).result(10)
    claimed_ids(store)  # leased, then the process goes away
    store.close()
    store = SqliteOutbox(tmp_path / "o.db", clock=clock)
    try:
        assert store.pending() == 100 and all(store.has_key(k) for k in KEYS)
        ids = claimed_ids(store)
        assert sorted(ids) == sorted(batch.message_ids)
        store.delivered(ids)
        assert store.pending() == 0
    finally:
        store.close()


def test_a_file_written_before_blocks_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in _MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    old = [Envelope.build("q", b"old%d" % i, key="a") for i in range(3)]
    conn.executemany(
        "INSERT INTO outbox (id, target, destination, key, headers, body, created_at, size)"
        " VALUES (?, '', 'q', ?, NULL, ?, ?, ?)",
        [(e.message_id, e.key, e.body, e.created_at, e.size) for e in old],
    )
    conn.close()
    store = SqliteOutbox(path)
    try:
        assert store.pending() == 3
        batch = keyed_batch(5, keys=[b"a"])
        store.put_batch_async(batch).result(10)
        expected = [e.message_id for e in old] + list(batch.message_ids)
        assert claimed_ids(store) == expected
        store.delivered(expected)
        assert store.pending() == 0
    finally:
        store.close()


def test_absorbing_a_file_with_blocks_puts_its_members_ahead(tmp_path: Path) -> None:
    ours = SqliteOutbox(tmp_path / "ours.db")
    theirs = SqliteOutbox(tmp_path / "theirs.db")
    try:
        here = keyed_batch(6, keys=[b"a"])
        there = keyed_batch(9, keys=[b"a"])
        ours.put_batch_async(here).result(10)
        theirs.put_batch_async(there).result(10)
        assert ours.absorb(theirs) == (9, 0)
        assert theirs.pending() == 0
        assert claimed_ids(ours) == list(there.message_ids) + list(here.message_ids)
    finally:
        ours.close()
        theirs.close()


def test_salvage_copies_a_block_as_its_members_in_order(tmp_path: Path) -> None:
    source = tmp_path / "o.db"
    store = SqliteOutbox(source)
    before = Envelope.build("q", b"before", key="k0")
    batch = keyed_batch(300)
    store.put([before])
    store.put_batch_async(batch).result(10)
    store.close()
    report = salvage(source, tmp_path / "copy.db")
    assert report.waiting == 301 and report.damaged_records == 0
    copy = SqliteOutbox(tmp_path / "copy.db")
    try:
        ids = claimed_ids(copy)
        assert sorted(ids) == sorted([before.message_id, *batch.message_ids])
        assert ids.index(before.message_id) < ids.index(batch.message_ids[0])
        assert per_key(ids[1:], batch) == per_key(list(batch.message_ids), batch)
    finally:
        copy.close()

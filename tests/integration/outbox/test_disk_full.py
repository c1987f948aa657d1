"""A full disk under the outbox (a 2 MiB tmpfs): sends that cannot be stored raise
OutboxFull, nothing that got a receipt is lost, and once space is freed storing and
draining resume."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe import Producer, Status
from msgsafe.errors import BatchFailed, OutboxFull
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox
from msgsafe.testing import MemoryBroker
from tests.fixtures._tmpfs import mounted_tmpfs

pytestmark = pytest.mark.integration


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted afterwards (also when the test fails)."""
    with mounted_tmpfs(tmp_path / "disk", "2m") as mount:
        yield mount


def test_full_disk_raises_typed_error_and_loses_nothing(small_disk: Path) -> None:
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * 256 * 1024)  # freed later to give the outbox room again
    name = f"diskfull-{uuid.uuid4().hex[:6]}"
    broker = MemoryBroker.install(MemoryBroker(name))
    broker.refuse_writes()
    path = small_disk / "outbox.sqlite3"
    receipted: list[str] = []
    failures = 0
    try:
        # require="any": the outbox is on a tmpfs (memory) on purpose, for a real ENOSPC.
        producer = Producer(f"memory://{name}", outbox=path, send_timeout=30, require="any")
        try:
            consecutive = 0
            while consecutive < 20:
                try:
                    receipt = producer.send("q", b"y" * 1000, key=f"k{len(receipted) % 3}")
                except OutboxFull:
                    failures += 1
                    consecutive += 1
                    continue
                assert receipt.status is Status.STORED
                receipted.append(receipt.message_id)
                consecutive = 0
            assert producer.pending() == len(receipted)
            # Space comes back: storing works again, and so does draining.
            filler.unlink()
            after = producer.send("q", b"z" * 100)
            assert after.status is Status.STORED
            receipted.append(after.message_id)
            broker.accept_writes()
            assert producer.drain(30) == 0
        finally:
            producer.close(10)
        delivered = set(broker.ids("q"))
        lost = [mid for mid in receipted if mid not in delivered]
        print(
            f"receipted={len(receipted)} refused_full={failures} "
            f"delivered={len(delivered)} lost={len(lost)}"
        )
        assert not lost and failures >= 20 and len(receipted) > 100
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            conn.close()
        SqliteOutbox(path).close()
    finally:
        MemoryBroker.forget(name)


def test_batches_on_a_full_disk_are_stored_whole_or_not_at_all(small_disk: Path) -> None:
    """Batches sent during the outage go to the outbox whole: on a full disk each one is
    either stored completely or fails completely with OutboxFull (the caller owns every
    id of it), and every stored id is delivered once space is back."""
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * 1024 * 1024)  # room for the drain's deletes later
    name = f"diskfull-{uuid.uuid4().hex[:6]}"
    broker = MemoryBroker.install(MemoryBroker(name))
    broker.refuse_writes()
    receipted: list[str] = []
    failed_ids: list[str] = []
    try:
        # require="any": the outbox is on a tmpfs (memory) on purpose, for a real ENOSPC.
        with Producer(
            f"memory://{name}", outbox=small_disk / "o.sqlite3", require="any"
        ) as producer:
            consecutive = 0
            while consecutive < 5:
                keys = [f"k{i % 3}" for i in range(50)]
                try:
                    receipt = producer.send_batch("q", [b"y" * 1000] * 50, keys=keys)
                except BatchFailed as exc:
                    assert exc.receipt is not None and len(exc.receipt) == 0
                    assert all(isinstance(e, OutboxFull) for e in exc.errors.values())
                    failed_ids.extend(exc.errors)
                    consecutive += 1
                    continue
                assert receipt.stored + receipt.confirmed == 50
                receipted.extend(receipt.message_ids)
                consecutive = 0
            filler.unlink()
            receipted.extend(producer.send_batch("q", [b"z"] * 10).message_ids)
            broker.accept_writes()
            assert producer.drain(30) == 0
        delivered = broker.ids("q")
        lost = set(receipted) - set(delivered)
        print(
            f"receipted={len(receipted)} failed={len(failed_ids)} delivered={len(delivered)} "
            f"lost={len(lost)}"
        )
        assert not lost and len(failed_ids) >= 250 and len(receipted) > 100
        assert not set(failed_ids) & set(delivered)
        assert len(delivered) == len(set(delivered))
    finally:
        MemoryBroker.forget(name)


def _fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` until ``leave`` bytes are free; returns the filler file."""
    stats = os.statvfs(disk)
    filler = disk / "filler-nearly"
    filler.write_bytes(b"\0" * max(0, stats.f_bavail * stats.f_frsize - leave))
    return filler


@pytest.mark.parametrize("leave", [4096, 16384])
def test_opening_on_a_nearly_full_disk_says_so_and_keeps_the_data(
    small_disk: Path, leave: int
) -> None:
    """On a disk with a few KiB left, a new outbox raises OutboxFull saying the disk is
    full, how much is free and needed, and what to do (it used to be "cannot rollback -
    no transaction is active"); one that already holds messages still opens with all of
    them, and the new one opens once room is made."""
    path = small_disk / "outbox.sqlite3"
    store = SqliteOutbox(path)
    store.put([Envelope.build("q", b"x" * 100, message_id=f"m-{i}") for i in range(20)])
    store.close()
    filler = _fill(small_disk, leave)
    with pytest.raises(OutboxFull) as caught:
        SqliteOutbox(small_disk / "fresh.sqlite3").close()
    text = str(caught.value)
    assert "disk holding the outbox is full" in text, text
    assert "free on" in text and "MiB needed" in text and "outbox=" in text, text
    assert "no transaction is active" not in text
    existing = SqliteOutbox(path)
    try:
        assert existing.stats().depth == 20
    finally:
        existing.close()
    filler.unlink()
    SqliteOutbox(small_disk / "fresh.sqlite3").close()

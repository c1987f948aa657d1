"""A full disk under the outbox (a 2 MiB tmpfs): sends that cannot be stored raise
OutboxFull, nothing that got a receipt is lost, and once space is freed storing and
draining resume."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe import Producer, Status
from msgsafe.errors import OutboxFull
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
        producer = Producer(f"memory://{name}", outbox=path, send_timeout=30)
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

"""A full disk under the PostgreSQL server of a shared outbox (its data directory on a
160 MiB tmpfs, filled by a ballast file): sends that cannot be stored raise OutboxFull,
every STORED receipt names a row in the table, and once the ballast is gone sends are
STORED again, on the producer's same outbox.

Counted: every id sent, its outcome (STORED, OutboxFull, anything else), and the ids in
the table. The broker is a port nothing listens on, so every send goes to the outbox.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from msgsafe import Producer, Status
from msgsafe.cluster._process import free_ports
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.errors import OutboxFull
from tests.fixtures._tmpfs import mounted_tmpfs

pytestmark = pytest.mark.integration

TABLE = "full_disk_outbox"
BODY = 2000  #: bytes a message


@pytest.fixture
def server_on_small_disk() -> Iterator[tuple[PostgresCluster, Path]]:
    """One PostgreSQL node whose data directory is on its own 160 MiB tmpfs.

    The mount is made outside pytest's temporary directory, which only root may enter:
    the server runs as the postgres account."""
    where = Path(tempfile.mkdtemp(prefix="msgsafe-pgdisk-"))
    where.chmod(0o755)
    try:
        with mounted_tmpfs(where / "disk", "160m") as mount:
            yield from _server_on(mount)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _server_on(mount: Path) -> Iterator[tuple[PostgresCluster, Path]]:
    mount.chmod(0o777)  # the server runs as the postgres account
    folder = mount / "pg"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    server = PostgresCluster(1, dir=folder)
    assert server.data_root == folder, "the data must live on the small disk"
    server.start()
    try:
        yield server, mount
    finally:
        server.stop()


def _fill(mount: Path) -> Path:
    """A ballast file that takes every free byte of ``mount``."""
    ballast = mount / "ballast"
    with open(ballast, "wb") as out:
        try:
            while True:
                out.write(b"\0" * (1 << 20))
                out.flush()
        except OSError as exc:
            assert exc.errno == 28, exc  # ENOSPC
    return ballast


def test_a_full_disk_under_the_server_refuses_sends_and_storing_resumes_after(
    server_on_small_disk: tuple[PostgresCluster, Path],
) -> None:
    server, mount = server_on_small_disk
    store = f"{server.url}&table={TABLE}"
    nowhere = f"amqp://127.0.0.1:{free_ports(1)[0]}/"
    stored: list[str] = []
    refused: list[str] = []
    other: list[str] = []

    with Producer(nowhere, outbox=store, forward=False, connect_timeout=1) as producer:

        def send(count: int) -> None:
            for _ in range(count):
                try:
                    receipt = producer.send("orders", os.urandom(BODY), key=b"k")
                except OutboxFull as exc:
                    refused.append(str(exc))
                    continue
                except Exception as exc:  # counted, and failed below
                    other.append(repr(exc))
                    continue
                if receipt.status is Status.STORED:
                    stored.append(receipt.message_id)
                else:
                    other.append(f"{receipt.status}: {receipt.message_id}")

        send(100)
        assert len(stored) == 100, other[:3]
        ballast = _fill(mount)
        # A page of the table may still have room for a few rows: then it refuses.
        send(300)
        assert refused, "nothing was refused on a full disk"
        assert "out of disk" in refused[0], refused[0]
        assert not other, other[:3]
        stored_while_full = len(stored) - 100

        ballast.unlink()
        send(100)
        # The producer's outbox took sends again (it did not keep refusing them with the
        # transaction the full disk had failed).
        assert not other, other[:3]
        assert len(stored) == 100 + stored_while_full + 100

    with psycopg.connect(server.url) as conn:
        rows = {str(r[0]) for r in conn.execute(f"SELECT id FROM {TABLE}").fetchall()}
    print(
        f"sent=600 stored={len(stored)} refused={len(refused)} other={len(other)} "
        f"stored_while_full={stored_while_full} rows={len(rows)}"
    )
    assert rows == set(stored), "every STORED receipt names a row, and no row is unknown"

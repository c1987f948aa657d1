"""Opening an outbox file that is damaged, foreign or in use: a typed error, and the file
left exactly as it was."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe.errors import OutboxCorrupt, OutboxLocked
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def make_outbox(path: Path, n: int = 300) -> None:
    s = SqliteOutbox(path)
    s.put([Envelope.build("q", bytes([i % 256]) * 200, key=f"k{i % 7}") for i in range(n)])
    s.close()


def test_not_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    path.write_bytes(b"this is somebody's notes, not a database\n" * 100)
    before, names = digest(path), siblings(path)
    with pytest.raises(OutboxCorrupt, match="not an SQLite file"):
        SqliteOutbox(path)
    assert digest(path) == before and siblings(path) == names


def test_foreign_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    before, names = digest(path), siblings(path)
    with pytest.raises(OutboxCorrupt, match="not an msgsafe outbox"):
        SqliteOutbox(path)
    assert digest(path) == before and siblings(path) == names


def test_corrupt_outbox_file(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    make_outbox(path)
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 6 * page
    # Scribble over interior pages (not the header): a damaged b-tree.
    for offset in range(2 * page, 5 * page, 7):
        data[offset] = 0xA5
    path.write_bytes(bytes(data))
    before, names = digest(path), siblings(path)
    with pytest.raises(OutboxCorrupt):
        SqliteOutbox(path)
    assert digest(path) == before and siblings(path) == names


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    make_outbox(path, 1)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    before = digest(path)
    with pytest.raises(OutboxCorrupt, match="newer"):
        SqliteOutbox(path)
    assert digest(path) == before


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that opened the outbox and keeps it open."""
    path = tmp_path / "o.db"
    make_outbox(path, 10)
    code = textwrap.dedent(
        f"""
        import sys
        from msgsafe.outbox import SqliteOutbox
        s = SqliteOutbox({str(path)!r})
        print("open", flush=True)
        sys.stdin.read()
        s.close()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_outbox_held_by_another_process(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    path = tmp_path / "o.db"
    with pytest.raises(OutboxLocked):
        SqliteOutbox(path)
    holder.kill()
    holder.wait(10)
    s = SqliteOutbox(path)
    try:
        assert s.stats().depth == 10
    finally:
        s.close()


def test_file_locked_by_a_plain_sqlite_writer(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    make_outbox(path, 5)
    code = textwrap.dedent(
        f"""
        import sqlite3, sys
        c = sqlite3.connect({str(path)!r}, isolation_level=None)
        c.execute("BEGIN EXCLUSIVE")
        print("locked", flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with pytest.raises(OutboxLocked):
            SqliteOutbox(path)
        assert time.monotonic() - started < 10
    finally:
        proc.kill()
        proc.wait(10)
    s = SqliteOutbox(path)
    try:
        assert s.stats().depth == 5
    finally:
        s.close()


def test_outbox_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """Message bodies are the application's data: the outbox, its WAL and shared-memory
    file, and a salvaged copy are readable by their owner only (0600), also under the
    common umask 022 that would leave a plain new file world-readable."""
    import os
    import stat

    from msgsafe.outbox.salvage import salvage

    old = os.umask(0o022)
    try:
        path = tmp_path / "outbox.db"
        store = SqliteOutbox(path)
        store.put([Envelope.build("q", b"secret body")])
        files = [f for f in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if f.exists()]
        assert len(files) >= 2, siblings(path)  # the file and its WAL at least
        modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files}
        store.close()
        assert set(modes.values()) == {0o600}, modes
        copy = tmp_path / "salvaged.db"
        salvage(path, copy)
        copies = [p for p in tmp_path.iterdir() if p.name.startswith("salvaged.db")]
        assert copies
        assert {stat.S_IMODE(p.stat().st_mode) for p in copies} == {0o600}, copies
    finally:
        os.umask(old)

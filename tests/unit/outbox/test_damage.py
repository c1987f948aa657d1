"""A damaged outbox: random bytes where the file should be, and a write-ahead log cut
short by a crash or a full disk.

Random bytes are an OutboxCorrupt that names the file and what to do, and the file is left
as it was. A truncated WAL loses only the transaction whose frames were cut: every row of
every transaction committed before the cut is read back (no intact accepted row lost).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgsafe.errors import OutboxCorrupt
from msgsafe.outbox import SqliteOutbox

ROOT = Path(__file__).resolve().parents[3]
_MAGIC = b"SQLite format 3\x00"


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    data=st.one_of(
        st.binary(min_size=1, max_size=9000),
        st.binary(min_size=0, max_size=9000).map(lambda tail: _MAGIC + tail),
    )
)
def test_random_bytes_are_an_outbox_corrupt_naming_the_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "random.db"
    path.write_bytes(data)
    before = hashlib.sha256(data).hexdigest()
    with pytest.raises(OutboxCorrupt) as caught:
        SqliteOutbox(path).close()
    said = str(caught.value)
    assert str(path) in said and "msgsafe outbox salvage" in said, said
    assert "left untouched" in said
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    for sibling in (Path(f"{path}-wal"), Path(f"{path}-shm")):
        sibling.unlink(missing_ok=True)


#: Puts BATCHES transactions of ROWS rows and dies without a checkpoint, printing the
#: WAL's size after each commit: the rows live only in the WAL.
_PUTS_AND_DIES = textwrap.dedent(
    """
    import os, sys
    from msgsafe.message import Envelope
    from msgsafe.outbox import SqliteOutbox
    store = SqliteOutbox(sys.argv[1])
    for batch in range(int(sys.argv[2])):
        envelopes = [Envelope.build("q", os.urandom(300), key=f"b{batch}") for _ in range(20)]
        store.put(envelopes)
        size = os.path.getsize(sys.argv[1] + "-wal")
        print(size, " ".join(e.message_id for e in envelopes), flush=True)
    os._exit(0)
    """
)


@pytest.mark.parametrize("cut", ["mid-frame", "frame-boundary", "header only"])
def test_a_truncated_wal_keeps_every_intact_commit(tmp_path: Path, cut: str) -> None:
    path = tmp_path / "crashed.db"
    proc = subprocess.run(
        [sys.executable, "-c", _PUTS_AND_DIES, str(path), "6"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    commits = [
        (int(size), ids.split())
        for size, ids in (line.split(" ", 1) for line in proc.stdout.splitlines())
    ]
    wal = Path(f"{path}-wal")
    assert wal.stat().st_size == commits[-1][0]
    # Cut inside the fourth commit: the first three are intact, the rest are not.
    start, end = commits[2][0], commits[3][0]
    at = {"mid-frame": (start + end) // 2, "frame-boundary": start + 24 + 4096, "header only": 32}[
        cut
    ]
    with wal.open("r+b") as fh:
        fh.truncate(at)
    intact = [i for size, ids in commits if size <= at for i in ids]

    store = SqliteOutbox(path)
    try:
        stored = {e.message_id for e in store.claim(limit=1000, lease_s=60)}
    finally:
        store.close()
    assert set(intact) <= stored, f"lost {len(set(intact) - stored)} intact rows"
    every = {i for _, ids in commits for i in ids}
    assert stored <= every
    # A cut commit is all or nothing.
    for _, ids in commits:
        assert set(ids) <= stored or not set(ids) & stored

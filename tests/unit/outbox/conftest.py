"""The outbox's tests share one pair of fixtures: a fake clock, and a SQLite outbox that
reads time from it (closed after the test). A module that needs another store overrides
``store`` (``test_sqlite.py``: one with a target; ``test_lease_renewal.py``: this one,
wrapped)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe.outbox import SqliteOutbox
from tests.support.clock import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[SqliteOutbox]:
    s = SqliteOutbox(tmp_path / "outbox.db", clock=clock)
    yield s
    s.close()

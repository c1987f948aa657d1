"""Finding outbox files and what they hold, and adopting the ones a producer should
forward.

:func:`find_outboxes` lists the outbox files of a directory (by default the one the
default outboxes live in) with their destination and counts, without holding any of
them longer than a glance: this is what ``msgsafe outbox status`` shows with no path.

:func:`adopt_strays` is what opening a producer's default outbox does: every other
outbox file of the directory whose waiting messages are for the same
:class:`~msgsafe.outbox.destination.Destination` — written under an earlier file naming
(a hash of the whole URL), under another process's slot, or by a process that died — is
emptied into the producer's own file, which forwards them; one WARNING line names the
files. A file held by a live process is left to it (that process forwards its messages).
Files for a destination that only shares hosts with this one (a node added to the list)
are not adopted, but named in a WARNING with the command that forwards them.

The destination of a file is read from its rows (each stores its target URL without
credentials), so files named under any earlier rule are found.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import platformdirs

from msgsafe.errors import MsgsafeError, OutboxError
from msgsafe.outbox._schema import APPLICATION_ID, check_header, translate_sqlite_error
from msgsafe.outbox.destination import Destination, destination_of_target
from msgsafe.outbox.sqlite import SqliteOutbox, held_here

__all__ = ["OutboxFile", "adopt_strays", "default_dir", "find_outboxes", "peek"]

log = logging.getLogger("msgsafe.outbox")

#: The schema version from which a waiting row may be a block (msgsafe.outbox._schema).
_BLOCKS_SINCE = 2

#: ``ok``: read; ``in use``: held by a live process (or this one); ``damaged``: not
#: readable as an outbox (see ``error``); ``foreign``: some other SQLite file.
State = Literal["ok", "in use", "damaged", "foreign"]


@dataclass(frozen=True, slots=True)
class OutboxFile:
    """One outbox file as :func:`peek` saw it. Counts are None unless ``state`` is ok."""

    path: Path
    state: State
    target: str | None = None  #: the newest row's target URL, without credentials
    destination: Destination | None = None
    waiting: int | None = None
    quarantined: int | None = None
    error: str | None = None


def default_dir() -> Path:
    """Where default outboxes live: ``platformdirs.user_data_dir("msgsafe")/outbox``."""
    return Path(platformdirs.user_data_dir("msgsafe")) / "outbox"


def find_outboxes(directory: Path | None = None, *, count: bool = True) -> list[OutboxFile]:
    """Every ``*.sqlite3`` file of ``directory`` (default: :func:`default_dir`), peeked
    (see :func:`peek` for ``count``), sorted by path. A missing directory holds none."""
    folder = default_dir() if directory is None else directory
    try:
        paths = sorted(p for p in folder.glob("*.sqlite3") if p.is_file())
    except OSError:
        return []
    return [peek(path, count=count) for path in paths]


def peek(path: Path, *, count: bool = True) -> OutboxFile:
    """What ``path`` holds, read in a few milliseconds under the file's lock; a file
    held by a process (this one included) is reported ``in use`` and not opened.

    ``count=False`` only asks whether messages wait (``waiting`` and ``quarantined``
    are then 0 or 1): no table is scanned, however large."""
    if held_here(path):
        return OutboxFile(path, "in use")
    try:
        check_header(path)
    except OutboxError as exc:
        return OutboxFile(path, "damaged", error=str(exc))
    try:
        with _locked(path) as free:
            if not free:
                return OutboxFile(path, "in use")
            return _read(path, count)
    except OSError as exc:
        return OutboxFile(path, "damaged", error=f"cannot read {path}: {exc}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[bool]:
    """Hold the file's advisory lock (the one every store takes) if it is free."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _read(path: Path, count: bool = True) -> OutboxFile:
    # NOTE: a read-write connection, although only reading: a read-only one leaves
    # empty -wal and -shm files behind, which it may not delete.
    try:
        conn = sqlite3.connect(path, timeout=0.5, isolation_level=None)
    except sqlite3.Error as exc:
        return OutboxFile(path, "damaged", error=str(translate_sqlite_error(exc, str(path))))
    try:
        if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            return OutboxFile(path, "foreign", error="not an msgsafe outbox")
        how = "SELECT count(*) FROM {}" if count else "SELECT EXISTS (SELECT 1 FROM {})"
        blocks = conn.execute("PRAGMA user_version").fetchone()[0] >= _BLOCKS_SINCE
        if count and blocks:
            # A block row stands for its members (msgsafe.outbox._blocks).
            waiting = conn.execute("SELECT coalesce(sum(count), 0) FROM outbox").fetchone()[0]
        else:
            waiting = conn.execute(how.format("outbox")).fetchone()[0]
        quarantined = conn.execute(how.format("quarantine")).fetchone()[0]
        row = conn.execute("SELECT target FROM outbox ORDER BY seq DESC LIMIT 1").fetchone()
        if row is None:
            row = conn.execute("SELECT target FROM quarantine ORDER BY seq DESC LIMIT 1").fetchone()
    except sqlite3.Error as exc:
        return OutboxFile(path, "damaged", error=str(translate_sqlite_error(exc, str(path))))
    finally:
        conn.close()
    target = None if row is None else str(row[0])
    destination = None if target is None else destination_of_target(target)
    return OutboxFile(path, "ok", target, destination, waiting, quarantined)


def adopt_strays(store: SqliteOutbox, destination: Destination, directory: Path) -> int:
    """Empty into ``store`` every other outbox file of ``directory`` with waiting
    messages for ``destination``, delete the emptied files, and say so in one WARNING;
    returns how many waiting messages were adopted. Never raises for a file it could not
    adopt (a WARNING names it): the producer opens all the same."""
    adopted: list[str] = []
    moved = 0
    nearby: list[OutboxFile] = []
    for found in find_outboxes(directory, count=False):
        if found.path == store.path or found.state != "ok" or not found.waiting:
            continue
        if found.destination is not None and destination.overlaps(found.destination):
            counted = peek(found.path)
            if counted.state == "ok" and counted.waiting:
                nearby.append(counted)
        if found.destination != destination:
            continue
        try:
            moved += _absorb(store, found.path)
        except MsgsafeError as exc:
            log.warning(
                "the outbox file %s holds waiting messages for %s but could not be adopted: %s",
                found.path,
                destination,
                exc,
            )
            continue
        adopted.append(str(found.path))
    if adopted:
        log.warning(
            "adopted %d waiting message(s) for %s from %d other outbox file(s) (%s); "
            "they are forwarded from %s",
            moved,
            destination,
            len(adopted),
            ", ".join(adopted),
            store.path,
        )
    for other in nearby:
        log.warning(
            "the outbox file %s holds %d waiting message(s) for %s, which shares hosts with "
            "%s but is not the same destination; forward them with `msgsafe outbox drain %s`",
            other.path,
            other.waiting,
            other.destination,
            destination,
            other.path,
        )
    return moved


def _absorb(store: SqliteOutbox, path: Path) -> int:
    other = SqliteOutbox(path)
    try:
        waiting, _ = store.absorb(other)
        empty = other.pending() == 0 and other.stats().quarantined == 0
    finally:
        other.close()
    if empty:
        _remove_if_empty(path)
    return waiting


def _remove_if_empty(path: Path) -> None:
    # NOTE: deleted only once SQLite closed it (a connection still open deletes its -wal
    # by name on close, which could be a newer opener's) and under the file's lock taken
    # again: whoever opened it in between holds the lock (then it stays) or has closed
    # it, maybe with new rows, hence the second look.
    with contextlib.suppress(OSError), _locked(path) as free:
        if not free:
            return
        again = _read(path)
        if again.state != "ok" or again.waiting or again.quarantined:
            return
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            with contextlib.suppress(FileNotFoundError):
                name.unlink()

"""Ports handed to local nodes, remembered across processes until their nodes bind them.

A node's port is drawn while free and bound only when the node starts (seconds later,
after a ``join_cluster`` or a JVM's boot), and is unbound again while the node is down
for a restart. Two processes drawing ports on one machine (two ``msgsafe cluster up``,
two test lanes, a nemesis run beside a service) could each see the same port free and
hand it to two nodes: the second node to start fails with EADDRINUSE. A suite run lost
a RabbitMQ cluster that way (a node's AMQP listener, port 61675, outside the kernel's
ephemeral range, taken while the node was between ``stop_app`` and ``start_app``).

The ledger is a directory of one file per drawn port, ``<tmp>/msgsafe-ports-<uid>/<port>``,
holding the drawing process's pid. A port is held while that process lives, and for
:data:`HOLD_S` after it ended (``msgsafe cluster up`` returns at once and leaves its
nodes running: they bind their ports long before then). Drawing takes an exclusive
``flock`` on the directory's lock file, so no two processes read the ledger at once.

The ledger only narrows what :func:`msgsafe.cluster._process.free_ports` draws: when it
cannot be used (a read-only temporary directory, another user's directory), drawing goes
on without it, as it did before.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("msgsafe.cluster")

#: Seconds a port stays held after the process that drew it ended.
HOLD_S = 600.0
#: Entries beyond which a draw first removes the ones no longer held...
_SWEEP_AT = 512
#: ...at most once in this many seconds (a sweep reads every entry; a test run's
#: workers draw a thousand ports, all held for HOLD_S).
_SWEEP_EVERY_S = 60.0


def ledger_dir() -> Path:
    """The ledger's directory for this user (the system's temporary directory)."""
    return Path(tempfile.gettempdir()) / f"msgsafe-ports-{os.getuid()}"


class PortLedger:
    """The ports drawn by every process of this user, open under an exclusive lock.

    Use as ``with PortLedger.open() as ledger:``; ``ledger`` is None when the directory
    cannot be used (drawing then goes on without it).
    """

    def __init__(self, where: Path) -> None:
        self._dir = where

    @classmethod
    @contextlib.contextmanager
    def open(cls, where: Path | None = None) -> Iterator[PortLedger | None]:
        folder = ledger_dir() if where is None else where
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            if folder.stat().st_uid != os.getuid():
                raise PermissionError(f"{folder} belongs to another user")
            lock = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            log.debug("drawing ports without the ledger: %s", exc)
            yield None
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            ledger = cls(folder)
            ledger._sweep()
            yield ledger
        finally:
            os.close(lock)  # closing releases the flock

    def held(self, port: int) -> bool:
        """True when a process (this one included) drew ``port`` and still holds it."""
        entry = self._dir / str(port)
        try:
            text = entry.read_text()
            age = time.time() - entry.stat().st_mtime
        except OSError:
            return False
        return _holds(text, age)

    def record(self, ports: list[int]) -> None:
        """Hold ``ports`` for this process."""
        mine = f"{os.getpid()}\n"
        for port in ports:
            try:
                (self._dir / str(port)).write_text(mine)
            except OSError as exc:  # a full disk: the ports are still free now
                log.debug("port %d not recorded in the ledger: %s", port, exc)

    def _sweep(self) -> None:
        marker = self._dir / ".swept"
        now = time.time()
        try:
            if now - marker.stat().st_mtime < _SWEEP_EVERY_S:
                return
        except FileNotFoundError:
            pass
        except OSError:
            return
        try:
            entries = [e for e in os.scandir(self._dir) if e.name.isdigit()]
        except OSError:
            return
        if len(entries) < _SWEEP_AT:
            return
        with contextlib.suppress(OSError):
            marker.touch()
        for entry in entries:
            with contextlib.suppress(OSError):
                text = Path(entry.path).read_text()
                if not _holds(text, now - entry.stat().st_mtime):
                    os.unlink(entry.path)


def _holds(text: str, age: float) -> bool:
    if age < HOLD_S:
        return True
    try:
        pid = int(text.split()[0])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True

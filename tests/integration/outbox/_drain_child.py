"""Child process of the kill-while-draining test: drains an outbox into a "broker" that
is an append-only file (a confirm resolves once the id is written; written data survives
the process's kill -9), until it is killed.

Run as ``python -m tests.integration.outbox._drain_child OUTBOX_PATH LOG_PATH``.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import Future

from msgsafe.message import Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox
from msgsafe.ports import TransportCapabilities


class FileBroker:
    """A transport whose "broker" is the file at ``path``: one id per line."""

    capabilities = TransportCapabilities()

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    @property
    def target(self) -> str:
        return "file://"

    def publish(self, envelope: Envelope) -> Future[None]:
        os.write(self._fd, f"{envelope.message_id}\n".encode())
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def close(self, timeout: float | None = None) -> None:
        os.close(self._fd)


def main(path: str, log: str) -> None:
    store = SqliteOutbox(path)
    forwarder = Forwarder(store, FileBroker(log), batch=100)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    forwarder.drain(None)
    sys.stdout.write("empty\n")
    sys.stdout.flush()
    sys.stdin.read()  # wait to be killed


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

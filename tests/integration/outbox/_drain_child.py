"""Child process of the kill-while-draining test: drains an outbox into a "broker" that
is an append-only file (a confirm resolves once the id is written; written data survives
the process's kill -9), until it is killed.

Run as ``python -m tests.integration.outbox._drain_child OUTBOX_PATH LOG_PATH [FLAKY]``;
with ``FLAKY`` = N > 0 every N-th publish is refused (not written): what is stored as
blocks is then split while it drains.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import Future

from msgsafe.errors import Refused
from msgsafe.message import Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox
from msgsafe.ports import TransportCapabilities
from msgsafe.retry import RetryPolicy


class FileBroker:
    """A transport whose "broker" is the file at ``path``: one id per line."""

    capabilities = TransportCapabilities()

    def __init__(self, path: str, flaky: int = 0) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._flaky = flaky
        self._published = 0

    @property
    def target(self) -> str:
        return "file://"

    def publish(self, envelope: Envelope) -> Future[None]:
        future: Future[None] = Future()
        self._published += 1
        if self._flaky and self._published % self._flaky == 0:
            future.set_exception(Refused("refused"))
            return future
        os.write(self._fd, f"{envelope.message_id}\n".encode())
        future.set_result(None)
        return future

    def close(self, timeout: float | None = None) -> None:
        os.close(self._fd)


def main(path: str, log: str, flaky: int) -> None:
    store = SqliteOutbox(path)
    # A refused message is retried at once: the kills then land among many splits.
    policy = RetryPolicy(initial=0.001, maximum=0.005) if flaky else None
    forwarder = Forwarder(store, FileBroker(log, flaky), batch=100, policy=policy)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    forwarder.drain(None)
    sys.stdout.write("empty\n")
    sys.stdout.flush()
    sys.stdin.read()  # wait to be killed


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)

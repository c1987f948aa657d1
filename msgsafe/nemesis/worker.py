"""The processes of a nemesis run, as a service would run them: ``python -m
msgsafe.nemesis.worker SPEC`` where SPEC is a JSON object (see :class:`Spec`).

- ``produce``: a :class:`msgsafe.Producer` with its own SQLite outbox sends keyed
  messages at a steady rate, one blocking ``send()`` at a time, and records each
  attempt, receipt and failure, and the ids its outbox's forwarder delivered; every half
  second it records its outbox's depth. A
  producer killed and started again takes up its keys where its history left them
  (the next sequence number of each key) and its outbox where the dead one left it.
  SIGTERM: stop sending, drain the outbox, record the last depth, exit. With a shared
  PostgreSQL outbox (``forward`` false) it neither forwards nor drains: the run's
  ``msgsafe outbox forward`` processes do, and the runner records the table's depth.
- ``consume``: a :class:`msgsafe.Consumer` (no dedup: duplicates are counted) records
  every delivery it receives and acks it; on an error it opens a new consumer.
  SIGTERM: close and exit.

Both write only their history file (:mod:`msgsafe.nemesis.history`); logging goes to
stderr, which the runner keeps in the run's directory.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgsafe
from msgsafe.endpoints import parse_url
from msgsafe.errors import MsgsafeError
from msgsafe.nemesis.history import History, read
from msgsafe.outbox._pg_url import is_store_url
from msgsafe.outbox.sqlite import SqliteOutbox
from msgsafe.retry import RetryPolicy

__all__ = ["Spec", "main", "next_seqs"]

log = logging.getLogger("msgsafe.nemesis")

#: Forwarder backoff: a 2 s cap shows the transports' recovery, not the default 30 s
#: backoff's (the chaos matrix uses the same).
RETRY = RetryPolicy(initial=0.2, maximum=2.0)


@dataclass(frozen=True, slots=True)
class Spec:
    """What one worker does. ``role``: ``produce`` or ``consume``; ``name``: its slot
    (``p0``, ``c``); ``history``: its file; ``options``: the client's URL options."""

    role: str
    name: str
    url: str
    destination: str
    history: str
    options: dict[str, Any] = field(default_factory=dict)
    outbox: str = ""
    keys: int = 8
    rate: float = 40.0
    send_timeout: float = 5.0
    drain_timeout: float = 120.0
    group: str = ""
    #: Earlier history files of this slot (a restarted producer's predecessors).
    before: Sequence[str] = ()
    #: False: a shared outbox that other processes forward (``Producer(forward=False)``);
    #: the producer then records no depth and does not drain at SIGTERM.
    forward: bool = True
    #: The producer's ``require=``: ``any`` for an outbox on the run's size-limited
    #: tmpfs (memory on purpose, for a real full disk).
    require: str = "durable"


def next_seqs(paths: Sequence[str | Path]) -> dict[str, int]:
    """Per key, the sequence number after the highest one attempted in ``paths``."""
    seqs: dict[str, int] = {}
    for path in paths:
        try:
            with Path(path).open(encoding="utf-8") as f:
                events = read(f)
        except FileNotFoundError:
            continue
        for e in events:
            if e["e"] == "attempted":
                seqs[e["key"]] = max(seqs.get(e["key"], 0), int(e["seq"]) + 1)
    return seqs


def _stopper() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


class _RecordingOutbox(SqliteOutbox):
    """The producer's SQLite outbox, recording in the history every id its forwarder
    removed on the broker's accept (``forwarded``): a lost message among them was lost by
    the broker, one not among them by the client."""

    def __init__(self, path: str, history: History, target: str) -> None:
        super().__init__(path, target=target)
        self._history = history

    @property
    def closed(self) -> bool:
        """Closed (a producer that failed to open closes the store it was given)."""
        return self._closed

    def delivered(self, ids: Sequence[str]) -> None:
        super().delivered(ids)
        self._history.write("forwarded", ids=list(ids))


def _outbox(spec: Spec, history: History) -> str | SqliteOutbox:
    if spec.outbox and not is_store_url(spec.outbox):
        return _RecordingOutbox(spec.outbox, history, parse_url(spec.url).redacted())
    return spec.outbox


def _open_producer(spec: Spec, history: History, stop: threading.Event) -> msgsafe.Producer:
    """A producer; while the broker refuses even that (a fault at start), try again."""
    outbox: str | SqliteOutbox | None = None
    while True:
        try:
            # Opened here, inside the retry: a full disk may refuse the file too.
            if outbox is None or (isinstance(outbox, _RecordingOutbox) and outbox.closed):
                outbox = _outbox(spec, history)
            return msgsafe.Producer(
                spec.url,
                outbox=outbox,
                send_timeout=spec.send_timeout,
                retry=RETRY,
                require=spec.require,
                forward=spec.forward,
                **spec.options,
            )
        except MsgsafeError as exc:
            history.write("note", text=f"producer not opened: {type(exc).__name__}: {exc}")
            if stop.wait(1.0):
                raise


def produce(spec: Spec) -> int:
    stop = _stopper()
    seqs = next_seqs(spec.before)
    with History(spec.history, spec.name) as history:
        producer = _open_producer(spec, history, stop)
        depth_stop = threading.Event()

        def sample() -> None:
            while not depth_stop.wait(0.5):
                history.write("depth", outbox=spec.name, n=producer.pending())

        sampler = threading.Thread(target=sample, name="nemesis-depth", daemon=True)
        if spec.forward:
            sampler.start()
        interval = 1.0 / spec.rate
        i = 0
        while not stop.is_set():
            key = f"{spec.name}-k{i % spec.keys}"
            i += 1
            seq = seqs.get(key, 0)
            seqs[key] = seq + 1
            mid = msgsafe.new_message_id()
            history.write("attempted", id=mid, key=key, seq=seq)
            started = time.monotonic()
            try:
                receipt = producer.send(
                    spec.destination, f"{key}:{seq}".encode(), key=key, message_id=mid
                )
            except MsgsafeError as exc:
                # maybe: the error says the broker may hold the message all the same.
                maybe = bool(getattr(exc, "maybe_delivered", False))
                history.write("failed", id=mid, error=type(exc).__name__, maybe=maybe)
            else:
                history.write(
                    "receipted",
                    id=mid,
                    status=receipt.status.value,
                    latency=round(time.monotonic() - started, 4),
                )
            # Pacing (a traffic rate), not synchronisation.
            stop.wait(interval)
        depth_stop.set()
        if not spec.forward:
            producer.close()
            return 0
        sampler.join()
        deadline = time.monotonic() + spec.drain_timeout
        left = producer.pending()
        while left and time.monotonic() < deadline:
            left = producer.drain(1.0)
            history.write("depth", outbox=spec.name, n=left)
        history.write("depth", outbox=spec.name, n=left)
        producer.close()
    return 0 if left == 0 else 1


def consume(spec: Spec) -> int:
    stop = _stopper()
    with History(spec.history, spec.name) as history:
        while not stop.is_set():
            try:
                with msgsafe.Consumer(spec.url, group=spec.group or None, **spec.options) as c:
                    c.subscribe(spec.destination)
                    while not stop.is_set():
                        for delivery in c.poll(0.5, max_messages=500):
                            history.write("received", id=delivery.message_id)
                            delivery.ack()
            except MsgsafeError as exc:
                history.write("note", text=f"consumer error: {type(exc).__name__}: {exc}")
                stop.wait(1.0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the worker the JSON spec (the only argument) describes."""
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    spec = Spec(**json.loads(args[0]))
    return produce(spec) if spec.role == "produce" else consume(spec)


if __name__ == "__main__":
    sys.exit(main())

"""The history of a nemesis run: one JSON-lines file per process, read back as one list.

Every process of a run (each producer incarnation, the consumer, the runner) appends
events to its own file in the run's directory, one JSON object per line, flushed after
each line: a process killed with SIGKILL loses at most the line it was writing (the OS
keeps what was flushed), and :func:`read` skips a torn last line.

Events (``e``), each with ``t`` (wall-clock seconds) and ``p`` (the process):

- ``attempted`` ``id`` ``key`` ``seq``: ``send()`` is about to be called;
- ``receipted`` ``id`` ``status`` (``confirmed``/``stored``) ``latency`` (seconds);
- ``failed`` ``id`` ``error``: ``send()`` raised (the caller kept the message);
- ``received`` ``id``: a delivery of ``id`` reached the consumer (repeats are duplicates);
- ``depth`` ``n``: the producer's outbox held ``n`` messages;
- ``forwarded`` ``ids``: the producer's forwarder removed these from its outbox, the
  broker having accepted them (a lost id among them: the broker lost what it accepted);
- ``fault`` ``name`` ``on`` (true at its start, false at its end), ``heal``, ``note``:
  what the runner did.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

__all__ = ["History", "read", "read_dir"]


class History:
    """An append-only JSON-lines writer for one process (the runner and workers each own
    theirs); threads of that process may share it, each line is written whole."""

    def __init__(self, path: str | Path, process: str) -> None:
        self.path = Path(path)
        self.process = process
        self._file: IO[str] = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        """Append one event, stamped with the time and this process, and flush it."""
        with self._lock:
            record = {"t": round(time.time(), 6), "p": self.process, "e": event, **fields}
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The events of ``lines``; a line that is not a JSON object (a torn write of a killed
    process) is skipped."""
    events: list[dict[str, Any]] = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "e" in event and "t" in event:
            events.append(event)
    return events


def read_dir(dir: str | Path) -> list[dict[str, Any]]:
    """Every event of every ``*.jsonl`` file in ``dir``, in time order."""
    events: list[dict[str, Any]] = []
    for path in sorted(Path(dir).glob("*.jsonl")):
        with path.open(encoding="utf-8") as f:
            events.extend(read(f))
    events.sort(key=lambda e: float(e["t"]))
    return events

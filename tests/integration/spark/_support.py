"""Bookkeeping for the Spark sink's integration tests: rows expected, copies received."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from msgsafe import Consumer

#: The repository's root: the driver processes run their module from there.
ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Received:
    """Every copy the consumer got: how often each id arrived and the body it carried."""

    copies: collections.Counter[str] = field(default_factory=collections.Counter)
    bodies: dict[str, bytes] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)  # one id, two different bodies

    def add(self, message_id: str | None, body: bytes) -> None:
        if message_id is None:
            self.conflicts.append(f"no id on {body!r}")
            return
        self.copies[message_id] += 1
        seen = self.bodies.setdefault(message_id, body)
        if seen != body:
            self.conflicts.append(message_id)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.copies.values() if n > 1)

    def deduplicated_bodies(self) -> collections.Counter[bytes]:
        """The rows the application sees after dropping repeats by id."""
        return collections.Counter(self.bodies.values())


@dataclass(frozen=True)
class Tally:
    """The reliability numbers of one run."""

    expected: int
    received: int
    unique: int
    lost: int
    duplicates: int
    unknown: int
    wrong_rows: int

    def __str__(self) -> str:
        return (
            f"expected={self.expected} received={self.received} unique={self.unique} "
            f"lost={self.lost} duplicates={self.duplicates} unknown={self.unknown} "
            f"wrong_rows={self.wrong_rows}"
        )


def tally(
    expected: collections.Counter[bytes], got: Received, known_ids: set[str] | None = None
) -> Tally:
    """Compare the expected rows with what arrived. ``lost``: expected rows never
    received; ``unknown``: ids outside ``known_ids`` (when given); ``wrong_rows``: rows
    that differ after dedup by id (collapsed, extra, or one id with two bodies)."""
    deduped = got.deduplicated_bodies()
    wrong = sum(((deduped - expected) + (expected - deduped)).values())
    return Tally(
        expected=sum(expected.values()),
        received=sum(got.copies.values()),
        unique=len(got.copies),
        lost=sum((expected - collections.Counter(set(deduped))).values()),
        duplicates=got.duplicates,
        unknown=0 if known_ids is None else len(set(got.copies) - known_ids),
        wrong_rows=wrong + len(got.conflicts),
    )


def consume(
    url: str,
    destination: str,
    expected: set[bytes],
    *,
    deadline_s: float,
    group: str | None = None,
    quiet_s: float = 1.0,
    **options: object,
) -> Received:
    """Read ``destination`` until every expected body arrived and nothing more came for
    ``quiet_s`` (to count late duplicates), or the deadline; acknowledges everything."""
    got = Received()
    missing = set(expected)
    with Consumer(url, group=group, **options) as consumer:
        consumer.subscribe(destination)
        deadline = time.monotonic() + deadline_s
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            batch = consumer.poll(max_messages=1000, timeout=0.25)
            for delivery in batch:
                got.add(delivery.message_id, delivery.body)
                missing.discard(delivery.body)
                delivery.ack()
            if missing:
                continue
            if batch or quiet_until is None:
                quiet_until = time.monotonic() + quiet_s
            elif time.monotonic() >= quiet_until:
                break
    return got


def wait_for_file(path: Path, timeout: float) -> bool:
    """Poll until ``path`` exists (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.02)
    return path.exists()


def gated_rows(markers: str, partition: int, rows_per_partition: int) -> Iterator[tuple[str, str]]:
    """Rows of one partition of the kill test, run inside a Spark task.

    The first attempt writes ``half-P`` halfway and waits until the test wrote ``killed``,
    so the second half is published while the broker is down and the task fails. A
    later attempt (Spark's retry) writes ``retry-P-A`` and waits for ``healed``. The rows
    are the same on every attempt, so the retry regenerates the same ids.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    base = Path(markers)
    if attempt > 0:
        (base / f"retry-{partition}-{attempt}").touch()
        if not wait_for_file(base / "healed", 120):
            raise RuntimeError("the test never restarted the broker")
    for i in range(rows_per_partition):
        if attempt == 0 and i == rows_per_partition // 2:
            (base / f"half-{partition}").touch()
            if not wait_for_file(base / "killed", 120):
                raise RuntimeError("the test never killed the broker")
        yield f"row-{partition}-{i}", f"k{i % 8}"


def marked_rows(markers: str, partition: int, rows: int) -> Iterator[tuple[str, str, int]]:
    """Rows ``(value, key, id)`` of one partition, run inside a Spark task: writes
    ``started-P-A`` (partition, attempt) before its first row, then waits for ``go``,
    so that a test acts while every task runs and before any row was produced."""
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    (Path(markers) / f"started-{partition}-{attempt}").touch()
    if not wait_for_file(Path(markers) / "go", 120):
        raise RuntimeError("the test never let the rows go")
    for i in range(partition * rows, (partition + 1) * rows):
        yield str(i), f"k{i % 7}", i


def retries_seen(markers: Path) -> list[str]:
    return sorted(p.name for p in markers.iterdir() if p.name.startswith("retry-"))


def start_driver(module: str, log: Path, args: list[str]) -> subprocess.Popen[bytes]:
    """Run ``python -m module args`` as a Spark driver, output appended to ``log``, in
    its own session: a SIGKILL of its process group takes its JVM with it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

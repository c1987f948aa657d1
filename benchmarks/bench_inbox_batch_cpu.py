"""Where ``run(..., batch=...)`` spends CPU beside the hand-written batch loop, on
``memory://`` (no broker I/O) with a SQLite inbox file:

    python3 benchmarks/bench_inbox_batch_cpu.py [--messages 20000] [--rounds 2] [--profile]

Both sides read ``--messages`` messages (100-byte bodies, 16 keys) and commit each poll's
(up to 500) in one transaction: the loop with bare sqlite3 (the ids in one ``INSERT ...
RETURNING``, each new one's effect, ``COMMIT``, then ``ack()`` each), msgsafe with
``Consumer(attempts=AttemptMemory()).run(handler, inbox=..., batch=BatchPolicy(500))``.
Printed: msg/s and CPU µs a message by thread (``time.thread_time()``: the caller's, and
run()'s worker's); ``--profile``: cProfile of run()'s worker on its thread's CPU clock.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgsafe
from msgsafe.dedup import AttemptMemory
from msgsafe.testing import MemoryBroker

URL = "memory://cpu"
BATCH = 500
EFFECT = "INSERT INTO effects (message_id, body) VALUES (?, ?)"
RECORD = (
    "INSERT INTO handled (message_id, source, attempt, handled_at) SELECT j.value ->> 0,"
    " j.value ->> 1, j.value ->> 2, ? FROM json_each(?) AS j WHERE true"
    " ON CONFLICT (message_id) DO NOTHING RETURNING message_id"
)


class Threads:
    """Each thread's CPU time (and, with ``profile``, a cProfile of it) once it ends."""

    def __init__(self, profile: bool) -> None:
        self.cpu: dict[str, float] = {}
        self.profiles: list[cProfile.Profile] = []
        self._profile = profile
        original = threading.Thread.run
        threads = self

        def run(thread: threading.Thread) -> None:
            profiler = cProfile.Profile(time.thread_time) if threads._profile else None
            if profiler is not None:
                threads.profiles.append(profiler)
                profiler.enable()
            try:
                original(thread)
            finally:
                if profiler is not None:
                    profiler.disable()
                threads.cpu[thread.name] = time.thread_time()

        threading.Thread.run = run  # type: ignore[method-assign,assignment]


def fill(queue: str, count: int) -> None:
    with msgsafe.Producer(URL, outbox=False) as producer:
        for i in range(count):
            producer.send(queue, b"x" * 100, key=f"key-{i % 16}")


def database() -> tuple[str, sqlite3.Connection]:
    path = os.path.join(tempfile.mkdtemp(), "inbox.db")
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE effects (message_id text NOT NULL, body blob)")
    return path, conn


def by_hand(queue: str, count: int) -> tuple[float, dict[str, float]]:
    _path, conn = database()
    conn.execute(
        "CREATE TABLE handled (message_id text PRIMARY KEY, source text NOT NULL,"
        " attempt integer NOT NULL, handled_at real NOT NULL)"
    )
    execute = conn.execute
    with msgsafe.Consumer(URL) as consumer:
        consumer.subscribe(queue)
        seen, started, cpu = 0, time.perf_counter(), time.thread_time()
        while seen < count:
            batch = consumer.poll(1.0, max_messages=BATCH)
            if not batch:
                continue
            execute("BEGIN IMMEDIATE")
            rows = json.dumps([[d.message_id, queue, d.attempt] for d in batch])
            fresh = {r[0] for r in execute(RECORD, (time.time(), rows)).fetchall()}
            for delivery in batch:
                if delivery.message_id in fresh:
                    execute(EFFECT, (delivery.message_id, delivery.body))
            execute("COMMIT")
            for delivery in batch:
                delivery.ack()
            seen += len(batch)
        return time.perf_counter() - started, {"caller": time.thread_time() - cpu}


def with_msgsafe(queue: str, count: int, threads: Threads) -> tuple[float, dict[str, float]]:
    path, conn = database()
    conn.close()
    consumer = msgsafe.Consumer(URL, attempts=AttemptMemory()).subscribe(queue)
    seen, ended = 0, []

    def handler(deliveries: list[Any], tx: Any) -> None:
        nonlocal seen
        for delivery in deliveries:
            tx.execute(EFFECT, (delivery.message_id, delivery.body))
        seen += len(deliveries)
        if seen == count:  # the clock stops once this batch is committed and acked
            threading.Thread(target=finish, daemon=True, name="finish").start()

    def finish() -> None:
        while consumer.stats().acked < count:
            time.sleep(0.001)
        ended.append(time.perf_counter() - started)
        consumer.stop()

    threads.cpu.clear()
    started, cpu = time.perf_counter(), time.thread_time()
    policy = msgsafe.BatchPolicy(max_messages=BATCH)
    consumer.run(handler, inbox=f"sqlite:///{path}", batch=policy, handle_signals=False)
    split = {"caller (polling)": time.thread_time() - cpu}
    split.update({k: v for k, v in threads.cpu.items() if k.startswith("msgsafe-run")})
    return ended[0], split


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="profile run()'s worker")
    args = parser.parse_args()
    MemoryBroker.install(MemoryBroker("cpu"))
    threads = Threads(args.profile)
    count = args.messages
    for n in range(args.rounds):
        for name in ("by hand", "msgsafe"):
            queue = f"q{n}-{name[0]}"
            fill(queue, count)
            wall, split = (
                by_hand(queue, count) if name == "by hand" else with_msgsafe(queue, count, threads)
            )
            parts = ", ".join(f"{k} {v / count * 1e6:.1f}" for k, v in split.items())
            total = sum(split.values()) / count * 1e6
            print(f"{name}: {count / wall:,.0f} msg/s; CPU µs/msg {total:.1f} = {parts}")
    if args.profile and threads.profiles:
        stats = pstats.Stats(threads.profiles[0])
        for profiler in threads.profiles[1:]:
            stats.add(profiler)
        stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()

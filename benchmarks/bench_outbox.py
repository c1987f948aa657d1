"""Outbox benchmarks, all figures from one run.

1. Durable buffering while the broker refuses: 100-byte messages sent with the blocking
   ``Producer.send`` from 8 threads (each one returns ``Status.STORED``); with
   ``Producer.send_batch`` of 1000 from 8 threads, paired with bare SQLite inserting the
   same rows in the same batches (same schema and sync settings, no msgsafe code); the
   store alone (4 threads, one message per put, group commit merging them), and the
   CPU per row of one put of 1000 prebuilt envelopes (caller and writer thread).
2. Per-message fsync: one thread, one message per put, each its own commit; compared
   with the disk's fdatasync rate for 4 KiB writes in place (its best case) and with
   bare SQLite committing the same rows one at a time (the same schema and settings, no
   msgsafe code), measured in alternating quarter-second slices so all see the same disk.
3. Drain rate to the memory broker with a 10k and a 1M backlog, and peak RSS for each
   (each size in its own process so peaks do not mix). The two are interleaved: the 1M
   backlog is filled and drained in chunks of 50k, and after every chunk the 10k
   backlog is filled and drained once, so both rates are sampled over the same minutes
   of a shared machine (measured one after the other, load changes alone moved the
   ratio between 0.5 and 1.8). Same rounds of 500, same automatic checkpoints.

Run: ``flock /tmp/msgsafe-bench.lock python3 benchmarks/bench_outbox.py [--big 1000000]
[--readme benchmarks/README.md]``; ``--only batch`` (or ``send``, ``put``, ``fsync``,
``drain``; repeatable) runs one part and prints its figures, for a quick comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

BODY = b"x" * 100
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._readme import replace_section  # noqa: E402
from msgsafe import Producer, Status  # noqa: E402
from msgsafe.adapters import open_transport  # noqa: E402
from msgsafe.endpoints import parse_url  # noqa: E402
from msgsafe.message import Envelope, new_message_id  # noqa: E402
from msgsafe.outbox import Forwarder, SqliteOutbox  # noqa: E402
from msgsafe.outbox._schema import migrate  # noqa: E402
from msgsafe.testing import MemoryBroker  # noqa: E402


def refusing_producer(directory: Path, file: str) -> tuple[Producer, str]:
    """A producer whose broker refuses every write: each message it accepts is STORED."""
    name = f"bench-buf-{uuid.uuid4().hex[:6]}"
    broker = MemoryBroker.install(MemoryBroker(name, retain=False))
    broker.refuse_writes()
    return Producer(f"memory://{name}", outbox=directory / file), name


def run_threads(target: Callable[[int], None], threads: int) -> float:
    """Run ``target(n)`` in ``threads`` threads at once; the wall time until all ended."""
    workers = [threading.Thread(target=target, args=(n,)) for n in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - started


def producer_buffering(directory: Path, threads: int = 8, per_thread: int = 5_000) -> float:
    """``Producer.send`` (blocking, one message per call) from ``threads`` threads while
    the broker refuses: every call returns once its message is durable in the outbox."""
    producer, name = refusing_producer(directory, "buffer.sqlite3")
    stored = [0] * threads

    def sender(n: int) -> None:
        send = producer.send
        stored[n] = sum(1 for _ in range(per_thread) if send("q", BODY).status is Status.STORED)

    elapsed = run_threads(sender, threads)
    producer.close(10)
    MemoryBroker.forget(name)
    if sum(stored) != threads * per_thread:
        raise SystemExit(f"only {sum(stored)} of {threads * per_thread} were stored")
    return threads * per_thread / elapsed


def batch_buffering(
    directory: Path, threads: int = 8, batches: int = 20, size: int = 1000
) -> tuple[float, float, float]:
    """``Producer.send_batch`` of ``size`` messages from ``threads`` threads while the
    broker refuses, and bare SQLite inserting the same rows in the same batches (one
    transaction each, the outbox's schema and sync settings, one connection shared by
    the threads as the outbox's writer is; see :func:`bare_batches`) in the same run.
    Returns the rates of send_batch, bare multi-row and bare executemany."""
    producer, name = refusing_producer(directory, "batch.sqlite3")
    stored = [0] * threads

    def sender(n: int) -> None:
        for _ in range(batches):
            stored[n] += producer.send_batch("q", [BODY] * size).stored

    elapsed = run_threads(sender, threads)
    producer.close(10)
    MemoryBroker.forget(name)
    if sum(stored) != threads * batches * size:
        raise SystemExit(f"only {sum(stored)} of {threads * batches * size} were stored")
    total = threads * batches * size
    rates = [total / elapsed]
    for multi in (True, False):
        raw = raw_sqlite(directory / f"raw-batch-{multi}.sqlite3")
        rates.append(total / run_threads(bare_batches(raw, batches, size, multi=multi), threads))
        raw.close()
    return rates[0], rates[1], rates[2]


def bare_batches(
    raw: sqlite3.Connection, batches: int, size: int, *, multi: bool
) -> Callable[[int], None]:
    """A thread's part of the bare SQLite batch baseline: ``batches`` transactions of
    ``size`` rows on the shared connection ``raw``, with one multi-row ``INSERT`` per
    batch (bare SQLite's fastest way in from Python) or with ``executemany`` (its usual
    one, which gives up and retakes the GIL at every row)."""
    lock = threading.Lock()
    target = "memory://bench"
    statement = RAW_INSERT.replace("VALUES (?, ?, ?, ?, ?, ?, ?, ?)", "VALUES ") + ",".join(
        ["(?, ?, ?, ?, ?, ?, ?, ?)"] * size
    )

    def inserter(n: int) -> None:
        for _ in range(batches):
            rows = [
                (new_message_id(), target, "q", None, None, BODY, time.time(), len(BODY))
                for _ in range(size)
            ]
            with lock:
                raw.execute("BEGIN IMMEDIATE")
                if multi:
                    raw.execute(statement, [value for row in rows for value in row])
                else:
                    raw.executemany(RAW_INSERT, rows)
                raw.execute("COMMIT")

    return inserter


def store_group_commit(directory: Path, threads: int = 4, per_thread: int = 5_000) -> float:
    store = SqliteOutbox(directory / "group.sqlite3")
    envelopes = [[Envelope("q", BODY) for _ in range(per_thread)] for _ in range(threads)]

    def sender(n: int) -> None:
        futures = [store.put_async([e]) for e in envelopes[n]]
        for f in futures:
            f.result()

    elapsed = run_threads(sender, threads)
    store.close()
    return threads * per_thread / elapsed


def fdatasync_slice(path: Path, seconds: float) -> tuple[int, float]:
    """4 KiB writes, each followed by fdatasync, cycling over a preallocated 4 MiB file:
    the disk's best case (no file growth), so the ratio against it is conservative."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    block = b"\0" * 4096
    n = 0
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            os.pwrite(fd, block, (n % 1024) * 4096)
            os.fdatasync(fd)
            n += 1
    finally:
        os.close(fd)
    return n, time.perf_counter() - started


def per_message_slice(store: SqliteOutbox, seconds: float) -> tuple[int, float]:
    n = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        store.put([Envelope("q", BODY)])
        n += 1
    return n, time.perf_counter() - started


def raw_sqlite(path: Path) -> sqlite3.Connection:
    """The outbox's schema and settings (WAL, ``synchronous=FULL``, exclusive locking)
    with no msgsafe code on the write path: what SQLite itself costs per one-row commit."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA locking_mode = EXCLUSIVE")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    migrate(conn, 0)
    return conn


#: The statement SqliteOutbox.put runs for one row.
RAW_INSERT = (
    "INSERT OR IGNORE INTO outbox (id, target, destination, key, headers, body, created_at, size)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def raw_slice(conn: sqlite3.Connection, seconds: float) -> tuple[int, float]:
    n = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            RAW_INSERT,
            (new_message_id(), "memory://bench", "q", None, None, BODY, time.time(), len(BODY)),
        )
        conn.execute("COMMIT")
        n += 1
    return n, time.perf_counter() - started


def per_message_vs_fdatasync(
    directory: Path, slices: int = 24, seconds: float = 0.25
) -> tuple[float, float, float, list[float], list[float]]:
    """Alternate short slices of the disk, the store and bare SQLite so a busy moment of
    a shared disk hits all alike. Returns the three rates over all slices and the ratios
    store / disk and store / bare SQLite of each pair of neighbouring slices."""
    store = SqliteOutbox(directory / "single.sqlite3")
    raw = raw_sqlite(directory / "raw.sqlite3")
    scratch = directory / "fdatasync.bin"
    scratch.write_bytes(b"\0" * 4 * 1024 * 1024)
    os.sync()
    disk = [0, 0.0]
    single = [0, 0.0]
    bare = [0, 0.0]
    pairs: list[float] = []
    bare_pairs: list[float] = []
    try:
        per_message_slice(store, 0.3)  # warm up: the WAL files exist
        raw_slice(raw, 0.3)
        fdatasync_slice(scratch, 0.1)
        for _ in range(slices):
            n, t = fdatasync_slice(scratch, seconds)
            disk[0] += n
            disk[1] += t
            m, u = per_message_slice(store, seconds)
            single[0] += m
            single[1] += u
            r, v = raw_slice(raw, seconds)
            bare[0] += r
            bare[1] += v
            pairs.append((m / u) / (n / t))
            bare_pairs.append((m / u) / (r / v))
    finally:
        store.close()
        raw.close()
    return disk[0] / disk[1], single[0] / single[1], bare[0] / bare[1], pairs, bare_pairs


def put_cpu(directory: Path, puts: int = 200, size: int = 1000) -> tuple[float, float]:
    """CPU (every thread of the process: caller and writer) and wall time per row of
    ``SqliteOutbox.put`` of ``size`` prebuilt envelopes, one put at a time."""
    store = SqliteOutbox(directory / "put.sqlite3")
    batches = [[Envelope("q", BODY) for _ in range(size)] for _ in range(puts + 5)]
    try:
        for batch in batches[:5]:
            store.put(batch)  # the file and its WAL exist
        before = os.times()
        for batch in batches[5:]:
            store.put(batch)
        after = os.times()
    finally:
        store.close()
    rows = puts * size
    cpu = (after.user - before.user) + (after.system - before.system)
    return cpu / rows * 1e6, (after.elapsed - before.elapsed) / rows * 1e6


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM). NOTE: not ru_maxrss, which Linux carries
    over from the parent across fork and exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class DrainChild:
    """One backlog in its own process (so peak RSS does not mix), driven over a pipe.

    Commands: ``fill N`` (puts of 1000), ``drain N`` (forwarder rounds of 500 until N
    were delivered), ``rss``; each answers wall and CPU seconds it took.
    """

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--drain-child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, command: str) -> dict[str, float]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise SystemExit(f"drain child died on {command!r}")
        answer: dict[str, float] = json.loads(line)
        return answer

    def close(self) -> None:
        self.ask("quit")
        self._proc.wait(60)


def drain_child() -> None:
    """The child's side of :class:`DrainChild`."""
    with tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp:
        store = SqliteOutbox(Path(tmp) / "drain.sqlite3")
        name = f"bench-drain-{uuid.uuid4().hex[:6]}"
        broker = MemoryBroker.install(MemoryBroker(name, retain=False))
        transport = open_transport(parse_url(f"memory://{name}"), {})
        forwarder = Forwarder(store, transport, batch=500)
        sent = 0
        for line in sys.stdin:
            command, *arg = line.split()
            wall, cpu = time.perf_counter(), time.process_time()
            if command == "fill":
                size = int(arg[0])
                for start in range(0, size, 1000):
                    store.put([Envelope("q", BODY) for _ in range(min(1000, size - start))])
            elif command == "drain":
                goal = store.pending() - int(arg[0])
                while store.pending() > goal:
                    if not forwarder.step():
                        raise SystemExit("drain: nothing to claim")
                sent += int(arg[0])
                if broker.count("q") != sent:
                    raise SystemExit(f"broker got {broker.count('q')}, expected {sent}")
            elif command == "quit":
                print("{}", flush=True)
                break
            answer = {
                "wall": time.perf_counter() - wall,
                "cpu": time.process_time() - cpu,
                "peak_rss_kib": peak_rss_kib(),
                "file_mib": os.path.getsize(Path(tmp) / "drain.sqlite3") / 2**20,
            }
            print(json.dumps(answer), flush=True)
        transport.close()
        store.close()


def drain_interleaved(small: int, big: int, chunk: int = 50_000) -> dict[str, float]:
    """Fill and drain the big backlog in chunks, with one fill+drain cycle of the small
    backlog after every chunk, so both see the same machine (the load of a shared
    machine changes from minute to minute) and both pay the WAL checkpoints their
    drains cause. Both drain in forwarder rounds of 500; both files are warm in the OS
    page cache (the big one was just written); neither is checkpointed by hand."""
    lo, hi = DrainChild(), DrainChild()
    totals = {k: 0.0 for k in ("sf", "sfc", "sd", "sdc", "bf", "bfc", "bd", "bdc", "sn")}

    def small_cycle() -> None:
        f = lo.ask(f"fill {small}")
        d = lo.ask(f"drain {small}")
        totals["sf"] += f["wall"]
        totals["sfc"] += f["cpu"]
        totals["sd"] += d["wall"]
        totals["sdc"] += d["cpu"]
        totals["sn"] += small

    try:
        small_cycle()  # both files exist and the small one is warm before timing
        totals = dict.fromkeys(totals, 0.0)
        for phase in ("fill", "drain"):
            for start in range(0, big, chunk):
                a = hi.ask(f"{phase} {min(chunk, big - start)}")
                totals["bf" if phase == "fill" else "bd"] += a["wall"]
                totals["bfc" if phase == "fill" else "bdc"] += a["cpu"]
                small_cycle()
        rss_lo, rss_hi = lo.ask("rss"), hi.ask("rss")
    finally:
        lo.close()
        hi.close()
    n = totals["sn"]
    return {
        "small_cycles": n / small,
        "small_fill": n / totals["sf"],
        "small_drain": n / totals["sd"],
        "small_drain_cpu_us": totals["sdc"] / n * 1e6,
        "big_fill": big / totals["bf"],
        "big_drain": big / totals["bd"],
        "big_drain_cpu_us": totals["bdc"] / big * 1e6,
        "small_rss_kib": rss_lo["peak_rss_kib"],
        "big_rss_kib": rss_hi["peak_rss_kib"],
        "big_file_mib": rss_hi["file_mib"],
    }


#: The parts ``--only`` can pick.
PARTS = ("send", "batch", "put", "fsync", "drain")


def run_parts(parts: list[str], small: int, big: int) -> None:
    """Some parts of the benchmark alone, for a quick before/after of one figure."""
    with tempfile.TemporaryDirectory(prefix="bench-outbox-") as tmp:
        directory = Path(tmp)
        if "send" in parts:
            sync_count, sync_s = fdatasync_slice(directory / "fdatasync.bin", 1.0)
            cpu = time.process_time()
            rate = producer_buffering(directory)
            cpu_us = (time.process_time() - cpu) / (8 * 5_000) * 1e6
            # One interpreter runs one send at a time: 1 / its CPU per send is a limit too.
            print(
                f"Producer.send x8: {rate:,.0f} msg/s, {cpu_us:.0f} µs CPU/msg (limit "
                f"{1e6 / cpu_us:,.0f}/s, ratio {rate * cpu_us / 1e6:.2f}); 8 x fdatasync "
                f"{8 * sync_count / sync_s:,.0f}/s (ratio {rate / (8 * sync_count / sync_s):.2f})"
            )
        if "batch" in parts:
            rate, multi, many = batch_buffering(directory)
            print(
                f"send_batch x8: {rate:,.0f} msg/s; bare multi-row {multi:,.0f} rows/s "
                f"(ratio {rate / multi:.2f}); bare executemany {many:,.0f} rows/s "
                f"(ratio {rate / many:.2f})"
            )
        if "put" in parts:
            group = store_group_commit(directory)
            put_us, _ = put_cpu(directory)
            print(f"group commit x4: {group:,.0f} msg/s; put of 1000: {put_us:.2f} µs CPU/row")
        if "fsync" in parts:
            disk, single, bare, _, bare_pairs = per_message_vs_fdatasync(directory)
            bare_pairs.sort()
            print(
                f"per-message fsync {single:,.0f}/s, bare SQLite {bare:,.0f}/s, fdatasync "
                f"{disk:,.0f}/s: ratio to bare {single / bare:.2f} (pair median "
                f"{bare_pairs[len(bare_pairs) // 2]:.2f})"
            )
    if "drain" in parts:
        drain = drain_interleaved(small, big)
        print(
            f"drain {small:,}: {drain['small_drain']:,.0f} msg/s "
            f"({drain['small_drain_cpu_us']:.1f} µs CPU/msg); {big:,}: "
            f"{drain['big_drain']:,.0f} msg/s ({drain['big_drain_cpu_us']:.1f} µs CPU/msg); "
            f"ratio {drain['big_drain'] / drain['small_drain']:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=1_000_000, help="the large backlog")
    parser.add_argument("--small", type=int, default=10_000, help="the small backlog")
    parser.add_argument("--readme", type=Path, help="update the '## Outbox' section there")
    parser.add_argument(
        "--only",
        choices=PARTS,
        action="append",
        help="run only this part (repeatable) and print its figures; not with --readme",
    )
    parser.add_argument("--drain-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drain_child:
        drain_child()
        return
    if args.only:
        if args.readme:
            parser.error("--readme needs every part: leave out --only")
        run_parts(args.only, args.small, args.big)
        return

    load = os.getloadavg()[0]
    started = time.gmtime()
    with tempfile.TemporaryDirectory(prefix="bench-outbox-") as tmp:
        directory = Path(tmp)
        buffering = producer_buffering(directory)
        batch_rate, batch_raw, batch_many = batch_buffering(directory)
        group = store_group_commit(directory)
        put_us, put_wall_us = put_cpu(directory)
        disk_rate, single_rate, raw_rate, pairs, bare_pairs = per_message_vs_fdatasync(directory)
    drain = drain_interleaved(args.small, args.big)
    load_end = os.getloadavg()[0]
    fsync_ratio = single_rate / disk_rate
    pairs.sort()
    bare_pairs.sort()
    drain_ratio = drain["big_drain"] / drain["small_drain"]
    rss_ratio = drain["big_rss_kib"] / drain["small_rss_kib"]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', started)} on {os.cpu_count()} "
        f"cores, load average {load:.1f} at the start and {load_end:.1f} at the end "
        f"(the machine is shared), Python {sys.version.split()[0]}, "
        f"SQLite {__import__('sqlite3').sqlite_version}.",
        "",
        "| figure | value | goal |",
        "|---|---|---|",
        f"| buffering, Producer.send x8 threads (blocking, 1 message per call), broker refusing "
        f"| {buffering:,.0f} msg/s | >= 100k msg/s |",
        f"| buffering, Producer.send_batch of 1000 x8 threads, broker refusing "
        f"| {batch_rate:,.0f} msg/s | |",
        f"| bare SQLite, same rows, batches, schema and settings, 8 threads, 1 multi-row "
        f"INSERT per batch (no msgsafe code) | {batch_raw:,.0f} rows/s | |",
        f"| the same with executemany per batch | {batch_many:,.0f} rows/s | |",
        f"| send_batch / bare SQLite multi-row batches | {batch_rate / batch_raw:.2f} | >= 0.8 |",
        f"| send_batch / bare SQLite executemany batches | {batch_rate / batch_many:.2f} | |",
        f"| buffering, store alone, 4 threads, 1 message per put (group commit) | {group:,.0f} "
        "msg/s | |",
        f"| store put of 1000 prebuilt envelopes: CPU per row (all threads) | {put_us:.2f} µs "
        f"({put_wall_us:.2f} µs wall) | as low as possible |",
        f"| disk: 4 KiB write + fdatasync (preallocated file) | {disk_rate:,.0f} /s | |",
        f"| per-message fsync mode (1 thread, 1 message per commit) | {single_rate:,.0f} msg/s | |",
        f"| per-message fsync / fdatasync ({len(pairs)} slice pairs) | {fsync_ratio:.2f} "
        f"(pairs: median {pairs[len(pairs) // 2]:.2f}, range {pairs[0]:.2f} to {pairs[-1]:.2f}) "
        "| |",
        f"| bare SQLite, same schema and settings, 1 row per commit (no msgsafe code) "
        f"| {raw_rate:,.0f} /s ({raw_rate / disk_rate:.2f} of fdatasync) | |",
        f"| per-message fsync / bare SQLite 1 row per commit ({len(bare_pairs)} slice pairs) "
        f"| {single_rate / raw_rate:.2f} (pairs: median {bare_pairs[len(bare_pairs) // 2]:.2f}, "
        f"range {bare_pairs[0]:.2f} to {bare_pairs[-1]:.2f}) | >= 0.9 |",
        f"| drain rate, {args.small:,} backlog ({drain['small_cycles']:.0f} fill+drain cycles) "
        f"| {drain['small_drain']:,.0f} msg/s ({drain['small_drain_cpu_us']:.1f} µs CPU/msg) | |",
        f"| drain rate, {args.big:,} backlog | {drain['big_drain']:,.0f} msg/s "
        f"({drain['big_drain_cpu_us']:.1f} µs CPU/msg) | |",
        f"| drain rate ratio big / small | {drain_ratio:.2f} | >= 0.95 |",
        f"| peak RSS, {args.small:,} backlog | {drain['small_rss_kib'] / 1024:,.1f} MiB | |",
        f"| peak RSS, {args.big:,} backlog ({drain['big_file_mib']:,.0f} MiB file) "
        f"| {drain['big_rss_kib'] / 1024:,.1f} MiB | |",
        f"| peak RSS ratio big / small | {rss_ratio:.2f} | <= 1.10 |",
        "",
        f"Fill rate (puts of 1000): {drain['small_fill']:,.0f} msg/s ({args.small:,}, "
        f"file reused), {drain['big_fill']:,.0f} msg/s ({args.big:,}, file growing).",
    ]
    text = "\n".join(lines)
    print(text)
    if args.readme:
        update_readme(args.readme, text)


def update_readme(path: Path, body: str) -> None:
    """Replace the ``## Outbox`` section of ``path`` (created if missing)."""
    section = (
        "## Outbox\n\n`flock /tmp/msgsafe-bench.lock python3 benchmarks/bench_outbox.py"
        " --readme benchmarks/README.md`\n\n" + body + "\n"
    )
    replace_section(path, section)


if __name__ == "__main__":
    main()

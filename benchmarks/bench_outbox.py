"""Outbox benchmarks, all figures from one run.

1. Durable buffering while the broker refuses: 100-byte messages sent with
   ``Producer.send_async`` from 4 threads (each one ends ``Status.STORED``), and the
   store alone (4 threads, one message per put, group commit merging them).
2. Per-message fsync: one thread, one message per put, each its own commit; compared
   with the disk's fdatasync rate for 4 KiB writes in place (its best case), measured
   in alternating quarter-second slices so both see the same disk.
3. Drain rate to the memory broker with a 10k and a 1M backlog, and peak RSS for each
   (each size in its own process so peaks do not mix). The 10k backlog is filled and
   drained 10 times over so its rate includes the WAL checkpoints a long drain pays.

Run: ``python benchmarks/bench_outbox.py [--big 1000000] [--readme benchmarks/README.md]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

BODY = b"x" * 100
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from msgsafe import Producer, Status  # noqa: E402
from msgsafe.adapters import open_transport  # noqa: E402
from msgsafe.endpoints import parse_url  # noqa: E402
from msgsafe.message import Envelope  # noqa: E402
from msgsafe.outbox import Forwarder, SqliteOutbox  # noqa: E402
from msgsafe.testing import MemoryBroker  # noqa: E402


def producer_buffering(directory: Path, threads: int = 4, per_thread: int = 25_000) -> float:
    name = f"bench-buf-{uuid.uuid4().hex[:6]}"
    broker = MemoryBroker.install(MemoryBroker(name, retain=False))
    broker.refuse_writes()
    producer = Producer(f"memory://{name}", outbox=directory / "buffer.sqlite3")
    stored = [0] * threads

    def sender(n: int) -> None:
        futures = [producer.send_async("q", BODY) for _ in range(per_thread)]
        stored[n] = sum(1 for f in futures if f.result().status is Status.STORED)

    workers = [threading.Thread(target=sender, args=(n,)) for n in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    producer.close(10)
    MemoryBroker.forget(name)
    if sum(stored) != threads * per_thread:
        raise SystemExit(f"only {sum(stored)} of {threads * per_thread} were stored")
    return threads * per_thread / elapsed


def store_group_commit(directory: Path, threads: int = 4, per_thread: int = 5_000) -> float:
    store = SqliteOutbox(directory / "group.sqlite3")
    envelopes = [[Envelope("q", BODY) for _ in range(per_thread)] for _ in range(threads)]

    def sender(batch: list[Envelope]) -> None:
        futures = [store.put_async([e]) for e in batch]
        for f in futures:
            f.result()

    workers = [threading.Thread(target=sender, args=(b,)) for b in envelopes]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
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


def per_message_vs_fdatasync(
    directory: Path, slices: int = 16, seconds: float = 0.25
) -> tuple[float, float]:
    """Alternate short slices of both so a busy moment of a shared disk hits both alike."""
    store = SqliteOutbox(directory / "single.sqlite3")
    scratch = directory / "fdatasync.bin"
    scratch.write_bytes(b"\0" * 4 * 1024 * 1024)
    os.sync()
    disk = [0, 0.0]
    single = [0, 0.0]
    try:
        per_message_slice(store, 0.3)  # warm up: the WAL file exists
        for _ in range(slices):
            n, t = fdatasync_slice(scratch, seconds)
            disk[0] += n
            disk[1] += t
            n, t = per_message_slice(store, seconds)
            single[0] += n
            single[1] += t
    finally:
        store.close()
    return disk[0] / disk[1], single[0] / single[1]


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM). NOTE: not ru_maxrss, which Linux carries
    over from the parent across fork and exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def drain_child(size: int, cycles: int) -> dict[str, float]:
    """Fill an outbox with ``size`` messages and drain it, ``cycles`` times over; runs in
    its own process. Several cycles let a small backlog's rate include the WAL
    checkpoints that a long drain pays throughout."""
    with tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp:
        store = SqliteOutbox(Path(tmp) / "drain.sqlite3")
        name = f"bench-drain-{uuid.uuid4().hex[:6]}"
        broker = MemoryBroker.install(MemoryBroker(name, retain=False))
        transport = open_transport(parse_url(f"memory://{name}"), {})
        forwarder = Forwarder(store, transport)
        fill = drain = 0.0
        for cycle in range(1, cycles + 1):
            started = time.perf_counter()
            for start in range(0, size, 1000):
                store.put([Envelope("q", BODY) for _ in range(min(1000, size - start))])
            fill += time.perf_counter() - started
            started = time.perf_counter()
            left = forwarder.drain(3600)
            drain += time.perf_counter() - started
            if left or broker.count("q") < size * cycle:
                raise SystemExit(f"drain left {left}, broker got {broker.count('q')}")
        transport.close()
        store.close()
    return {
        "size": size,
        "cycles": cycles,
        "fill_rate": size * cycles / fill,
        "drain_rate": size * cycles / drain,
        "peak_rss_kib": peak_rss_kib(),
    }


def drain_in_child(size: int, cycles: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--drain-child", str(size), str(cycles)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"drain child failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=1_000_000, help="the large backlog")
    parser.add_argument("--small", type=int, default=10_000, help="the small backlog")
    parser.add_argument("--readme", type=Path, help="update the '## Outbox' section there")
    parser.add_argument("--small-cycles", type=int, default=10, help="fill+drain cycles")
    parser.add_argument("--drain-child", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drain_child:
        print(json.dumps(drain_child(*args.drain_child)))
        return

    load = os.getloadavg()[0]
    started = time.gmtime()
    with tempfile.TemporaryDirectory(prefix="bench-outbox-") as tmp:
        directory = Path(tmp)
        buffering = producer_buffering(directory)
        group = store_group_commit(directory)
        disk_rate, single_rate = per_message_vs_fdatasync(directory)
    small = drain_in_child(args.small, args.small_cycles)
    big = drain_in_child(args.big, 1)
    fsync_ratio = single_rate / disk_rate
    drain_ratio = big["drain_rate"] / small["drain_rate"]
    rss_ratio = big["peak_rss_kib"] / small["peak_rss_kib"]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', started)} on {os.cpu_count()} "
        f"cores, load average {load:.1f} at the start (the machine is shared), "
        f"Python {sys.version.split()[0]}, SQLite {__import__('sqlite3').sqlite_version}.",
        "",
        "| figure | value | goal |",
        "|---|---|---|",
        f"| buffering, Producer.send_async x4 threads, broker refusing | {buffering:,.0f} msg/s "
        "| >= 100k msg/s |",
        f"| buffering, store alone, 4 threads, 1 message per put (group commit) | {group:,.0f} "
        "msg/s | |",
        f"| disk: 4 KiB write + fdatasync (preallocated file) | {disk_rate:,.0f} /s | |",
        f"| per-message fsync mode (1 thread, 1 message per commit) | {single_rate:,.0f} msg/s | |",
        f"| per-message fsync / fdatasync | {fsync_ratio:.2f} | >= 0.8 |",
        f"| drain rate, {args.small:,} backlog ({args.small_cycles} fill+drain cycles) "
        f"| {small['drain_rate']:,.0f} msg/s | |",
        f"| drain rate, {args.big:,} backlog | {big['drain_rate']:,.0f} msg/s | |",
        f"| drain rate ratio big / small | {drain_ratio:.2f} | >= 0.9 |",
        f"| peak RSS, {args.small:,} backlog | {small['peak_rss_kib'] / 1024:,.1f} MiB | |",
        f"| peak RSS, {args.big:,} backlog | {big['peak_rss_kib'] / 1024:,.1f} MiB | |",
        f"| peak RSS ratio big / small | {rss_ratio:.2f} | <= 1.10 |",
        "",
        f"Fill rate (puts of 1000): {small['fill_rate']:,.0f} msg/s ({args.small:,}), "
        f"{big['fill_rate']:,.0f} msg/s ({args.big:,}).",
    ]
    text = "\n".join(lines)
    print(text)
    if args.readme:
        update_readme(args.readme, text)


def update_readme(path: Path, body: str) -> None:
    """Replace the ``## Outbox`` section of ``path`` (created if missing)."""
    section = (
        "## Outbox\n\n`python benchmarks/bench_outbox.py --readme benchmarks/README.md`\n\n"
        + body
        + "\n"
    )
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find("## Outbox\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + ("" if end < 0 else text[end:])
    path.write_text(text)


if __name__ == "__main__":
    main()

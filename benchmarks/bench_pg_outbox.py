"""PostgreSQL outbox benchmarks (the store a fleet shares), all figures from one run, on
a real primary + synchronous standby pair (``msgsafe cluster``'s postgres launcher):

1. Store puts against bare psycopg: ``PostgresOutbox.put`` of one message per commit,
   and of batches of 100 and 1000, against bare psycopg inserting the same rows (same
   table, same columns, same INSERT) with the same commits (``executemany`` in one
   transaction), no msgsafe code. The two alternate in short slices so both see the
   same moments of a shared machine; the ratio is msgsafe / bare (goal >= 0.8 each).
2. Forwarding rate with 1, 2 and 4 ``msgsafe outbox forward`` processes sharing one
   table of 64 keys, to a real RabbitMQ node (a quorum queue): the backlog is put first,
   then the forwarders start, held at the table until all of them have started; the rate
   is counted from their release to the last row gone. Beside it, the same counted from
   the first row gone with the forwarders let go as each starts (the later ones still
   starting while the first drains).
3. Bloat: table and index size after ``--bloat`` rows were put and forwarded (deleted
   row by row as the broker confirms them: ``DELETE ... WHERE id = ANY(...)`` per round,
   autovacuum at the server's defaults), then after a plain ``VACUUM``.

4. Backlog size (``--only backlog``, not part of ``--readme``): a ``--backlog SMALL BIG``
   pair of backlogs on 64 keys (the first 1,000 rows put through ``PostgresOutbox.put``,
   the rest written by the server in one INSERT ... SELECT), each drained by one
   forwarder to RabbitMQ; the big one's rate as a ratio of the small one's (goal >=
   0.9), EXPLAIN (ANALYZE, BUFFERS) of the claim, stats and delete queries on each full
   table, ``outbox status`` timed, and the table's size and dead tuples full, drained and
   ``--settle`` seconds later, for each ``--vacuum`` set of autovacuum reloptions. The
   destination queue is purged during every drain (``--queue``), ``--big-runs`` big
   drains interleave with ``--small-runs`` small ones before, between and after them
   (each big one against the small ones around it), and each drain counts the WAL bytes
   a message, the checkpoints and the pages the backends wrote out themselves.
   ``--pg-nodes 1`` runs the primary alone, ``--pg-set NAME=VALUE`` a server setting.

Run: ``flock /tmp/msgsafe-bench.lock python3 benchmarks/bench_pg_outbox.py
[--bloat 1000000] [--readme benchmarks/README.md]``; ``--only put`` (or ``forward``,
``bloat``, ``backlog``; repeatable) runs one part and prints its figures.

5. ``--scaling`` (alone): 1, 2 and 4 forwarders to RabbitMQ (1 node and 3 nodes, a
   quorum queue) and to Kafka (3 nodes; ``--targets`` picks among them), all started
   before the first row may go, with the CPU of each forwarder process, of their
   PostgreSQL backends, of the rest of the primary and of the standby, of each broker
   node and of the machine (/proc), the database's commits per second, the broker's own
   rate from its raw client and the store's own drain rate with no broker, both in the
   same run, so that the table names what limits the rate.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._readme import replace_section  # noqa: E402
from msgsafe.message import Envelope  # noqa: E402

BODY = b"x" * 100
KEYS = 64
PARTS = ("put", "forward", "bloat", "backlog")
SCALING_TARGETS = ("rabbitmq1", "rabbitmq3", "kafka3")
#: Seconds between two purges of the backlog part's destination queue (``--queue emptied``).
PURGE_EVERY = 0.25


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", action="append", choices=PARTS, help="run one part (repeatable)")
    parser.add_argument("--seconds", type=float, default=8.0, help="per put mode, each side")
    parser.add_argument(
        "--forward-rows", type=int, default=20_000, help="backlog per forwarder count"
    )
    parser.add_argument(
        "--forwarders", type=int, nargs="+", default=[1, 2, 4], help="forwarder counts"
    )
    parser.add_argument(
        "--bloat", type=int, default=1_000_000, help="rows put and forwarded for the bloat part"
    )
    parser.add_argument(
        "--backlog",
        type=int,
        nargs=2,
        default=[10_000, 1_000_000],
        metavar=("SMALL", "BIG"),
        help="backlog sizes of the backlog part (drained by one forwarder)",
    )
    parser.add_argument(
        "--vacuum",
        action="append",
        default=None,
        help="autovacuum reloptions tried on the big backlog, e.g."
        " 'autovacuum_vacuum_scale_factor=0,autovacuum_vacuum_threshold=10000' (repeatable;"
        " 'default' for the server's)",
    )
    parser.add_argument(
        "--small-runs",
        type=int,
        default=2,
        help="drains of the small backlog before, between and after the big ones (each big "
        "one's ratio is to the median of the small drains just before and just after it)",
    )
    parser.add_argument(
        "--big-runs",
        type=int,
        default=1,
        help="drains of the big backlog, each between two groups of --small-runs small ones",
    )
    parser.add_argument(
        "--queue",
        choices=("emptied", "kept"),
        default="emptied",
        help="the backlog part's destination queue during each drain: purged every "
        f"{PURGE_EVERY} s (the broker in the same state for every backlog size) or kept "
        "(every drained message stays in it)",
    )
    parser.add_argument(
        "--pg-nodes",
        type=int,
        choices=(1, 2),
        default=2,
        help="PostgreSQL nodes: 2 (primary + synchronous standby) or 1 (the primary alone)",
    )
    parser.add_argument(
        "--pg-set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a postgresql.conf setting of every node for the run, e.g. shared_buffers=1GB "
        "(repeatable; the rest as msgsafe cluster sets them)",
    )
    parser.add_argument(
        "--settle", type=float, default=60.0, help="seconds to watch autovacuum after a drain"
    )
    parser.add_argument(
        "--naptime",
        help="the server's autovacuum_naptime for the run (e.g. 5s; default: the server's)",
    )
    parser.add_argument("--readme", type=Path, help="update the '## PostgreSQL outbox' section")
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="only the forwarder scaling to 3-node RabbitMQ and Kafka, with what limits it "
        "(--forwarders, --forward-rows; --readme then updates its own section)",
    )
    parser.add_argument(
        "--targets",
        nargs="+",
        choices=SCALING_TARGETS,
        default=list(SCALING_TARGETS),
        help="the brokers of --scaling",
    )
    args = parser.parse_args(argv)
    if args.readme is not None and args.only and not args.scaling:
        parser.error("--readme needs every part: leave out --only")
    if args.seconds <= 0 or args.forward_rows < 1 or args.bloat < 1:
        parser.error("--seconds, --forward-rows and --bloat must be > 0")
    if any(n < 1 for n in args.forwarders):
        parser.error("--forwarders must be >= 1")
    if any("=" not in item or not item.split("=", 1)[0] for item in args.pg_set):
        parser.error("--pg-set takes NAME=VALUE")
    if args.big_runs < 1 or args.small_runs < 1:
        parser.error("--big-runs and --small-runs must be >= 1")
    return args


def _envelopes(n: int, queue: str = "bench") -> list[Envelope]:
    return [Envelope.build(queue, BODY, key=f"k{i % KEYS}") for i in range(n)]


# --- 1. puts --------------------------------------------------------------------------------


@dataclass
class PutResult:
    batch: int
    store: float  #: msg/s
    bare: float
    pairs: list[float]  #: store/bare per slice pair

    @property
    def ratio(self) -> float:
        return self.store / self.bare


def puts(url: str, batch: int, seconds: float) -> PutResult:
    """Alternating slices of ``PostgresOutbox.put`` and bare psycopg, ``batch`` rows per
    commit, about ``seconds`` each side."""
    import psycopg

    from msgsafe.outbox import PostgresOutbox

    table = f"bench_put_{uuid.uuid4().hex[:8]}"
    store = PostgresOutbox.from_url(f"{url}&table={table}", target="amqp://bench/")
    insert = store._sql["insert"]  # the same INSERT, the same table
    bare = psycopg.connect(store._conninfo, autocommit=True)
    slice_s = 0.5
    totals = {"store": [0, 0.0], "bare": [0, 0.0]}
    pairs: list[float] = []

    def run(side: str) -> float:
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < slice_s:
            rows = _envelopes(batch)
            if side == "store":
                t0 = time.perf_counter()
                store.put(rows)
            else:
                values = [store._row(env) for env in rows]
                t0 = time.perf_counter()
                with bare.transaction(), bare.cursor() as cur:
                    cur.executemany(insert, values)
            totals[side][1] += time.perf_counter() - t0
            count += len(rows)
        totals[side][0] += count
        return count / (time.perf_counter() - started)

    try:
        deadline = time.monotonic() + 2 * seconds
        while time.monotonic() < deadline:
            order = ("store", "bare") if len(pairs) % 2 == 0 else ("bare", "store")
            rates = {side: run(side) for side in order}
            pairs.append(rates["store"] / rates["bare"])
            with bare.transaction():
                bare.execute(f"TRUNCATE {table}")  # keeps the table small for both sides
    finally:
        bare.close()
        store.close()
    return PutResult(
        batch,
        totals["store"][0] / totals["store"][1],
        totals["bare"][0] / totals["bare"][1],
        sorted(pairs),
    )


# --- 2. forwarding --------------------------------------------------------------------------


def _count(url: str, table: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def fill(url: str, table: str, rows: int, queue: str, target: str) -> None:
    """``rows`` messages on 64 keys put into ``table``, 1000 per commit."""
    from msgsafe.outbox import PostgresOutbox

    store = PostgresOutbox.from_url(f"{url}&table={table}", target=target)
    try:
        for start in range(0, rows, 1000):
            store.put(_envelopes(min(1000, rows - start), queue))
    finally:
        store.close()


def forward(url: str, table: str, broker: str, forwarders: int, rows: int) -> float:
    """msg/s of ``forwarders`` processes draining ``rows`` rows of ``table``, all of them
    started before the first row may go (see :func:`forward_sampled`)."""
    return forward_sampled(url, table, broker, ["declare=quorum"], forwarders, rows).rate


# --- 2b. forwarder scaling: what limits 1, 2 and 4 forwarders -------------------------------


def _proc_cpu(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) used so far by ``pids`` (a process gone counts 0)."""
    return sum(_cpu_of(pid) or 0.0 for pid in pids)


def _cpu_of(pid: int) -> float | None:
    """CPU seconds (user + system) ``pid`` has used so far; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _busy_cores() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    # guest time is counted in user time already
    return (sum(values[:8]) - idle) / tick, sum(values[:8]) / tick


def _children() -> dict[int, list[int]]:
    """Every live process's children, by parent pid (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _family(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """``pid`` and every live process under it: a postmaster's backends and helpers, and
    the postmaster itself where ``pid`` is the wrapper that runs it as its own user."""
    children = _children() if children is None else children
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def _commits(url: str) -> int:
    """The database's committed transactions so far (``pg_stat_database.xact_commit``)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


class CpuBook:
    """CPU seconds of groups of processes between two moments, processes born and gone
    in between included: each sample reads every process of every group and keeps the
    last value seen per pid, so a process that ends keeps what it used."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[int, float]] = {}
        self.base: dict[str, dict[int, float]] = {}

    def sample(self, groups: dict[str, Sequence[int]]) -> None:
        for name, pids in groups.items():
            book = self.seen.setdefault(name, {})
            for pid in pids:
                cpu = _cpu_of(pid)
                if cpu is not None:
                    book[pid] = cpu

    def start(self) -> None:
        """From now on (the last sample is the base)."""
        self.base = {name: dict(book) for name, book in self.seen.items()}

    def used(self, name: str) -> float:
        base = self.base.get(name, {})
        return sum(cpu - base.get(pid, 0.0) for pid, cpu in self.seen.get(name, {}).items())


@dataclass
class Drained:
    """One gated drain: the rate and the CPU of every process group over it."""

    rate: float  #: msg/s, from the release of the table to the table empty
    seconds: float  #: the drain's length
    start_cpu: list[float]  #: each forwarder's CPU seconds to start (before the release)
    cores: dict[str, float]  #: CPU in cores over the drain, per group (see forward_sampled)
    forwarder_cores: list[float]  #: each forwarder process's, in cores
    machine_cores: float  #: the whole machine's busy CPU (other users' too), in cores
    commits: float  #: the database's commits per second
    #: over the drain: WAL bytes written per message, checkpoints, and buffers the server
    #: backends had to write out themselves (``pg_stat_bgwriter.buffers_backend``)
    wal_per_message: float = 0.0
    checkpoints: int = 0
    backend_writes: int = 0


def forward_sampled(
    url: str,
    table: str,
    broker: str,
    options: Sequence[str],
    forwarders: int,
    rows: int,
    groups: dict[str, int | None] | None = None,
    *,
    gated: bool = True,
) -> Drained:
    """``forwarders`` ``msgsafe outbox forward`` processes draining the ``rows`` rows of
    ``table`` to ``broker``, all of them started before the first row may go: the table
    is held (``LOCK TABLE ... ACCESS EXCLUSIVE`` in an open transaction) until each
    forwarder (told apart by its ``application_name``) waits on it, so their start
    (interpreter, imports, connections: about a second of a core each) is not part of
    the drain, as it is not for a fleet that runs. The rate runs from the release to the
    table empty. Sampled every 0.2 s: each forwarder's CPU, their PostgreSQL backends
    (``pg_stat_activity``), the rest of the PostgreSQL node of pid ``groups["primary"]``,
    every process under each other pid of ``groups`` (the standby, the broker's nodes),
    this process, the machine's busy CPU and the database's commits.

    ``gated=False``: the forwarders start on the open table, as a benchmark that starts
    them and counts from the first row gone does; the later ones still start (and take
    CPU) while the first drains. ``start_cpu`` is then each one's CPU up to the first row
    gone."""
    import psycopg

    run = uuid.uuid4().hex[:6]
    store = f"{url}&table={table}"
    procs = []
    for i in range(forwarders):
        command = [
            sys.executable,
            "-m",
            "msgsafe",
            "outbox",
            "forward",
            f"{store}&application_name=bench-fwd-{run}-{i}",
            "--url",
            broker,
        ]
        for option in options:
            command += ["-o", option]
        procs.append([*command, "--until-empty", "--json"])
    groups = groups or {}
    book = CpuBook()
    head = f"SELECT seq FROM {table} WHERE seq >= %s ORDER BY seq LIMIT 1"
    gate = psycopg.connect(url)
    watch = psycopg.connect(url, autocommit=True)
    started: list[subprocess.Popen[bytes]] = []
    try:
        seen = int((watch.execute(head, (0,)).fetchone() or (0,))[0])  # before the lock
        if gated:
            gate.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        started = [
            subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            for command in procs
        ]

        def backends() -> list[int]:
            return [
                int(r[0])
                for r in watch.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
                    (f"bench-fwd-{run}-%",),
                )
            ]

        def sample() -> tuple[float, float, int]:
            children = _children()
            ours = backends()
            primary = groups.get("primary")
            sets: dict[str, Sequence[int]] = {
                "forwarders": [p.pid for p in started],
                "backends": ours,
                "bench": [os.getpid()],
            }
            for name, pid in groups.items():
                if pid is not None:
                    family = _family(pid, children)
                    sets[name] = [p for p in family if p not in ours] if pid == primary else family
            book.sample(sets)
            row = watch.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
            return time.monotonic(), _busy_cores()[0], int(row[0]) if row else 0

        deadline = time.monotonic() + 120
        while not gated:
            time.sleep(0.02)  # a sampling period: from the first row gone
            row = watch.execute(head, (seen,)).fetchone()
            t0 = time.monotonic()
            if row is None or int(row[0]) != seen:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("no row went in 120 s")
        while gated:
            waiting = watch.execute(
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity"
                " WHERE application_name LIKE %s AND wait_event_type = 'Lock'",
                (f"bench-fwd-{run}-%",),
            ).fetchone()
            if waiting and int(waiting[0]) >= forwarders:
                break
            if any(p.poll() is not None for p in started):
                raise RuntimeError("a forwarder exited before the table was released")
            if time.monotonic() > deadline:
                raise RuntimeError("the forwarders did not all reach the table in 120 s")
            time.sleep(0.1)  # polling the server's view of the waiters, with a deadline
        start_cpu = [_cpu_of(p.pid) or 0.0 for p in started]
        server0 = _server_counters(watch)
        first = sample()
        book.start()
        if gated:
            t0 = time.monotonic()
            gate.rollback()  # the release: every forwarder claims at once
        next_sample = time.monotonic() + 0.2
        while True:
            # The head is asked every 0.05 s (one index probe: the end of the drain to
            # within 0.05 s); the processes' CPU every 0.2 s (a walk of /proc) and at
            # the end: each process's last value counts.
            time.sleep(0.05)
            row = watch.execute(head, (seen,)).fetchone()
            t1 = time.monotonic()
            if row is None:
                break
            seen = int(row[0])
            if t1 >= next_sample:
                sample()
                next_sample = t1 + 0.2
                if all(p.poll() is not None for p in started):
                    raise RuntimeError(f"the forwarders exited with rows left in {table}")
        last = sample()
        server1 = _server_counters(watch)
    finally:
        for p in started:
            if p.poll() is None:
                p.terminate()
            p.wait(60)
        gate.close()
        watch.close()
    seconds = max(t1 - t0, 1e-6)
    cpu_seconds = max(last[0] - first[0], 1e-6)  # the CPU figures' interval
    names = ["backends", "bench", *(name for name in groups if groups[name] is not None)]
    return Drained(
        rate=rows / seconds,
        seconds=seconds,
        start_cpu=start_cpu,
        cores={name: book.used(name) / cpu_seconds for name in names},
        forwarder_cores=[
            (book.seen["forwarders"].get(p.pid, 0.0) - book.base["forwarders"].get(p.pid, 0.0))
            / cpu_seconds
            for p in started
        ],
        machine_cores=(last[1] - first[1]) / cpu_seconds,
        commits=(last[2] - first[2]) / cpu_seconds,
        wal_per_message=(server1[0] - server0[0]) / rows,
        checkpoints=server1[1] - server0[1],
        backend_writes=server1[2] - server0[2],
    )


def _server_counters(conn: Any) -> tuple[int, int, int]:
    """(WAL position in bytes, checkpoints so far, buffers written by backends so far)."""
    row = conn.execute(
        "SELECT pg_current_wal_lsn() - '0/0', checkpoints_timed + checkpoints_req,"
        " buffers_backend FROM pg_stat_bgwriter"
    ).fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


def store_alone(url: str, rows: int, limit: int = 2_000) -> float:
    """msg/s of the store drained with no broker: one ``PostgresOutbox`` claiming up to
    ``limit`` rows and deleting each claim (the database's own rate for the forwarder's
    queries, on the same primary + standby, with ``rows`` rows on 64 keys)."""
    from msgsafe.outbox import PostgresOutbox

    table = f"bench_alone_{uuid.uuid4().hex[:8]}"
    load(url, table, rows, "bench-alone", "amqp://bench/")
    store = PostgresOutbox.from_url(f"{url}&table={table}", target="amqp://bench/")
    try:
        done, started = 0, time.perf_counter()
        while done < rows:
            claimed = store.claim(limit=limit, lease_s=30.0)
            if not claimed:
                raise RuntimeError(f"the store gave nothing with {rows - done} rows left")
            store.delivered([env.message_id for env in claimed])
            done += len(claimed)
        return rows / (time.perf_counter() - started)
    finally:
        store.close()


@dataclass
class ScalingRun:
    """One forwarder count to one broker: the rate and where the CPU went meanwhile."""

    broker: str
    forwarders: int
    drained: Drained
    raw: float  #: the broker's own rate, from its raw client (same count, same guarantees)
    raw_machine: float  #: the machine's busy cores while the raw client ran
    alone: float  #: the store's own drain rate, no broker (:func:`store_alone`)

    @property
    def rate(self) -> float:
        return self.drained.rate

    @property
    def ours(self) -> float:
        """Cores taken by the processes this run started (forwarders, PostgreSQL, the
        broker, this benchmark)."""
        return sum(self.drained.forwarder_cores) + sum(self.drained.cores.values())

    @property
    def cost_us(self) -> float:
        """CPU microseconds per message, all of this run's processes together."""
        return self.ours / self.rate * 1e6

    def limit(self, cores: int) -> str:
        """What the figures point at: the machine's cores when they are (nearly) all
        busy, else the broker near its raw client's rate, else the database near its own
        drain rate, else a forwarder's core, else waits."""
        d = self.drained
        busy = d.machine_cores / cores
        if busy >= 0.9:
            others = max(0.0, d.machine_cores - self.ours)
            return (
                f"machine: {cores} cores {busy:.0%} busy ({self.ours:.2f} this run's, "
                f"{others:.2f} other work); at {self.cost_us:.0f} µs a message, {cores} "
                f"cores alone carry about {cores / self.cost_us * 1e6:,.0f} msg/s"
            )
        if self.rate >= 0.8 * self.raw:
            return f"broker ({self.rate / self.raw:.2f} x its raw client's rate)"
        if self.rate >= 0.8 * self.alone:
            return f"database ({self.rate / self.alone:.0%} of the store alone)"
        if max(d.forwarder_cores, default=0.0) >= 0.9:
            return "a forwarder's core"
        return f"none saturated (machine {busy:.0%} busy): waits"


def scaling(
    pair: Any, forwarders: Sequence[int], rows: int, tmp: Path, targets: Sequence[str]
) -> list[ScalingRun]:
    """1, 2 and 4 forwarders (``forwarders``) from the shared outbox to each of
    ``targets``: RabbitMQ (``rabbitmq1``: 1 node, ``rabbitmq3``: 3 nodes; a quorum
    queue) and Kafka (``kafka3``: (3 nodes, a topic of 8 partitions replicated 3 times,
    ``acks=all``), ``rows`` rows each; the raw client's rate of the same count and the
    store's own drain rate beside, both measured in the same run."""
    from benchmarks.bench_kafka import run_raw as kafka_raw
    from benchmarks.bench_rabbitmq import _declare, bench_raw_pipelined
    from msgsafe.cluster.kafka import KafkaCluster
    from msgsafe.cluster.rabbitmq import RabbitCluster

    url = pair.url
    runs: list[ScalingRun] = []

    def measure(
        name: str, broker: str, options: list[str], fresh: Any, raw: Any, nodes: list[int]
    ) -> None:
        busy0, at0 = _busy_cores()[0], time.monotonic()
        rate_raw = raw(fresh(), rows)
        raw_machine = (_busy_cores()[0] - busy0) / (time.monotonic() - at0)
        alone = store_alone(url, rows)
        print(f"  scaling: {name}: raw {rate_raw:,.0f}, store alone {alone:,.0f}", file=sys.stderr)
        for n in forwarders:
            table = f"bench_scale_{uuid.uuid4().hex[:8]}"
            load(url, table, rows, fresh(), broker)
            groups: dict[str, int | None] = {"primary": pair.pids[0], "standby": pair.pids[1]}
            groups.update({f"broker {i}": pid for i, pid in enumerate(nodes)})
            got = forward_sampled(url, table, broker, options, n, rows, groups)
            runs.append(ScalingRun(name, n, got, rate_raw, raw_machine, alone))
            print(f"  scaling: {name}, {n} forwarder(s): {got}", file=sys.stderr)

    for size in (1, 3):
        if f"rabbitmq{size}" not in targets:
            continue
        rabbit = RabbitCluster(size=size, dir=tmp / f"rabbit{size}")
        rabbit.start()
        try:
            first_node = rabbit.node_url(0)

            def queue(node: str = first_node) -> str:
                name = f"bench-scale-{uuid.uuid4().hex[:6]}"
                _declare(node, name)
                return name

            measure(
                f"RabbitMQ ({size} node{'s' if size > 1 else ''}, quorum queue)",
                rabbit.cluster_url() if size > 1 else first_node,
                ["declare=quorum"],
                queue,
                lambda dest, n, node=first_node: bench_raw_pipelined(node, dest, n),
                [pid for pid in (rabbit.pid(i) for i in range(size)) if pid is not None],
            )
        finally:
            rabbit.stop()
    if "kafka3" not in targets:
        return runs
    kafka = KafkaCluster(nodes=3, dir=tmp / "kafka3")
    kafka.start()
    try:

        def topic() -> str:
            name = f"bench-scale-{uuid.uuid4().hex[:6]}"
            kafka.create_topic(name, partitions=8, replication=3)
            return name

        measure(
            "Kafka (3 nodes, 8 partitions, replication 3)",
            kafka.url,
            [],
            topic,
            lambda dest, n: kafka_raw(kafka.bootstrap, dest, n, ids=True)[0],
            [pid for pid in kafka.pids if pid is not None],
        )
    finally:
        kafka.stop()
    return runs


def scaling_report(runs: Sequence[ScalingRun], rows: int, header: str) -> str:
    """The ``## PostgreSQL outbox: forwarder scaling`` section's command, header and
    table (the notes below the table are kept by hand in the README)."""
    cores = os.cpu_count() or 1
    lines = [
        "## PostgreSQL outbox: forwarder scaling",
        "",
        "`flock /tmp/msgsafe-bench.lock python3 benchmarks/bench_pg_outbox.py --scaling "
        f"--forward-rows {rows}`",
        "",
        header,
        "",
        f"{rows:,} rows on {KEYS} keys per run, loaded first; the forwarders (`msgsafe "
        "outbox forward --until-empty`) are all started and waiting on the table before "
        "the first row may go, and the rate runs from then to the table empty (start "
        "CPU: each forwarder's CPU seconds before that, its interpreter, imports and "
        "connections). CPU in "
        "cores over the drain (1.0 = one core busy throughout), from /proc: each "
        "forwarder process; their PostgreSQL backends; the rest of the primary and the "
        "synchronous standby (every process of each); the broker's nodes (each JVM or "
        "Erlang VM with its children); this benchmark; their sum, this run's CPU, and "
        "what it costs per message; the whole machine's busy share "
        "from /proc/stat, other users' work included. Commits per second from "
        "`pg_stat_database.xact_commit`. In the same run, before the drains: the broker's "
        "raw client (pika with publisher confirms / confluent-kafka with `acks=all`, the "
        "same count) and the store alone (one claimer claiming 2,000 rows and deleting "
        "them, no broker).",
        "",
        "| broker | forwarders | msg/s | x 1 | drain s | start CPU s each | CPU each forwarder "
        "| their backends | "
        "primary rest / standby | broker nodes | benchmark | this run's CPU (µs a message) "
        "| machine busy | commits/s | "
        "raw client msg/s (machine busy) | store alone msg/s | limit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base: dict[str, float] = {}
    for r in runs:
        d = r.drained
        base.setdefault(r.broker, r.rate)
        each = ", ".join(f"{c:.2f}" for c in d.forwarder_cores)
        start = ", ".join(f"{c:.2f}" for c in d.start_cpu)
        nodes = " + ".join(f"{v:.2f}" for k, v in d.cores.items() if k.startswith("broker"))
        lines.append(
            f"| {r.broker} | {r.forwarders} | {r.rate:,.0f} | {r.rate / base[r.broker]:.2f} "
            f"| {d.seconds:.1f} | {start} | {each} | {d.cores['backends']:.2f} | "
            f"{d.cores.get('primary', 0):.2f} / "
            f"{d.cores.get('standby', 0):.2f} | {nodes} | {d.cores['bench']:.2f} | "
            f"{r.ours:.2f} ({r.cost_us:.0f}) | "
            f"{d.machine_cores:.2f} of {cores} ({d.machine_cores / cores:.0%}) | "
            f"{d.commits:,.0f} | {r.raw:,.0f} ({r.raw_machine / cores:.0%}) | "
            f"{r.alone:,.0f} | {r.limit(cores)} |"
        )
    return "\n".join(lines) + "\n"


# --- 3. bloat -------------------------------------------------------------------------------


def sizes(url: str, table: str) -> dict[str, int]:
    """Bytes of the table (heap), its indexes, and its dead tuples as counted."""
    import psycopg

    with psycopg.connect(url) as conn:
        heap, index = conn.execute(
            "SELECT pg_relation_size(%s::regclass), pg_indexes_size(%s::regclass)",
            (table, table),
        ).fetchone() or (0, 0)
        dead = conn.execute(
            "SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relname = %s",
            (table,),
        ).fetchone()
    return {"heap": int(heap), "index": int(index), "dead": int(dead[0]) if dead else 0}


def bloat(url: str, broker: str, rows: int) -> dict[str, Any]:
    """Put and forward ``rows`` rows in chunks of 50k (the backlog a forwarder sees), then
    the sizes; then after a VACUUM."""
    import psycopg

    table = f"bench_bloat_{uuid.uuid4().hex[:8]}"
    queue = f"bench-bloat-{uuid.uuid4().hex[:6]}"
    chunk = 50_000
    forwarded = 0
    started = time.monotonic()
    peak = {"heap": 0, "index": 0}
    while forwarded < rows:
        n = min(chunk, rows - forwarded)
        fill(url, table, n, queue, broker)
        full = sizes(url, table)
        peak = {k: max(peak[k], full[k]) for k in peak}
        forward(url, table, broker, 2, n)
        forwarded += n
        print(f"  bloat: {forwarded:,} of {rows:,} forwarded", file=sys.stderr)
    after = sizes(url, table)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"VACUUM {table}")
    vacuumed = sizes(url, table)
    return {
        "rows": rows,
        "seconds": time.monotonic() - started,
        "peak": peak,
        "after": after,
        "vacuumed": vacuumed,
    }


# --- 4. backlog size -----------------------------------------------------------------------

#: The queries a claim, a stats question and a delivery run, explained on each backlog.
EXPLAINED = ("keys", "claim", "claim, no key free", "stats", "delivered")


def load(url: str, table: str, rows: int, queue: str, target: str, sample: int = 1000) -> None:
    """``rows`` messages on 64 keys in ``table``: the first ``sample`` put through
    ``PostgresOutbox.put`` (the store's own path), the rest written by the server in one
    INSERT ... SELECT of the same columns (the same row shape: id, key k0..k63, a body
    of 100 bytes, no headers), then ANALYZE."""
    import psycopg

    from msgsafe.outbox import PostgresOutbox

    sample = min(sample, rows)
    store = PostgresOutbox.from_url(f"{url}&table={table}", target=target)
    try:
        for start in range(0, sample, 1000):
            store.put(_envelopes(min(1000, sample - start), queue))
        conninfo = store._conninfo
    finally:
        store.close()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {table} (id, target, destination, key, headers, body, created_at,"
            " size) SELECT %s || i, %s, %s, convert_to('k' || (i %% %s), 'UTF8'), NULL,"
            " convert_to(repeat('x', %s), 'UTF8'), extract(epoch FROM clock_timestamp()), %s"
            " FROM generate_series(1, %s) AS i",
            (f"{table}-", target, queue, KEYS, len(BODY), len(BODY), rows - sample),
        )
        conn.execute(f"ANALYZE {table}")


def explain(url: str, table: str) -> dict[str, tuple[float, int]]:
    """(milliseconds, buffers touched) of each query of :data:`EXPLAINED` on ``table``
    as ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` reports it, each in a transaction
    rolled back (the claim's leases are not kept)."""
    import psycopg

    from msgsafe.outbox import PostgresOutbox

    store = PostgresOutbox.from_url(f"{url}&table={table}")
    sql, conninfo = store._sql, store._conninfo
    store.close()
    now = time.time()
    found: dict[str, tuple[float, int]] = {}
    with psycopg.connect(conninfo) as conn:
        keys = [
            bytes(r[0])
            for r in conn.execute(sql["keys"], {"now": now, "scan": 10_000, "keys": 16, "after": 0})
        ]
        conn.rollback()
        first = conn.execute(f"SELECT id FROM {table} ORDER BY seq LIMIT 100").fetchall()
        conn.rollback()
        claim = {"now": now, "until": now + 10, "limit": 1000}
        asked: dict[str, tuple[str, Any]] = {
            "keys": (sql["keys"], {"now": now, "scan": 10_000, "keys": 16, "after": 0}),
            "claim": (sql["claim_keys"], {**claim, "keys": keys, "per_key": 63}),
            "claim, no key free": (sql["claim_keys"], {**claim, "keys": [], "per_key": 1000}),
            "stats": (sql["stats"], (100_001,)),
            "delivered": (sql["delivered"], {"ids": [r[0] for r in first], "epoch": None}),
        }
        for name, (query, params) in asked.items():
            row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params)
            plan: dict[str, Any] = (row.fetchone() or [[{}]])[0][0]
            top = plan["Plan"]
            buffers = sum(int(top.get(f"Shared {k} Blocks", 0)) for k in ("Hit", "Read", "Dirtied"))
            found[name] = (float(plan["Execution Time"]), buffers)
            conn.rollback()
    return found


def status_time(url: str, table: str) -> tuple[float, float, float, bool]:
    """Seconds of what ``outbox status`` asks the store (stats and the first row), of
    the whole command (a new process, as an operator runs it) and of its ``--help`` (the
    interpreter's start and imports, no database), and whether the depth it showed was
    estimated."""
    from msgsafe.outbox import PostgresOutbox

    store = PostgresOutbox.from_url(f"{url}&table={table}")
    try:
        t0 = time.perf_counter()
        stats = store.stats()
        store.list(limit=1)
        asked = time.perf_counter() - t0
    finally:
        store.close()
    took = []
    for args in (["--help"], [f"{url}&table={table}", "--json"]):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "msgsafe", "outbox", "status", *args],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        took.append(time.perf_counter() - t0)
    return asked, took[1], took[0], stats.estimated


def forget(broker: str, queue: str) -> None:
    """Delete ``queue`` from the broker (a big backlog's messages would fill the node)."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(broker))
    try:
        conn.channel().queue_delete(queue)
    finally:
        conn.close()


def total_size(url: str, table: str) -> dict[str, int]:
    """Bytes of the table with its indexes and TOAST, and its dead tuples."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size(%s::regclass), coalesce(n_dead_tup, 0),"
            " coalesce(autovacuum_count, 0) FROM pg_stat_user_tables WHERE relname = %s",
            (table, table),
        ).fetchone() or (0, 0, 0)
    return {"total": int(row[0]), "dead": int(row[1]), "autovacuums": int(row[2])}


@dataclass
class Backlog:
    rows: int
    vacuum: str  #: the table's autovacuum reloptions ("default": the server's)
    rate: float  #: msg/s
    explained: dict[str, tuple[float, int]]
    status: tuple[float, float, float, bool]  #: store s, command s, its --help s, estimated
    before: dict[str, int]  #: sizes when full
    after: dict[str, int]  #: just drained
    settled: dict[str, int]  #: after the settle period
    settle_s: float
    drained: Drained  #: the drain's rate and the CPU of each process group over it
    more: list[Drained] = field(default_factory=list)  #: drains of the same size after it
    #: a big backlog's drains each against the median of the small drains around it
    ratios: list[float] = field(default_factory=list)

    @property
    def rates(self) -> list[float]:
        """msg/s of every drain of this size, sorted."""
        return sorted(d.rate for d in [self.drained, *self.more])

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def round_ratios(bigs: Sequence[float], gaps: Sequence[Sequence[float]]) -> list[float]:
    """Each big drain's rate over the median of the small drains just before and just
    after it: ``gaps[i]`` are the small drains before ``bigs[i]``, ``gaps[i + 1]`` those
    after it (the rounds interleave, so both sides of a ratio see the same moments of a
    shared machine)."""
    if len(gaps) != len(bigs) + 1:
        raise ValueError(f"{len(bigs)} big drains need {len(bigs) + 1} groups of small ones")
    return [big / statistics.median([*gaps[i], *gaps[i + 1]]) for i, big in enumerate(bigs)]


class Purger:
    """``--queue emptied``: the destination ``queue`` purged every :data:`PURGE_EVERY` s
    from a thread while a drain runs, so the broker holds at most a fraction of a second
    of messages whatever the backlog's size (as under a consumer that keeps up, without
    a consumer's CPU on the shared cores). The queue is declared first as the forwarder
    declares it (durable, quorum: the forwarder's declare is then a no-op). ``purged``
    counts the messages the purges removed."""

    def __init__(self, broker: str, queue: str) -> None:
        import threading

        self.broker, self.queue = broker, queue
        self.purged = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-purger", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        import pika

        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.broker))
            try:
                channel = conn.channel()
                while not self._stop.wait(PURGE_EVERY):  # the purge period
                    frame = channel.queue_purge(self.queue)
                    self.purged += int(frame.method.message_count)
                frame = channel.queue_purge(self.queue)
                self.purged += int(frame.method.message_count)
            finally:
                conn.close()
        except BaseException as exc:  # reported by __exit__
            self._error = exc

    def __enter__(self) -> Purger:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(self.broker))
        try:
            conn.channel().queue_declare(
                self.queue, durable=True, arguments={"x-queue-type": "quorum"}
            )
        finally:
            conn.close()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        if self._error is not None:
            raise RuntimeError(f"purging {self.queue}: {self._error!r}") from self._error


def drain_sampled(
    url: str,
    table: str,
    broker: str,
    rows: int,
    groups: dict[str, int | None],
    queue: str | None = None,
) -> Drained:
    """One ``msgsafe outbox forward --until-empty`` draining ``table``, started before the
    first row may go, with the CPU of ``groups`` sampled (:func:`forward_sampled`);
    ``queue`` given: that destination queue purged meanwhile (:class:`Purger`)."""
    if queue is None:
        got = forward_sampled(url, table, broker, ["declare=quorum"], 1, rows, groups)
    else:
        with Purger(broker, queue) as purger:
            got = forward_sampled(url, table, broker, ["declare=quorum"], 1, rows, groups)
        print(f"  {queue}: {purger.purged:,} messages purged", file=sys.stderr)
    per = {k: round(v / got.rate * 1e6, 1) for k, v in got.cores.items()}
    print(
        f"  drained {rows:,}: {got.rate:,.0f} msg/s, forwarder "
        f"{sum(got.forwarder_cores) / got.rate * 1e6:.1f} µs, {per}, machine "
        f"{got.machine_cores:.2f}, WAL {got.wal_per_message:,.0f} B/msg, "
        f"{got.checkpoints} checkpoints, {got.backend_writes:,} backend writes",
        file=sys.stderr,
    )
    return got


def drain_again(
    url: str,
    broker: str,
    rows: int,
    groups: dict[str, int | None],
    *,
    vacuum: str = "default",
    emptied: bool = False,
) -> Drained:
    """A further drain of a fresh ``rows``-row backlog: loaded, drained, its queue gone."""
    import psycopg

    table = f"bench_backlog_{uuid.uuid4().hex[:8]}"
    queue = f"bench-backlog-{uuid.uuid4().hex[:6]}"
    load(url, table, rows, queue, broker)
    if vacuum != "default":
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} SET ({vacuum})")
    got = drain_sampled(url, table, broker, rows, groups, queue if emptied else None)
    forget(broker, queue)
    drop(url, table)
    print(f"  backlog {rows:,} again: {got.rate:,.0f} msg/s", file=sys.stderr)
    return got


def drop(url: str, table: str) -> None:
    """Drop a drained backlog's table (the next ones start on a database as small)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def backlog(
    url: str,
    broker: str,
    rows: int,
    vacuum: str,
    settle_s: float,
    groups: dict[str, int | None] | None = None,
    *,
    emptied: bool = False,
) -> Backlog:
    """Load ``rows``, explain the queries, time the status, drain with one forwarder
    (the CPU of ``groups`` sampled; ``emptied``: the destination queue purged meanwhile),
    and measure the sizes before, right after and ``settle_s`` after the drain."""
    import psycopg

    table = f"bench_backlog_{uuid.uuid4().hex[:8]}"
    queue = f"bench-backlog-{uuid.uuid4().hex[:6]}"
    load(url, table, rows, queue, broker)
    if vacuum != "default":
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} SET ({vacuum})")
    explained = explain(url, table)
    status = status_time(url, table)
    before = total_size(url, table)
    drained = drain_sampled(url, table, broker, rows, groups or {}, queue if emptied else None)
    rate = drained.rate
    forget(broker, queue)
    after = total_size(url, table)
    time.sleep(settle_s)  # the figure is what autovacuum did in this period
    settled = total_size(url, table)
    drop(url, table)
    print(
        f"  backlog {rows:,} ({vacuum}): {rate:,.0f} msg/s, total "
        f"{_mib(before['total'])} -> {_mib(after['total'])} -> {_mib(settled['total'])}, "
        f"dead {after['dead']:,} -> {settled['dead']:,}",
        file=sys.stderr,
    )
    return Backlog(rows, vacuum, rate, explained, status, before, after, settled, settle_s, drained)


def backlog_lines(results: list[Backlog]) -> list[str]:
    """The README rows of the backlog part."""
    if not results:
        return []
    small = results[0]
    lines = []
    for r in results:
        if len(r.rates) > 1:
            value = (
                f"median {r.median:,.0f} msg/s of {len(r.rates)} drains ("
                + ", ".join(f"{x:,.0f}" for x in r.rates)
                + ")"
            )
        else:
            value = f"{r.rate:,.0f} msg/s"
        if r is not small and r.ratios:
            ratios = sorted(r.ratios)
            value += (
                f" = {statistics.median(ratios):.2f} x the {small.rows:,}-row drains around "
                "each (the median of the per-round ratios"
                + (": " + ", ".join(f"{x:.2f}" for x in ratios) if len(ratios) > 1 else "")
                + f"); {r.median / small.median:.2f} median to median"
            )
        elif r is not small:
            value += f" = {r.rate / small.median:.2f} x the {small.rows:,}-row backlog"
            if len(small.rates) > 1:
                value += "'s median"
        lines.append(
            f"| drain of {r.rows:,} rows ({KEYS} keys), 1 forwarder to RabbitMQ, autovacuum "
            f"{r.vacuum} | {value} | >= 0.9 |"
        )
    for r in results:
        runs = [r.drained, *r.more]
        d = sorted(runs, key=lambda x: x.rate)[len(runs) // 2]  # the median run
        per = {
            "the forwarder": sum(d.forwarder_cores),
            "its backend": d.cores.get("backends", 0.0),
            "the rest of the primary": d.cores.get("primary", 0.0),
            "the standby": d.cores.get("standby", 0.0),
            "RabbitMQ": d.cores.get("broker 0", 0.0),
            "this benchmark": d.cores.get("bench", 0.0),
        }
        cost = ", ".join(f"{k} {v / d.rate * 1e6:.1f}" for k, v in per.items())
        lines.append(
            f"| CPU µs per message, drain of {r.rows:,} rows ({r.vacuum})"
            + (" (its median run)" if len(runs) > 1 else "")
            + f" | {cost}; all {sum(per.values()) / d.rate * 1e6:.1f}; machine busy "
            f"{d.machine_cores:.2f} of {os.cpu_count()} cores over {d.seconds:.1f} s; WAL "
            f"{d.wal_per_message:,.0f} bytes a message, {d.checkpoints} checkpoint(s), "
            f"{d.backend_writes:,} buffers written by backends | |"
        )
    for r in results:
        queries = ", ".join(
            f"{n} {ms:.1f} ms / {b:,} buffers" for n, (ms, b) in r.explained.items()
        )
        lines.append(f"| EXPLAIN ANALYZE on {r.rows:,} rows ({r.vacuum}) | {queries} | flat |")
    for r in results:
        asked, whole, start, estimated = r.status
        lines.append(
            f"| outbox status on {r.rows:,} rows ({r.vacuum}) | store {asked * 1000:.0f} ms, "
            f"whole command {whole:.2f} s (its --help alone: {start:.2f} s), waiting "
            f"{'estimated' if estimated else 'exact'} | < 1 s |"
        )
    for r in results:
        lines.append(
            f"| {r.rows:,} rows ({r.vacuum}): total size full / drained / "
            f"{r.settle_s:.0f} s later; dead "
            f"tuples drained / later; autovacuums | {_mib(r.before['total'])} / "
            f"{_mib(r.after['total'])} / {_mib(r.settled['total'])}; {r.after['dead']:,} / "
            f"{r.settled['dead']:,}; {r.settled['autovacuums']} | bounded |"
        )
    return lines


@contextlib.contextmanager
def pg_settings(items: Sequence[str]) -> Iterator[None]:
    """``msgsafe cluster``'s postgresql.conf settings with ``items`` (``NAME=VALUE``)
    added or replaced while a cluster is made, as they were after."""
    from msgsafe.cluster import postgres

    kept = dict(postgres._SETTINGS)
    for item in items:
        name, value = item.split("=", 1)
        postgres._SETTINGS[name] = value
    try:
        yield
    finally:
        postgres._SETTINGS.clear()
        postgres._SETTINGS.update(kept)


def backlog_rounds(
    url: str, broker: str, pids: Sequence[int | None], rabbit: Any, args: argparse.Namespace
) -> list[Backlog]:
    """The backlog part: ``--small-runs`` drains of the small backlog, then for each
    ``--vacuum`` setting ``--big-runs`` rounds of one big drain followed by
    ``--small-runs`` small ones (the first drain of each size with its EXPLAINs, status
    time and sizes); each big drain's ratio is to the small drains just before and just
    after it (:func:`round_ratios`)."""
    small, big = args.backlog
    emptied = args.queue == "emptied"
    groups: dict[str, int | None] = {
        "primary": pids[0],
        "standby": pids[1] if len(pids) > 1 else None,
        "broker 0": rabbit.pid(0) if rabbit is not None else None,
    }
    first = backlog(url, broker, small, "default", args.settle, groups, emptied=emptied)
    found = [first]
    gap = [first.drained] + [
        drain_again(url, broker, small, groups, emptied=emptied) for _ in range(args.small_runs - 1)
    ]
    first.more.extend(gap[1:])
    for vacuum in args.vacuum or ["default"]:
        gaps, bigs = [[d.rate for d in gap]], []
        big_one: Backlog | None = None
        for _ in range(args.big_runs):
            if big_one is None:
                big_one = backlog(url, broker, big, vacuum, args.settle, groups, emptied=emptied)
                bigs.append(big_one.rate)
            else:
                got = drain_again(url, broker, big, groups, vacuum=vacuum, emptied=emptied)
                big_one.more.append(got)
                bigs.append(got.rate)
            gap = [
                drain_again(url, broker, small, groups, emptied=emptied)
                for _ in range(args.small_runs)
            ]
            first.more.extend(gap)
            gaps.append([d.rate for d in gap])
        assert big_one is not None  # --big-runs >= 1
        big_one.ratios = round_ratios(bigs, gaps)
        print(f"  backlog {big:,} ({vacuum}): ratios {big_one.ratios}", file=sys.stderr)
        found.append(big_one)
    return found


# --- the run --------------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def report(
    put_results: list[PutResult],
    rates: dict[int, float],
    starting: dict[int, float],
    bloated: dict[str, Any] | None,
    args: argparse.Namespace,
    header: str,
) -> str:
    """The README section's body: the table of figures."""
    lines = [header, "", "| figure | value | goal |", "|---|---|---|"]
    for r in put_results:
        what = "1 message per commit" if r.batch == 1 else f"batches of {r.batch}"
        lines.append(
            f"| put, {what}: PostgresOutbox / bare psycopg | {r.store:,.0f} / {r.bare:,.0f} "
            f"msg/s = {r.ratio:.2f} (slice pairs: median {r.pairs[len(r.pairs) // 2]:.2f}, "
            f"range {r.pairs[0]:.2f} to {r.pairs[-1]:.2f}) | >= 0.8 |"
        )
    base, base_starting = rates.get(1), starting.get(1)
    for n, rate in sorted(rates.items()):
        scale = f" ({rate / base:.2f} x 1 forwarder)" if base and n != 1 else ""
        also = starting.get(n)
        if also is not None:
            scale += (
                f"; counted from the first row gone, the later ones starting meanwhile: "
                f"{also:,.0f} msg/s"
                + (f" ({also / base_starting:.2f} x 1)" if base_starting and n != 1 else "")
            )
        lines.append(
            f"| forwarding, {n} forwarder process(es), {KEYS} keys, {args.forward_rows:,} rows "
            f"to RabbitMQ (1 node, quorum queue), all started first | {rate:,.0f} msg/s{scale}"
            " | |"
        )
    if bloated is not None:
        peak, after, vac = bloated["peak"], bloated["after"], bloated["vacuumed"]
        lines += [
            f"| largest backlog (50k rows): table / indexes | {_mib(peak['heap'])} / "
            f"{_mib(peak['index'])} | |",
            f"| after {bloated['rows']:,} rows put and forwarded ({bloated['seconds']:.0f} s), "
            f"empty: table / indexes / dead tuples | {_mib(after['heap'])} / "
            f"{_mib(after['index'])} / {after['dead']:,} | |",
            f"| the same after VACUUM | {_mib(vac['heap'])} / {_mib(vac['index'])} / "
            f"{vac['dead']:,} | |",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.scaling:
        scaling_main(args)
        return
    parts = set(args.only or PARTS)
    from msgsafe.cluster.postgres import PostgresCluster, postgres_bin
    from msgsafe.cluster.rabbitmq import RabbitCluster

    load = os.getloadavg()[0]
    started = time.gmtime()
    with tempfile.TemporaryDirectory(prefix="bench-pg-") as tmp:
        pair = PostgresCluster(nodes=args.pg_nodes, dir=Path(tmp) / "pg")
        rabbit: RabbitCluster | None = None
        with pg_settings(args.pg_set):
            pair.start()
        try:
            url = pair.url
            if args.naptime:
                import psycopg
                from psycopg import sql

                # The superuser's login (ALTER SYSTEM): the cluster's own.
                admin = pair._conninfo(pair.primary)
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(
                        sql.SQL("ALTER SYSTEM SET autovacuum_naptime = {}").format(
                            sql.Literal(args.naptime)
                        )
                    )
                    conn.execute("SELECT pg_reload_conf()")
            put_results = (
                [puts(url, b, args.seconds) for b in (1, 100, 1000)] if "put" in parts else []
            )
            rates: dict[int, float] = {}
            starting: dict[int, float] = {}  #: counted from the first row gone
            bloated = None
            backlogs: list[Backlog] = []
            if parts & {"forward", "bloat", "backlog"}:
                rabbit = RabbitCluster(size=1, dir=Path(tmp) / "rabbit")
                rabbit.start()
                broker = rabbit.node_url(0)
            if "forward" in parts:
                for n in args.forwarders:
                    for gated in (False, True):
                        table = f"bench_fwd_{uuid.uuid4().hex[:8]}"
                        fill(url, table, args.forward_rows, f"bench-{n}-{table}", broker)
                        got = forward_sampled(
                            url,
                            table,
                            broker,
                            ["declare=quorum"],
                            n,
                            args.forward_rows,
                            gated=gated,
                        )
                        (rates if gated else starting)[n] = got.rate
                        print(f"  {n} forwarder(s), gated {gated}: {got}", file=sys.stderr)
            if "bloat" in parts:
                bloated = bloat(url, broker, args.bloat)
            if "backlog" in parts:
                backlogs = backlog_rounds(url, broker, pair.pids, rabbit, args)
        finally:
            if rabbit is not None:
                rabbit.stop()
            pair.stop()
            pair.delete_data()  # data kept outside tmp (run as root) goes too
    load_end = os.getloadavg()[0]
    header = (
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', started)} on {os.cpu_count()} cores, "
        f"load average {load:.1f} at the start and {load_end:.1f} at the end (the machine is "
        f"shared), PostgreSQL {postgres_bin().parent.parent.name} ("
        + (
            "primary + synchronous standby on the same machine"
            if args.pg_nodes == 2
            else "the primary alone, no standby"
        )
        + f"), Python {sys.version.split()[0]}"
        + (f", autovacuum_naptime {args.naptime}" if args.naptime else "")
        + (f", {', '.join(args.pg_set)}" if args.pg_set else "")
        + (
            f"; the backlog part's destination queue purged every {PURGE_EVERY} s during "
            "each drain."
            if "backlog" in parts and args.queue == "emptied"
            else "."
        )
    )
    text = report(put_results, rates, starting, bloated, args, header)
    if backlogs:
        text += "\n" + "\n".join(backlog_lines(backlogs))
    print(text)
    if args.readme is not None:
        update_readme(args.readme, text)


def scaling_main(args: argparse.Namespace) -> None:
    """``--scaling``: the forwarder scaling table alone (see :func:`scaling`)."""
    from msgsafe.cluster.postgres import PostgresCluster, postgres_bin

    load = os.getloadavg()[0]
    started = time.gmtime()
    with tempfile.TemporaryDirectory(prefix="bench-pg-") as tmp:
        pair = PostgresCluster(nodes=2, dir=Path(tmp) / "pg")
        pair.start()
        try:
            runs = scaling(pair, args.forwarders, args.forward_rows, Path(tmp), args.targets)
        finally:
            pair.stop()
            pair.delete_data()  # data kept outside tmp (run as root) goes too
    header = (
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', started)} on {os.cpu_count()} cores, "
        f"load average {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end (the "
        f"machine is shared), PostgreSQL {postgres_bin().parent.parent.name} (primary + "
        f"synchronous standby on the same machine), Python {sys.version.split()[0]}."
    )
    text = scaling_report(runs, args.forward_rows, header)
    print(text)
    if args.readme is not None:
        replace_section(args.readme, text)


def update_readme(path: Path, body: str) -> None:
    """Replace the ``## PostgreSQL outbox`` section of ``path`` (created if missing)."""
    replace_section(
        path,
        "## PostgreSQL outbox\n\n`flock /tmp/msgsafe-bench.lock python3 "
        "benchmarks/bench_pg_outbox.py --readme benchmarks/README.md`\n\n" + body + "\n",
    )


if __name__ == "__main__":
    main()

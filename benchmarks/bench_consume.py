"""Consuming: msgsafe against the raw clients' at-least-once loops, side by side in one run.

    flock /tmp/msgsafe-bench.lock python3 benchmarks/bench_consume.py
        [--only kafka|rabbitmq|amqp10|inbox|pg-inbox] [--rounds 3] [--messages 200000]
        [--rabbit-messages 50000] [--url kafka://...|amqp://...|amqp10://...] [--profile 50000]
        [--readme benchmarks/README.md]

Every variant reads messages that msgsafe's own producer wrote (100-byte bodies, 16
keys in turn, each with its ``msgsafe-id``), on one real broker node per protocol
started here through ``msgsafe.cluster`` (``--url`` names a running one instead):

- **Kafka** (``KafkaCluster(nodes=1)``, one topic of 3 partitions filled once with
  ``--messages`` messages; every run reads all of it as a new consumer group):

  - ``raw``: ``confluent_kafka.Consumer`` with ``enable.auto.commit=true`` and
    ``enable.auto.offset.store=false``; ``consume(500, 1.0)``, then per message
    ``error()``, ``value()`` and ``store_offsets(message)``: the hand-written
    at-least-once loop (an offset is stored once its message is processed).
  - ``poll+ack``: ``msgsafe.Consumer(url, group=g)``; ``poll(1.0, max_messages=500)``,
    ``ack()`` per delivery.
  - ``dedup``: the same with ``dedup=True``.
  - ``run x4``: ``Consumer.run(handler, concurrency=4)`` with a handler that only
    counts (and stops the run at the last message).
  - ``floor``: the raw loop with one slotted object per message (its ``value()`` read)
    whose ``ack()`` stores the offset: the least any API handing out delivery objects
    does per message. ``floor x4``: the raw loop putting every message on a
    ``queue.SimpleQueue`` that 4 threads read (each stores the offset and counts under
    a lock): the least a run() of worker threads does. Not goals: the limits the goals
    are read against where they are not met. Both floors take msgsafe's consumer
    setting ``fetch.queue.backoff.ms=20`` (see ``msgsafe.adapters.kafka.config``): with
    librdkafka's 1000 ms a loop that falls behind the fetch stalls for up to a second.

- **RabbitMQ** (``RabbitCluster(nodes=1)``, a durable quorum queue per run, filled with
  ``--rabbit-messages`` messages before the run):

  - ``raw``: pika ``BlockingConnection``, ``basic_qos(prefetch_count=500)``,
    ``basic_consume`` with a callback that acks each message (``basic_ack(tag)``),
    ``process_data_events`` until every message came.
  - ``poll+ack``: ``msgsafe.Consumer(url, prefetch=500)``, ``poll(1.0,
    max_messages=500)``, ``ack()`` per delivery; ``dedup`` and ``run x4`` as for Kafka.

- **AMQP 1.0** (``ArtemisCluster()``: the primary of an Artemis primary/backup pair with
  replication, the only shape ``msgsafe.cluster`` starts; an anycast queue per run,
  filled with ``--rabbit-messages`` messages):

  - ``raw``: a proton ``Container`` running a ``MessagingHandler(prefetch=500,
    auto_accept=False)`` whose ``on_message`` reads the body and accepts the delivery:
    the same credit window as msgsafe's.
  - ``poll+ack``: ``msgsafe.Consumer(url, credit=500)``, ``poll`` + ``ack()`` as above.
  - ``floor`` (not a goal): the raw receiver on a thread of its own handing each
    message to the caller's thread, which hands them back in batches to be accepted on
    proton's thread: the least any ``poll`` on the application's thread does there.

- **The inbox** (``inbox``: SQLite, each run a new database file in a temporary
  directory, WAL and ``synchronous=FULL`` on both sides; ``pg-inbox``: PostgreSQL, one
  node started through ``PostgresCluster(nodes=1)``, psycopg in autocommit sending
  ``BEGIN`` ... ``COMMIT``; both on RabbitMQ as above):

  - ``raw``: msgsafe's ``poll`` + ``ack()`` with the inbox written by hand in bare
    sqlite3: per message ``BEGIN IMMEDIATE``, the id into a table under a primary key
    (``ON CONFLICT DO NOTHING RETURNING``), the effect's row, ``COMMIT``, ``ack()``.
  - ``run``: ``Consumer.run(handler, inbox="sqlite:///...")``, the handler inserting
    the effect's row through ``tx``. The two differ by the inbox alone: the consumer's
    own cost against pika is the RabbitMQ rows. A quorum queue counts no first
    delivery, so ``run`` also counts each handler call durably in the inbox (a
    transaction of its own before the handler's): ``raw+count`` is ``raw`` doing that
    too (the same two commits), and ``run mem`` is ``run`` with
    ``attempts=AttemptMemory()`` (the same one commit as ``raw``). ``poll+process``:
    ``raw``'s loop calling msgsafe's SQLite inbox (``process(id, work)``) instead of
    its own SQL: the store's share without run()'s threads (not a goal).
  - ``batch``: ``run(handler, inbox=..., batch=BatchPolicy(max_messages=500))``, the
    handler taking a list and inserting each delivery's effect through ``tx``: one
    transaction per batch. ``raw batch``: ``raw``'s loop committing each poll's messages
    in one transaction written by hand with the statements msgsafe's inbox sends (the
    ids in one ``INSERT ... RETURNING``, each new one's effect, ``COMMIT``), then
    ``ack()`` each; ``raw batch+count`` adds the batch's attempt counts as msgsafe keeps
    them (one statement, a commit of its own) and ``batch mem`` is ``batch`` with
    ``attempts=AttemptMemory()``: the same pairs as above, a batch at a time.

The clocks of a run start at its first message (joining a group or opening a channel is
not counted) and stop when its last message was settled; every run must see every
message of its source. Variants take turns by round (in order, then reversed); per
round a variant's ratio is its wall-clock rate over raw's in the same round, and a goal
is read on the median of the rounds. CPU is ``time.process_time()`` of this process
(every thread: the clients' I/O threads and librdkafka's included) per message.

``--profile N``: after the rounds, ``poll+ack`` and ``dedup`` read ``N`` messages under
:mod:`cProfile` (one profiler per thread, each on its thread's CPU clock) and the table
printed says where the CPU goes per message.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._readme import replace_section
from benchmarks.bench_send import (
    Result,
    Tally,
    ThreadProfiles,
    declare_quorum_queue,
    goal_lines,
    print_profile,
    tables,
    urls_by_protocol,
)

BODY = b"x" * 100
KEYS = [f"key-{i}".encode() for i in range(16)]
PROTOCOLS = ("kafka", "rabbitmq", "amqp10", "inbox", "pg-inbox")
TITLE = "## Consuming"
BATCH = 500
WORKERS = 4

#: The inbox's protocol (its --only name) and label by database; both read RabbitMQ.
INBOXES = {"sqlite": ("inbox", "SQLite"), "postgres": ("pg-inbox", "PostgreSQL")}


def inbox_goals(database: str) -> tuple[tuple[str, str, str, float, str], ...]:
    protocol, label = INBOXES[database]
    bare = "bare sqlite3" if database == "sqlite" else "bare psycopg"
    return (
        (
            protocol,
            "run",
            "raw+count",
            0.9,
            f"{label} inbox `run(handler, inbox=...)` / {bare}, the same two commits",
        ),
        (
            protocol,
            "run mem",
            "raw",
            0.9,
            f"{label} inbox, attempts counted in memory / {bare}, the same one commit",
        ),
        (
            protocol,
            "poll+process",
            "raw",
            0.0,
            f"{label} inbox's `process()` in the poll loop / {bare}, one commit",
        ),
        (protocol, "run mem", "poll+process", 0.0, f"{label} inbox, attempts in memory / that"),
        (protocol, "run", "raw", 0.0, f"{label} inbox `run(handler, inbox=...)` / {bare}"),
        (
            protocol,
            "batch",
            "raw batch+count",
            0.9,
            f"{label} inbox `run(..., batch=BatchPolicy({BATCH}))` / {bare}, the same two"
            " commits a batch",
        ),
        (
            protocol,
            "batch mem",
            "raw batch",
            0.9,
            f"{label} inbox batches, attempts counted in memory / {bare}, the same one commit"
            " a batch",
        ),
        (
            protocol,
            "batch",
            "run",
            0.0,
            f"{label} inbox `run(..., batch=...)` / `run(handler, inbox=...)`",
        ),
    )


def inbox_loops(database: str) -> dict[tuple[str, str], str]:
    protocol = INBOXES[database][0]
    if database == "sqlite":
        url, bare = "sqlite:///...", "bare sqlite3 (WAL, synchronous=FULL): BEGIN IMMEDIATE"
    else:
        url, bare = "postgresql://...", "bare psycopg (autocommit, one statement a call): BEGIN"
    return {
        (protocol, "raw"): (
            f"msgsafe.Consumer(prefetch={BATCH}).poll(1.0, max_messages={BATCH}); per "
            f"message {bare}, INSERT the id (primary key, ON CONFLICT DO NOTHING RETURNING), "
            "INSERT the effect, COMMIT; then ack()"
        ),
        (protocol, "raw+count"): (
            "the same, and before each transaction the inbox's durable attempt count as "
            "msgsafe keeps it where the broker counts no first delivery: SELECT the id, "
            "BEGIN, INSERT ... ON CONFLICT DO UPDATE attempts + 1 RETURNING, COMMIT"
        ),
        (protocol, "run"): (
            f"msgsafe.Consumer(prefetch={BATCH}).run(handler, inbox='{url}'); the "
            "handler INSERTs the effect through tx"
        ),
        (protocol, "poll+process"): (
            f"msgsafe.Consumer(prefetch={BATCH}).poll(1.0, max_messages={BATCH}); per "
            f"message open_inbox('{url}').process(id, work) (work INSERTs the effect), "
            "then ack()"
        ),
        (protocol, "run mem"): (
            f"msgsafe.Consumer(prefetch={BATCH}, attempts=AttemptMemory()).run(handler, "
            f"inbox='{url}'): attempts counted in memory, not in the inbox"
        ),
        (protocol, "raw batch"): (
            f"msgsafe.Consumer(prefetch={BATCH}).poll(1.0, max_messages={BATCH}); per poll "
            f"{bare}, INSERT the ids (one statement, ON CONFLICT DO NOTHING RETURNING), "
            "INSERT each new one's effect, COMMIT; then ack() each"
        ),
        (protocol, "raw batch+count"): (
            "the same, and before each transaction the batch's durable attempt counts as "
            "msgsafe keeps them: BEGIN, one INSERT ... SELECT the ids not handled ... ON "
            "CONFLICT DO UPDATE attempts + 1 RETURNING, COMMIT; the counters DELETEd in the "
            "batch's transaction"
        ),
        (protocol, "batch"): (
            f"msgsafe.Consumer(prefetch={BATCH}).run(handler, inbox='{url}', "
            f"batch=BatchPolicy(max_messages={BATCH})); the handler INSERTs each delivery's "
            "effect through tx"
        ),
        (protocol, "batch mem"): (
            f"the same with msgsafe.Consumer(prefetch={BATCH}, attempts=AttemptMemory()): "
            "attempts counted in memory, not in the inbox"
        ),
    }


#: (protocol, variant compared, baseline, goal, what is compared)
GOALS: tuple[tuple[str, str, str, float, str], ...] = (
    ("kafka", "poll+ack", "raw", 0.9, "Kafka `poll` + `ack()` / raw `consume` + `store_offsets`"),
    ("kafka", "dedup", "raw", 0.8, "Kafka, the same with `dedup=True` / raw"),
    ("kafka", "run x4", "raw", 0.8, f"Kafka `run(handler, concurrency={WORKERS})`, no-op / raw"),
    # Not goals: the least an API of delivery objects, or of worker threads, can do.
    ("kafka", "floor", "raw", 0.0, "floor: a slotted object per message + `ack()` / raw"),
    ("kafka", "poll+ack", "floor", 0.0, "Kafka `poll` + `ack()` / that floor"),
    ("kafka", "floor x4", "raw", 0.0, f"floor: {WORKERS} threads fed by a `SimpleQueue` / raw"),
    (
        "kafka",
        "run x4",
        "floor x4",
        0.0,
        f"Kafka `run(handler, concurrency={WORKERS})` / that floor",
    ),
    ("rabbitmq", "poll+ack", "raw", 1.0, "RabbitMQ `poll` + `ack()` / raw pika `basic_ack`"),
    ("rabbitmq", "dedup", "raw", 0.0, "RabbitMQ, the same with `dedup=True` / raw"),
    ("rabbitmq", "run x4", "raw", 0.0, f"RabbitMQ `run(handler, concurrency={WORKERS})` / raw"),
    ("amqp10", "poll+ack", "raw", 0.9, "AMQP 1.0 `poll` + `ack()` / raw proton receiver"),
    ("amqp10", "floor", "raw", 0.0, "floor: proton's thread handing over, batches back / raw"),
    ("amqp10", "poll+ack", "floor", 0.0, "AMQP 1.0 `poll` + `ack()` / that floor"),
    *(goal for database in ("sqlite", "postgres") for goal in inbox_goals(database)),
)

#: What each variant's loop does, for the output.
LOOPS: dict[tuple[str, str], str] = {
    ("kafka", "raw"): (
        "confluent_kafka.Consumer (auto commit, enable.auto.offset.store=false); "
        f"consume({BATCH}, 1.0); per message error(), value(), store_offsets(message)"
    ),
    ("kafka", "poll+ack"): f"msgsafe.Consumer; poll(1.0, max_messages={BATCH}); ack() each",
    ("kafka", "dedup"): f"msgsafe.Consumer(dedup=True); poll(1.0, max_messages={BATCH}); ack()",
    ("kafka", "run x4"): f"msgsafe.Consumer.run(handler, concurrency={WORKERS}); no-op handler",
    ("kafka", "floor"): (
        f"the raw loop, a slotted object per message (its value() read) made for each "
        f"consume({BATCH}, 1.0), then obj.ack() each: store_offsets(message); "
        "fetch.queue.backoff.ms=20 as msgsafe's"
    ),
    ("kafka", "floor x4"): (
        f"the raw loop, every message put on a queue.SimpleQueue read by {WORKERS} threads: "
        "store_offsets(message), count under a lock; fetch.queue.backoff.ms=20 as msgsafe's"
    ),
    ("rabbitmq", "raw"): (
        f"pika.BlockingConnection; basic_qos(prefetch_count={BATCH}); basic_consume(callback "
        "calling basic_ack(tag)); process_data_events() until all came"
    ),
    ("rabbitmq", "poll+ack"): (
        f"msgsafe.Consumer(prefetch={BATCH}); poll(1.0, max_messages={BATCH}); ack() each"
    ),
    ("rabbitmq", "dedup"): (
        f"msgsafe.Consumer(prefetch={BATCH}, dedup=True); poll(1.0, max_messages={BATCH}); ack()"
    ),
    ("rabbitmq", "run x4"): (
        f"msgsafe.Consumer(prefetch={BATCH}).run(handler, concurrency={WORKERS}); no-op handler"
    ),
    ("amqp10", "raw"): (
        f"proton Container + MessagingHandler(prefetch={BATCH}, auto_accept=False); "
        "on_message reads the body, accept(delivery)"
    ),
    ("amqp10", "floor"): (
        "the raw receiver on its own thread putting (body, delivery) on a SimpleQueue; the "
        f"caller takes up to {BATCH} at a time and hands them back to be accepted on "
        "proton's thread (a deque, one EventInjector wake-up per batch)"
    ),
    ("amqp10", "poll+ack"): (
        f"msgsafe.Consumer(credit={BATCH}); poll(1.0, max_messages={BATCH}); ack() each"
    ),
    **inbox_loops("sqlite"),
    **inbox_loops("postgres"),
}


class Clock:
    """A run's clocks: started at its first message, stopped after its last settle."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.started = False

    def start(self) -> None:
        if not self.started:
            self.started = True
            self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self, count: int) -> Tally:
        return Tally(time.perf_counter() - self.wall, time.process_time() - self.cpu, count)


#: Reads ``count`` messages of a source (a topic or a queue) once; returns the run's tally.
Run = Callable[[str, int], Tally]


@dataclass
class Variant:
    name: str
    run: Run


def _check(name: str, seen: int, count: int) -> None:
    if seen != count:
        raise SystemExit(f"{name}: {seen} of {count} messages")


# --- msgsafe, on every protocol ---------------------------------------------------------


def msgsafe_poll(url: str, count: int, source: str, options: dict[str, Any]) -> Tally:
    """``poll(1.0, max_messages=BATCH)`` and ``ack()`` each, until ``count`` came."""
    import msgsafe

    with msgsafe.Consumer(url, **options) as consumer:
        consumer.subscribe(source)
        clock, seen = Clock(), 0
        poll = consumer.poll
        while seen < count:
            batch = poll(1.0, max_messages=BATCH)
            if batch:
                clock.start()
            for delivery in batch:
                delivery.ack()
            seen += len(batch)
        tally = clock.stop(seen)
    _check("msgsafe poll", seen, count)
    return tally


def msgsafe_run(url: str, count: int, source: str, options: dict[str, Any]) -> Tally:
    """``run(handler, concurrency=WORKERS)`` with a handler that counts, and stops the run
    at the last message."""
    import msgsafe

    consumer = msgsafe.Consumer(url, **options)
    consumer.subscribe(source)
    clock = Clock()
    lock = threading.Lock()
    seen = 0
    done: list[Tally] = []

    def handler(_delivery: Any) -> None:
        nonlocal seen
        with lock:
            clock.start()
            seen += 1
            if seen == count:
                done.append(clock.stop(count))
                consumer.stop()

    consumer.run(handler, concurrency=WORKERS, handle_signals=False)
    _check("msgsafe run", seen, count)
    return done[0]


def msgsafe_variants(url: str, group_options: Callable[[], dict[str, Any]]) -> list[Variant]:
    def poll_ack(source: str, count: int) -> Tally:
        return msgsafe_poll(url, count, source, group_options())

    def dedup(source: str, count: int) -> Tally:
        return msgsafe_poll(url, count, source, {**group_options(), "dedup": True})

    def run4(source: str, count: int) -> Tally:
        return msgsafe_run(url, count, source, group_options())

    return [Variant("poll+ack", poll_ack), Variant("dedup", dedup), Variant("run x4", run4)]


def fill(url: str, destination: str, count: int) -> None:
    """``count`` messages into ``destination`` through msgsafe's producer, confirmed."""
    import msgsafe

    size = 10_000
    with msgsafe.Producer(url, outbox=False) as producer:
        futures = []
        for start in range(0, count, size):
            n = min(size, count - start)
            keys = [KEYS[i & 15] for i in range(start, start + n)]
            futures.append(producer.send_batch_async(destination, [BODY] * n, keys=keys))
        confirmed = sum(f.result(600).confirmed for f in futures)
    _check(f"fill {destination}", confirmed, count)


# --- Kafka ------------------------------------------------------------------------------


def _raw_consumer(bootstrap: str, **settings: object) -> Any:
    """A raw consumer in a new group, subscribed to nothing yet: auto commit of the
    offsets stored (``enable.auto.offset.store=false``), from the earliest offset;
    ``settings`` (librdkafka names with ``_`` for ``.``) added."""
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
            **{name.replace("_", "."): value for name, value in settings.items()},
        }
    )


def _floor_consumer(bootstrap: str) -> Any:
    """The floors' raw consumer: msgsafe's prefetch backoff, as its consumer has."""
    from msgsafe.adapters.kafka.config import FETCH_QUEUE_BACKOFF_MS

    return _raw_consumer(bootstrap, fetch_queue_backoff_ms=FETCH_QUEUE_BACKOFF_MS)


def kafka_raw(bootstrap: str) -> Run:
    def run(topic: str, count: int) -> Tally:
        consumer = _raw_consumer(bootstrap)
        consumer.subscribe([topic])
        clock, seen, errors = Clock(), 0, 0
        consume, store = consumer.consume, consumer.store_offsets
        try:
            while seen < count:
                messages = consume(BATCH, 1.0)
                if messages:
                    clock.start()
                for message in messages:
                    if message.error() is not None:
                        errors += 1
                        continue
                    message.value()
                    store(message)
                    seen += 1
            tally = clock.stop(seen)
        finally:
            consumer.close()
        _check(f"kafka raw ({errors} errors)", seen, count)
        return tally

    return run


class Handed:
    """The floor's delivery: one slotted object per message whose ``ack()`` stores the
    message's offset (what any API handing out delivery objects makes per message)."""

    __slots__ = ("body", "message", "store")

    def __init__(self, message: Any, store: Callable[[Any], None]) -> None:
        self.message = message
        self.body = message.value()
        self.store = store

    def ack(self) -> None:
        self.store(self.message)


def kafka_floor(bootstrap: str) -> Run:
    """The raw loop with a :class:`Handed` per message, made for the batch and then
    acknowledged one by one: the floor under ``poll`` + ``ack()``."""

    def run(topic: str, count: int) -> Tally:
        consumer = _floor_consumer(bootstrap)
        consumer.subscribe([topic])
        clock, seen = Clock(), 0
        consume, store = consumer.consume, consumer.store_offsets
        try:
            while seen < count:
                batch = [Handed(m, store) for m in consume(BATCH, 1.0) if m.error() is None]
                if batch:
                    clock.start()
                for handed in batch:
                    handed.ack()
                seen += len(batch)
            tally = clock.stop(seen)
        finally:
            consumer.close()
        _check("kafka floor", seen, count)
        return tally

    return run


def kafka_floor_workers(bootstrap: str) -> Run:
    """The raw loop handing every message to one of WORKERS threads through a
    ``queue.SimpleQueue`` (unbounded); each thread stores the offset and counts under a
    lock, as the ``run x4`` handler counts: the floor under a run() of worker threads."""

    def run(topic: str, count: int) -> Tally:
        consumer = _floor_consumer(bootstrap)
        consumer.subscribe([topic])
        clock, lock = Clock(), threading.Lock()
        handed: queue.SimpleQueue[Any] = queue.SimpleQueue()
        seen, done = 0, threading.Event()
        store = consumer.store_offsets

        def work() -> None:
            nonlocal seen
            while (message := handed.get()) is not None:
                store(message)
                with lock:
                    seen += 1
                    if seen == count:
                        done.set()

        threads = [threading.Thread(target=work) for _ in range(WORKERS)]
        for thread in threads:
            thread.start()
        fetched = 0
        try:
            while fetched < count:
                messages = [m for m in consumer.consume(BATCH, 1.0) if m.error() is None]
                if messages:
                    clock.start()
                for message in messages:
                    handed.put(message)
                fetched += len(messages)
            done.wait(600)
            tally = clock.stop(seen)
        finally:
            for _ in threads:
                handed.put(None)
            for thread in threads:
                thread.join(30)
            consumer.close()
        _check("kafka floor x4", seen, count)
        return tally

    return run


@contextlib.contextmanager
def kafka_target(url: str | None, count: int) -> Iterator[Target]:
    from msgsafe.cluster.kafka_admin import create_topic

    cluster: Any = None
    broker = "a running Kafka (--url)"
    if url is None:
        from msgsafe.cluster.kafka import VERSION, KafkaCluster

        cluster = KafkaCluster(nodes=1)
        started = time.monotonic()
        cluster.start()
        print(f"kafka: 1 node up in {time.monotonic() - started:.1f} s", flush=True)
        url = str(cluster.url)
        broker = f"Apache Kafka {VERSION}, 1 KRaft node, a topic of 3 partitions"
    bootstrap = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].split("@")[-1]
    try:
        topic = f"bench-consume-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 3, 1, timeout=60)
        fill(url, topic, count)

        def groups() -> dict[str, Any]:
            return {"group": f"bench-{uuid.uuid4().hex[:8]}"}

        variants = [
            Variant("raw", kafka_raw(bootstrap)),
            *msgsafe_variants(url, groups),
            Variant("floor", kafka_floor(bootstrap)),
            Variant("floor x4", kafka_floor_workers(bootstrap)),
        ]
        yield Target("kafka", broker, variants, lambda: topic, count)
    finally:
        if cluster is not None:
            cluster.stop()


# --- RabbitMQ ---------------------------------------------------------------------------


def rabbit_raw(url: str) -> Run:
    def run(queue: str, count: int) -> Tally:
        import pika

        from benchmarks.bench_send import _pika_params

        connection = pika.BlockingConnection(_pika_params(url))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=BATCH)
        clock, seen = Clock(), 0
        ack = channel.basic_ack

        def on_message(_ch: Any, method: Any, _properties: Any, _body: bytes) -> None:
            nonlocal seen
            clock.start()
            ack(method.delivery_tag)
            seen += 1

        channel.basic_consume(queue, on_message, auto_ack=False)
        try:
            deadline = time.monotonic() + 600
            while seen < count and time.monotonic() < deadline:
                connection.process_data_events(time_limit=1.0)
            tally = clock.stop(seen)
        finally:
            connection.close()
        _check("rabbitmq raw", seen, count)
        return tally

    return run


@contextlib.contextmanager
def rabbit_target(url: str | None, count: int) -> Iterator[Target]:
    cluster: Any = None
    broker = "a running RabbitMQ (--url)"
    if url is None:
        from msgsafe.cluster.rabbitmq import RabbitCluster

        cluster = RabbitCluster(nodes=1)
        started = time.monotonic()
        cluster.start()
        print(f"rabbitmq: 1 node up in {time.monotonic() - started:.1f} s", flush=True)
        url = cluster.node_url(0)
        broker = "RabbitMQ 1 node, a durable quorum queue per run"
    rabbit_url = url
    try:

        def source() -> str:
            queue = f"bench-consume-{uuid.uuid4().hex[:8]}"
            declare_quorum_queue(rabbit_url, queue)
            fill(rabbit_url, queue, count)
            return queue

        def options() -> dict[str, Any]:
            return {"prefetch": BATCH}

        variants = [Variant("raw", rabbit_raw(rabbit_url)), *msgsafe_variants(rabbit_url, options)]
        yield Target("rabbitmq", broker, variants, source, count, rabbit_url)
    finally:
        if cluster is not None:
            cluster.stop()


# --- AMQP 1.0 ---------------------------------------------------------------------------


def amqp10_raw(url: str) -> Run:
    """A plain proton receiver with msgsafe's credit window (``prefetch=BATCH``: proton
    tops the credit up as messages arrive), accepting each message as it comes."""

    def run(address: str, count: int) -> Tally:
        from proton.handlers import MessagingHandler
        from proton.reactor import Container

        from benchmarks.bench_amqp10 import _plain_url, _sasl_kwargs

        clock, done = Clock(), []
        seen = 0

        class Receive(MessagingHandler):
            def __init__(self) -> None:
                super().__init__(prefetch=BATCH, auto_accept=False)

            def on_start(self, event: Any) -> None:
                connection = event.container.connect(
                    _plain_url(url), reconnect=False, **_sasl_kwargs(url)
                )
                event.container.create_receiver(connection, address)

            def on_message(self, event: Any) -> None:
                nonlocal seen
                clock.start()
                event.message.body  # noqa: B018 - read as the other loops read it
                self.accept(event.delivery)
                seen += 1
                if seen == count:
                    done.append(clock.stop(count))
                    event.connection.close()

            def on_transport_error(self, event: Any) -> None:
                raise SystemExit(f"amqp10 raw: {event.transport.condition}")

        Container(Receive()).run()
        _check("amqp10 raw", seen, count)
        return done[0]

    return run


def amqp10_floor(url: str) -> Run:
    """The raw receiver on a thread of its own handing messages to the caller's thread
    (a ``SimpleQueue``), which takes up to BATCH at a time and hands them back to be
    accepted on proton's thread (a deque and one ``EventInjector`` wake-up per batch):
    the least a ``poll`` on the application's thread over proton's reactor does."""

    def run(address: str, count: int) -> Tally:
        import collections

        from proton.handlers import MessagingHandler
        from proton.reactor import ApplicationEvent, Container, EventInjector

        from benchmarks.bench_amqp10 import _plain_url, _sasl_kwargs

        handed: queue.SimpleQueue[Any] = queue.SimpleQueue()
        settle: collections.deque[Any] = collections.deque()
        injector = EventInjector()
        failed: list[str] = []

        class Receive(MessagingHandler):
            def __init__(self) -> None:
                super().__init__(prefetch=BATCH, auto_accept=False)
                self.connection: Any = None

            def on_start(self, event: Any) -> None:
                self.connection = event.container.connect(
                    _plain_url(url), reconnect=False, **_sasl_kwargs(url)
                )
                event.container.create_receiver(self.connection, address)

            def on_message(self, event: Any) -> None:
                handed.put((event.message.body, event.delivery))

            def on_settle(self, _event: Any) -> None:
                while settle:
                    delivery = settle.popleft()
                    if delivery is None:
                        self.connection.close()
                        injector.close()
                        return
                    self.accept(delivery)

            def on_transport_error(self, event: Any) -> None:
                failed.append(str(event.transport.condition))
                handed.put(None)

        container = Container(Receive())
        container.selectable(injector)
        reactor = threading.Thread(target=container.run, daemon=True)
        reactor.start()
        clock, seen = Clock(), 0
        while seen < count and not failed:
            first = handed.get(timeout=60)
            if first is None:
                break
            clock.start()
            batch = [first]
            while len(batch) < BATCH:
                try:
                    batch.append(handed.get_nowait())
                except queue.Empty:
                    break
            settle.extend(delivery for _body, delivery in batch)
            injector.trigger(ApplicationEvent("settle"))
            seen += len(batch)
        tally = clock.stop(seen)
        settle.append(None)
        injector.trigger(ApplicationEvent("settle"))
        reactor.join(30)
        _check(f"amqp10 floor {failed}", seen, count)
        return tally

    return run


@contextlib.contextmanager
def amqp10_target(url: str | None, count: int) -> Iterator[Target]:
    cluster: Any = None
    broker = "a running AMQP 1.0 broker (--url)"
    if url is None:
        from msgsafe.cluster.artemis import ArtemisCluster

        cluster = ArtemisCluster()
        started = time.monotonic()
        cluster.fetch()
        cluster.start()
        print(f"amqp10: Artemis up in {time.monotonic() - started:.1f} s", flush=True)
        url = str(cluster.node_url(0))
        broker = (
            f"ActiveMQ Artemis {cluster.version} primary/backup pair (replication, the "
            "only shape msgsafe.cluster starts), an anycast queue per run"
        )
    amqp10_url = url
    try:

        def source() -> str:
            address = f"bench-consume-{uuid.uuid4().hex[:8]}"
            fill(amqp10_url, address, count)
            return address

        def options() -> dict[str, Any]:
            return {"credit": BATCH}

        variants = [
            Variant("raw", amqp10_raw(amqp10_url)),
            Variant("poll+ack", lambda s, n: msgsafe_poll(amqp10_url, n, s, options())),
            Variant("floor", amqp10_floor(amqp10_url)),
        ]
        yield Target("amqp10", broker, variants, source, count)
    finally:
        if cluster is not None:
            cluster.stop()


# --- the inbox (SQLite, on RabbitMQ) ----------------------------------------------------

#: The handler's effect: one row per message, in the inbox's database.
EFFECTS = "CREATE TABLE IF NOT EXISTS effects (message_id text NOT NULL, body blob)"
#: The hand-written inbox's table: the id under a primary key (as msgsafe's inbox keeps).
RAW_INBOX = (
    "CREATE TABLE IF NOT EXISTS handled (message_id text PRIMARY KEY, source text NOT NULL,"
    " attempt integer NOT NULL, handled_at real NOT NULL)"
)
RAW_ATTEMPTS = (
    "CREATE TABLE IF NOT EXISTS attempts (message_id text PRIMARY KEY, source text NOT NULL,"
    " attempts integer NOT NULL, updated_at real NOT NULL)"
)
RAW_HANDLED = "SELECT 1 FROM handled WHERE message_id = ?"
RAW_COUNT = (
    "INSERT INTO attempts (message_id, source, attempts, updated_at) VALUES (?, ?, 1, ?)"
    " ON CONFLICT (message_id) DO UPDATE SET attempts = attempts.attempts + 1,"
    " source = excluded.source, updated_at = excluded.updated_at RETURNING attempts"
)
RAW_RECORD = (
    "INSERT INTO handled (message_id, source, attempt, handled_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (message_id) DO NOTHING RETURNING message_id"
)
EFFECT = "INSERT INTO effects (message_id, body) VALUES (?, ?)"
#: A batch's statements, as msgsafe's inbox sends them (by dialect: JSON rows for SQLite,
#: arrays for PostgreSQL): the new ids of a batch, their counters dropped, and the
#: attempt counts of the ids not handled.
RAW_RECORD_MANY = {
    "sqlite": (
        "INSERT INTO handled (message_id, source, attempt, handled_at) SELECT j.value ->> 0,"
        " j.value ->> 1, j.value ->> 2, ? FROM json_each(?) AS j WHERE true"
        " ON CONFLICT (message_id) DO NOTHING RETURNING message_id"
    ),
    "postgres": (
        "INSERT INTO handled (message_id, source, attempt, handled_at) SELECT m, s, a, %s"
        " FROM unnest(%s::text[], %s::text[], %s::integer[]) AS r(m, s, a)"
        " ON CONFLICT (message_id) DO NOTHING RETURNING message_id"
    ),
}
RAW_FORGET_MANY = {
    "sqlite": "DELETE FROM attempts WHERE message_id IN (SELECT value FROM json_each(?))",
    "postgres": "DELETE FROM attempts WHERE message_id = ANY(%s)",
}
RAW_COUNT_MANY = {
    "sqlite": (
        "INSERT INTO attempts (message_id, source, attempts, updated_at) SELECT j.value ->> 0,"
        " j.value ->> 1, 1, ? FROM json_each(?) AS j WHERE NOT EXISTS (SELECT 1 FROM handled"
        " h WHERE h.message_id = j.value ->> 0) ON CONFLICT (message_id) DO UPDATE SET"
        " attempts = attempts.attempts + 1, source = excluded.source,"
        " updated_at = excluded.updated_at RETURNING message_id, attempts"
    ),
    "postgres": (
        "INSERT INTO attempts (message_id, source, attempts, updated_at) SELECT m, s, 1, %s"
        " FROM unnest(%s::text[], %s::text[]) AS r(m, s) WHERE NOT EXISTS (SELECT 1 FROM"
        " handled h WHERE h.message_id = r.m) ON CONFLICT (message_id) DO UPDATE SET"
        " attempts = attempts.attempts + 1, source = excluded.source,"
        " updated_at = excluded.updated_at RETURNING message_id, attempts"
    ),
}


class Database:
    """Where an inbox run writes: a new SQLite file per run in the directory ``where`` (as
    msgsafe's inbox opens its own: autocommit, WAL, ``synchronous=FULL``), or the
    PostgreSQL database at ``url`` (tables shared by the runs, every run's ids new)."""

    def __init__(self, kind: str, where: str) -> None:
        self.kind, self.where = kind, where
        self.begin = "BEGIN IMMEDIATE" if kind == "sqlite" else "BEGIN"

    def sql(self, statement: str) -> str:
        """``statement`` in this database's dialect (written for SQLite)."""
        if self.kind == "sqlite":
            return statement
        return (
            statement.replace("?", "%s")
            .replace(" real ", " double precision ")
            .replace(" blob)", " bytea)")
        )

    def open(self, name: str) -> tuple[str, Any]:
        """The inbox URL of a run and a connection to its database, in autocommit, the
        effects table created."""
        if self.kind == "sqlite":
            import sqlite3

            path = Path(self.where) / f"{name}-{uuid.uuid4().hex[:8]}.db"
            conn: Any = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            url = f"sqlite:///{path}"
        else:
            import psycopg

            url = self.where
            conn = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        conn.execute(self.sql(EFFECTS))
        return url, conn


def inbox_raw(url: str, database: Database, count_attempts: bool = False) -> Run:
    """msgsafe's ``poll`` and ``ack()``, with the inbox's transactions written by hand;
    ``count_attempts``: each preceded by the attempt count's own transaction."""

    def run(queue: str, count: int) -> Tally:
        import msgsafe

        _inbox_url, conn = database.open("raw")
        sql = database.sql
        conn.execute(sql(RAW_INBOX))
        conn.execute(sql(RAW_ATTEMPTS))
        execute, begin = conn.execute, database.begin
        handled, counted, record, effect = map(sql, (RAW_HANDLED, RAW_COUNT, RAW_RECORD, EFFECT))
        try:
            with msgsafe.Consumer(url, prefetch=BATCH) as consumer:
                consumer.subscribe(queue)
                clock, seen = Clock(), 0
                while seen < count:
                    batch = consumer.poll(1.0, max_messages=BATCH)
                    if batch:
                        clock.start()
                    for delivery in batch:
                        message_id = delivery.message_id
                        if count_attempts and execute(handled, (message_id,)).fetchone():
                            delivery.ack()
                            continue
                        if count_attempts:
                            execute(begin)
                            execute(counted, (message_id, queue, time.time())).fetchone()
                            execute("COMMIT")
                        execute(begin)
                        fresh = execute(
                            record, (message_id, queue, delivery.attempt, time.time())
                        ).fetchone()
                        if fresh is not None:
                            execute(effect, (message_id, delivery.body))
                        execute("COMMIT")
                        delivery.ack()
                    seen += len(batch)
                tally = clock.stop(seen)
        finally:
            conn.close()
        _check("inbox raw", seen, count)
        return tally

    return run


def inbox_raw_batch(url: str, database: Database, count_attempts: bool = False) -> Run:
    """msgsafe's ``poll`` and ``ack()``, each poll's messages one transaction written by
    hand with the statements msgsafe's inbox sends; ``count_attempts``: preceded by the
    batch's attempt counts in a transaction of their own."""

    def run(queue: str, count: int) -> Tally:
        import json

        import msgsafe

        _inbox_url, conn = database.open("rawbatch")
        sql, kind = database.sql, database.kind
        conn.execute(sql(RAW_INBOX))
        conn.execute(sql(RAW_ATTEMPTS))
        execute, begin = conn.execute, database.begin
        effect = sql(EFFECT)
        record, forget, counted = RAW_RECORD_MANY[kind], RAW_FORGET_MANY[kind], RAW_COUNT_MANY[kind]
        sqlite = kind == "sqlite"
        batches = 0
        try:
            with msgsafe.Consumer(url, prefetch=BATCH) as consumer:
                consumer.subscribe(queue)
                clock, seen = Clock(), 0
                while seen < count:
                    batch = consumer.poll(1.0, max_messages=BATCH)
                    if not batch:
                        continue
                    clock.start()
                    ids = [d.message_id for d in batch]
                    now = time.time()
                    if count_attempts:
                        execute(begin)
                        if sqlite:
                            items = json.dumps([[i, queue] for i in ids])
                            execute(counted, (now, items)).fetchall()
                        else:
                            execute(counted, (now, ids, [queue] * len(ids))).fetchall()
                        execute("COMMIT")
                    execute(begin)
                    if sqlite:
                        rows = json.dumps([[d.message_id, queue, d.attempt] for d in batch])
                        fresh = {r[0] for r in execute(record, (now, rows)).fetchall()}
                        if count_attempts:
                            execute(forget, (json.dumps(ids),))
                    else:
                        params = (now, ids, [queue] * len(ids), [d.attempt for d in batch])
                        fresh = {r[0] for r in execute(record, params).fetchall()}
                        if count_attempts:
                            execute(forget, (ids,))
                    for delivery in batch:
                        if delivery.message_id in fresh:
                            execute(effect, (delivery.message_id, delivery.body))
                    execute("COMMIT")
                    for delivery in batch:
                        delivery.ack()
                    seen += len(batch)
                    batches += 1
                tally = clock.stop(seen)
        finally:
            conn.close()
        print(f"    ({count / max(1, batches):.0f} messages a batch)", flush=True)
        _check("inbox raw batch", seen, count)
        return tally

    return run


def inbox_run(url: str, database: Database, in_memory: bool = False, batch: bool = False) -> Run:
    """``run(handler, inbox=...)``, the handler inserting its effect via tx;
    ``in_memory``: the consumer given an ``AttemptMemory`` (no attempt count in the inbox);
    ``batch``: with ``batch=BatchPolicy(max_messages=BATCH)``, the handler taking a list."""

    def run(queue: str, count: int) -> Tally:
        import msgsafe
        from msgsafe.dedup import AttemptMemory

        inbox_url, conn = database.open("msgsafe")
        conn.close()
        effect = database.sql(EFFECT)
        options: dict[str, Any] = {"attempts": AttemptMemory()} if in_memory else {}
        consumer = msgsafe.Consumer(url, prefetch=BATCH, **options)
        consumer.subscribe(queue)
        clock, seen, done = Clock(), 0, []

        def handler(delivery: Any, tx: Any) -> None:
            nonlocal seen
            clock.start()
            tx.execute(effect, (delivery.message_id, delivery.body))
            seen += 1
            if seen == count:
                done.append(clock.stop(count))
                consumer.stop()

        def batch_handler(deliveries: list[Any], tx: Any) -> None:
            nonlocal seen
            clock.start()
            execute = tx.execute
            for delivery in deliveries:
                execute(effect, (delivery.message_id, delivery.body))
            seen += len(deliveries)
            if seen == count:
                # The clock stops once this batch is committed and acknowledged (a batch is
                # up to BATCH messages: its commit is not left out of the run).
                threading.Thread(target=finish, daemon=True).start()

        def finish() -> None:
            while consumer.stats().acked < count:
                time.sleep(0.001)
            done.append(clock.stop(count))
            consumer.stop()

        if batch:
            policy = msgsafe.BatchPolicy(max_messages=BATCH)
            consumer.run(batch_handler, inbox=inbox_url, batch=policy, handle_signals=False)
            batches = consumer.stats().batches
            print(f"    ({count / max(1, batches):.0f} messages a batch)", flush=True)
        else:
            consumer.run(handler, inbox=inbox_url, handle_signals=False)
        _check("inbox run", seen, count)
        return done[0]

    return run


def inbox_process(url: str, database: Database) -> Run:
    """``poll`` and ``ack()`` around msgsafe's inbox called directly
    (``process(id, work)``, no attempt count): the store's cost without run()'s threads."""

    def run(queue: str, count: int) -> Tally:
        import msgsafe
        from msgsafe.inbox import open_inbox

        inbox_url, conn = database.open("process")
        conn.close()
        inbox = open_inbox(inbox_url)
        effect = database.sql(EFFECT)
        try:
            with msgsafe.Consumer(url, prefetch=BATCH) as consumer:
                consumer.subscribe(queue)
                clock, seen = Clock(), 0
                process = inbox.process
                while seen < count:
                    batch = consumer.poll(1.0, max_messages=BATCH)
                    if batch:
                        clock.start()
                    for delivery in batch:
                        body, message_id = delivery.body, delivery.message_id or ""

                        def work(tx: Any) -> None:
                            tx.execute(effect, (message_id, body))  # noqa: B023 - called now

                        process(message_id, work, source=queue, attempt=delivery.attempt)
                        delivery.ack()
                    seen += len(batch)
                tally = clock.stop(seen)
        finally:
            inbox.close()
        _check("inbox process", seen, count)
        return tally

    return run


@contextlib.contextmanager
def inbox_target(url: str | None, count: int, kind: str) -> Iterator[Target]:
    """The inbox's variants on RabbitMQ, writing to SQLite files in a temporary
    directory (``kind`` "sqlite") or to a PostgreSQL node started here ("postgres")."""
    import tempfile

    with contextlib.ExitStack() as stack:
        rabbit = stack.enter_context(rabbit_target(url, count))
        if kind == "sqlite":
            import sqlite3

            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            database = Database(kind, tmp)
            where = f"SQLite {sqlite3.sqlite_version}, a file per run in {Path(tmp).parent}"
        else:
            from msgsafe.cluster.postgres import PostgresCluster

            cluster = PostgresCluster(nodes=1)
            started = time.monotonic()
            cluster.start()
            stack.callback(cluster.stop)
            print(f"postgres: 1 node up in {time.monotonic() - started:.1f} s", flush=True)
            database = Database(kind, cluster.node_url(0))
            where = "PostgreSQL, 1 node (msgsafe.cluster, no standby), tables shared by the runs"
        variants = [
            Variant("raw", inbox_raw(rabbit.url, database)),
            Variant("run mem", inbox_run(rabbit.url, database, in_memory=True)),
            Variant("run", inbox_run(rabbit.url, database)),
            Variant("raw+count", inbox_raw(rabbit.url, database, count_attempts=True)),
            Variant("poll+process", inbox_process(rabbit.url, database)),
            Variant("raw batch", inbox_raw_batch(rabbit.url, database)),
            Variant("batch mem", inbox_run(rabbit.url, database, in_memory=True, batch=True)),
            Variant("batch", inbox_run(rabbit.url, database, batch=True)),
            Variant("raw batch+count", inbox_raw_batch(rabbit.url, database, True)),
        ]
        broker = f"{rabbit.broker}; {where}"
        yield Target(INBOXES[kind][0], broker, variants, rabbit.source, count, rabbit.url)


# --- measuring --------------------------------------------------------------------------


@dataclass
class Target:
    """One protocol's variants and where they read: ``source()`` gives a topic or queue
    holding ``count`` messages for one run (the same topic every time on Kafka, where a
    new group reads it again; a new filled queue on RabbitMQ)."""

    protocol: str
    broker: str
    variants: list[Variant]
    source: Callable[[], str]
    count: int
    url: str = ""


def measure(target: Target, rounds: int) -> dict[str, list[Tally]]:
    """``rounds`` rounds of every variant reading ``target.count`` messages, in order in
    even rounds and reversed in odd ones."""
    tallies: dict[str, list[Tally]] = {v.name: [] for v in target.variants}
    for n in range(rounds):
        order = target.variants if n % 2 == 0 else target.variants[::-1]
        this: dict[str, Tally] = {}
        for variant in order:
            source = target.source()
            this[variant.name] = variant.run(source, target.count)
        for name in tallies:
            tallies[name].append(this[name])
        print(
            f"  round {n + 1}: "
            + ", ".join(
                f"{name} {this[name].rate:,.0f} msg/s {this[name].cpu_us:.1f} µs CPU"
                for name in tallies
            ),
            flush=True,
        )
    return tallies


def run_target(target: Target, args: argparse.Namespace) -> Result:
    print(f"{target.protocol}: {target.broker}", flush=True)
    warm = target.source()
    for variant in target.variants:  # the brokers' and clients' first reads, untimed
        variant.run(warm, target.count)
        if target.protocol != "kafka":
            warm = target.source()
    result = Result(target.protocol, target.broker, measure(target, args.rounds))
    if args.profile:
        unprofiled = {name: result.total(name).cpu_us for name in result.rounds}
        for variant in target.variants[1:3]:
            profile(target, variant, min(args.profile, target.count), unprofiled[variant.name])
    return result


def profile(target: Target, variant: Variant, count: int, real_us: float) -> None:
    source = target.source()
    with ThreadProfiles() as profiles:
        profiles.arm()
        cpu = time.process_time()
        variant.run(source, count)
        cpu = time.process_time() - cpu
        profiles.stop_caller()
    print_profile(f"{target.protocol} {variant.name}", profiles, count, cpu, real_us)


# --- the report -------------------------------------------------------------------------


def report(
    results: Sequence[Result], args: argparse.Namespace, started: str, ended: str, loads: str
) -> str:
    """The README section (``## Consuming``), without notes of its own."""
    versions = [f"Python {platform.python_version()}"]
    for dist in ("confluent-kafka", "pika", "python-qpid-proton"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions.append(f"{dist} {version(dist)}")
    command = (
        "`flock /tmp/msgsafe-bench.lock python3 benchmarks/bench_consume.py "
        f"--rounds {args.rounds} --messages {args.messages} "
        f"--rabbit-messages {args.rabbit_messages}"
        + "".join(f" --only {p}" for p in args.only or ())
        + " --readme benchmarks/README.md`"
    )
    lines = [
        TITLE,
        "",
        command,
        "",
        f"Measured {started}\N{EN DASH}{ended} UTC on {os.cpu_count()} cores, {loads} "
        f"(the machine is shared), {', '.join(versions)}. Kafka: {args.messages:,} messages "
        f"per run, RabbitMQ, AMQP 1.0 and the inbox: {args.rabbit_messages:,}; 100-byte "
        f"bodies written by msgsafe's producer (16 keys); {args.rounds} rounds, the variants "
        "in turn; clocks from a run's first message to its last settle. CPU: "
        "`time.process_time()` of the benchmark process (every thread) per message, all rounds.",
        "",
        *tables(results, LOOPS, goal_lines(results, GOALS)),
    ]
    brokers = "; ".join(f"{r.protocol}: {r.broker}" for r in results)
    lines += ["", f"Brokers: {brokers}."]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument(
        "--only", action="append", choices=PROTOCOLS, help="measure this protocol (repeatable)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every variant")
    parser.add_argument("--messages", type=int, default=200_000, help="Kafka: messages per run")
    parser.add_argument(
        "--rabbit-messages",
        type=int,
        default=50_000,
        help="RabbitMQ, AMQP 1.0 and the inbox: messages per run",
    )
    parser.add_argument(
        "--url",
        action="append",
        default=[],
        help="a running broker instead of one started here: kafka://, amqp:// or amqp10://",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="then profile N messages of poll+ack and dedup (per-thread CPU)",
    )
    parser.add_argument("--readme", type=Path, help=f"write the {TITLE[3:]!r} section there")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.messages < 1 or args.rabbit_messages < 1 or args.profile < 0:
        parser.error("--rounds, --messages and --rabbit-messages must be >= 1")
    urls_by_protocol(args.url)  # refuses a scheme of another protocol now
    return args


def main(argv: Sequence[str] | None = None) -> list[Result]:
    args = parse_args(argv)
    wanted = set(args.only or PROTOCOLS)
    urls = urls_by_protocol(args.url)
    started = datetime.datetime.now(datetime.UTC)
    load_start = os.getloadavg()[0]
    results: list[Result] = []
    if "kafka" in wanted:
        with kafka_target(urls.get("kafka"), args.messages) as target:
            results.append(run_target(target, args))
    if "rabbitmq" in wanted:
        with rabbit_target(urls.get("rabbitmq"), args.rabbit_messages) as target:
            results.append(run_target(target, args))
    if "amqp10" in wanted:
        with amqp10_target(urls.get("amqp10"), args.rabbit_messages) as target:
            results.append(run_target(target, args))
    for kind, (protocol, _label) in INBOXES.items():
        if protocol in wanted:
            with inbox_target(urls.get("rabbitmq"), args.rabbit_messages, kind) as target:
                results.append(run_target(target, args))
    ended = datetime.datetime.now(datetime.UTC)
    loads = f"load average {load_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end"
    text = report(results, args, f"{started:%Y-%m-%d %H:%M}", f"{ended:%H:%M}", loads)
    print()
    print(text)
    if args.readme is not None:
        replace_section(args.readme, text)
    return results


if __name__ == "__main__":
    main()

"""Spark writers to RabbitMQ and AMQP 1.0 brokers: msgsafe's data source and foreachBatch
sink against the raw clients' pipelined publish in a hand-written ``foreachPartition``.

Spark has no RabbitMQ or AMQP 1.0 sink of its own, so the bar is what a team writes by
hand with the raw client and the same guarantee: every row confirmed by the broker before
the task ends, a replay-stable id per row (a BLAKE2b digest of batch id, partition and
row position, the cheapest such id), at most ``--window`` messages unconfirmed. Rows are
``--rows`` strings padded to 100 bytes, on a Spark standalone cluster started here (a
master and ``--cores`` one-core workers from the installed PySpark,
:class:`msgsafe.cluster.spark.SparkCluster`), in one run per broker:

- ``raw`` — RabbitMQ: pika ``SelectConnection`` in confirm mode, persistent and
  mandatory, message id and ``msgsafe-id`` header, to a quorum queue. AMQP 1.0: a proton
  ``Container`` sender, durable messages with a message id, unsettled transfers, done
  when every message is accepted. One connection per task; the task fails on any nack,
  return, rejection or missing outcome.
- ``data source`` — ``df.write.format("msgsafe")`` (:class:`msgsafe.spark.MsgsafeDataSource`):
  ids from the rows, the promise, the per-batch report.
- ``sink`` — ``foreach_batch_sink(url, destination)(df, batch_id)``.

Brokers (``--broker``, repeatable; by default all three), each started here on loopback
through ``msgsafe.cluster`` and stopped at the end: ``rabbitmq`` a 3-node RabbitMQ with a
quorum queue per write (deleted after it); ``artemis`` an ActiveMQ Artemis primary/backup
pair with replication; ``qpid`` a Qpid Broker-J BDB HA group of three nodes, sending to
the master (a new address per write, created on first use by both).

Every write is counted afterwards (untimed): RabbitMQ's queue is deleted and must have
held every row, an AMQP 1.0 address is read (pre-settled) until every row came. Rounds
alternate raw / data source / sink after one warm-up round that is not counted;
the best round of each is reported with the ratio data source / raw (and each round's),
and CPU per row of the Python workers, Spark's JVMs and the brokers (from /proc, this
benchmark's descendants only) over the counted rounds.

    flock /tmp/msgsafe-bench.lock python -m benchmarks.bench_spark_amqp [--broker rabbitmq]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

# Run as a file (`python benchmarks/bench_spark_amqp.py`, as `make bench` does), the
# repository root is not on the path yet.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_spark import _CpuMeter, _session
from tests.support.rabbit_queues import declare_quorum

#: Spark's process kinds whose CPU is measured around each write (name, a part of the
#: command line); the brokers are counted by their pids (they run in their own sessions).
_KINDS = (
    ("python workers", "pyspark.daemon"),
    ("spark jvm", "SparkSubmit"),
    ("spark executors", "CoarseGrainedExecutorBackend"),
)

WINDOW = 1000


def _pids_cpu(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) used so far by ``pids``."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class _Meter(_CpuMeter):
    """Spark's processes by kind, plus the broker nodes' pids as ``brokers``."""

    def __init__(self, broker_pids: Sequence[int]) -> None:
        super().__init__(_KINDS)
        self._pids = broker_pids
        self._brokers = 0.0

    def __enter__(self) -> _Meter:
        self._brokers = _pids_cpu(self._pids)
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        used = _pids_cpu(self._pids) - self._brokers
        self.seconds["brokers"] = self.seconds.get("brokers", 0.0) + used


def _ids(batch: int, rows: Iterable[Any]) -> Iterator[tuple[bytes, str]]:
    """(body, replay-stable id) per row: the cheapest id a retried task repeats."""
    from pyspark import TaskContext

    context = TaskContext.get()
    prefix = b"%d:%d:" % (batch, context.partitionId() if context else 0)
    blake2b = hashlib.blake2b
    for position, row in enumerate(rows):
        yield row[0].encode(), blake2b(prefix + b"%d" % position, digest_size=16).hexdigest()


def _raw_rabbitmq(url: str, queue: str, batch: int, rows: Iterable[Any]) -> None:
    """Raw pika, pipelined confirms, run in each Python worker."""
    import pika
    from pika.adapters.select_connection import SelectConnection
    from pika.spec import Basic

    from msgsafe.endpoints import parse_url

    parsed = parse_url(url)
    endpoint = parsed.endpoints[0]
    params = pika.ConnectionParameters(
        host=endpoint.host,
        port=endpoint.port,
        credentials=pika.PlainCredentials(
            parsed.username or "guest", parsed.password.reveal() if parsed.password else "guest"
        ),
    )
    source = _ids(batch, rows)
    in_flight: collections.OrderedDict[int, None] = collections.OrderedDict()
    state = {"sent": 0, "done": False, "failed": ""}
    channel_ref: list[Any] = []

    def publish_some() -> None:
        channel = channel_ref[0]
        while len(in_flight) < WINDOW:
            item = next(source, None)
            if item is None:
                break
            body, row_id = item
            channel.basic_publish(
                "",
                queue,
                body,
                pika.BasicProperties(
                    delivery_mode=2, message_id=row_id, headers={"msgsafe-id": row_id}
                ),
                mandatory=True,
            )
            state["sent"] += 1
            in_flight[state["sent"]] = None
        if not in_flight:
            state["done"] = True
            channel.connection.close()

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if isinstance(method, Basic.Nack):
            state["failed"] = "nack"
            channel_ref[0].connection.close()
            return
        if method.multiple:
            while in_flight and next(iter(in_flight)) <= method.delivery_tag:
                in_flight.popitem(last=False)
        else:
            in_flight.pop(method.delivery_tag, None)
        publish_some()

    def returned(*_args: Any) -> None:
        state["failed"] = "returned (no queue)"

    def on_channel(channel: Any) -> None:
        channel_ref.append(channel)
        channel.add_on_return_callback(returned)
        channel.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda _f: publish_some())

    connection = SelectConnection(
        params,
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_open_error_callback=lambda c, e: (state.__setitem__("failed", str(e)), c.ioloop.stop()),
        on_close_callback=lambda c, _r: c.ioloop.stop(),
    )
    connection.ioloop.start()
    if state["failed"] or not state["done"]:
        raise RuntimeError(f"raw pika: {state['failed'] or 'closed early'} after {state['sent']}")


def _raw_amqp10(url: str, address: str, batch: int, rows: Iterable[Any]) -> None:
    """A raw proton sender, unsettled durable transfers, run in each Python worker."""
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import AtLeastOnce, Container

    from benchmarks.bench_amqp10 import _plain_url, _sasl_kwargs

    source = _ids(batch, rows)

    class Send(MessagingHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.sent = 0
            self.accepted = 0
            self.exhausted = False
            self.error = ""

        def on_start(self, event: Any) -> None:
            conn = event.container.connect(_plain_url(url), reconnect=False, **_sasl_kwargs(url))
            event.container.create_sender(conn, address, options=AtLeastOnce())

        def on_sendable(self, event: Any) -> None:
            sender = event.sender
            while sender.credit and self.sent - self.accepted < WINDOW:
                item = next(source, None)
                if item is None:
                    self.exhausted = True
                    break
                sender.send(Message(body=item[0], id=item[1], durable=True))
                self.sent += 1
            self._maybe_done(event)

        def _maybe_done(self, event: Any) -> None:
            if self.exhausted and self.accepted == self.sent:
                event.connection.close()

        def on_accepted(self, event: Any) -> None:
            self.accepted += 1
            if self.exhausted:
                self._maybe_done(event)
            else:
                self.on_sendable(event)

        def on_rejected(self, event: Any) -> None:
            self.error = "rejected"
            event.connection.close()

        on_released = on_rejected

        def on_transport_error(self, event: Any) -> None:
            self.error = f"transport: {event.transport.condition}"

    handler = Send()
    Container(handler).run()
    if handler.error or not handler.exhausted or handler.accepted != handler.sent:
        raise RuntimeError(
            f"raw proton: {handler.accepted} of {handler.sent} accepted, {handler.error or 'ended'}"
        )


def _drain_amqp10(url: str, address: str, expect: int, timeout: float = 180.0) -> int:
    """Read ``address`` until ``expect`` messages came (pre-settled, untimed): the write
    is counted, and the broker holds no backlog into the next write."""
    from proton.handlers import MessagingHandler
    from proton.reactor import AtMostOnce, Container

    from benchmarks.bench_amqp10 import _plain_url, _sasl_kwargs

    class Drain(MessagingHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(prefetch=1000)
            self.received = 0

        def on_start(self, event: Any) -> None:
            conn = event.container.connect(_plain_url(url), reconnect=False, **_sasl_kwargs(url))
            event.container.create_receiver(conn, address, options=AtMostOnce())
            event.container.schedule(timeout, self)

        def on_message(self, event: Any) -> None:
            self.received += 1
            if self.received >= expect:
                event.connection.close()
                event.container.stop()

        def on_timer_task(self, event: Any) -> None:
            event.container.stop()

    handler = Drain()
    Container(handler).run()
    return handler.received


def _delete(url: str, queue: str) -> int:
    """Delete ``queue``; return how many messages it held."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(conn.channel().queue_delete(queue).method.message_count)
    finally:
        conn.close()


def _start_broker(kind: str) -> tuple[Any, str]:
    """Start ``kind``; return the cluster and the URL the writers publish to."""
    if kind == "rabbitmq":
        from msgsafe.cluster.rabbitmq import RabbitCluster

        rabbit = RabbitCluster(size=3)
        rabbit.start()
        return rabbit, rabbit.node_url(0)
    # NOTE: with the clusters' 256 MB default heaps and every write's rows left on the
    # broker, the Artemis primary went away (connection refused) in the first round of
    # 100,000 rows; with 1 GB it went in the third. Each write is now read back before
    # the next, and the JVM brokers get 1 GB.
    from benchmarks.bench_amqp10 import _start_jvm_broker

    return _start_jvm_broker(kind, heap_mb=1024)


def measure(spark: Any, args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """The paired rounds on one broker; return its figures."""
    from msgsafe.spark import foreach_batch_sink

    started = time.monotonic()
    cluster, url = _start_broker(kind)
    print(f"{kind} up in {time.monotonic() - started:.1f} s", flush=True)
    rabbit = kind == "rabbitmq"
    raw_writer = _raw_rabbitmq if rabbit else _raw_amqp10
    rates: dict[str, list[float]] = {"raw": [], "data source": [], "sink": []}
    pids = [node.pid for node in cluster.nodes() if node.pid]
    meters = {name: _Meter(pids) for name in rates}
    try:
        df = spark.range(0, args.rows, numPartitions=args.cores).selectExpr(
            "rpad(cast(id AS string), 100, 'x') AS value"
        )
        df = df.cache()
        df.count()

        def timed(name: str, write: Callable[[str], None]) -> None:
            destination = f"bench-spark-{name.replace(' ', '-')}-{uuid.uuid4().hex[:8]}"
            if rabbit:
                declare_quorum(url, destination)
            try:
                began = time.perf_counter()
                with meters[name]:
                    write(destination)
                rates[name].append(args.rows / (time.perf_counter() - began))
            finally:
                # Counted, and the broker left empty for the next write (a JVM broker
                # holding every write's rows ran out of heap).
                if rabbit:
                    held = _delete(url, destination)
                else:
                    held = _drain_amqp10(url, destination, args.rows)
            if held < args.rows:
                raise RuntimeError(f"{name}: {held} of {args.rows} rows reached {destination}")

        # Round 0 warms up Python workers, connections and the JVMs; it is not counted.
        for round_ in range(args.rounds + 1):
            timed(
                "raw",
                lambda d, b=round_: df.foreachPartition(lambda rows: raw_writer(url, d, b, rows)),
            )
            timed(
                "data source",
                lambda d, b=round_: (
                    df.write.format("msgsafe")
                    .mode("append")
                    .option("url", url)
                    .option("destination", d)
                    .option("batch_id", 1000 + b)
                    .save()
                ),
            )

            def sink(destination: str, batch: int = 2000 + round_) -> None:
                report = foreach_batch_sink(url, destination)(df, batch)
                if report.confirmed != args.rows:
                    raise RuntimeError(f"the sink confirmed {report.confirmed} of {args.rows}")

            timed("sink", sink)
            for meter in meters.values():
                meter.end_round(args.rows, counted=round_ > 0)
            print(
                f"  round {round_}{' (warm-up)' if not round_ else ''}: "
                + "   ".join(f"{name} {r[-1]:>8,.0f}" for name, r in rates.items())
                + " rows/s",
                flush=True,
            )
            if not round_:
                for r in rates.values():
                    r.clear()
        df.unpersist()
    finally:
        cluster.stop()
    cpu = {name: meter.per_row_us() for name, meter in meters.items()}
    per_round = [d / r for d, r in zip(rates["data source"], rates["raw"], strict=True)]
    return {
        "best": {name: max(r) for name, r in rates.items()},
        "ratio_datasource_raw": max(rates["data source"]) / max(rates["raw"]),
        "ratio_datasource_raw_rounds": per_round,
        "ratio_datasource_raw_median": statistics.median(per_round),
        "ratio_sink_raw": max(rates["sink"]) / max(rates["raw"]),
        "cpu_us_per_row": cpu,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Run the benchmark on each ``--broker``, print a table per broker, return figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--broker", action="append", choices=("rabbitmq", "artemis", "qpid"))
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args(argv)

    from msgsafe.cluster.spark import SparkCluster

    standalone = SparkCluster(nodes=args.cores, cores=1, memory="1536m")
    standalone.start()
    print(f"spark standalone up in {standalone.start_seconds:.1f} s: {standalone.url}")
    load = os.getloadavg()
    figures: dict[str, dict[str, Any]] = {}
    try:
        spark = _session(args.cores, standalone.url, kafka_sink=False)
        try:
            for kind in args.broker or ("rabbitmq", "artemis", "qpid"):
                figures[kind] = measure(spark, args, kind)
        finally:
            spark.stop()
    finally:
        standalone.stop()
    print(
        f"{args.rows:,} rows of 100 bytes on a standalone cluster of {args.cores} one-core "
        f"workers, window {WINDOW}; load average {load[0]:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    for kind, fig in figures.items():
        best = fig["best"]
        rounds = ", ".join(f"{r:.2f}" for r in fig["ratio_datasource_raw_rounds"])
        print(f"{kind}:")
        for name, rate in best.items():
            cpu = fig["cpu_us_per_row"][name]
            spent = "  ".join(f"{part} {us:.1f}" for part, us in cpu.items())
            print(
                f"  {name:<12} {rate:>9,.0f} rows/s (best)   CPU µs/row: {spent}"
                f"   all {sum(cpu.values()):.1f}"
            )
        print(
            f"  data source / raw {fig['ratio_datasource_raw']:.2f} best of each "
            f"(rounds {rounds}; median {fig['ratio_datasource_raw_median']:.2f}); "
            f"sink / raw {fig['ratio_sink_raw']:.2f}"
        )
    return figures


if __name__ == "__main__":
    main()

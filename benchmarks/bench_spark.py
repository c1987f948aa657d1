"""Spark sink throughput: msgsafe's foreachBatch sink vs Spark's own Kafka sink and a
hand-written foreachPartition.

``--rows`` (default 1M) small rows (the row number as a string, ~6 bytes) on
``local[2]``, published to one Kafka topic, in one run against one broker:

- ``spark`` — Spark's own Kafka sink, ``df.write.format("kafka")`` (spark-sql-kafka-0-10
  from Maven Central through ``spark.jars``, see :mod:`tests.support.spark_kafka`) with
  ``kafka.acks=all`` and idempotence: no ids, so a replayed batch duplicates its rows.
  The goal ratio sink/spark >= 1.0 is against this one.

- ``raw`` — ``df.foreachPartition`` with confluent-kafka directly: ``acks=all``,
  idempotence, one producer per Python worker (cached like the sink's), waits for
  every delivery report and fails the task on any error. No message ids, no outbox:
  at-least-once, but a retried task's repeats cannot be told from new rows.
- ``raw + ids`` — the same plus what the sink's guarantee needs by hand: an id per row
  that a retried task repeats, here the cheapest one (a BLAKE2b digest of batch id,
  partition and row position, in a header). The sink's ids hash the row's content
  instead, which also survives a replay that reorders rows; that costs more per row, so
  this baseline flatters the hand-written side (goal sink/(raw + ids) >= 0.9).
- ``sink`` — ``foreach_batch_sink(url, topic)(df, batch_id)``: the same guarantees plus
  a deterministic message id per row and the per-batch report.
- ``via Producer`` — the same sink with an option only the Producer takes
  (``send_timeout``): it publishes through :class:`msgsafe.Producer` (receipts per chunk
  of rows) instead of the Kafka fast path, as a sink with an outbox does.
- ``data source`` — ``df.write.format("msgsafe")`` (:class:`msgsafe.spark.MsgsafeDataSource`,
  Spark 4's Python writer API, Arrow record batches): the sink's ids and promise through
  Spark's own writer; goal data source/spark >= 0.95.
- ``producer`` — ``df.foreachPartition`` with ``msgsafe.Producer.send_async`` per row
  (``outbox=False``), waiting for every receipt: what the sink adds on top of the SDK.
- CPU per row of this run's Python workers, Spark's JVM and Kafka brokers (from /proc)
  around Spark's sink, the sink and the sink via the Producer, over the counted rounds.
- ``empty`` — the sink on an empty batch (``df.limit(0)``: Spark knows it is empty),
  and on a scan that finds no rows next to a bare Spark job on the same scan.

Rounds alternate raw / raw + ids / producer / spark / sink on the same cached DataFrame
after one warm-up round that is not counted; the best round of each is reported with the
ratios sink/spark (goal >= 1.0), sink/(raw + ids) (goal >= 0.9) and sink/raw, and the
empty-batch overhead (goal <= 100 ms). The brokers are a 3-node Apache Kafka cluster
started here (replication factor 3, ``min.insync.replicas=2``) unless ``--url
kafka://...`` names another. ``--standalone`` runs it all on a Spark standalone cluster
(:class:`msgsafe.cluster.spark.SparkCluster`, one one-core worker per ``--cores``)
started here, instead of ``local[N]``.

    python -m benchmarks.bench_spark           # or: python benchmarks/bench_spark.py
    python -m benchmarks.bench_spark --standalone
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

_RAW_PRODUCERS: dict[str, Any] = {}

#: Process kinds whose CPU is measured around each write, by a part of their command line.
_KINDS = (
    ("python workers", "pyspark.daemon"),
    ("spark jvm", "SparkSubmit"),
    ("spark executors", "CoarseGrainedExecutorBackend"),
    ("kafka brokers", "kafka.Kafka"),
)


def _cpu_by_kind(kinds: Sequence[tuple[str, str]] = _KINDS) -> dict[str, float]:
    """CPU seconds (user + system) used so far by this benchmark's descendant processes
    of each of ``kinds`` (name, a part of the command line), from /proc (other engineers'
    brokers and Spark runs are not counted).
    Python workers are forked by pyspark.daemon, keep its command line and are reused
    across tasks, so they live through a write."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    commands: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                commands[int(entry)] = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        parents[int(entry)] = int(fields[1])
        used[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    totals = dict.fromkeys((kind for kind, _ in kinds), 0.0)
    for pid, seconds in used.items():
        ancestor = parents.get(pid)
        while ancestor and ancestor != os.getpid():
            ancestor = parents.get(ancestor)
        if ancestor != os.getpid():
            continue
        for kind, marker in kinds:
            if marker in commands.get(pid, ""):
                totals[kind] += seconds
                break
    return totals


class _CpuMeter:
    """CPU per row of each process kind, summed over the counted rounds of one writer."""

    def __init__(self, kinds: Sequence[tuple[str, str]] = _KINDS) -> None:
        self.seconds: dict[str, float] = {}
        self.rows = 0
        self._kinds = kinds
        self._start: dict[str, float] = {}

    def __enter__(self) -> _CpuMeter:
        self._start = _cpu_by_kind(self._kinds)
        return self

    def __exit__(self, *exc: object) -> None:
        for kind, value in _cpu_by_kind(self._kinds).items():
            self.seconds[kind] = self.seconds.get(kind, 0.0) + value - self._start[kind]

    def end_round(self, rows: int, counted: bool) -> None:
        """A round of ``rows`` ended: counted, or a warm-up whose CPU is dropped."""
        if counted:
            self.rows += rows
        else:
            self.seconds.clear()

    def per_row_us(self) -> dict[str, float]:
        return {k: v * 1e6 / self.rows for k, v in self.seconds.items()} if self.rows else {}


def _raw_producer(bootstrap: str) -> Any:
    """The hand-written baselines' producer, cached per Python worker like the sink's."""
    from confluent_kafka import Producer

    producer = _RAW_PRODUCERS.get(bootstrap)
    if producer is None:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "batch.num.messages": 10_000,
                "queue.buffering.max.messages": 100_000,
            }
        )
        _RAW_PRODUCERS[bootstrap] = producer
    return producer


def _raw_finish(producer: Any, errors: list[Any]) -> None:
    """Wait for every delivery report; fail the task on any error."""
    from confluent_kafka import KafkaException

    if producer.flush(120) != 0:
        raise KafkaException("delivery reports missing after 120 s")
    if errors:
        raise KafkaException(errors[0])


def _raw_partition(bootstrap: str, topic: str, rows: Iterable[Any]) -> None:
    """The hand-written baseline, run in each Python worker."""
    producer = _raw_producer(bootstrap)
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    produce = producer.produce
    for row in rows:
        value = row[0].encode()
        while True:
            try:
                produce(topic, value, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)  # local queue full: serve delivery reports
    _raw_finish(producer, errors)


def _raw_ids_partition(bootstrap: str, topic: str, batch: int, rows: Iterable[Any]) -> None:
    """The hand-written baseline with the sink's guarantee: a replay-stable id per row."""
    import hashlib

    from pyspark import TaskContext

    producer = _raw_producer(bootstrap)
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    context = TaskContext.get()
    prefix = b"%d:%d:" % (batch, context.partitionId() if context else 0)
    blake2b = hashlib.blake2b
    produce = producer.produce
    for position, row in enumerate(rows):
        value = row[0].encode()
        row_id = blake2b(prefix + b"%d" % position, digest_size=16).hexdigest()
        while True:
            try:
                produce(topic, value, headers=[("msgsafe-id", row_id)], on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
    _raw_finish(producer, errors)


_SDK_PRODUCERS: dict[str, Any] = {}


def _producer_partition(url: str, topic: str, rows: Iterable[Any]) -> None:
    """msgsafe's Producer in a hand-written foreachPartition: what the sink costs on top."""
    from msgsafe import Producer

    producer = _SDK_PRODUCERS.get(url)
    if producer is None:
        producer = _SDK_PRODUCERS[url] = Producer(url, outbox=False)
    # The same bounded window as the sink: a receipt is due confirm_timeout after send.
    window: deque[Any] = deque()
    for row in rows:
        window.append(producer.send_async(topic, row[0].encode()))
        if len(window) >= 5_000:
            window.popleft().result(120)
    for future in window:
        future.result(120)


def _spark_sink(df: Any, bootstrap: str, topic: str) -> None:
    """Spark's own Kafka sink, with the guarantees msgsafe's sink gives its broker writes."""
    (
        df.write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("kafka.acks", "all")
        .option("kafka.enable.idempotence", "true")
        .option("topic", topic)
        .save()
    )


def _datasource(df: Any, url: str, topic: str, batch_id: int) -> None:
    """msgsafe's data source, ``format("msgsafe")``, with the sink's defaults."""
    (
        df.write.format("msgsafe")
        .mode("append")
        .option("url", url)
        .option("destination", topic)
        .option("batch_id", batch_id)
        .save()
    )


def _session(cores: int, master: str | None = None, *, kafka_sink: bool = True) -> Any:
    """A session on ``master`` (or ``local[cores]``) with msgsafe's data source registered
    and, with ``kafka_sink``, Spark's own Kafka sink on ``spark.jars``."""
    from pyspark.sql import SparkSession

    from msgsafe.spark import MsgsafeDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    builder = SparkSession.builder.master(master or f"local[{cores}]")
    if kafka_sink:
        from tests.support.spark_kafka import spark_kafka_jars

        builder = builder.config("spark.jars", ",".join(spark_kafka_jars()))
    session = (
        builder.appName("msgsafe-bench-spark")
        # Executors of a standalone cluster import this module's functions.
        .config("spark.executorEnv.PYTHONPATH", root)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executor.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(MsgsafeDataSource)
    return session


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print a table and return the figures."""
    parser = argparse.ArgumentParser(description="Spark sink throughput")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument(
        "--url", help="kafka://host:port,... (default: a 3-node Kafka cluster started here)"
    )
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="run on a Spark standalone cluster (one one-core worker per --cores) started here",
    )
    args = parser.parse_args(argv)

    from msgsafe.cluster.kafka import KafkaCluster
    from msgsafe.cluster.kafka_admin import create_topic
    from msgsafe.spark import foreach_batch_sink

    cluster = None
    url = args.url
    if url is None:
        cluster = KafkaCluster(nodes=3)
        cluster.start()
        print(f"kafka cluster up in {cluster.start_seconds:.1f} s: {cluster.url}", flush=True)
        url = cluster.url
    bootstrap = url.removeprefix("kafka://").split("?", 1)[0]
    standalone = None
    if args.standalone:
        from msgsafe.cluster.spark import SparkCluster

        standalone = SparkCluster(nodes=args.cores, cores=1, memory="1536m")
        standalone.start()
        print(f"spark standalone up in {standalone.start_seconds:.1f} s: {standalone.url}")
    where = standalone.url if standalone is not None else f"local[{args.cores}]"
    try:
        spark = _session(args.cores, standalone.url if standalone is not None else None)
    except BaseException:
        if standalone is not None:
            standalone.stop()
        raise
    try:
        df = spark.range(0, args.rows, numPartitions=args.cores).selectExpr(
            "cast(id AS string) AS value"
        )
        df = df.cache()
        df.count()
        raw: list[float] = []
        raw_ids: list[float] = []
        sink_rates: list[float] = []
        producer_rates: list[float] = []
        spark_rates: list[float] = []
        via_producer: list[float] = []
        ds_rates: list[float] = []
        spark_cpu, sink_cpu, via_cpu = _CpuMeter(), _CpuMeter(), _CpuMeter()
        ds_cpu = _CpuMeter()
        # Round 0 warms up Python workers, producers and the JVM; it is not counted.
        for round_ in range(args.rounds + 1):
            topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
            create_topic(bootstrap, topic, args.cores, 3, timeout=30)
            started = time.perf_counter()
            df.foreachPartition(lambda rows, t=topic: _raw_partition(bootstrap, t, rows))
            raw.append(args.rows / (time.perf_counter() - started))

            started = time.perf_counter()
            df.foreachPartition(
                lambda rows, t=topic, b=round_: _raw_ids_partition(bootstrap, t, b, rows)
            )
            raw_ids.append(args.rows / (time.perf_counter() - started))

            started = time.perf_counter()
            df.foreachPartition(lambda rows, t=topic: _producer_partition(url, t, rows))
            producer_rates.append(args.rows / (time.perf_counter() - started))

            started = time.perf_counter()
            with spark_cpu:
                _spark_sink(df, bootstrap, topic)
            spark_rates.append(args.rows / (time.perf_counter() - started))

            sink = foreach_batch_sink(url, topic)
            started = time.perf_counter()
            with sink_cpu:
                report = sink(df, round_)
            sink_rates.append(args.rows / (time.perf_counter() - started))
            if report.confirmed != args.rows:
                raise RuntimeError(f"the sink confirmed {report.confirmed} of {args.rows}")

            # send_timeout is an option only the Producer takes: this sink skips the
            # Kafka fast path, as a sink with an outbox or telemetry does.
            sink = foreach_batch_sink(url, topic, send_timeout=30.0)
            started = time.perf_counter()
            with via_cpu:
                report = sink(df, 1000 + round_)
            via_producer.append(args.rows / (time.perf_counter() - started))
            if report.confirmed != args.rows:
                raise RuntimeError(f"the sink confirmed {report.confirmed} of {args.rows}")

            started = time.perf_counter()
            with ds_cpu:
                _datasource(df, url, topic, 2000 + round_)
            ds_rates.append(args.rows / (time.perf_counter() - started))
            for meter in (spark_cpu, sink_cpu, via_cpu, ds_cpu):
                meter.end_round(args.rows, counted=round_ > 0)
            print(
                f"  round {round_}{' (warm-up)' if not round_ else ''}: "
                f"raw {raw[-1]:>9,.0f}   raw + ids {raw_ids[-1]:>9,.0f}   "
                f"producer {producer_rates[-1]:>9,.0f}   spark {spark_rates[-1]:>9,.0f}   "
                f"sink {sink_rates[-1]:>9,.0f}   via Producer {via_producer[-1]:>9,.0f}   "
                f"data source {ds_rates[-1]:>9,.0f} rows/s",
                flush=True,
            )
            if not round_:
                raw.clear()
                raw_ids.clear()
                producer_rates.clear()
                spark_rates.clear()
                sink_rates.clear()
                via_producer.clear()
                ds_rates.clear()

        # What a DataFrame with no rows looks like to the optimizer (an empty local
        # relation): no Spark job is needed.
        empty_df = df.limit(0)
        empty_topic = f"bench-spark-empty-{uuid.uuid4().hex[:8]}"
        empty_sink = foreach_batch_sink(url, empty_topic)
        empty_sink(df.limit(1), 0)  # the producers exist, as in a running query
        empty: list[float] = []
        bare: list[float] = []
        filtered_empty: list[float] = []
        nothing = df.where("value = 'none'")
        for i in range(5):
            started = time.perf_counter()
            empty_sink(empty_df, 100 + i)
            empty.append(time.perf_counter() - started)
            started = time.perf_counter()
            empty_sink(nothing, 200 + i)
            filtered_empty.append(time.perf_counter() - started)
            started = time.perf_counter()
            nothing.foreachPartition(lambda rows: None)
            bare.append(time.perf_counter() - started)
    finally:
        spark.stop()
        if standalone is not None:
            standalone.stop()
        if cluster is not None:
            cluster.stop()

    figures: dict[str, Any] = {
        "raw_best": max(raw),
        "raw_ids_best": max(raw_ids),
        "sink_best": max(sink_rates),
        "spark_best": max(spark_rates),
        "ratio_spark": max(sink_rates) / max(spark_rates),
        "ratio_spark_rounds": [s / k for s, k in zip(sink_rates, spark_rates, strict=True)],
        "ratio": max(sink_rates) / max(raw_ids),
        "ratio_no_ids": max(sink_rates) / max(raw),
        "producer_best": max(producer_rates),
        "ratio_producer": max(sink_rates) / max(producer_rates),
        "empty_ms": statistics.median(empty) * 1000,
        "empty_scan_ms": statistics.median(filtered_empty) * 1000,
        "bare_job_ms": statistics.median(bare) * 1000,
        "via_producer_best": max(via_producer),
        "ratio_via_producer": max(via_producer) / max(spark_rates),
        "datasource_best": max(ds_rates),
        "ratio_datasource_spark": max(ds_rates) / max(spark_rates),
        "ratio_datasource_spark_rounds": [
            d / k for d, k in zip(ds_rates, spark_rates, strict=True)
        ],
        "ratio_datasource_sink": max(ds_rates) / max(sink_rates),
        "cpu_us_per_row": {
            "spark": spark_cpu.per_row_us(),
            "sink": sink_cpu.per_row_us(),
            "via Producer": via_cpu.per_row_us(),
            "data source": ds_cpu.per_row_us(),
        },
    }
    print(f"{args.rows:,} rows on {where}, Kafka {url}")
    print(
        f"  Spark's own Kafka sink (acks=all)       {figures['spark_best']:>10,.0f} rows/s (best)"
    )
    print(f"  raw foreachPartition (confluent-kafka)  {figures['raw_best']:>10,.0f} rows/s (best)")
    print(
        f"  raw + a replay-stable id per row        {figures['raw_ids_best']:>10,.0f} rows/s (best)"
    )
    print(f"  msgsafe foreach_batch_sink              {figures['sink_best']:>10,.0f} rows/s (best)")
    print(
        f"  the sink through the Producer (no fast path) "
        f"{figures['via_producer_best']:>10,.0f} rows/s "
        f"(best; / Spark's sink {figures['ratio_via_producer']:.2f})"
    )
    print(
        f"  msgsafe Producer in foreachPartition    {figures['producer_best']:>10,.0f} rows/s "
        "(best)"
    )
    ds_rounds = ", ".join(f"{r:.2f}" for r in figures["ratio_datasource_spark_rounds"])
    print(
        f"  msgsafe format('msgsafe') data source   {figures['datasource_best']:>10,.0f} rows/s "
        f"(best; / Spark's sink {figures['ratio_datasource_spark']:.2f}, goal >= 0.95; "
        f"rounds {ds_rounds}; / the sink {figures['ratio_datasource_sink']:.2f})"
    )
    rounds = ", ".join(f"{r:.2f}" for r in figures["ratio_spark_rounds"])
    print(
        f"  ratio sink/Spark's sink                 {figures['ratio_spark']:>10.2f} (goal >= 1.0;"
        f" rounds {rounds})"
    )
    print(f"  ratio sink/(raw + ids)                  {figures['ratio']:>10.2f} (goal >= 0.9)")
    print(f"  ratio sink/raw (no ids)                 {figures['ratio_no_ids']:>10.2f}")
    print(f"  ratio sink/Producer-foreachPartition    {figures['ratio_producer']:>10.2f}")
    print(f"  empty batch (no rows, known empty)      {figures['empty_ms']:>10.1f} ms (median)")
    print(
        f"  empty batch (a scan that finds none)    {figures['empty_scan_ms']:>10.1f} ms (median)"
    )
    print(f"  bare Spark job on that scan             {figures['bare_job_ms']:>10.1f} ms (median)")
    for writer, kinds in figures["cpu_us_per_row"].items():
        spent = "   ".join(f"{kind} {us:.2f}" for kind, us in kinds.items())
        total = sum(kinds.values())
        print(f"  CPU per row, {writer:<12} (µs)  {spent}   all {total:.2f}")
    return figures


if __name__ == "__main__":
    main()

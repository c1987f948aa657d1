"""The report of a ``format("msgsafe")`` write whose driver is SIGKILLed mid-batch,
against the suite's real Kafka: its confirmed count must be what the broker confirmed,
or say that it is a lower bound and for how many partitions it does not know.

The story: 4,000 rows in two partitions (batch id 43). Partition 0's task finishes and
its commit message reaches the driver. Partition 1's task has published every row (the
topic holds all 4,000) and still runs: the step before the writer holds its input open
after the last row. Then the driver's Python process is SIGKILLed: its JVM sees the
pipe from it close and exits, and on the way out stops the SparkContext, which cancels
the job; Spark calls the writer's ``abort`` with partition 0's message and ``None`` for
partition 1. That report used to read "2,000 confirmed, 1 partition failed" as if
exact, while the topic held 4,000.

The driver is another process (this module run with ``python -m``; a SparkSession is
one per process, and the suite's is the shared one).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from msgsafe.spark.ids import ContentIds
from tests.integration.spark._support import consume, start_driver, tally
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
ROWS_PER_PARTITION = 2_000
BATCH_ID = 43
DEADLINE_S = 300.0


# --- the driver (another process) ---------------------------------------------------------


def _hold_partition_1(markers: str, batches: Iterator[Any]) -> Iterator[Any]:
    """The ``mapInArrow`` step before the writer: partition 0 passes as it is; partition
    1 passes every row, writes ``held-1`` and then keeps its input open until ``open``
    exists (never, in the kill story).

    While it holds, it yields filler rows (``keep`` false, dropped by the filter before
    the writer) so that the worker's output buffer pushes the partition's last real
    rows on to the writer instead of sitting on them.
    """
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    yield from batches
    if context.partitionId() != 1:
        return
    base = Path(markers)
    (base / "held-1").touch()
    # NOTE: the JVM's batching loop asks for the next row before it sends a full batch
    # on (hasNext first, then the row count): one more kept row lets partition 1's last
    # batch go, and itself waits for a batch that never fills (it is never sent).
    yield pa.RecordBatch.from_pydict({"value": ["never"], "key": ["k"], "keep": [True]})
    filler = pa.RecordBatch.from_pydict(
        {
            "value": ["x" * 64] * 2_000,
            "key": ["x"] * 2_000,
            "keep": [False] * 2_000,
        }
    )
    deadline = time.monotonic() + DEADLINE_S
    while not (base / "open").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the test never killed the driver")
        yield filler
        time.sleep(0.1)  # the pace of the filler, not a synchronisation


def driver(argv: list[str] | None = None) -> None:
    """Run the batch write of the story; it never returns by itself (partition 1 is
    held until the test kills this process)."""
    parser = argparse.ArgumentParser()
    for name in ("url", "destination", "markers", "reports"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args(argv)

    import functools

    from pyspark.sql import SparkSession

    from msgsafe.spark import MsgsafeDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("msgsafe-abort")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", str(ROOT))
        # NOTE: the JVM hands the writer Arrow batches of this many rows through a
        # stream buffered by this many bytes, flushed when full: at Spark's 10,000 rows
        # and 64 KiB partition 1's 2,000 small rows waited there (behind the held input)
        # and never reached the writer.
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
        .config("spark.sql.execution.pandas.udf.buffer.size", "8")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MsgsafeDataSource)
    hold = functools.partial(_hold_partition_1, args.markers)
    (
        spark.range(0, 2 * ROWS_PER_PARTITION, numPartitions=2)
        .selectExpr("cast(id AS string) AS value", "concat('k', id % 7) AS key", "true AS keep")
        .mapInArrow(hold, "value string, key string, keep boolean")
        .where("keep")
        .select("value", "key")
        .write.format("msgsafe")
        .mode("append")
        .option("url", args.url)
        .option("destination", args.destination)
        .option("key_col", "key")
        .option("batch_id", BATCH_ID)
        .option("report_dir", args.reports)
        .save()
    )


# --- the test side ------------------------------------------------------------------------


class Driver:
    """The driver process in its own session: Python, and its JVM as a child."""

    def __init__(self, log: Path, args: list[str]) -> None:
        self.log = log
        self.proc = start_driver("tests.integration.spark.test_datasource_abort", log, args)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def group_gone(self) -> bool:
        """Whether no process of the driver's session is left (its JVM exited too)."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return True
        return False

    def kill_all(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "markers").mkdir()
    return tmp_path


def test_the_abort_report_after_a_driver_kill_counts_what_the_broker_confirmed(
    kafka_url: str, kafka_topic: str, work: Path
) -> None:
    markers, reports = work / "markers", work / "reports"
    args = ["--url", kafka_url, "--destination", kafka_topic]
    args += ["--markers", str(markers), "--reports", str(reports)]
    job = Driver(work / "driver.log", args)
    try:
        total = 2 * ROWS_PER_PARTITION
        expected = collections.Counter(str(i).encode() for i in range(total))
        # Content ids: spark.range puts rows [p*N, (p+1)*N) in partition p.
        known: set[str] = set()
        for p in (0, 1):
            gen = ContentIds(kafka_topic, BATCH_ID, p)
            for i in range(p * ROWS_PER_PARTITION, (p + 1) * ROWS_PER_PARTITION):
                known.add(gen.next_id(str(i).encode(), f"k{i % 7}".encode(), {}))

        # Mid-batch: partition 0 is done, partition 1 has published and holds.
        wait_until(
            lambda: (markers / "held-1").exists() or not job.alive(),
            DEADLINE_S,
            "partition 1 to hold",
        )
        assert job.alive(), f"the driver exited early:\n{job.tail()}"
        # NOTE: not all of partition 1 need be out: the JVM was seen to keep its last
        # Arrow batch back while the input is held (500 rows here). What the topic holds
        # is counted after the kill; the report must match or bound it.
        before = consume(
            kafka_url, kafka_topic, set(expected), deadline_s=60, group=f"g-{uuid.uuid4()}"
        )
        published_by_1 = sum(
            1 for b in before.bodies.values() if b.isdigit() and int(b) >= ROWS_PER_PARTITION
        )
        assert published_by_1 > 0, f"partition 1 published nothing before the kill: {before}"
        assert job.alive(), f"the write ended before the kill:\n{job.tail()}"

        # The driver's Python process only: its JVM goes down on its own, aborting.
        os.kill(job.proc.pid, signal.SIGKILL)
        job.proc.wait(30)
        aborted = reports / f"batch-{BATCH_ID}.aborted.json"
        wait_until(
            lambda: aborted.exists() or job.group_gone(),
            DEADLINE_S,
            "the abort report, or the driver's JVM to exit",
        )
        wait_until(aborted.exists, 10, "the abort report", diagnose=job.tail)
    finally:
        (markers / "open").touch()
        job.kill_all()

    from msgsafe.spark import read_reports

    [(outcome, report)] = read_reports(reports)
    held = tally(
        expected,
        consume(kafka_url, kafka_topic, set(expected), deadline_s=60, group=f"g-{uuid.uuid4()}"),
        known,
    )
    print(f"[abort after a driver kill -> kafka] {outcome}: {report}; the topic: {held}")
    assert outcome == "aborted" and report.batch_id == BATCH_ID
    assert held.unknown == 0 and held.wrong_rows == held.lost and held.duplicates == 0
    on_topic = held.unique
    assert on_topic >= ROWS_PER_PARTITION + published_by_1
    # The report never claims more than the broker holds, and what it leaves out is
    # covered by the partitions it says it does not know.
    assert report.confirmed + report.stored <= on_topic, report
    if report.exact:
        assert report.confirmed + report.stored == on_topic, report
    else:
        assert on_topic - report.confirmed - report.stored <= (
            report.unknown_partitions * ROWS_PER_PARTITION
        ), report
        assert report.partitions + report.unknown_partitions == 2, report


if __name__ == "__main__":
    driver()

"""The report of a ``format("msgsafe")`` write that Spark aborts while a task that
finished is still unheard of, against the suite's real Kafka: its confirmed count must
be what the broker confirmed, or say that it is a lower bound and for how many
partitions it does not know.

The story (reported after a driver SIGKILL mid-batch; here the closest reproducible
equivalent): 4,000 rows in two partitions (batch id 43). The step before the writer
fails partition 1's input after its last row: the writer takes that for the end of
the partition and finishes with its rows confirmed, but its task fails, the job fails,
and Spark calls ``abort`` without partition 1's commit message (and without partition
0's when its task was cancelled). That report used to count only the messages and
call the rest failed partitions, as if exact, while the topic held more.

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


def _fail_partition_1(markers: str, batches: Iterator[Any]) -> Iterator[Any]:
    """The ``mapInArrow`` step before the writer: partition 0 passes as it is; partition
    1 passes every row, writes ``passed-1`` and then fails: its task fails (local mode
    retries nothing), the job with it, and Spark cancels partition 0's task if it still
    runs. The writer of partition 1 was seen to take the end of its input for the end
    of the partition and finish (its rows confirmed) while its task failed."""
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    yield from batches
    if context.partitionId() == 1:
        (Path(markers) / "passed-1").touch()
        raise RuntimeError("partition 1's input fails after its last row")


def driver(argv: list[str] | None = None) -> None:
    """Run the batch write of the story (it fails: partition 1's input fails)."""
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
        # and 64 KiB partition 1's 2,000 small rows waited there while its input was
        # held, and none reached the writer; at these, all but its last batch did.
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
        .config("spark.sql.execution.pandas.udf.buffer.size", "8")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MsgsafeDataSource)
    fail = functools.partial(_fail_partition_1, args.markers)
    (
        spark.range(0, 2 * ROWS_PER_PARTITION, numPartitions=2)
        .selectExpr("cast(id AS string) AS value", "concat('k', id % 7) AS key", "true AS keep")
        .mapInArrow(fail, "value string, key string, keep boolean")
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


def test_an_aborted_write_reports_what_the_broker_confirmed(
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

        aborted = reports / f"batch-{BATCH_ID}.aborted.json"
        wait_until(lambda: not job.alive(), DEADLINE_S, "the write to fail", diagnose=job.tail)
        assert job.proc.returncode != 0, f"the write did not fail:\n{job.tail()}"
        assert (markers / "passed-1").exists(), f"partition 1 never ran out:\n{job.tail()}"
        wait_until(aborted.exists, 10, "the abort report", diagnose=job.tail)
    finally:
        job.kill_all()

    from msgsafe.spark import read_reports

    [(outcome, report)] = read_reports(reports)
    held = tally(
        expected,
        consume(kafka_url, kafka_topic, set(expected), deadline_s=60, group=f"g-{uuid.uuid4()}"),
        known,
    )
    print(f"[abort without partition messages -> kafka] {outcome}: {report}; the topic: {held}")
    assert outcome == "aborted" and report.batch_id == BATCH_ID
    assert held.unknown == 0 and held.wrong_rows == held.lost and held.duplicates == 0
    on_topic = held.unique
    assert on_topic > 0, "nothing was published: the story did not happen"
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

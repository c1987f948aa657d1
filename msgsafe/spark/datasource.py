"""Spark's own writer API: ``df.write.format("msgsafe")`` and ``df.writeStream.format("msgsafe")``.

PySpark 4 lets a Python class be a data source (:mod:`pyspark.sql.datasource`). Registered
once per session, :class:`MsgsafeDataSource` is the :mod:`~msgsafe.spark.sink` as such a
source, with the same options, ids and promise::

    from msgsafe.spark import MsgsafeDataSource

    spark.dataSource.register(MsgsafeDataSource)
    (df.write.format("msgsafe").mode("append")
        .option("url", "kafka://b1:9092").option("destination", "events")
        .option("key_col", "user").option("batch_id", 20261122)
        .save())
    (df.writeStream.format("msgsafe")
        .option("url", "amqp://h1,h2/%2F").option("destination", "events")
        .option("producer.declare", "quorum")
        .option("checkpointLocation", "/chk/events")
        .start())

Each task writes its partition with the sink's executor code (Arrow record batches
through :func:`~msgsafe.spark.arrow.publish_batches`, or pickled rows through
:func:`~msgsafe.spark.partition.publish_partition` where PySpark has no Arrow writer):
it returns only when every row is CONFIRMED (or STORED, with an outbox) and fails
otherwise, and Spark retries it. A transient failure (a broker node restarting for a
few seconds) is waited for inside an Arrow task first: it keeps its partition's record
batches (Arrow buffers Spark already made) until they are safe, and sends them again
with the same ids, with backoff, until ``receipt_timeout`` has passed since the failure.

Spark calls ``commit`` on the driver when every task
of a write (or of a micro-batch) succeeded and ``abort`` when the write failed (a task
failed for good, or the job was cancelled, as when its driver dies); both log what the
batch did as a :class:`~msgsafe.spark.SparkBatchReport` and, with ``report_dir``, write
it to a file there (:func:`read_reports`). ``abort`` gets no commit message from a task
that had not reported yet, finished or not: each task also records its partition's
counts in ``report_dir`` before it returns, and a partition without either is reported
as unknown (:func:`partition_outcomes`), never as a count. NOTE: Spark forwards
no metric of a Python writer into a streaming query's progress (its ``sink.metrics``
stay empty), hence the log and the file.

Message ids are the sink's (:mod:`~msgsafe.spark.ids`): ``(destination, batch id,
id_cols)`` or ``(destination, batch id, partition, row content, rank)``. In a stream the
batch id is Spark's micro-batch id, which a query restarted from its checkpoint reuses
for the batch it replays; a batch write takes ``batch_id`` from its options (re-running
a job with the same number repeats the same ids) or, without it, a number the driver
picks once per write (stable across task retries, logged and reported). Consumers with
``dedup=`` drop every repeat.

Options (Spark passes them as strings; names are case-insensitive):

=====================  ==============================================================
``url``                the broker (required; may hold credentials, never logged)
``destination``        topic, queue or address (required)
``value_col``          binary or string column of the body (default ``value``)
``key_col``            binary or string column of the key (optional)
``header_cols``        comma-separated string columns sent as headers
``id_cols``            comma-separated columns that identify a row (see above)
``outbox``             ``false`` (default), ``true`` or a path (see the sink)
``max_in_flight``      sends per partition awaiting confirmation (default 50000)
``receipt_timeout``    seconds a task waits for one receipt (default 120)
``batch_id``           a batch write's id number (an integer; default: picked per write)
``report_dir``         directory where commit and abort write each batch's report (and
                       each task its partition's counts, for abort)
``producer.NAME``      option ``NAME`` for :class:`~msgsafe.Producer` and the adapter;
                       the value is read as JSON when it parses (``5``, ``true``) and
                       as a string otherwise (``quorum``)
=====================  ==============================================================

Needs PySpark >= 4.0 on the driver (4.1 for the streaming Arrow writer; 4.0 streams
through the row writer) and msgsafe with the broker's extra on the executors.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from msgsafe.errors import ClosedError, ConfigurationError, MissingExtra, TransientError
from msgsafe.spark import arrow
from msgsafe.spark.partition import PartitionPlan, PartitionResult, publish_partition
from msgsafe.spark.sink import ForeachBatchSink, SparkBatchReport

try:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        WriterCommitMessage,
    )
except ImportError as exc:  # pragma: no cover - the spark extra brings PySpark 4
    raise MissingExtra("spark", "pyspark>=4.0") from exc

#: Whether this PySpark hands a streaming writer Arrow record batches (4.1+).
STREAM_ARROW = True
try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamBase
except ImportError:  # pragma: no cover - PySpark 4.0 streams rows
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamBase  # type: ignore[assignment]

    STREAM_ARROW = False

__all__ = [
    "MsgsafeDataSource",
    "MsgsafeStreamWriter",
    "MsgsafeWriter",
    "PartitionCommit",
    "SinkOptions",
    "partition_outcomes",
    "read_reports",
    "record_partition",
]

log = logging.getLogger("msgsafe.spark")

#: The local property Spark sets on every task of a micro-batch: its batch id.
_BATCH_ID_PROPERTY = "streaming.sql.batchId"

#: Options Spark itself adds or reads (not the data source's to check).
_SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})

#: Producer options named ``producer.NAME``.
_PRODUCER_PREFIX = "producer."

_KNOWN = frozenset(
    {
        "url",
        "destination",
        "value_col",
        "key_col",
        "header_cols",
        "id_cols",
        "outbox",
        "max_in_flight",
        "receipt_timeout",
        "batch_id",
        "report_dir",
    }
)


def _names(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _number(
    options: Mapping[str, str], name: str, kind: type[int] | type[float], default: Any
) -> Any:
    text = options.get(name)
    if text is None:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ConfigurationError(
            f"option {name!r} must be {'an integer' if kind is int else 'a number'}, not {text!r}"
        ) from None


def _outbox(text: str | None) -> bool | str:
    if text is None or text.strip().lower() in ("", "false", "no", "0"):
        return False
    if text.strip().lower() in ("true", "yes", "1"):
        return True
    return text


def _producer_value(text: str) -> object:
    # Spark options are strings; numbers and booleans are what Producer options mostly
    # are, and a JSON reading gives them their type ("quorum" stays a string).
    try:
        value: object = json.loads(text)
    except ValueError:
        return text
    return value


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """The data source's options, checked and typed (see the module docstring).

    Unknown options are refused (a typo must not be a silent default); Spark's own
    (``path``, ``checkpointLocation``, ``queryName``) are passed over.
    """

    url: str
    destination: str
    value_col: str = "value"
    key_col: str | None = None
    header_cols: tuple[str, ...] = ()
    id_cols: tuple[str, ...] | None = None
    outbox: bool | str = False
    max_in_flight: int = 50_000
    receipt_timeout: float = 120.0
    batch_id: int | None = None
    report_dir: str | None = None
    producer_options: tuple[tuple[str, object], ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Read Spark's options; :class:`ConfigurationError` naming what is wrong."""
        lowered = {str(name).lower(): str(value) for name, value in options.items()}
        producer: list[tuple[str, object]] = []
        unknown: list[str] = []
        for name, value in sorted(lowered.items()):
            if name.startswith(_PRODUCER_PREFIX) and len(name) > len(_PRODUCER_PREFIX):
                producer.append((name[len(_PRODUCER_PREFIX) :], _producer_value(value)))
            elif name not in _KNOWN and name not in _SPARK_OPTIONS:
                unknown.append(name)
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) of format('msgsafe'): {', '.join(unknown)} "
                f"(known: {', '.join(sorted(_KNOWN))}, and producer.NAME for a Producer option)"
            )
        for required in ("url", "destination"):
            if not lowered.get(required):
                raise ConfigurationError(f"format('msgsafe') needs .option({required!r}, ...)")
        id_cols = _names(lowered.get("id_cols"))
        if "id_cols" in lowered and not id_cols:
            raise ConfigurationError("option 'id_cols' must name at least one column")
        parsed = cls(
            url=lowered["url"],
            destination=lowered["destination"],
            value_col=lowered.get("value_col") or "value",
            key_col=lowered.get("key_col") or None,
            header_cols=_names(lowered.get("header_cols")),
            id_cols=id_cols or None,
            outbox=_outbox(lowered.get("outbox")),
            max_in_flight=_number(lowered, "max_in_flight", int, 50_000),
            receipt_timeout=_number(lowered, "receipt_timeout", float, 120.0),
            batch_id=_number(lowered, "batch_id", int, None),
            report_dir=lowered.get("report_dir") or None,
            producer_options=tuple(producer),
        )
        parsed.sink()  # every check of the sink, before Spark plans anything
        return parsed

    def sink(self) -> ForeachBatchSink:
        """The ``foreachBatch`` sink with these options: its checks and its plan."""
        return ForeachBatchSink(
            self.url,
            self.destination,
            value_col=self.value_col,
            key_col=self.key_col,
            header_cols=self.header_cols,
            id_cols=self.id_cols,
            outbox=self.outbox,
            max_in_flight=self.max_in_flight,
            receipt_timeout=self.receipt_timeout,
            producer_options=dict(self.producer_options),
        )

    def __repr__(self) -> str:
        # The URL may hold credentials: the plan's target is the redacted one.
        return f"SinkOptions(destination={self.destination!r}, batch_id={self.batch_id!r})"


@dataclass(frozen=True, slots=True)
class PartitionCommit(WriterCommitMessage):
    """What one successful task sent back to the driver: its batch and its result."""

    batch_id: int
    result: PartitionResult


def _task() -> tuple[int, int, Any]:
    """This task's partition, attempt and context (0, 0, None outside Spark)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return 0, 0, None
    return context.partitionId(), context.attemptNumber(), context


class _Writing:
    """What the batch and the streaming writer share: the plan made on the driver, the
    executor side (:meth:`_publish_arrow`, :meth:`_publish_rows`) and the reports
    (:meth:`_commit`, :meth:`_abort`).

    Created on the driver and pickled to every task with the plan, so a retried task
    and every partition of a write publish with the same ids.
    """

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        names, plan = options.sink().plan(schema)
        positions = {f.name: i for i, f in enumerate(schema.fields)}
        self._plan: PartitionPlan = plan
        #: Where each column of the plan's row tuples is in Spark's (the whole schema).
        self._columns = tuple(positions[name] for name in names)
        self._names = tuple(names)
        self._destination = options.destination
        self._report_dir = options.report_dir

    # --- executor side --------------------------------------------------------------------

    def _publish_arrow(self, batch_id: int, batches: Iterator[Any]) -> PartitionCommit:
        import pyarrow as pa

        partition, attempt, _ = _task()
        columns, names = self._columns, list(self._names)
        kept: list[Any] = []

        def selected() -> Iterator[Any]:
            for batch in batches:
                # Zero-copy: the plan's columns in the plan's order.
                chosen = pa.RecordBatch.from_arrays([batch.column(i) for i in columns], names=names)
                kept.append(chosen)
                yield chosen

        plan = self._plan
        source = selected()
        try:
            result = arrow.publish_batches(plan, batch_id, partition, source, attempt=attempt)
        except (TransientError, ClosedError) as first:
            # A broker that restarts for a few seconds is waited for inside the task:
            # the partition is sent again (same ids) until receipt_timeout has passed
            # since this failure; then the task fails and Spark retries it.
            def again() -> Iterator[Any]:
                # What was read so far, then the rest (a failed try may stop early).
                return itertools.chain(list(kept), source)

            result = self._again(first, again, batch_id, partition, attempt)
        return self._finished(batch_id, result)

    def _again(
        self,
        first: BaseException,
        batches: Callable[[], Iterator[Any]],
        batch_id: int,
        partition: int,
        attempt: int,
    ) -> PartitionResult:
        """Publish the partition (``batches()``: its record batches from the first) again
        after ``first`` failed, with backoff, until it succeeds or ``receipt_timeout`` has
        passed (then raise the latest error)."""
        plan = self._plan
        deadline = time.monotonic() + plan.receipt_timeout
        pause, tries = 0.5, 1
        error: BaseException = first
        while time.monotonic() + pause < deadline:
            log.warning(
                "batch %d partition %d to %s %r: %s; sending the partition again in %.1f s "
                "(same ids)",
                batch_id,
                partition,
                plan.target,
                plan.destination,
                error,
                pause,
            )
            time.sleep(pause)  # a backoff between attempts, not a synchronisation
            tries += 1
            try:
                return arrow.publish_batches(plan, batch_id, partition, batches(), attempt=attempt)
            except (TransientError, ClosedError) as exc:
                error = exc
            pause = min(pause * 2, 5.0)
        error.add_note(
            f"msgsafe Spark data source: {tries} tries within receipt_timeout="
            f"{plan.receipt_timeout}s; the task fails so that Spark retries it"
        )
        raise error

    def _publish_rows(self, batch_id: int, rows: Iterator[Any]) -> PartitionCommit:
        partition, attempt, _ = _task()
        columns = self._columns
        selected = (tuple(row[i] for i in columns) for row in rows)
        result = publish_partition(self._plan, batch_id, partition, selected, attempt=attempt)
        return self._finished(batch_id, result)

    def _finished(self, batch_id: int, result: PartitionResult) -> PartitionCommit:
        """The commit message of a task whose partition is safe, recorded first (with
        ``report_dir``) beside the batch's report: Spark may never hand the message to
        ``abort`` (a write aborted while it ran, or cancelled because its driver died),
        and the record still tells what the broker confirmed."""
        if self._report_dir is not None:
            record_partition(self._report_dir, batch_id, result)
        return PartitionCommit(batch_id, result)

    # --- driver side ----------------------------------------------------------------------

    def _results(self, messages: Sequence[Any]) -> list[PartitionResult]:
        return [m.result for m in messages if isinstance(m, PartitionCommit)]

    def _commit(self, messages: Sequence[Any], batch_id: int) -> SparkBatchReport:
        results = self._results(messages)
        report = SparkBatchReport.sum(
            batch_id,
            self._destination,
            results,
            # The longest task: the driver's commit runs in a process that saw none.
            max((r.seconds for r in results), default=0.0),
        )
        log.info("%s", report)
        self._write_report(batch_id, "committed", report, failed_partitions=0)
        return report

    def _abort(self, messages: Sequence[Any], batch_id: int) -> SparkBatchReport:
        results, unknown = partition_outcomes(messages, batch_id, self._report_dir)
        report = SparkBatchReport.sum(
            batch_id,
            self._destination,
            results,
            max((r.seconds for r in results), default=0.0),
            unknown_partitions=unknown,
        )
        log.error(
            "batch %d to %s %r aborted: %d of %d partition(s) published %d rows (%d confirmed, "
            "%d stored); the outcome of %d partition(s) is unknown (failed, or cancelled or "
            "killed before reporting: what they published is not counted%s). A run with the "
            "same batch id repeats the same ids (consumers with dedup= drop them)",
            batch_id,
            self._plan.target,
            self._destination,
            len(results),
            len(messages),
            report.rows,
            report.confirmed,
            report.stored,
            unknown,
            ", so these are lower bounds" if unknown else "",
        )
        self._write_report(batch_id, "aborted", report, failed_partitions=unknown)
        return report

    def _write_report(
        self, batch_id: int, outcome: str, report: SparkBatchReport, *, failed_partitions: int
    ) -> None:
        if self._report_dir is None:
            return
        folder = Path(self._report_dir)
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            "outcome": outcome,
            "failed_partitions": failed_partitions,
            "confirmed_exact": report.exact,
            **asdict(report),
        }
        _write_json(folder / f"batch-{batch_id}.{outcome}.json", record)
        if outcome == "committed":
            # The report covers every partition: their records are no longer needed.
            shutil.rmtree(_partitions_dir(folder, batch_id), ignore_errors=True)


class MsgsafeWriter(_Writing, DataSourceArrowWriter):
    """``df.write.format("msgsafe")``: one batch, ``batch_id`` from the options or picked
    on the driver when the write is planned. Arrow record batches to the executors."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        super().__init__(options, schema)
        if options.batch_id is not None:
            self.batch_id = options.batch_id
        else:
            # Milliseconds since the epoch: a fresh number per write, the same in every
            # task and retry of it (the writer is pickled to them).
            self.batch_id = time.time_ns() // 1_000_000
            log.info(
                "batch write to %r without option batch_id: its messages carry batch id %d "
                "(pass .option('batch_id', %d) to re-run it with the same ids)",
                options.destination,
                self.batch_id,
                self.batch_id,
            )

    def write(self, iterator: Iterator[Any]) -> PartitionCommit:
        """Publish this task's partition; return when every row is safe, else raise."""
        return self._publish_arrow(self.batch_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded: log (and with ``report_dir``, record) the report."""
        self._commit(messages, self.batch_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """The write failed (a task failed for good, or the job was cancelled): log (and
        record) what the partitions did, as far as the driver knows (see
        :func:`partition_outcomes`)."""
        self._abort(messages, self.batch_id)


def _stream_batch_id(context: Any) -> int:
    """The micro-batch id Spark gave this task."""
    value = None if context is None else context.getLocalProperty(_BATCH_ID_PROPERTY)
    if value is None:
        raise ConfigurationError(
            "this task belongs to no micro-batch (Spark set no batch id): "
            "MsgsafeStreamWriter runs only inside a streaming query"
        )
    return int(value)


class MsgsafeStreamWriter(_Writing, _StreamBase):
    """``df.writeStream.format("msgsafe")``: each micro-batch is a batch of the sink with
    Spark's batch id (a replay after a restart from the checkpoint reuses it). Arrow
    record batches where PySpark has a streaming Arrow writer (4.1+), rows otherwise."""

    #: Whether this PySpark hands the streaming writer Arrow record batches.
    arrow = STREAM_ARROW

    def write(self, iterator: Iterator[Any]) -> PartitionCommit:
        """Publish this task's partition of the micro-batch; return when every row is
        safe, else raise."""
        batch_id = _stream_batch_id(_task()[2])
        if self.arrow:
            return self._publish_arrow(batch_id, iterator)
        return self._publish_rows(batch_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every task of micro-batch ``batchId`` succeeded: log (and record) the report."""
        self._commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Micro-batch ``batchId`` failed: log (and record) what its partitions did as
        far as the driver knows (:func:`partition_outcomes`); the query stops, and its
        restart replays the batch with its id."""
        self._abort(messages, batchId)


class MsgsafeDataSource(DataSource):
    """The data source ``msgsafe``: register it with
    ``spark.dataSource.register(MsgsafeDataSource)``; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        """The short name for ``format(...)``."""
        return "msgsafe"

    def _options(self) -> SinkOptions:
        return SinkOptions.parse(self.options)

    def writer(self, schema: Any, overwrite: bool) -> MsgsafeWriter:
        """The batch writer (``df.write``); ``mode("overwrite")`` is refused."""
        _refuse_overwrite(overwrite)
        return MsgsafeWriter(self._options(), schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> MsgsafeStreamWriter:
        """The streaming writer (``df.writeStream``); ``outputMode("complete")`` is refused."""
        _refuse_overwrite(overwrite)
        return MsgsafeStreamWriter(self._options(), schema)


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise ConfigurationError(
            "format('msgsafe') only appends: a message sent cannot be overwritten "
            "(use mode('append') or outputMode('append'))"
        )


def _partitions_dir(report_dir: Path, batch_id: int) -> Path:
    return report_dir / f"batch-{batch_id}.partitions"


def _write_json(path: Path, record: Mapping[str, object]) -> None:
    # Whole or absent: a reader never sees half a file (tasks of several processes
    # and the driver write into one folder).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def record_partition(report_dir: str, batch_id: int, result: PartitionResult) -> None:
    """Record, in the executor, that partition ``result.partition`` of ``batch_id`` is
    safe with ``result``'s counts: a file in ``report_dir/batch-B.partitions/``. A
    folder the executor cannot write is logged, not fatal: the partition's rows are safe,
    and an abort that finds no record reports the partition as unknown."""
    folder = _partitions_dir(Path(report_dir), batch_id)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(folder / f"{result.partition}.json", asdict(result))
    except OSError as exc:
        log.warning(
            "batch %d partition %d: cannot record its confirmations in %s (%s); an abort "
            "of the batch will report this partition as unknown",
            batch_id,
            result.partition,
            folder,
            exc,
        )


def _recorded(report_dir: str | None, batch_id: int, partition: int) -> PartitionResult | None:
    if report_dir is None:
        return None
    path = _partitions_dir(Path(report_dir), batch_id) / f"{partition}.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning(
            "batch %d partition %d: unreadable record %s: %s", batch_id, partition, path, exc
        )
        return None
    return PartitionResult(**record)


def partition_outcomes(
    messages: Sequence[Any], batch_id: int, report_dir: str | None
) -> tuple[list[PartitionResult], int]:
    """What the partitions of an aborted batch did: the results known and how many
    partitions are unknown.

    ``messages`` is what Spark hands ``abort``: one entry per partition, in partition
    order, with ``None`` (or no :class:`PartitionCommit`) for every task that did not
    report to the driver before the write failed. That is not "failed": a task still
    running when another failed for good, or when the driver was killed and the job
    cancelled, may have had every row confirmed. Such a partition's result is read
    from the record its task wrote into ``report_dir`` when it finished
    (:func:`record_partition`); a partition with neither is unknown (its task failed,
    or was killed, before it finished: what it published is counted nowhere).
    """
    results: list[PartitionResult] = []
    unknown = 0
    for partition, message in enumerate(messages):
        if isinstance(message, PartitionCommit):
            results.append(message.result)
            continue
        recorded = _recorded(report_dir, batch_id, partition)
        if recorded is None:
            unknown += 1
        else:
            results.append(recorded)
    return results, unknown


def read_reports(report_dir: str | os.PathLike[str]) -> list[tuple[str, SparkBatchReport]]:
    """The reports that ``commit`` and ``abort`` wrote into ``report_dir``, as
    ``(outcome, report)`` with outcome ``committed`` or ``aborted``, by batch id."""
    found: list[tuple[int, str, SparkBatchReport]] = []
    fields = set(SparkBatchReport.__dataclass_fields__)
    for path in Path(report_dir).glob("batch-*.json"):
        record = json.loads(path.read_text())
        report = SparkBatchReport(**{k: v for k, v in record.items() if k in fields})
        found.append((report.batch_id, str(record["outcome"]), report))
    found.sort(key=lambda item: (item[0], item[1]))
    return [(outcome, report) for _, outcome, report in found]

"""The driver side: check the batch's schema, run one task per partition, report.

``foreach_batch_sink(...)`` returns a :class:`ForeachBatchSink`, a callable for
``df.writeStream.foreachBatch(sink)`` that also works on a batch DataFrame
(``sink(df, batch_id)``). Each call checks the column types before anything is sent,
publishes every partition (a task fails when any of its rows is not safe, and Spark
retries it), and returns a :class:`SparkBatchReport` summed from the successful task
attempts. Partitions are read as Arrow record batches (``df.mapInArrow``,
:func:`~.arrow.publish_batches`) when PySpark's pandas and pyarrow are installed, and as
pickled rows (``mapPartitionsWithIndex``, :func:`~.partition.publish_partition`)
otherwise; both give every row the same id. Arrow batches to Kafka without an outbox go
through :mod:`~.kafka_fast` instead of the Producer.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from msgsafe.endpoints import parse_url, traits
from msgsafe.errors import ConfigurationError, InvalidMessage, MissingExtra, MsgsafeError
from msgsafe.spark import arrow, kafka_fast
from msgsafe.spark.partition import PartitionPlan, PartitionResult, publish_partition
from msgsafe.spark.producers import SinkOutbox

__all__ = ["SparkBatchFailed", "SparkBatchReport", "ForeachBatchSink", "foreach_batch_sink"]

log = logging.getLogger("msgsafe.spark")

#: Rows per Producer.submit_batch call at most.
_CHUNK_ROWS = 10_000

_ERROR_LINE = re.compile(r"msgsafe\.errors\.\w+: [^\n]*")


class SparkBatchFailed(MsgsafeError):
    """A batch could not be made safe even after Spark's task retries; run it again with
    the same batch id (rows already published keep their ids, so consumers drop them)."""

    def __init__(
        self,
        message: str = "",
        *,
        batch_id: int | None = None,
        endpoint: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message, endpoint=endpoint, message_id=message_id)
        self.batch_id = batch_id

    def _extra(self) -> dict[str, object]:
        return {"batch_id": self.batch_id}


@dataclass(frozen=True, slots=True)
class SparkBatchReport:
    """What one batch did, summed over the successful task attempts.

    ``rows`` = ``confirmed`` + ``stored`` + ``failed``; ``failed`` is 0 whenever the
    call returns (a batch with a row that is not safe raises :class:`SparkBatchFailed`).
    ``retried_partitions`` counts partitions whose successful attempt was not the first.

    ``unknown_partitions`` (only ever above 0 in the report of an aborted
    ``format("msgsafe")`` write) counts partitions whose outcome the driver does not
    know: no task of theirs is known to have finished (it failed, or was cancelled or
    killed before it reported), so whatever they published is not in ``rows`` or
    ``confirmed``, which are then lower bounds (:attr:`exact` is False).
    """

    batch_id: int
    destination: str
    rows: int
    confirmed: int
    stored: int
    failed: int
    partitions: int
    retried_partitions: int
    seconds: float
    unknown_partitions: int = 0

    @property
    def exact(self) -> bool:
        """Whether the counts cover every partition (no :attr:`unknown_partitions`)."""
        return self.unknown_partitions == 0

    @classmethod
    def sum(
        cls,
        batch_id: int,
        destination: str,
        results: Sequence[PartitionResult],
        seconds: float,
        *,
        unknown_partitions: int = 0,
    ) -> SparkBatchReport:
        """The report of a batch whose tasks returned ``results`` (one per partition), and
        ``unknown_partitions`` more whose outcome is unknown."""
        rows = sum(r.rows for r in results)
        confirmed = sum(r.confirmed for r in results)
        stored = sum(r.stored for r in results)
        return cls(
            batch_id=batch_id,
            destination=destination,
            rows=rows,
            confirmed=confirmed,
            stored=stored,
            failed=rows - confirmed - stored,
            partitions=len(results),
            retried_partitions=sum(1 for r in results if r.attempt > 0),
            seconds=seconds,
            unknown_partitions=unknown_partitions,
        )

    def __str__(self) -> str:
        text = (
            f"batch {self.batch_id} to {self.destination!r}: {self.rows} rows, "
            f"{self.confirmed} confirmed, {self.stored} stored, {self.failed} failed "
            f"({self.partitions} partitions, {self.retried_partitions} retried) "
            f"in {self.seconds:.3f}s"
        )
        if self.unknown_partitions:
            text += (
                f"; unknown for {self.unknown_partitions} more partition(s): "
                "what they published is not counted (at least these many)"
            )
        return text


def _spark_types() -> tuple[Any, Any]:
    try:
        from pyspark.sql.types import BinaryType, StringType
    except ImportError as exc:
        raise MissingExtra("spark", "pyspark") from exc
    return BinaryType, StringType


def _run_partition(
    plan: PartitionPlan, batch_id: int, index: int, rows: Iterable[Sequence[object]]
) -> Iterator[PartitionResult]:
    # Runs in the executor's Python worker.
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    yield publish_partition(plan, batch_id, index, rows, attempt=attempt)


def _known_empty(df: Any) -> bool:
    """True when Spark's optimizer already knows ``df`` has no rows (an empty local
    relation), so no job needs to run; False when it cannot tell without running one."""
    try:
        plan = df._jdf.queryExecution().optimizedPlan()
        return bool(plan.nodeName() == "LocalRelation" and plan.data().isEmpty())
    except Exception:  # not a classic JVM-backed DataFrame (e.g. Spark Connect): run the job
        return False


class ForeachBatchSink:
    """Publishes each batch DataFrame to ``destination``; see :func:`foreach_batch_sink`.

    Calls are serialised (a streaming query calls it once per micro-batch anyway). The
    reports of the last 1000 batches are kept in :attr:`reports`.
    """

    def __init__(
        self,
        url: str,
        destination: str,
        *,
        value_col: str = "value",
        key_col: str | None = None,
        header_cols: Sequence[str] = (),
        id_cols: Sequence[str] | str | None = None,
        outbox: SinkOutbox = False,
        max_in_flight: int = 50_000,
        receipt_timeout: float = 120.0,
        producer_options: Mapping[str, object] | None = None,
    ) -> None:
        target = parse_url(url)
        if not isinstance(destination, str) or not destination:
            raise ConfigurationError("destination must be a non-empty string")
        if not isinstance(value_col, str) or not value_col:
            raise ConfigurationError("value_col must be a column name")
        if key_col is not None and (not isinstance(key_col, str) or not key_col):
            raise ConfigurationError("key_col must be a column name or None")
        if isinstance(header_cols, str):
            header_cols = (header_cols,)
        if isinstance(id_cols, str):
            id_cols = (id_cols,)
        if id_cols is not None and not id_cols:
            raise ConfigurationError("id_cols must name at least one column (or be None)")
        for name in (*header_cols, *(id_cols or ())):
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"column names must be non-empty strings, not {name!r}")
        if (
            outbox is not None
            and not isinstance(outbox, (bool, str))
            and not hasattr(outbox, "__fspath__")
        ):
            raise ConfigurationError(
                "the Spark sink's outbox must be True, False or a path, "
                f"not {type(outbox).__name__}"
            )
        if max_in_flight < 1:
            raise ConfigurationError("max_in_flight must be >= 1")
        if receipt_timeout <= 0:
            raise ConfigurationError("receipt_timeout must be > 0")
        self._url = url
        self._target = target.redacted()
        self._destination = destination
        self._value_col = value_col
        self._key_col = key_col
        self._header_cols = tuple(header_cols)
        self._id_cols = None if id_cols is None else tuple(id_cols)
        self._outbox = outbox
        # The protocol's measured bulk defaults (Kafka: a longer linger, bigger
        # batches), under what the caller gave.
        self._options = {**traits(target.protocol).bulk_options, **(producer_options or {})}
        self._max_in_flight = max_in_flight
        self._receipt_timeout = receipt_timeout
        self._lock = threading.Lock()
        #: Whether PySpark can hand the executors Arrow batches (None: not asked yet).
        self._arrow: bool | None = None
        #: Reports of the most recent batches, oldest first.
        self.reports: deque[SparkBatchReport] = deque(maxlen=1000)

    @property
    def last_report(self) -> SparkBatchReport | None:
        """The report of the latest successful batch, or None."""
        return self.reports[-1] if self.reports else None

    def plan(self, schema: Any) -> tuple[list[str], PartitionPlan]:
        """The columns to select and the executors' plan for a DataFrame of ``schema``.

        Raises :class:`ConfigurationError` for a missing column and
        :class:`InvalidMessage` for a value or key column that is not binary or string,
        or a header column that is not a string — before anything is sent.
        """
        binary_type, string_type = _spark_types()
        types = {f.name: f.dataType for f in schema.fields}

        def column_type(name: str, role: str) -> Any:
            if name not in types:
                raise ConfigurationError(
                    f"{role} {name!r} is not a column of the batch (columns: {sorted(types)})"
                )
            return types[name]

        def text_or_binary(name: str, role: str) -> bool:
            kind = column_type(name, role)
            if isinstance(kind, string_type):
                return True
            if isinstance(kind, binary_type):
                return False
            raise InvalidMessage(
                f"{role} {name!r} has type {kind.simpleString()}; it must be binary or string "
                f"(cast it first, e.g. col({name!r}).cast('string'))"
            )

        names: list[str] = []

        def position(name: str) -> int:
            if name not in names:
                names.append(name)
            return names.index(name)

        value_is_text = text_or_binary(self._value_col, "value_col")
        key_is_text = False
        key_index = None
        if self._key_col is not None:
            key_is_text = text_or_binary(self._key_col, "key_col")
        for name in self._header_cols:
            if not isinstance(column_type(name, "header column"), string_type):
                raise InvalidMessage(
                    f"header column {name!r} has type {types[name].simpleString()}; "
                    "header values must be strings"
                )
        for name in self._id_cols or ():
            column_type(name, "id column")
        value_index = position(self._value_col)
        if self._key_col is not None:
            key_index = position(self._key_col)
        headers = tuple((name, position(name)) for name in self._header_cols)
        id_indexes = None
        if self._id_cols is not None:
            id_indexes = tuple(position(name) for name in self._id_cols)
        plan = PartitionPlan(
            url=self._url,
            target=self._target,
            destination=self._destination,
            outbox=self._outbox,
            options=self._options,
            value_index=value_index,
            value_name=self._value_col,
            value_is_text=value_is_text,
            key_index=key_index,
            key_is_text=key_is_text,
            headers=headers,
            id_indexes=id_indexes,
            max_in_flight=self._max_in_flight,
            # A handful of chunks in flight: each receipt waits for its whole chunk.
            chunk_rows=max(1, min(_CHUNK_ROWS, self._max_in_flight // 5)),
            receipt_timeout=self._receipt_timeout,
            kafka_fast=not headers and kafka_fast.eligible(self._url, self._outbox, self._options),
        )
        return names, plan

    def __call__(self, df: Any, batch_id: int) -> SparkBatchReport:
        """Publish every row of ``df`` as batch ``batch_id``; return when all are safe.

        ``batch_id`` is part of every message id: a streaming query passes its
        micro-batch id; a batch job should pass a stable number of its own (e.g. the run
        date) so that re-running it deduplicates. Raises :class:`SparkBatchFailed` when a
        partition still fails after Spark's task retries.
        """
        if isinstance(batch_id, bool) or not isinstance(batch_id, int):
            raise ConfigurationError(f"batch_id must be an int, not {type(batch_id).__name__}")
        with self._lock:
            started = time.monotonic()
            names, plan = self.plan(df.schema)
            selected = df.select(*[df[name] for name in names])
            results: list[PartitionResult] = []
            if not _known_empty(selected):
                try:
                    if self._reads_arrow(df.schema):
                        arrow_task = functools.partial(arrow.run_partition, plan, batch_id)
                        rows = selected.mapInArrow(arrow_task, arrow.RESULT_SCHEMA).collect()
                        results = [PartitionResult(**row.asDict()) for row in rows]
                    else:
                        task = functools.partial(_run_partition, plan, batch_id)
                        results = selected.rdd.mapPartitionsWithIndex(task).collect()
                except MsgsafeError:
                    raise
                except Exception as exc:
                    raise self._failed(batch_id, exc) from exc
            report = SparkBatchReport.sum(
                batch_id, self._destination, results, time.monotonic() - started
            )
            self.reports.append(report)
        log.info("%s", report)
        return report

    def _reads_arrow(self, schema: Any) -> bool:
        """True when the executors can read this batch as Arrow record batches
        (``mapInArrow``) with the same ids as pickled rows: PySpark's pandas and pyarrow
        are installed and every id column has a type Arrow converts alike."""
        if self._arrow is None:
            try:
                from pyspark.sql.pandas.utils import (
                    require_minimum_pandas_version,
                    require_minimum_pyarrow_version,
                )

                require_minimum_pandas_version()
                require_minimum_pyarrow_version()
                self._arrow = True
            except Exception as exc:  # ImportError, or PySpark's PACKAGE_NOT_INSTALLED
                log.info("the Spark sink reads pickled rows (no Arrow: %s)", exc)
                self._arrow = False
        if not self._arrow:
            return False
        types = {f.name: f.dataType.simpleString() for f in schema.fields}
        return all(types[name] in arrow.ARROW_ID_TYPES for name in self._id_cols or ())

    def _failed(self, batch_id: int, exc: Exception) -> SparkBatchFailed:
        text = str(exc)
        causes = _ERROR_LINE.findall(text)
        cause = causes[-1] if causes else (text.strip().splitlines() or [type(exc).__name__])[0]
        message = (
            f"batch {batch_id} to {self._target} {self._destination!r} failed after Spark's "
            f"task retries ({cause[:500]}); run it again with the same batch id"
        )
        log.error("%s", message)
        return SparkBatchFailed(message, batch_id=batch_id, endpoint=self._target)

    def __repr__(self) -> str:
        return f"ForeachBatchSink({self._target!r}, {self._destination!r})"


def foreach_batch_sink(
    url: str,
    destination: str,
    *,
    value_col: str = "value",
    key_col: str | None = None,
    header_cols: Sequence[str] = (),
    id_cols: Sequence[str] | str | None = None,
    outbox: SinkOutbox = False,
    max_in_flight: int = 50_000,
    receipt_timeout: float = 120.0,
    **producer_options: object,
) -> ForeachBatchSink:
    """A ``foreachBatch`` sink that publishes every row to ``destination`` on ``url``.

    ``value_col`` (and ``key_col``) must be binary or string columns (strings are sent
    UTF-8 encoded); ``header_cols`` are string columns sent as headers named after them.
    Message ids are derived from the batch id and ``id_cols`` (exact under any
    partitioning; equal id columns mean the same message) or, without ``id_cols``, from
    the row's content, partition and rank among identical rows (exact when a replay
    partitions the batch the same way, as a micro-batch replay does); see
    :mod:`msgsafe.spark.ids`. Consumers with ``dedup=`` drop the repeats of a
    replayed batch.

    ``outbox=False`` (default): a broker failure fails the task and Spark's task retry is
    the retry. ``outbox=True`` or a path: rows the broker cannot take are stored in a
    per-process outbox file of this machine and count as safe (``stored``).
    ``producer_options`` go to :class:`~msgsafe.Producer` in each executor (and from
    there to the adapter, which refuses unknown ones on the first task). To Kafka
    without an outbox (and without ``telemetry`` or other options only the Producer
    takes), Arrow batches skip the Producer: a client with the adapter's librdkafka
    settings counts confirms instead of resolving a receipt per row
    (:mod:`~msgsafe.spark.kafka_fast`), the same records at a third less CPU.

    A replayed batch repeats up to a whole batch of ids: consumers should use a dedup
    window at least as large as a batch (``Consumer(url, dedup=rows_per_batch)``).
    ``max_in_flight`` bounds the sends per partition waiting for their confirm;
    ``receipt_timeout`` is the longest wait for one receipt before the task fails.

    Spark's task retry is what recovers a failed partition: on a cluster it is
    ``spark.task.maxFailures`` (4 by default); in local mode there is none unless the
    master says so, e.g. ``local[2,4]``.
    """
    return ForeachBatchSink(
        url,
        destination,
        value_col=value_col,
        key_col=key_col,
        header_cols=header_cols,
        id_cols=id_cols,
        outbox=outbox,
        max_in_flight=max_in_flight,
        receipt_timeout=receipt_timeout,
        producer_options=producer_options,
    )

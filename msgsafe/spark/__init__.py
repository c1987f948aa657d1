"""The Spark sink: PySpark ``foreachBatch`` pipelines publish with the msgsafe promise.

::

    from msgsafe.spark import foreach_batch_sink

    sink = foreach_batch_sink("kafka://b1:9092,b2:9092", "events", key_col="user")
    query = df.writeStream.foreachBatch(sink).start()   # streaming
    report = sink(batch_df, 20261122)                   # or one batch DataFrame

Each partition publishes through a producer cached per executor process and waits for
every receipt before its task returns; any failure fails the task and Spark retries it
with the same message ids. Needs the ``spark`` extra (``pip install 'msgsafe[spark]'``)
on the driver; executors need msgsafe and the broker's extra.

- :mod:`.sink` — the driver side: schema check, one task per partition, the report;
- :mod:`.datasource` — the same sink as Spark 4's data source ``format("msgsafe")``
  (:class:`MsgsafeDataSource`, imported on first use: it needs PySpark 4);
- :mod:`.partition` — what runs in an executor: publish one partition, wait for receipts;
- :mod:`.arrow` — the same over Arrow record batches (``mapInArrow``), the fast route;
- :mod:`.kafka_fast` — Arrow batches to Kafka without an outbox: rows counted, not receipted;
- :mod:`.producers` — the producer (and outbox file) cached per executor process;
- :mod:`.ids` — message ids derived from the batch id and the row.

The sink's report and error are :class:`SparkBatchReport` and :class:`SparkBatchFailed`
(a whole Spark batch), not to be confused with :class:`msgsafe.errors.BatchFailed` and
:class:`msgsafe.ports.BatchReport` (one ``Producer.send_batch`` call).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from msgsafe.spark.ids import ContentIds, key_id
from msgsafe.spark.partition import PartitionPlan, PartitionResult, publish_partition
from msgsafe.spark.producers import close_all
from msgsafe.spark.sink import (
    ForeachBatchSink,
    SparkBatchFailed,
    SparkBatchReport,
    foreach_batch_sink,
)

if TYPE_CHECKING:
    from msgsafe.spark.datasource import MsgsafeDataSource, read_reports

__all__ = [
    "ContentIds",
    "ForeachBatchSink",
    "MsgsafeDataSource",
    "PartitionPlan",
    "PartitionResult",
    "SparkBatchFailed",
    "SparkBatchReport",
    "close_all",
    "foreach_batch_sink",
    "key_id",
    "publish_partition",
    "read_reports",
]

#: Names of :mod:`.datasource`, imported on first use (it subclasses PySpark 4's classes;
#: the foreachBatch sink also runs on Spark 3).
_DATASOURCE = frozenset({"MsgsafeDataSource", "read_reports"})

#: Names of earlier releases, kept importable.
_RENAMED = {"BatchFailed": "SparkBatchFailed", "BatchReport": "SparkBatchReport"}


def __getattr__(name: str) -> object:
    if name in _DATASOURCE:
        from msgsafe.spark import datasource

        found: object = getattr(datasource, name)
        return found
    # The old names shadowed msgsafe.errors.BatchFailed and msgsafe.ports.BatchReport;
    # code that still imports them keeps working, with a warning naming the new one.
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(
            f"msgsafe.spark.{name} is now msgsafe.spark.{new}", DeprecationWarning, stacklevel=2
        )
        cls: type = globals()[new]
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

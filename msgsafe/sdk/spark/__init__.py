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
"""

from msgsafe.sdk.spark.ids import ContentIds, key_id
from msgsafe.sdk.spark.partition import PartitionPlan, PartitionResult, publish_partition
from msgsafe.sdk.spark.producers import close_all
from msgsafe.sdk.spark.sink import BatchFailed, BatchReport, ForeachBatchSink, foreach_batch_sink

__all__ = [
    "BatchFailed",
    "BatchReport",
    "ContentIds",
    "ForeachBatchSink",
    "PartitionPlan",
    "PartitionResult",
    "close_all",
    "foreach_batch_sink",
    "key_id",
    "publish_partition",
]

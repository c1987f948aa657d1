"""Public entry point of the Spark sink: ``from msgsafe.spark import foreach_batch_sink``.

See :mod:`msgsafe.sdk.spark`.
"""

from msgsafe.sdk.spark import BatchFailed, BatchReport, ForeachBatchSink, foreach_batch_sink

__all__ = ["BatchFailed", "BatchReport", "ForeachBatchSink", "foreach_batch_sink"]

"""How a sink without an outbox publishes Arrow batches on a Kafka lane.

Without an outbox the sink's promise is the broker's confirm of every row before the
task returns, or a failed task (Spark retries it with the same ids). That needs no
receipt per row, only a count, so the sink puts its rows straight on a
:class:`~msgsafe.adapters.kafka.lane.KafkaLane` and spares the two costs per row that
:class:`~msgsafe.Producer` pays for its per-message receipts (the CPU of the Python
worker is what limits the sink on a busy machine):

- the lane reports only failed deliveries (``failures_only``): no delivery report, and
  no Python call, per confirmed row. A task is done when librdkafka holds none of its
  messages (the lane drained); every message it no longer holds was either confirmed
  (``acks=all``, idempotent) or reported failed, so ``confirmed = sent - failed``, and
  any failure fails the task;
- rows go to ``produce()`` in runs (:meth:`~msgsafe.adapters.kafka.lane.KafkaLane.produce_run`),
  without Python code per row, each with the lane's id header.

The lane's settings, id header and errors are the Kafka adapter's for the same URL and
options, so consumers see the same records as from the Producer path. What is the
sink's own is here: the window of unconfirmed rows, the per-partition counts, and which
lanes are kept for the next task.

One lane is used by one task at a time (a Python worker runs one task at a time);
lanes are cached per process like the producers (:mod:`.producers`). A lane whose task
failed is dropped, with whatever it still held: a retried attempt starts clean.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgsafe.endpoints import parse_url
from msgsafe.errors import MessageTooLarge, MsgsafeError, SendTimeout
from msgsafe.spark.ids import ContentIds, key_id
from msgsafe.spark.partition import PartitionPlan, PartitionResult, empty_result, task_failed

if TYPE_CHECKING:
    from msgsafe.adapters.kafka.lane import KafkaLane

__all__ = ["close_lanes", "eligible", "give_back", "publish_lane", "take"]

log = logging.getLogger("msgsafe.spark")

#: Producer options that need :class:`~msgsafe.Producer` itself (not librdkafka).
_PRODUCER_ONLY = frozenset({"send_timeout", "retry", "telemetry"})
#: Rows handed to ``produce()`` in one run (delivery failures are served between).
_CHUNK = 10_000
#: Seconds of one wait for room in librdkafka's queue.
_ROOM_POLL_S = 0.01

#: A cache key: the URL and the options' reprs.
LaneKey = tuple[str, tuple[tuple[str, str], ...]]

_lock = threading.Lock()
_idle: dict[LaneKey, list[KafkaLane]] = {}


def eligible(url: str, outbox: object, options: Mapping[str, object]) -> bool:
    """Whether a sink with these settings publishes through a lane: Kafka, no outbox
    (with one, failed rows must be stored one by one: the Producer does that), and no
    option that only :class:`~msgsafe.Producer` understands (e.g. ``telemetry``)."""
    if outbox is not None and outbox is not False:
        return False
    return parse_url(url).protocol == "kafka" and not (_PRODUCER_ONLY & set(options))


def _key(url: str, options: Mapping[str, object]) -> LaneKey:
    return url, tuple(sorted((name, repr(value)) for name, value in options.items()))


def _error(lane: KafkaLane) -> MsgsafeError | None:
    """The error that fails the task: the first failed delivery, or a fatal error (the
    idempotence state is lost); None while there is neither."""
    if lane.failures:
        return lane.error(lane.failures[0])
    if lane.fatal is not None:
        return lane.error(lane.fatal)
    return None


def _publish(
    lane: KafkaLane,
    topic: str,
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None,
    ids: Sequence[str | bytes],
    deadline: float,
    limit: int,
) -> int:
    """Hand every row to the lane, with at most ``limit`` messages (and its queue's size)
    unconfirmed at once, waiting for room until ``deadline``; the number of rows it
    took, all of them unless a delivery failed meanwhile (then the caller stops)."""
    from confluent_kafka import KafkaException

    producer = lane.producer
    count = len(values)
    done = 0
    limit = min(limit, lane.options.max_in_flight)
    while done < count:
        if lane.failures or lane.fatal is not None:
            return done
        room = limit - len(producer)
        if room <= 0:
            # The window is full, so its batch is as large as it gets: flush() sends it
            # now instead of after linger.ms, and serves failures meanwhile.
            producer.flush(_ROOM_POLL_S)
            if time.monotonic() > deadline:
                raise SendTimeout(
                    f"{limit} messages stayed unconfirmed until the receipt timeout",
                    endpoint=lane.target,
                )
            continue
        stop = min(count, done + room, done + _CHUNK)
        # on_delivery None: the lane's own, which keeps failures only.
        done, refused = lane.produce_run(topic, values, keys, ids, None, None, done, stop)
        if isinstance(refused, BufferError):
            producer.poll(_ROOM_POLL_S)
        elif isinstance(refused, KafkaException):
            raise lane.error(refused.args[0]) from None
        elif refused is not None:
            raise refused
        producer.poll(0)
    return done


def _settle(lane: KafkaLane, deadline: float) -> None:
    """Wait until librdkafka holds nothing more (every message confirmed or reported
    failed), sending what lingers now; raise :class:`SendTimeout` at ``deadline``."""
    left = lane.drain(max(0.0, deadline - time.monotonic()))
    if left:
        raise SendTimeout(f"{left} messages not confirmed in time", endpoint=lane.target)


def _too_large(lane: KafkaLane, values: Any, keys: Any | None) -> MessageTooLarge | None:
    """The error for the first row whose value and key pass the lane's ``size_limit``,
    as the adapter refuses it (librdkafka's own limit is set above it)."""
    import pyarrow.compute as pc

    limit = lane.size_limit
    sizes = pc.binary_length(values)
    if keys is not None:
        sizes = pc.add(sizes, pc.fill_null(pc.binary_length(keys), 0))
    largest = pc.max(sizes).as_py()
    if largest is None or largest <= limit:
        return None
    index = pc.index(pc.greater(sizes, limit), True).as_py()
    return MessageTooLarge(
        f"row {index} is {sizes[index].as_py()} bytes, more than the limit {limit}",
        endpoint=lane.target,
    )


def _on_error(err: Any) -> None:
    # Client-level errors: a fatal one (the lane keeps it) fails the task; the rest
    # (brokers down, a connection refused) end as failed deliveries anyway.
    log.debug("kafka lane: %s", err)


def take(key: LaneKey, url: str, options: Mapping[str, object]) -> KafkaLane:
    """An idle lane of this process for ``url`` and ``options`` (``key``: their
    :func:`_key`), or a new one."""
    with _lock:
        idle = _idle.get(key)
        if idle:
            return idle.pop()
    # NOTE: imported here: the driver imports this module for eligible(), also for
    # sinks of other protocols, where confluent-kafka need not be installed.
    from msgsafe.adapters.kafka.lane import KafkaLane

    return KafkaLane.for_url(url, options, on_error=_on_error, failures_only=True)


def give_back(key: LaneKey, lane: KafkaLane, ok: bool) -> None:
    """Return ``lane`` after its task: kept for the next task when the task succeeded
    (the lane holds nothing), dropped otherwise, with what it still holds."""
    if not ok:
        lane.purge(blocking=True)
        return
    lane.failures.clear()
    with _lock:
        _idle.setdefault(key, []).append(lane)


def close_lanes(timeout: float = 30.0) -> None:
    """Close every idle lane of this process (at exit; they hold nothing)."""
    with _lock:
        lanes = [lane for idle in _idle.values() for lane in idle]
        _idle.clear()
    for lane in lanes:
        try:
            lane.drain(timeout)
        except Exception:
            log.debug("closing a kafka lane to %s", lane.target, exc_info=True)


def publish_lane(
    plan: PartitionPlan,
    batch_id: int,
    partition: int,
    batches: Iterable[Any],
    columns: Callable[[Any, int], tuple[Any, Any | None]],
    attempt: int = 0,
) -> PartitionResult:
    """Publish every row of ``batches`` (Arrow record batches; ``columns(batch,
    offset)`` gives the checked binary value and key columns) through a lane and wait
    until librdkafka confirmed each; raise otherwise, with the counts in a note, so
    that Spark retries the task with the same ids."""
    started = time.monotonic()
    destination = plan.destination
    content_ids = (
        None if plan.id_indexes is not None else ContentIds(destination, batch_id, partition)
    )
    key = _key(plan.url, plan.options)
    lane: KafkaLane | None = None
    count = 0
    try:
        for batch in batches:
            rows = batch.num_rows
            if not rows:
                continue
            if lane is None:
                # Opened with the first row: an empty partition opens no connection.
                lane = take(key, plan.url, plan.options)
            values, keys = columns(batch, count)
            too_large = _too_large(lane, values, keys)
            if too_large is not None:
                raise too_large
            ids: Sequence[bytes | str]
            if content_ids is not None:
                ids = content_ids.arrow_ids(values, keys)
            else:
                id_columns = [batch.column(i).to_pylist() for i in plan.id_indexes or ()]
                ids = [key_id(destination, batch_id, row) for row in zip(*id_columns, strict=True)]
            deadline = time.monotonic() + plan.receipt_timeout
            count += _publish(
                lane,
                destination,
                values.to_pylist(),
                None if keys is None else keys.to_pylist(),
                ids,
                deadline,
                plan.max_in_flight,
            )
            if _error(lane) is not None:
                break
        if lane is None:
            return empty_result(partition, attempt, started)
        _settle(lane, time.monotonic() + plan.receipt_timeout)
        error = _error(lane)
        if error is not None:
            raise error
    except BaseException as exc:
        # What librdkafka confirmed before the failure is unknown (no reports of
        # successes): the whole attempt fails, and its retry repeats the same ids.
        failed = 0 if lane is None else len(lane.failures)
        if lane is not None:
            give_back(key, lane, ok=False)
        task_failed(exc, plan, batch_id, partition, attempt, (count, 0, 0, failed))
        raise
    give_back(key, lane, ok=True)
    return PartitionResult(
        partition=partition,
        attempt=attempt,
        rows=count,
        confirmed=count,
        stored=0,
        seconds=time.monotonic() - started,
    )

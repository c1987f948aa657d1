"""The Kafka lane: how a sink without an outbox publishes Arrow batches to Kafka.

Without an outbox the sink's promise is the broker's confirm of every row before the
task returns, or a failed task (Spark retries it with the same ids). That needs no
receipt per row, only a count, so this lane spares the two costs per row that
:class:`~msgsafe.Producer` pays for its per-message receipts (the CPU of the Python
worker is what limits the sink on a busy machine):

- librdkafka reports only failed deliveries (``delivery.report.only.error``): no
  delivery report, and no Python call, per confirmed row. A task is done when
  librdkafka holds none of its messages (``flush()`` returned with an empty queue);
  every message it no longer holds was either confirmed (``acks=all``, idempotent) or
  reported failed, so ``confirmed = sent - failed``, and any failure fails the task;
- ``produce()`` is called by ``map`` over the columns, without Python code per row.

The librdkafka settings are the Kafka adapter's for the same URL and options
(:func:`~msgsafe.adapters.kafka.config.producer_settings`: ``acks=all``, idempotence,
``message.timeout.ms`` inside ``confirm_timeout``, TLS and credentials), and the id
header is the adapter's, so consumers see the same records as from the Producer path.

One lane is used by one task at a time (a Python worker runs one task at a time);
lanes are cached per process like the producers (:mod:`.producers`). A lane whose task
failed is dropped, with whatever it still held: a retried attempt starts clean.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from msgsafe.endpoints import parse_url
from msgsafe.errors import MessageTooLarge, MsgsafeError, SendTimeout
from msgsafe.message import MESSAGE_ID_HEADER
from msgsafe.spark.ids import ContentIds, key_id
from msgsafe.spark.partition import PartitionPlan, PartitionResult, empty_result, task_failed

__all__ = ["KafkaLane", "close_lanes", "eligible", "give_back", "publish_lane", "take"]

log = logging.getLogger("msgsafe.spark")

#: Producer options that need :class:`~msgsafe.Producer` itself (not librdkafka).
_PRODUCER_ONLY = frozenset({"send_timeout", "retry", "telemetry"})
#: Rows handed to ``produce()`` in one ``map`` (delivery failures are served between).
_CHUNK = 10_000
#: Seconds of one wait for room in librdkafka's queue, and of one flush() at the end.
_ROOM_POLL_S = 0.01
_FLUSH_S = 0.5

#: The id header's name, as ``dict.fromkeys`` takes it.
_ID_NAME = (MESSAGE_ID_HEADER,)

_lock = threading.Lock()
_idle: dict[tuple[str, tuple[tuple[str, str], ...]], list[KafkaLane]] = {}


def eligible(url: str, outbox: object, options: Mapping[str, object]) -> bool:
    """Whether a sink with these settings publishes through a lane: Kafka, no outbox
    (with one, failed rows must be stored one by one: the Producer does that), and no
    option that only :class:`~msgsafe.Producer` understands (e.g. ``telemetry``)."""
    if outbox is not None and outbox is not False:
        return False
    return parse_url(url).protocol == "kafka" and not (_PRODUCER_ONLY & set(options))


def _key(url: str, options: Mapping[str, object]) -> tuple[str, tuple[tuple[str, str], ...]]:
    return url, tuple(sorted((name, repr(value)) for name, value in options.items()))


class KafkaLane:
    """One librdkafka producer that reports failures only, and the failures it reported.

    Not thread-safe: held by one task at a time (:func:`take`, :func:`give_back`).
    """

    __slots__ = ("_fatal", "failures", "key", "producer", "room", "size_limit", "target")

    def __init__(self, url: str, options: Mapping[str, object]) -> None:
        from confluent_kafka import Producer

        from msgsafe.adapters._config import build_config
        from msgsafe.adapters.kafka.config import KafkaOptions, producer_settings

        parsed = parse_url(url)
        config = build_config(KafkaOptions, parsed, options)
        self.key = _key(url, options)
        self.target = parsed.redacted()
        self.room = config.max_in_flight
        self.size_limit = config.size_limit
        #: The error of each failed delivery, in the order reported (which rows failed
        #: does not matter: the whole task fails, and its retry repeats every id).
        self.failures: list[Any] = []
        self._fatal: Any = None
        settings = producer_settings(parsed, config)
        settings["delivery.report.only.error"] = True
        settings["on_delivery"] = self._failed
        settings["error_cb"] = self._error
        self.producer = Producer(settings)

    def _failed(self, err: Any, _msg: Any) -> None:
        # librdkafka's delivery report, of failures only; must never raise into it.
        self.failures.append(err)

    def _error(self, err: Any) -> None:
        # Client-level errors: a fatal one (the idempotence state is lost) fails the task;
        # the rest (brokers down, a connection refused) end as failed deliveries anyway.
        if err.fatal():
            self._fatal = err
        log.debug("kafka lane to %s: %s", self.target, err)

    def error(self) -> MsgsafeError | None:
        """The error that fails the task, if any delivery failed."""
        from msgsafe.adapters.kafka._errors import translate

        if self.failures:
            return translate(self.failures[0], endpoint=self.target)
        if self._fatal is not None:
            return translate(self._fatal, endpoint=self.target)
        return None

    def publish(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[dict[str, Any]],
        deadline: float,
        limit: int,
    ) -> int:
        """Hand every row to librdkafka, with at most ``limit`` messages (and its queue's
        size) unconfirmed at once, waiting for room until ``deadline``; the number of
        rows it took, all of them unless a delivery failed meanwhile (then the caller
        stops)."""
        from confluent_kafka import KafkaException

        producer = self.producer
        produce = producer.produce
        count = len(values)
        done = 0
        limit = min(limit, self.room)
        while done < count:
            if self.failures or self._fatal is not None:
                return done
            room = limit - len(producer)
            if room <= 0:
                # The window is full, so its batch is as large as it gets: flush() sends it
                # now instead of after linger.ms, and serves failures meanwhile.
                producer.flush(_ROOM_POLL_S)
                if time.monotonic() > deadline:
                    raise SendTimeout(
                        f"{limit} messages stayed unconfirmed until the receipt timeout",
                        endpoint=self.target,
                    )
                continue
            stop = min(count, done + room, done + _CHUNK)
            rows: Any = iter(values[done:stop])  # a list iterator: it knows what is left
            # produce(topic, value, key, partition (-1: by key), on_delivery (None: the
            # producer's), callback, timestamp (0: now), headers), positional: the
            # binding parses keywords about 1 µs slower per call.
            calls = map(
                produce,
                itertools.repeat(topic),
                rows,
                itertools.repeat(None) if keys is None else keys[done:stop],
                itertools.repeat(-1),
                itertools.repeat(None),
                itertools.repeat(None),
                itertools.repeat(0),
                headers[done:stop],
            )
            try:
                collections.deque(calls, maxlen=0)
                done = stop
            except BufferError:
                # The row that did not fit is the last one map took from ``rows``.
                done = stop - rows.__length_hint__() - 1
                producer.poll(_ROOM_POLL_S)
            except KafkaException as exc:
                from msgsafe.adapters.kafka._errors import translate

                raise translate(exc.args[0], endpoint=self.target) from None
            producer.poll(0)
        return done

    def settle(self, deadline: float) -> None:
        """Wait until librdkafka holds nothing more (every message confirmed or reported
        failed), sending what lingers now; raise :class:`SendTimeout` at ``deadline``."""
        producer = self.producer
        while len(producer):
            left = deadline - time.monotonic()
            if left <= 0:
                raise SendTimeout(
                    f"{len(producer)} messages not confirmed in time", endpoint=self.target
                )
            producer.flush(min(left, _FLUSH_S))

    def too_large(self, values: Any, keys: Any | None) -> MessageTooLarge | None:
        """The error for the first row whose value and key pass ``size_limit``, as the
        adapter refuses it (librdkafka's own limit is set above it)."""
        import pyarrow.compute as pc

        sizes = pc.binary_length(values)
        if keys is not None:
            sizes = pc.add(sizes, pc.fill_null(pc.binary_length(keys), 0))
        largest = pc.max(sizes).as_py()
        if largest is None or largest <= self.size_limit:
            return None
        index = pc.index(pc.greater(sizes, self.size_limit), True).as_py()
        return MessageTooLarge(
            f"row {index} is {sizes[index].as_py()} bytes, more than the limit {self.size_limit}",
            endpoint=self.target,
        )

    def drop(self) -> None:
        """Forget what this lane still holds (its task failed: Spark retries the rows)."""
        try:
            self.producer.purge()
            self.producer.flush(0)
        except Exception:  # a broken producer is dropped all the same
            log.debug("dropping a kafka lane to %s", self.target, exc_info=True)


def take(url: str, options: Mapping[str, object]) -> KafkaLane:
    """An idle lane of this process for ``url`` and ``options``, or a new one."""
    key = _key(url, options)
    with _lock:
        idle = _idle.get(key)
        if idle:
            return idle.pop()
    return KafkaLane(url, options)


def give_back(lane: KafkaLane, ok: bool) -> None:
    """Return ``lane`` after its task: kept for the next task when the task succeeded
    (the lane holds nothing), dropped otherwise."""
    if not ok:
        lane.drop()
        return
    lane.failures.clear()
    with _lock:
        _idle.setdefault(lane.key, []).append(lane)


def close_lanes(timeout: float = 30.0) -> None:
    """Close every idle lane of this process (at exit; they hold nothing)."""
    with _lock:
        lanes = [lane for idle in _idle.values() for lane in idle]
        _idle.clear()
    for lane in lanes:
        try:
            lane.producer.flush(timeout)
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
    lane: KafkaLane | None = None
    count = 0
    try:
        for batch in batches:
            rows = batch.num_rows
            if not rows:
                continue
            if lane is None:
                # Opened with the first row: an empty partition opens no connection.
                lane = take(plan.url, plan.options)
            values, keys = columns(batch, count)
            too_large = lane.too_large(values, keys)
            if too_large is not None:
                raise too_large
            ids: Sequence[bytes | str]
            if content_ids is not None:
                ids = content_ids.arrow_ids(values, keys)
            else:
                id_columns = [batch.column(i).to_pylist() for i in plan.id_indexes or ()]
                ids = [key_id(destination, batch_id, row) for row in zip(*id_columns, strict=True)]
            # {name: id} per row, built by a C loop (dict.fromkeys((name,), id)). NOTE: a
            # dict of str and bytes is not tracked by the cyclic GC, a list is: a list per
            # row measured 0.9 µs per row of collections.
            headers = list(map(dict.fromkeys, itertools.repeat(_ID_NAME), ids))
            deadline = time.monotonic() + plan.receipt_timeout
            count += lane.publish(
                destination,
                values.to_pylist(),
                None if keys is None else keys.to_pylist(),
                headers,
                deadline,
                plan.max_in_flight,
            )
            if lane.error() is not None:
                break
        if lane is None:
            return empty_result(partition, attempt, started)
        lane.settle(time.monotonic() + plan.receipt_timeout)
        error = lane.error()
        if error is not None:
            raise error
    except BaseException as exc:
        # What librdkafka confirmed before the failure is unknown (no reports of
        # successes): the whole attempt fails, and its retry repeats the same ids.
        failed = 0 if lane is None else len(lane.failures)
        if lane is not None:
            give_back(lane, ok=False)
        task_failed(exc, plan, batch_id, partition, attempt, (count, 0, 0, failed))
        raise
    give_back(lane, ok=True)
    return PartitionResult(
        partition=partition,
        attempt=attempt,
        rows=count,
        confirmed=count,
        stored=0,
        seconds=time.monotonic() - started,
    )

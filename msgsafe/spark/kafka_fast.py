"""The Spark writer's fast path: a sink without an outbox publishes Arrow batches on a
Kafka client.

Without an outbox the sink's promise is the broker's confirm of every row before the
task returns, or a failed task (Spark retries it with the same ids). That needs no
receipt per row, only a count, so the sink puts its rows straight on a
:class:`~msgsafe.adapters.kafka.client.KafkaClient` and spares the two costs per row that
:class:`~msgsafe.Producer` pays for its per-message receipts (the CPU of the Python
worker is what limits the sink on a busy machine):

- the client reports only failed deliveries (``failures_only``): no delivery report, and
  no Python call, per confirmed row. A task is done when librdkafka holds none of its
  messages (the client drained); every message it no longer holds was either confirmed
  (``acks=all``, idempotent) or reported failed, so ``confirmed = sent - failed``, and
  any failure fails the task;
- rows go to ``produce()`` in runs (:meth:`~msgsafe.adapters.kafka.client.KafkaClient.produce_run`),
  without Python code per row, each with the client's id header.

The client's settings, id header and errors are the Kafka adapter's for the same URL and
options, so consumers see the same records as from the Producer path. What is the
sink's own is here: the window of unconfirmed rows, the per-partition counts, and which
clients are kept for the next task.

Unlike the other fast paths this one never falls back to the outbox, so it has no
:class:`~msgsafe.fastpath.FastPath` state: without an outbox a failure is the task's
(a sink with one takes the Producer, whose own fast path that is). Which protocols
have it is their trait (:attr:`msgsafe.endpoints.ProtocolTraits.bulk_fast_path`).

One client is used by one task at a time (a Python worker runs one task at a time);
clients are cached per process like the producers (:mod:`.producers`). A client whose task
failed is dropped, with whatever it still held: a retried attempt starts clean.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgsafe.endpoints import parse_url, traits
from msgsafe.errors import MessageTooLarge, MsgsafeError, SendTimeout
from msgsafe.spark.ids import ContentIds, key_id
from msgsafe.spark.partition import PartitionPlan, PartitionResult, empty_result, task_failed

if TYPE_CHECKING:
    from msgsafe.adapters.kafka.client import KafkaClient

__all__ = ["close_clients", "eligible", "give_back", "publish_fast", "take"]

log = logging.getLogger("msgsafe.spark")

#: Producer options that need :class:`~msgsafe.Producer` itself (not librdkafka).
_PRODUCER_ONLY = frozenset({"send_timeout", "retry", "telemetry"})
#: Rows handed to ``produce()`` in one run (delivery failures are served between).
_CHUNK = 10_000
#: Seconds of one wait for room in librdkafka's queue.
_ROOM_POLL_S = 0.01

#: A cache key: the URL and the options' reprs.
ClientKey = tuple[str, tuple[tuple[str, str], ...]]

_lock = threading.Lock()
_idle: dict[ClientKey, list[KafkaClient]] = {}


def eligible(url: str, outbox: object, options: Mapping[str, object]) -> bool:
    """Whether a sink with these settings publishes through the fast path: a protocol
    that has one (``bulk_fast_path``: Kafka), no outbox (with one, failed rows must be
    stored one by one: the Producer does that), and no option that only
    :class:`~msgsafe.Producer` understands (e.g. ``telemetry``)."""
    if outbox is not None and outbox is not False:
        return False
    return traits(parse_url(url).protocol).bulk_fast_path and not (_PRODUCER_ONLY & set(options))


def _key(url: str, options: Mapping[str, object]) -> ClientKey:
    return url, tuple(sorted((name, repr(value)) for name, value in options.items()))


def _error(client: KafkaClient) -> MsgsafeError | None:
    """The error that fails the task: the first failed delivery, or a fatal error (the
    idempotence state is lost); None while there is neither."""
    if client.failures:
        return client.error(client.failures[0])
    if client.fatal is not None:
        return client.error(client.fatal)
    return None


def _publish(
    client: KafkaClient,
    topic: str,
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None,
    ids: Sequence[str | bytes],
    deadline: float,
    limit: int,
) -> int:
    """Hand every row to the client, with at most ``limit`` messages (and its queue's size)
    unconfirmed at once, waiting for room until ``deadline``; the number of rows it
    took, all of them unless a delivery failed meanwhile (then the caller stops)."""
    from confluent_kafka import KafkaException

    producer = client.producer
    count = len(values)
    done = 0
    limit = min(limit, client.options.max_in_flight)
    while done < count:
        if client.failures or client.fatal is not None:
            return done
        room = limit - len(producer)
        if room <= 0:
            # The window is full, so its batch is as large as it gets: flush() sends it
            # now instead of after linger.ms, and serves failures meanwhile.
            producer.flush(_ROOM_POLL_S)
            if time.monotonic() > deadline:
                raise SendTimeout(
                    f"{limit} messages stayed unconfirmed until the receipt timeout",
                    endpoint=client.target,
                )
            continue
        stop = min(count, done + room, done + _CHUNK)
        # on_delivery None: the client's own, which keeps failures only.
        done, refused = client.produce_run(topic, values, keys, ids, None, None, done, stop)
        if isinstance(refused, BufferError):
            producer.poll(_ROOM_POLL_S)
        elif isinstance(refused, KafkaException):
            raise client.error(refused.args[0]) from None
        elif refused is not None:
            raise refused
        producer.poll(0)
    return done


def _settle(client: KafkaClient, deadline: float) -> None:
    """Wait until librdkafka holds nothing more (every message confirmed or reported
    failed), sending what lingers now; raise :class:`SendTimeout` at ``deadline``."""
    left = client.drain(max(0.0, deadline - time.monotonic()))
    if left:
        raise SendTimeout(f"{left} messages not confirmed in time", endpoint=client.target)


def _too_large(client: KafkaClient, values: Any, keys: Any | None) -> MessageTooLarge | None:
    """The error for the first row whose value and key pass the client's ``size_limit``,
    as the adapter refuses it (librdkafka's own limit is set above it)."""
    import pyarrow.compute as pc

    limit = client.size_limit
    sizes = pc.binary_length(values)
    if keys is not None:
        sizes = pc.add(sizes, pc.fill_null(pc.binary_length(keys), 0))
    largest = pc.max(sizes).as_py()
    if largest is None or largest <= limit:
        return None
    index = pc.index(pc.greater(sizes, limit), True).as_py()
    return MessageTooLarge(
        f"row {index} is {sizes[index].as_py()} bytes, more than the limit {limit}",
        endpoint=client.target,
    )


def _on_error(err: Any) -> None:
    # Client-level errors: a fatal one (the client keeps it) fails the task; the rest
    # (brokers down, a connection refused) end as failed deliveries anyway.
    log.debug("kafka client: %s", err)


def take(key: ClientKey, url: str, options: Mapping[str, object]) -> KafkaClient:
    """An idle client of this process for ``url`` and ``options`` (``key``: their
    :func:`_key`), or a new one."""
    with _lock:
        idle = _idle.get(key)
        if idle:
            return idle.pop()
    # NOTE: imported here: the driver imports this module for eligible(), also for
    # sinks of other protocols, where confluent-kafka need not be installed.
    from msgsafe.adapters.kafka.client import KafkaClient

    return KafkaClient.for_url(url, options, on_error=_on_error, failures_only=True)


def give_back(key: ClientKey, client: KafkaClient, ok: bool) -> None:
    """Return ``fast_path`` after its task: kept for the next task when the task succeeded
    (the client holds nothing), dropped otherwise, with what it still holds."""
    if not ok:
        client.purge(blocking=True)
        return
    client.failures.clear()
    with _lock:
        _idle.setdefault(key, []).append(client)


def close_clients(timeout: float = 30.0) -> None:
    """Close every idle client of this process (at exit; they hold nothing)."""
    with _lock:
        clients = [client for idle in _idle.values() for client in idle]
        _idle.clear()
    for client in clients:
        try:
            client.drain(timeout)
        except Exception:
            log.debug("closing a kafka client to %s", client.target, exc_info=True)


def publish_fast(
    plan: PartitionPlan,
    batch_id: int,
    partition: int,
    batches: Iterable[Any],
    columns: Callable[[Any, int], tuple[Any, Any | None]],
    attempt: int = 0,
) -> PartitionResult:
    """Publish every row of ``batches`` (Arrow record batches; ``columns(batch,
    offset)`` gives the checked binary value and key columns) through a client and wait
    until librdkafka confirmed each; raise otherwise, with the counts in a note, so
    that Spark retries the task with the same ids."""
    started = time.monotonic()
    destination = plan.destination
    content_ids = (
        None if plan.id_indexes is not None else ContentIds(destination, batch_id, partition)
    )
    key = _key(plan.url, plan.options)
    client: KafkaClient | None = None
    count = 0
    try:
        for batch in batches:
            rows = batch.num_rows
            if not rows:
                continue
            if client is None:
                # Opened with the first row: an empty partition opens no connection.
                client = take(key, plan.url, plan.options)
            values, keys = columns(batch, count)
            too_large = _too_large(client, values, keys)
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
                client,
                destination,
                values.to_pylist(),
                None if keys is None else keys.to_pylist(),
                ids,
                deadline,
                plan.max_in_flight,
            )
            if _error(client) is not None:
                break
        if client is None:
            return empty_result(partition, attempt, started)
        _settle(client, time.monotonic() + plan.receipt_timeout)
        error = _error(client)
        if error is not None:
            raise error
    except BaseException as exc:
        # What librdkafka confirmed before the failure is unknown (no reports of
        # successes): the whole attempt fails, and its retry repeats the same ids.
        failed = 0 if client is None else len(client.failures)
        if client is not None:
            give_back(key, client, ok=False)
        task_failed(exc, plan, batch_id, partition, attempt, (count, 0, 0, failed))
        raise
    give_back(key, client, ok=True)
    return PartitionResult(
        partition=partition,
        attempt=attempt,
        rows=count,
        confirmed=count,
        stored=0,
        seconds=time.monotonic() - started,
    )

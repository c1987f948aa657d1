"""What runs in an executor: publish one partition of a batch and wait for every receipt.

:func:`publish_partition` is pure Python over an iterator of row tuples, so it is tested
without Spark; the sink calls it from ``mapPartitionsWithIndex`` (and
:mod:`msgsafe.spark.arrow` for a sink with header columns). It returns only when
every row of the partition is safe (CONFIRMED, or STORED with an outbox) and raises on
the first row that is not, after letting the rest in flight settle, so that Spark fails
the task and runs it again. The retry publishes the same ids (:mod:`.ids`).

Rows travel in chunks through ``Producer.submit_batch`` (columns, one receipt per
chunk); only a sink with header columns sends row by row, because a batch carries one
set of headers for all its messages.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from msgsafe.errors import BatchFailed, ClosedError, InvalidMessage, SendTimeout
from msgsafe.message import Batch, BatchReceipt, Envelope, Receipt, Status
from msgsafe.spark import producers
from msgsafe.spark.ids import ContentIds, key_id
from msgsafe.spark.producers import SinkOutbox

__all__ = [
    "PartitionPlan",
    "PartitionResult",
    "PartitionSender",
    "empty_result",
    "publish_partition",
    "task_failed",
]

log = logging.getLogger("msgsafe.spark")

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionPlan:
    """Everything an executor needs, shipped with the task (picklable, no Spark types).

    Column positions refer to the row tuples the driver selected: ``value_index`` always,
    ``key_index`` and ``id_indexes`` when given, ``headers`` as (header name, index).
    ``*_is_text`` says the column is a Spark string (sent UTF-8 encoded).
    """

    url: str = field(repr=False)  # may hold credentials
    target: str  # the URL without credentials, for messages
    destination: str
    outbox: SinkOutbox = False
    options: Mapping[str, object] = field(default_factory=dict, repr=False)
    value_index: int = 0
    value_name: str = "value"
    value_is_text: bool = False
    key_index: int | None = None
    key_is_text: bool = False
    headers: tuple[tuple[str, int], ...] = ()
    id_indexes: tuple[int, ...] | None = None
    #: Sends in flight per partition before the oldest is waited for: bounds memory and
    #: keeps each send's wait for its confirm well inside the adapter's confirm_timeout.
    max_in_flight: int = 5_000
    #: Rows per ``submit_batch`` chunk (without header columns).
    chunk_rows: int = 1_000
    #: Longest wait for one receipt once the partition is read (then SendTimeout).
    receipt_timeout: float = 120.0
    #: Publish Arrow batches through :mod:`msgsafe.spark.kafka_fast` (Kafka, no outbox).
    kafka_fast: bool = False


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What one successful task attempt did; the driver sums these into the report."""

    partition: int
    attempt: int
    rows: int
    confirmed: int
    stored: int
    seconds: float


class _Tally:
    __slots__ = ("confirmed", "error", "failed", "stored")

    def __init__(self) -> None:
        self.confirmed = 0
        self.stored = 0
        self.failed = 0
        self.error: BaseException | None = None

    def settle(self, future: Future[Receipt], message_id: str, timeout: float) -> None:
        try:
            receipt = future.result(timeout)
        except FutureTimeout:
            self.fail(SendTimeout(f"no receipt within {timeout}s", message_id=message_id))
        except Exception as exc:
            self.fail(exc)
        else:
            if receipt.status is Status.CONFIRMED:
                self.confirmed += 1
            else:
                self.stored += 1

    def settle_batch(self, future: Future[BatchReceipt], size: int, timeout: float) -> None:
        try:
            receipt = future.result(timeout)
        except FutureTimeout:
            self.failed += size
            self.error = self.error or SendTimeout(f"no receipt within {timeout}s")
        except BatchFailed as exc:
            safe = exc.receipt
            if isinstance(safe, BatchReceipt):
                self.confirmed += safe.confirmed
                self.stored += safe.stored
            self.failed += len(exc.errors)
            self.error = self.error or next(iter(exc.errors.values()), exc)
        except Exception as exc:
            self.failed += size
            self.error = self.error or exc
        else:
            self.confirmed += receipt.confirmed
            self.stored += receipt.stored

    def fail(self, exc: BaseException) -> None:
        self.failed += 1
        if self.error is None:
            self.error = exc


def _as_bytes(value: object, is_text: bool, what: str, row: int) -> bytes:
    if is_text and isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        # NOTE: PySpark hands BinaryType values to Python as bytearray.
        return bytes(value)
    if value is None:
        raise InvalidMessage(f"row {row}: {what} is null")
    raise InvalidMessage(f"row {row}: {what} must be bytes or a string, not {type(value).__name__}")


class PartitionSender:
    """The sends of one partition attempt: chunks (or single envelopes) in flight up to
    ``plan.max_in_flight``, their receipts tallied, and the outcome as a result or an
    error. Shared by the row path (:func:`publish_partition`) and the Arrow path
    (:mod:`msgsafe.spark.arrow`). Not thread-safe: one per task.
    """

    __slots__ = (
        "_chunk_limit",
        "_chunks",
        "_limit",
        "_window",
        "attempt",
        "batch_id",
        "count",
        "partition",
        "plan",
        "producer",
        "started",
        "tally",
    )

    def __init__(self, plan: PartitionPlan, batch_id: int, partition: int, attempt: int) -> None:
        self.started = time.monotonic()
        self.plan = plan
        self.batch_id = batch_id
        self.partition = partition
        self.attempt = attempt
        self.producer = producers.producer_for(plan.url, plan.outbox, plan.options)
        self.tally = _Tally()
        #: Rows handed to the producer so far.
        self.count = 0
        self._window: deque[tuple[Future[Receipt], str]] = deque()
        self._chunks: deque[tuple[Future[BatchReceipt], int]] = deque()
        self._limit = plan.max_in_flight
        self._chunk_limit = max(1, plan.max_in_flight // max(1, plan.chunk_rows))

    def submit(self, bodies: list[bytes], ids: list[str], keys: list[bytes | None] | None) -> bool:
        """Send one chunk of columns (checked by the caller); False once a receipt failed
        (the caller stops reading rows)."""
        # Columns checked row by row by the caller: the batch is built without checking
        # them again.
        batch = Batch(self.plan.destination, bodies, ids, keys)
        self._chunks.append((self.producer.submit_batch(batch), len(bodies)))
        self.count += len(bodies)
        if len(self._chunks) >= self._chunk_limit:
            self.tally.settle_batch(*self._chunks.popleft(), self.plan.receipt_timeout)
        return self.tally.error is None

    def send(self, envelope: Envelope) -> bool:
        """Send one envelope; False once a receipt failed."""
        self._window.append((self.producer.send_envelope(envelope), envelope.message_id))
        self.count += 1
        if len(self._window) >= self._limit:
            self.tally.settle(*self._window.popleft(), self.plan.receipt_timeout)
        return self.tally.error is None

    def settle_all(self) -> None:
        """Wait for every receipt still in flight."""
        timeout = self.plan.receipt_timeout
        last: Future[Any] | None = None
        if self._chunks:
            last = self._chunks[-1][0]
        elif self._window:
            last = self._window[-1][0]
        if last is not None and self.tally.error is None:
            # Nothing more will join the adapter's last batch: it need not linger.
            self.producer.hurry(last, timeout)
        while self._chunks:
            self.tally.settle_batch(*self._chunks.popleft(), timeout)
        while self._window:
            self.tally.settle(*self._window.popleft(), timeout)

    def finish(self) -> PartitionResult:
        """The result once everything settled, or the first error (with the counts in a
        note) so that the task fails and Spark retries it."""
        self.settle_all()
        tally = self.tally
        if tally.error is not None:
            counts = (self.count, tally.confirmed, tally.stored, tally.failed)
            raise task_failed(
                tally.error, self.plan, self.batch_id, self.partition, self.attempt, counts
            )
        return PartitionResult(
            partition=self.partition,
            attempt=self.attempt,
            rows=self.count,
            confirmed=tally.confirmed,
            stored=tally.stored,
            seconds=time.monotonic() - self.started,
        )


def task_failed(
    error: BaseException,
    plan: PartitionPlan,
    batch_id: int,
    partition: int,
    attempt: int,
    counts: tuple[int, int, int, int],
) -> BaseException:
    """``error`` with a note of what the attempt did (rows sent, confirmed, stored,
    failed: ``counts``), logged: the task fails so that Spark retries it."""
    sent, confirmed, stored, failed = counts
    note = (
        f"msgsafe Spark sink: batch {batch_id} partition {partition} attempt {attempt} to "
        f"{plan.target} {plan.destination!r}: {sent} rows sent, {confirmed} confirmed, "
        f"{stored} stored, {failed} failed; the task fails so that Spark retries it with "
        "the same message ids"
    )
    log.warning("%s: %s", note, error)
    error.add_note(note)
    return error


def empty_result(partition: int, attempt: int, started: float) -> PartitionResult:
    """The result of a partition without rows (no producer opened)."""
    return PartitionResult(partition, attempt, 0, 0, 0, time.monotonic() - started)


def publish_partition(
    plan: PartitionPlan,
    batch_id: int,
    partition: int,
    rows: Iterable[Sequence[object]],
    *,
    attempt: int = 0,
) -> PartitionResult:
    """Publish every row and wait until each is safe; raise if any is not.

    Rows are sent pipelined (up to ``plan.max_in_flight`` at once) through the cached
    producer of this process. A null or non-bytes/str value raises
    :class:`~msgsafe.errors.InvalidMessage`; a null key means no key; a null header is
    left out. On failure the first error is raised with a note giving the counts, after
    the sends already in flight settled, so a retried attempt does not race this one.
    """
    started = time.monotonic()
    iterator = iter(rows)
    first = next(iterator, None)
    if first is None:
        # An empty partition opens no connection: empty batches stay cheap even where
        # Spark starts a fresh Python worker per task.
        return empty_result(partition, attempt, started)
    rows = itertools.chain((first,), iterator)
    sender = PartitionSender(plan, batch_id, partition, attempt)
    sender.started = started
    destination = plan.destination
    content_ids = (
        None if plan.id_indexes is not None else ContentIds(destination, batch_id, partition)
    )
    id_indexes = plan.id_indexes
    value_index, value_is_text, value_name = plan.value_index, plan.value_is_text, plan.value_name
    key_index, key_is_text = plan.key_index, plan.key_is_text
    header_layout = plan.headers
    count = 0
    # Per-row header columns need an envelope per row; otherwise rows go in chunks.
    batched = not header_layout
    chunk_rows = max(1, plan.chunk_rows)
    bodies: list[bytes] = []
    keys: list[bytes | None] | None = [] if key_index is not None else None
    ids: list[str] = []
    try:
        for row in rows:
            value = row[value_index]
            if value_is_text and value.__class__ is str:
                body = value.encode("utf-8")
            else:
                body = _as_bytes(value, value_is_text, f"column {value_name!r}", count)
            key: bytes | None = None
            if key_index is not None:
                raw_key = row[key_index]
                if raw_key is not None:
                    key = _as_bytes(raw_key, key_is_text, "the key column", count)
            headers = _NO_HEADERS
            if header_layout:
                headers = MappingProxyType(
                    {name: row[i] for name, i in header_layout if row[i] is not None}  # type: ignore[misc]
                )
            if content_ids is not None:
                message_id = content_ids.next_id(body, key, headers)
            else:
                message_id = key_id(destination, batch_id, [row[i] for i in id_indexes or ()])
            count += 1
            if batched:
                bodies.append(body)
                ids.append(message_id)
                if keys is not None:
                    keys.append(key)
                if len(bodies) >= chunk_rows:
                    going = sender.submit(bodies, ids, keys)
                    bodies, ids = [], []
                    keys = [] if keys is not None else None
                    if not going:
                        break
                continue
            envelope = Envelope(
                destination=destination,
                body=body,
                message_id=message_id,
                key=key,
                headers=headers,
            )
            if not sender.send(envelope):
                break
        if bodies and sender.tally.error is None:
            sender.submit(bodies, ids, keys)
    except ClosedError:
        # Someone closed the cached producer: the next attempt opens a fresh one.
        producers.discard(sender.producer)
        sender.settle_all()
        raise
    except BaseException as exc:
        sender.tally.fail(exc)
    return sender.finish()

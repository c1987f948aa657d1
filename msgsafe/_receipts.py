"""The receipts transports report to: one future per message, one per batch.

:class:`Send` is the receipt future of one message and, at the same time, the callback
its transport reports to (:data:`msgsafe.ports.PublishCallback`). :class:`BatchSend` is
the future of one batch and the :class:`msgsafe.ports.BatchReport` its transport calls;
a batch costs a handful of objects however many messages it holds, because the transport
reports confirmations in counts and only a message that takes a detour (to the outbox,
or out with an error) gets an object of its own (:class:`BatchPart`).

Receipts decide nothing themselves: they hand every outcome to their
:class:`ReceiptOwner` (the producer's :class:`~msgsafe._settlement.Settlement`), which
resolves, stores or fails the message and counts it for ``flush()``.
"""

from __future__ import annotations

import threading
from _thread import RLock
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures._base import PENDING
from typing import Protocol

from msgsafe._futures import LightFuture
from msgsafe.errors import BatchFailed, MsgsafeError, OutboxError
from msgsafe.message import (
    Batch,
    BatchReceipt,
    Envelope,
    Guarantee,
    Receipt,
    Status,
    new_receipt,
)

__all__ = [
    "BatchPart",
    "BatchSend",
    "OneOfBatch",
    "ReceiptOwner",
    "Send",
    "StoreItem",
    "SubsetReport",
]


class ReceiptOwner(Protocol):
    """What a receipt reports to (the producer's bookkeeping)."""

    #: Each checked destination's guarantee, for the receipts.
    guarantees: dict[str, Guarantee]
    #: The outbox's guarantee, for STORED receipts (None without an outbox).
    store_guarantee: Guarantee | None

    def published(self, send: Send, error: BaseException | None) -> None:
        """The transport's outcome for one message: ``None`` when the broker confirmed."""
        ...

    def detour(self, send: BatchSend, index: int, error: MsgsafeError) -> bool:
        """Take message ``index`` of a batch to the outbox after ``error``; False if it
        cannot go there (no outbox, or a permanent error)."""
        ...

    def settled(self, units: int) -> None:
        """``units`` sends (messages or batches) are finished: what ``flush()`` counts."""
        ...


class StoreItem(Protocol):
    """What the outbox writer's queue holds: a single send or one message of a batch."""

    @property
    def envelope(self) -> Envelope: ...

    def stored(self, error: MsgsafeError | None) -> int:
        """Settle with the writer's outcome; returns how many flush() units finished."""
        ...

    def send_order(self) -> tuple[int, int]:
        """Where the message stands among the producer's sends: (ticket, index in batch)."""
        ...


class Send(LightFuture[Receipt]):
    """The receipt future of one message, which is also what its transport reports to.

    One object per message carries the envelope, the outcome and the caller's
    callbacks: no second future, no closure (the cyclic GC walks every container
    object while messages are in flight, so each one costs on every send).
    """

    # NOTE: ``doubt`` is set only when a send to the broker ended without an answer
    # before the message was detoured to the outbox (read with getattr): no cost on
    # the common path.
    __slots__ = ("doubt", "envelope", "held", "owner", "ticket")
    doubt: bool

    def __init__(self, owner: ReceiptOwner, envelope: Envelope) -> None:
        # LightFuture.__init__, inlined: one frame fewer for every message.
        self._mutex = RLock()
        self._state = PENDING
        self.owner = owner
        self.envelope = envelope
        #: The send's place among the producer's sends (set by the producer).
        self.ticket = 0
        #: Bound for the outbox: queued there without a transport attempt (set by the
        #: producer), or after the transport failed (set by the settlement).
        self.held = False

    def send_order(self) -> tuple[int, int]:
        """(ticket, 0): see :class:`StoreItem`."""
        return (self.ticket, 0)

    def cancel(self) -> bool:
        """Always False: the message is already on its way (to the broker or the
        outbox) and the receipt is the only way to learn where it ended."""
        return False

    def __call__(self, error: BaseException | None) -> None:
        # The transport's report (see msgsafe.ports.CallbackTransport).
        self.owner.published(self, error)

    def transport_done(self, future: Future[None]) -> None:
        # The same report from a transport that only returns futures.
        self.owner.published(self, future.exception())

    def stored(self, error: MsgsafeError | None) -> int:
        """The outbox writer's outcome for this message (see :class:`StoreItem`)."""
        env = self.envelope
        if error is None:
            owner = self.owner
            guarantee = owner.guarantees.get(env.destination, Guarantee.UNKNOWN)
            self.set_result(
                new_receipt(
                    env.message_id,
                    Status.STORED,
                    env.destination,
                    guarantee,
                    owner.store_guarantee,
                )
            )
        else:
            self.set_exception(error.refusing(env.message_id, doubt=getattr(self, "doubt", False)))
        return 1


class BatchSend(LightFuture[BatchReceipt]):
    """The future of one batch, and the report its transport calls.

    Resolves once every message is confirmed, stored or failed: with a
    :class:`~msgsafe.message.BatchReceipt` when all are safe, otherwise with
    :class:`~msgsafe.errors.BatchFailed` naming each failed id (the receipt of the safe
    ones inside). Thread-safe: reports come from the transport's thread, the outbox
    writer and the caller's thread.
    """

    __slots__ = ("_count_lock", "_errors", "_owner", "_remaining", "_stored", "batch", "ticket")

    def __init__(self, owner: ReceiptOwner, batch: Batch) -> None:
        super().__init__()
        self.batch = batch
        #: The batch's place among the producer's sends (set by the producer).
        self.ticket = 0
        self._owner = owner
        self._count_lock = threading.Lock()
        self._remaining = len(batch)
        self._stored: list[str] = []
        self._errors: dict[str, MsgsafeError] = {}

    def _guarantee(self) -> Guarantee:
        return self._owner.guarantees.get(self.batch.destination, Guarantee.UNKNOWN)

    def _store_guarantee(self) -> Guarantee | None:
        return self._owner.store_guarantee if self._stored else None

    def cancel(self) -> bool:
        """Always False: the messages are on their way (see ``Producer.send_async``)."""
        return False

    # --- BatchReport -------------------------------------------------------------------

    def confirmed(self, count: int) -> None:
        """``count`` more messages were confirmed by the broker."""
        with self._count_lock:
            self._remaining -= count
            done = self._remaining == 0
        if done:
            self._finish()

    def failed(self, index: int, error: MsgsafeError) -> None:
        """Message ``index`` was not confirmed: the outbox takes it if it can, otherwise
        it is reported as failed."""
        if self._owner.detour(self, index, error):
            return
        self._fail(index, error)

    # --- from the producer ---------------------------------------------------------------

    def stored(self, index: int, error: MsgsafeError | None) -> None:
        """The outbox writer committed message ``index`` (or could not: ``error``)."""
        if error is not None:
            self._fail(index, error)
            return
        message_id = self.batch.message_ids[index]
        with self._count_lock:
            self._stored.append(message_id)
            self._remaining -= 1
            done = self._remaining == 0
        if done:
            self._finish()

    def stored_all(self, error: OutboxError | None) -> None:
        """The outbox writer committed every message of the batch in one put (or none
        of them: ``error``)."""
        ids = self.batch.message_ids
        errors = {} if error is None else {mid: error.with_id(mid) for mid in ids}
        with self._count_lock:
            if error is None:
                self._stored.extend(ids)
            else:
                self._errors.update(errors)
            self._remaining -= len(ids)
            done = self._remaining == 0
        if done:
            self._finish()

    def fail_unrouted(self, error: MsgsafeError) -> bool:
        """Nothing of the batch was routed (the producer could not carry out its route):
        every message fails with ``error``, the outbox taking what it can (as
        :meth:`failed`). False, and nothing done, once any message was reported."""
        with self._count_lock:
            if self._remaining != len(self.batch):
                return False
        for index in range(len(self.batch)):
            self.failed(index, error)
        return True

    def _fail(self, index: int, error: MsgsafeError) -> None:
        message_id = self.batch.message_ids[index]
        # One error object per message: transports share one for many messages.
        own = error.with_id(message_id)
        with self._count_lock:
            self._errors[message_id] = own
            self._remaining -= 1
            done = self._remaining == 0
        if done:
            self._finish()

    def _finish(self) -> None:
        batch = self.batch
        try:
            if not self._errors:
                self.set_result(
                    BatchReceipt(
                        batch.destination,
                        batch.message_ids,
                        frozenset(self._stored),
                        self._guarantee(),
                        self._store_guarantee(),
                    )
                )
            else:
                errors = self._errors
                safe = [mid for mid in batch.message_ids if mid not in errors]
                receipt = BatchReceipt(
                    batch.destination,
                    safe,
                    frozenset(self._stored),
                    self._guarantee(),
                    self._store_guarantee(),
                )
                kinds = sorted({type(e).__name__ for e in errors.values()})
                self.set_exception(
                    BatchFailed(
                        f"{len(errors)} of {len(batch)} messages neither confirmed nor stored "
                        f"({', '.join(kinds)}); {receipt.confirmed} confirmed, "
                        f"{receipt.stored} stored",
                        errors=errors,
                        receipt=receipt,
                    )
                )
        finally:
            self._owner.settled(1)


class BatchPart:
    """One message of a batch on its way to the outbox (an item of the writer's queue)."""

    __slots__ = ("doubt", "envelope", "index", "send")

    def __init__(self, send: BatchSend, index: int, *, doubt: bool = False) -> None:
        self.send = send
        self.index = index
        self.envelope: Envelope = send.batch.envelope(index)
        #: The broker may hold it: its send ended without an answer (as :attr:`Send.doubt`).
        self.doubt = doubt

    def stored(self, error: MsgsafeError | None) -> int:
        """Settle it with the writer's outcome; returns 0 (the batch counts itself)."""
        if error is not None and self.doubt:
            error = error.refusing(self.envelope.message_id, doubt=True)
        self.send.stored(self.index, error)
        return 0

    def send_order(self) -> tuple[int, int]:
        """(the batch's ticket, index): see :class:`StoreItem`."""
        return (self.send.ticket, self.index)


class SubsetReport:
    """The report for the part of a batch that was published: maps the part's indexes
    back to the batch's (the rest of it waits behind the outbox barrier)."""

    __slots__ = ("indexes", "send")

    def __init__(self, send: BatchSend, indexes: Sequence[int]) -> None:
        self.send = send
        self.indexes = indexes

    def confirmed(self, count: int) -> None:
        self.send.confirmed(count)

    def failed(self, index: int, error: MsgsafeError) -> None:
        self.send.failed(self.indexes[index], error)


class OneOfBatch:
    """The per-message callback that reports one message of a batch, for transports
    without ``publish_batch`` (see :class:`msgsafe.ports.CallbackTransport`)."""

    __slots__ = ("index", "report")

    def __init__(self, report: BatchSend | SubsetReport, index: int) -> None:
        self.report = report
        self.index = index

    def __call__(self, error: MsgsafeError | None) -> None:
        if error is None:
            self.report.confirmed(1)
        else:
            self.report.failed(self.index, error)

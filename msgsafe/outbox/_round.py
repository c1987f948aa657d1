"""One claimed batch in flight: published at once in claim order, every answer kept by
claim index until the forwarder settles them in that order.

Where the transport declares a batch seam (:class:`~msgsafe.ports.BatchTransport`, which
the forwarder hands over as ``publish_batch``), runs of
consecutive messages that share a destination, headers and the second of their
``created_at`` go out as one :class:`~msgsafe.message.Batch` (no future and no envelope
per message on the transport's side: the per-message path is several times slower than
the broker on Kafka). Only the second is kept because that is all a batch can carry per
message that a wire format uses: AMQP 0-9-1's ``timestamp`` is in seconds, Kafka stamps
the send time, AMQP 1.0 has no batch seam. A batch reports failures by index and
confirmations only by count: a run is known confirmed when its count is complete, so a
run still incomplete at the lease deadline is re-sent whole (duplicates, never a loss).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from itertools import groupby

from msgsafe.errors import ConfirmTimeout, MsgsafeError, PermanentError
from msgsafe.message import Batch, Envelope
from msgsafe.outbox._rows import ClaimedRows, column, run_signatures
from msgsafe.ports import BatchReport, Transport

__all__ = ["UNSENT", "PublishBatch", "Round"]

#: No answer yet.
_PENDING = object()
#: Not handed to the transport: the round stopped before it (the broker refused at once).
UNSENT = ConfirmTimeout("not attempted: the broker refused")

#: A transport's ``publish_batch`` (see msgsafe.ports.BatchTransport).
PublishBatch = Callable[[Batch, BatchReport], None]
#: The destination check (see msgsafe.checks.gate): raises when nothing may go there.
_Admit = Callable[[str], object]

#: Not the message's fault: permanent for a send, about the connection (see the forwarder).
_NotTheMessage = tuple[type[MsgsafeError], ...]


class Round:
    """Answers of one claimed batch, by claim index. Thread-safe: answers arrive on the
    transport's threads, the forwarder waits for them on its own."""

    def __init__(self, envelopes: Sequence[Envelope], not_the_message: _NotTheMessage) -> None:
        self.envelopes = envelopes
        self._not_the_message = not_the_message
        self._answers: list[object] = [_PENDING] * len(envelopes)
        self._open = len(envelopes)
        self._lock = threading.Lock()
        self._all = threading.Event()
        #: Resolved with the last answer: what a transport's ``hurry`` waits for.
        self.answered: Future[None] = Future()
        if not envelopes:
            self._all.set()
            self.answered.set_result(None)

    # --- answers ----------------------------------------------------------------------------

    def answer(self, index: int, error: BaseException | None) -> None:
        """Message ``index`` was confirmed (None) or failed; the first answer counts."""
        with self._lock:
            if self._answers[index] is not _PENDING:
                return
            self._answers[index] = error
            self._open -= 1
            if self._open == 0:
                self._all.set()
                self.answered.set_result(None)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every answer; False if some are missing."""
        return self._all.wait(max(0.0, timeout))

    def outcomes(self) -> list[BaseException | None]:
        """Every message's answer in claim order: None (confirmed), its error,
        :data:`UNSENT`, or a :class:`ConfirmTimeout` when none came before the lease
        deadline."""
        with self._lock:
            answers = list(self._answers)
        late = ConfirmTimeout("no confirm before the lease deadline")
        return [late if a is _PENDING else a for a in answers]  # type: ignore[misc]

    def confirm_rest(self, start: int, end: int) -> None:
        """Messages ``start`` to ``end`` without an answer are confirmed."""
        with self._lock:
            answers = self._answers
            confirmed = 0
            for index in range(start, end):
                if answers[index] is _PENDING:
                    answers[index] = None
                    confirmed += 1
            self._open -= confirmed
            if self._open == 0 and confirmed:
                self._all.set()
                self.answered.set_result(None)

    # --- publishing --------------------------------------------------------------------------

    def publish(
        self,
        transport: Transport,
        admit: _Admit | None = None,
        publish_batch: PublishBatch | None = None,
    ) -> None:
        """Hand every message to ``transport`` in claim order, until one fails at once
        for a reason other than itself (the broker refuses: stop hammering it).

        ``admit(destination)`` runs once per destination of the round before its first
        message goes: its error answers that destination's messages unsent (permanent:
        each is answered with it; transient: the round stops there, as at a refusal).
        ``publish_batch``: the transport's batch seam, where it declares one
        (``capabilities.batch``); runs of messages then go out as batches."""
        count = len(self.envelopes)
        verdicts: dict[str, MsgsafeError | None] = {}
        for start, end, batchable in _runs(self.envelopes):
            if admit is not None:
                destination = self.envelopes[start].destination
                if destination not in verdicts:
                    verdicts[destination] = _verdict(admit, destination)
                refusal = verdicts[destination]
                if refusal is not None:
                    for index in range(start, end):
                        self.answer(index, refusal)
                    if not isinstance(refusal, PermanentError):
                        self._unsent(end, count)
                        return
                    continue
            if publish_batch is not None and batchable:
                self._publish_run(publish_batch, start, end)
                if self._refused_at_once(start, end):
                    self._unsent(end, count)
                    return
                continue
            for index in range(start, end):
                self._publish_one(transport, index)
                if self._refused_at_once(index, index + 1):
                    self._unsent(index + 1, count)
                    return

    def withhold(self) -> None:
        """Publish nothing: every message is answered :data:`UNSENT`."""
        self._unsent(0, len(self.envelopes))

    def _unsent(self, start: int, end: int) -> None:
        for rest in range(start, end):
            self.answer(rest, UNSENT)

    def _publish_one(self, transport: Transport, index: int) -> None:
        try:
            future = transport.publish(self.envelopes[index])
        except MsgsafeError as exc:
            self.answer(index, exc)
            return
        except Exception as exc:  # a transport bug must not kill the round
            self.answer(index, ConfirmTimeout(f"publish raised {type(exc).__name__}: {exc}"))
            return

        def report(done: Future[None]) -> None:
            self.answer(index, done.exception())

        future.add_done_callback(report)

    def _publish_run(self, publish_batch: PublishBatch, start: int, end: int) -> None:
        envelopes = self.envelopes
        first = envelopes[start]
        if isinstance(envelopes, ClaimedRows):
            run: Sequence[Envelope] = ClaimedRows(envelopes.rows[start:end])
        else:
            run = envelopes[start:end]
        batch = Batch(
            first.destination,
            column(run, "body"),
            column(run, "message_id"),
            column(run, "key"),
            first.headers,
            first.created_at,
        )
        try:
            publish_batch(batch, _RunReport(self, start, end - start))
        except Exception as exc:  # a transport bug must not kill the round
            error = ConfirmTimeout(f"publish_batch raised {type(exc).__name__}: {exc}")
            for index in range(start, end):
                self.answer(index, error)

    def _refused_at_once(self, start: int, end: int) -> bool:
        with self._lock:
            answers = self._answers[start:end]
        # No error among them (the usual run): counted in C, not tested one by one.
        if answers.count(_PENDING) + answers.count(None) == len(answers):
            return False
        return any(
            isinstance(a, BaseException)
            and (isinstance(a, self._not_the_message) or not isinstance(a, PermanentError))
            for a in answers
        )


def _verdict(admit: _Admit, destination: str) -> MsgsafeError | None:
    """None when ``destination`` may be sent to, else the check's error."""
    try:
        admit(destination)
    except MsgsafeError as exc:
        return exc
    return None


class _RunReport:
    """The :class:`~msgsafe.ports.BatchReport` of one run: failures by index; the run's
    confirmations complete once the count of answers reaches its size."""

    __slots__ = ("_left", "_lock", "_round", "_size", "_start")

    def __init__(self, rnd: Round, start: int, size: int) -> None:
        self._round = rnd
        self._start = start
        self._size = size
        self._left = size
        self._lock = threading.Lock()

    def confirmed(self, count: int) -> None:
        self._count(count)

    def failed(self, index: int, error: MsgsafeError) -> None:
        self._round.answer(self._start + index, error)
        self._count(1)

    def _count(self, count: int) -> None:
        with self._lock:
            self._left -= count
            complete = self._left <= 0
        if complete:
            # Every failure was reported by index before the count completed: what has
            # no answer now is what the broker confirmed.
            self._round.confirm_rest(self._start, self._start + self._size)


def _runs(envelopes: Sequence[Envelope]) -> list[tuple[int, int, bool]]:
    """``(start, end, batchable)`` runs of consecutive messages: those one batch can
    carry (see the module docstring), and every tombstone alone (a batch has no null
    value)."""
    runs: list[tuple[int, int, bool]] = []
    start = 0
    # NOTE: groupby over the signature columns: C loops, this sees every message.
    for signature, group in groupby(run_signatures(envelopes)):
        end = start + len(list(group))
        if signature[-1]:
            runs.extend((index, index + 1, False) for index in range(start, end))
        else:
            runs.append((start, end, True))
        start = end
    return runs

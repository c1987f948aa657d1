"""``Consumer.run``: fetch, hand each delivery to its key's lane, settle it by what the
handler did, stop cleanly.

After a handler call the delivery is, in this order of preference:

- acknowledged, when the handler returned (or left alone, when it settled it itself);
  a worker handles a run of a key's deliveries in order and acknowledges those of the
  run whose handler returned together, after the run (or before anything else of it is
  settled: a failure's retry, dead letter or give-back), never before;
  with an inbox (:class:`~msgsafe.ports.InboxStore`) the handler runs as
  ``handler(delivery, tx)`` inside the inbox's transaction, which records the message id
  and commits before the acknowledgement; a message the inbox has recorded already is
  acknowledged without calling the handler (counted ``skipped``);
- tried again after the retry policy's backoff, on its lane (the key waits, the others
  go on), ``attempt`` one higher — unless its error type is ``permanent`` or the policy
  is exhausted;
- then sent to the dead-letter destination through a :class:`~msgsafe.producer.Producer`
  and acknowledged only once the dead letter's receipt is in (CONFIRMED or STORED); a
  failed dead-letter send gives the original back instead, so it is never lost;
- or, without a dead-letter destination, settled as ``on_exhausted`` says: ``"reject"``
  (dropped, or dead-lettered by the broker where it is set up to) or ``"stop"`` (given
  back, and the run stops with the handler's error);
- without a retry policy, dead-letter destination or ``on_exhausted``: given back for the
  broker to deliver again; so is a delivery whose inbox took no writes in time
  (:class:`~msgsafe.errors.InboxUnavailable`: the database, not the handler, failed),
  whatever the policy: no retry of the handler is spent on it, nor is it dead-lettered
  for it (a broker that counts redeliveries still counts this one).

Stopping (``stop()``, SIGTERM, SIGINT) stops fetching, gives back what has not started
(``release()``: a broker that counts deliveries counts no attempt for it), lets running
handlers end within ``stop_timeout`` (then gives them back too, with ``nack()``: they
were tried), and closes the consumer, which commits what it may and leaves the group.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

from msgsafe.consuming.batching import BatchPolicy
from msgsafe.consuming.clock import RunClock
from msgsafe.consuming.dead_letter import dead_letter_headers
from msgsafe.consuming.lanes import Lane, LanePool, Verdict
from msgsafe.errors import ClosedError, InboxUnavailable, InvalidMessage, MsgsafeError
from msgsafe.message import Delivery
from msgsafe.ports import AttemptCounter, BatchInboxStore, InboxStore, inbox_capabilities
from msgsafe.retry import RetryPolicy

if TYPE_CHECKING:
    from msgsafe.producer import Producer

__all__ = ["BatchHandler", "Handler", "InboxHandler", "OnExhausted", "RunTally", "Runner"]

log = logging.getLogger("msgsafe.consumer")

#: What ``Consumer.run`` calls once per attempt: returning acknowledges, raising retries.
Handler = Callable[[Delivery], object]

#: The same with an inbox: ``tx`` is a DB-API connection inside the inbox's open
#: transaction; the handler writes its effects through it and neither commits nor rolls
#: back.
InboxHandler = Callable[[Delivery, Any], object]

#: With an inbox and a :class:`~msgsafe.consuming.batching.BatchPolicy`: a run of
#: deliveries (each new to the inbox) and the one transaction they are committed in.
BatchHandler = Callable[[list[Delivery], Any], object]

#: What to do with a message whose attempts are exhausted, without a dead-letter queue.
OnExhausted = Literal["reject", "stop"]

#: How long one fetch waits for a delivery: also how soon a stop is noticed.
_FETCH_WAIT = 0.2


@dataclass(frozen=True, slots=True)
class RunTally:
    """What ``Runner`` counts on every handler call, as calls taking nothing: the
    consumer's are C calls (``itertools.count``), with no lock
    (:class:`~msgsafe.telemetry.stats.ConsumerCounters`)."""

    started: Callable[[], object]  #: a handler call begins (in flight: started - ended)
    ended: Callable[[], object]  #: a handler call ended, however
    handled: Callable[[], object]  #: a delivery whose handler returned was acknowledged


class HandlerDidNotReturn(RuntimeError):
    """What a message is dead-lettered (or ``on_exhausted`` applied) with when the inbox
    counted more handler calls than ``max_attempts`` allows and none of them ended: the
    process stopped inside the handler each time (killed, out of memory, a crash in a C
    extension). The handler is not called again."""


class Runner:
    """One ``Consumer.run`` call; see the module docstring. ``fetch(room, wait)`` polls
    the consumer, ``count(figure, n)`` adds to its stats, ``close()`` closes it."""

    def __init__(
        self,
        handler: Handler | InboxHandler | BatchHandler,
        *,
        fetch: Callable[[int, float], list[Delivery]],
        close: Callable[[], None],
        count: Callable[[str, int], None],
        tally: RunTally | None = None,
        attempts: AttemptCounter,
        concurrency: int,
        prefetch: int,
        retry: RetryPolicy | None,
        permanent: tuple[type[BaseException], ...],
        dead_letter: str | None,
        dead_letter_producer: Producer | None,
        on_exhausted: OnExhausted | None,
        stop_timeout: float,
        clock: RunClock,
        inbox: InboxStore | None = None,
        count_in_inbox: bool = False,
        batch: BatchPolicy | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._handler: Callable[..., object] = handler
        self._inbox = inbox
        #: The inbox's batch methods (None: it has none; one call at a time).
        self._batch_inbox: BatchInboxStore | None = (
            inbox if inbox is not None and inbox_capabilities(inbox).batch else None  # type: ignore[assignment]
        )
        self._batch = batch
        #: Deliveries whose attempt a batch counted in the inbox and whose handler was not
        #: called for it (their key's earlier delivery failed first): not counted again.
        self._counted_ahead: dict[Delivery, int] = {}
        self._count_in_inbox = count_in_inbox
        self._fetch = fetch
        self._close = close
        self._count = count
        #: Per handler call: started, ended (in flight: the difference) and handled.
        if tally is None:
            tally = RunTally(
                started=lambda: count("in_flight", 1),
                ended=lambda: count("in_flight", -1),
                handled=lambda: count("handled", 1),
            )
        self._started = tally.started
        self._ended = tally.ended
        self._handled = tally.handled
        self._attempts = attempts
        #: The attempt memory's forget of many ids at once, where it has one.
        self._forget_all: Callable[[list[str]], None] | None = getattr(attempts, "forget_all", None)
        self._prefetch = prefetch
        self._retry = retry
        self._permanent = permanent
        self._dead_letter = dead_letter
        self._producer = dead_letter_producer
        self._on_exhausted = on_exhausted
        self._stop_timeout = stop_timeout
        self._clock = clock
        self._rng = rng
        # A plain flag, not an Event: a signal handler sets it between two bytecodes of
        # the main thread, which may hold any lock at that moment.
        self._stopping = False
        self._error: BaseException | None = None
        self._pool = LanePool(
            self._handle_run,
            concurrency=concurrency,
            clock=clock,
            give_back=_give_back,
            release=_release,
            acknowledge=_acknowledge,
            batch_work=self._handle_batch if batch is not None else None,
            batch_size=batch.max_messages if batch is not None else 1,
            batch_wait=batch.max_wait if batch is not None else 0.0,
        )

    def stop(self) -> None:
        """Ask the run to stop (any thread, or a signal handler); returns at once. No
        handler starts after this call."""
        self._stopping = True
        self._pool.halt()

    def run(self, *, signals: bool) -> None:
        """Fetch and dispatch until stopped; then shut down (see the module docstring).
        Raises what the fetch raised, or the handler's error after ``on_exhausted="stop"``."""
        self._pool.start()
        try:
            with _stop_on_signals(self.stop) if signals else _nothing():
                self._loop()
        finally:
            self._shutdown()
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        while not self._stopping:
            room = self._pool.room(self._prefetch, _FETCH_WAIT)
            if not room or self._stopping:
                continue
            try:
                batch = self._fetch(room, _FETCH_WAIT)
            except ClosedError:
                if not self._stopping:
                    log.info("consumer closed during run(); stopping")
                return
            self._pool.submit(*batch)

    def _shutdown(self) -> None:
        self._stopping = True
        late = self._pool.close(self._stop_timeout)
        if late:
            log.warning(
                "%d handler(s) still running after stop_timeout=%gs; their deliveries were"
                " given back and will be delivered again",
                len(late),
                self._stop_timeout,
            )
        self._close()

    # --- one handler call, on a worker thread --------------------------------------------

    def _handle_run(self, lane: Lane, run: list[Delivery]) -> Verdict | float:
        """Handle ``run``, the first deliveries of ``lane``, in order, each finished before
        the next starts (``lane.done`` counts them), until one is not done: the verdict
        on it (DONE: all were). No lock of the pool's is taken between two of them; the
        finished ones are settled before this returns."""
        if self._inbox is not None:
            # The ids are committed as each handler returns; their acknowledgements wait
            # for the run's end, as below (a redelivery before them is skipped).
            committed: list[Delivery] = []
            for delivery in run:
                if self._stopping:  # no handler starts after stop()
                    self._ack_returned(committed)
                    return Verdict.RELEASE if lane.first_start is None else Verdict.GIVE_BACK
                verdict = self._handle(lane, delivery, returned=committed)
                if verdict is not Verdict.DONE:
                    self._ack_returned(committed)
                    return verdict
                lane.first_start = None
                lane.done += 1
            self._ack_returned(committed)
            return Verdict.DONE
        # NOTE: _handle without an inbox, inlined for the common first attempt: a Python
        # call and its checks per delivery were a fifth of run()'s own cost. The run's
        # returned handlers are acknowledged together (one receiver lock, not one a
        # delivery), before the run's verdict is booked and before anything else is
        # settled: never before their handler returned.
        handler = self._handler
        started, ended = self._started, self._ended
        clock = self._clock if self._retry is not None else None
        returned: list[Delivery] = []
        for delivery in run:
            if self._stopping:
                self._ack_returned(returned)
                return Verdict.RELEASE if lane.first_start is None else Verdict.GIVE_BACK
            if lane.first_start is not None:  # a retry: attempt counts, clock kept
                self._ack_returned(returned)
                verdict = self._handle(lane, delivery)
                if verdict is not Verdict.DONE:
                    return verdict
            else:
                # The run's clock is read only where a retry policy will use the time.
                lane.first_start = float(clock.now()) if clock is not None else 0.0
                started()
                try:
                    handler(delivery)
                except Exception as exc:
                    ended()
                    if delivery.settled is None:
                        self._ack_returned(returned)
                        verdict = self._failed(lane, delivery, exc)
                        if verdict is not Verdict.DONE:
                            return verdict
                    else:  # settled by the handler itself
                        self._forget(delivery)
                else:
                    ended()
                    if delivery.settled is None:
                        returned.append(delivery)
                    else:
                        self._forget(delivery)
            lane.first_start = None
            lane.done += 1
        self._ack_returned(returned)
        return Verdict.DONE

    def _ack_returned(self, returned: list[Delivery]) -> None:
        """Acknowledge ``returned`` (deliveries whose handler returned), counted handled,
        their attempts forgotten; emptied."""
        if not returned:
            return
        failed = type(returned[0])._ack_run(returned)
        for _, exc in failed:
            log.info("cannot settle a delivery (it will be delivered again): %s", exc)
        lost = {id(delivery) for delivery, _ in failed} if failed else ()
        handled = self._handled
        forgotten: list[str] = []
        for delivery in returned:
            if lost and id(delivery) in lost:
                continue
            handled()
            message_id = delivery.message_id
            if message_id is not None and not delivery.attempt_from_broker:
                forgotten.append(message_id)
        if self._forget_all is not None:
            self._forget_all(forgotten)
        else:
            for message_id in forgotten:
                self._attempts.forget(message_id)
        returned.clear()

    def _handle(
        self,
        lane: Lane,
        delivery: Delivery,
        *,
        counted: int | None = None,
        returned: list[Delivery] | None = None,
    ) -> Verdict | float:
        """One handler call on ``delivery``, ``lane``'s first not finished; ``counted``:
        its attempt was counted in the inbox already, by a batch (that count), and this
        call continues it. ``returned``: a handler that returned (and ran) puts its
        delivery there to be acknowledged with the rest of the run, which is
        acknowledged before anything else is settled here."""
        first = lane.first_start is None
        if first:
            # NOTE: the run's clock is read only where a retry policy will use the time:
            # without one, first_start only marks the head as tried (0.0).
            lane.first_start = float(self._clock.now()) if self._retry is not None else 0.0
        else:
            delivery.attempt += 1
            if delivery.message_id is not None and not delivery.attempt_from_broker:
                self._attempts.retried(delivery.message_id, delivery.attempt)
        if counted is None:
            counted = self._count_attempt(delivery, first=first) if self._inbox is not None else 0
        if counted and self._beyond_max(counted):
            if returned:
                self._ack_returned(returned)
            # NOTE: the inbox counts calls, not failures: calls beyond max_attempts mean
            # earlier ones ended with no outcome (the process died in the handler). Calling
            # it again would crash-loop the consumer on this message for ever.
            return self._exhausted(
                delivery,
                HandlerDidNotReturn(
                    f"attempt {delivery.attempt} of {delivery.message_id}: the handler's"
                    " earlier attempts ended with no outcome (the process stopped in them)"
                ),
            )
        self._started()
        ran = True
        try:
            if self._inbox is None:
                self._handler(delivery)
            else:
                ran = self._call(delivery)
        except Exception as exc:
            error: Exception | None = exc
        else:
            error = None
        finally:
            self._ended()
        if delivery.settled is not None:
            self._forget(delivery)
            return Verdict.DONE  # the handler settled it itself
        if error is None:
            # With an inbox the id and the handler's effects are committed by now: a
            # crash before this ack redelivers a message the inbox then skips.
            if ran and returned is not None:
                returned.append(delivery)
                return Verdict.DONE
            try:
                delivery.ack()
            except MsgsafeError as exc:
                log.info("cannot settle a delivery (it will be delivered again): %s", exc)
                return Verdict.DONE
            if ran:
                self._handled()
            else:
                self._count("skipped", 1)
            message_id = delivery.message_id
            if message_id is not None and not delivery.attempt_from_broker:
                self._attempts.forget(message_id)
            return Verdict.DONE
        if returned:
            self._ack_returned(returned)
        return self._failed(lane, delivery, error)

    def _beyond_max(self, calls: int) -> bool:
        """Whether ``calls`` handler calls counted in the inbox exceed the retry policy's
        ``max_attempts`` (with a dead-letter queue or ``on_exhausted`` to go to)."""
        retry = self._retry
        return (
            retry is not None
            and retry.max_attempts is not None
            and calls > retry.max_attempts
            and (self._dead_letter is not None or self._on_exhausted is not None)
        )

    def _count_attempt(self, delivery: Delivery, *, first: bool) -> int:
        """Count this handler call in the inbox, durably, when the broker keeps no count:
        ``delivery.attempt`` then goes on from the calls of processes that are gone. A
        message the inbox has recorded (``first`` call of a redelivery after a crash
        between commit and ack) is not counted: it is skipped, and its count was dropped
        with the record. The inbox's count of calls, 0 when it counted none."""
        inbox = self._inbox
        message_id = delivery.message_id
        if (
            inbox is None
            or not self._count_in_inbox
            or message_id is None
            or delivery.attempt_from_broker
        ):
            return 0
        if first and delivery in self._counted_ahead:
            return self._counted_ahead.pop(delivery)  # a batch counted it
        # NOTE: Kafka counts no redeliveries, and a message that kills its consumer (or
        # meets SIGKILL) would start from attempt 1 in the next process without this.
        # Counted at the call, not at the fetch: a prefetched delivery given back at a
        # stop was never tried.
        try:
            if first and self._batch_inbox is not None:
                # One statement: the count, unless the id is handled (then skipped).
                counts = self._batch_inbox.record_attempts([(message_id, delivery.destination)])
                if message_id not in counts:
                    return 0
                counted = counts[message_id]
            elif first and inbox.handled([message_id]):
                return 0
            else:
                counted = inbox.record_attempt(message_id, source=delivery.destination)
        except MsgsafeError as exc:  # the inbox's errors, or closed
            log.warning(
                "attempt %d of %s counted in memory only: %s", delivery.attempt, message_id, exc
            )
            return 0
        if counted > delivery.attempt:
            delivery.attempt = counted
            self._attempts.retried(message_id, counted)
        return counted

    def _call(self, delivery: Delivery) -> bool:
        """Call the handler, through the inbox's transaction when there is one; False
        when the inbox had the message recorded and the handler was not called."""
        inbox = self._inbox
        if inbox is None:
            self._handler(delivery)
            return True
        if delivery.message_id is None:
            raise _NoMessageId(
                "a delivery without a message id cannot be handled through the inbox: "
                "exactly-once needs the id msgsafe's producers give every message"
            )
        handler = self._handler
        if self._batch is not None:
            # A batch handler's delivery handled alone: a list of one.
            work: Callable[[Any], object] = lambda tx: handler([delivery], tx)  # noqa: E731
        else:
            work = lambda tx: handler(delivery, tx)  # noqa: E731
        processed = inbox.process(
            delivery.message_id,
            work,
            source=delivery.destination,
            attempt=delivery.attempt,
        )
        return processed.ran

    # --- a batch, on a worker thread (run(batch=...)) ----------------------------------------

    def _handle_batch(
        self, taken: list[tuple[Lane, list[Delivery]]]
    ) -> list[tuple[Lane, Verdict | float]]:
        """One handler call for runs of the heads of ``taken``'s lanes, through one inbox
        transaction; see :mod:`msgsafe.consuming.batching`. A delivery seen before, or
        without an id, and what follows it on its lane, are handled one at a time after
        the batch; so is everything of a batch whose handler raised."""
        if self._stopping:  # stopped while the batch was gathered: no handler starts
            return [(lane, Verdict.RELEASE) for lane, _ in taken]
        counts = self._count_batch([d for _, run in taken for d in run])
        plan: list[tuple[Lane, list[Delivery], list[Delivery]]] = []
        batch: list[tuple[Lane, Delivery]] = []
        for lane, run in taken:
            cut = 0
            while cut < len(run) and _batchable(run[cut], counts):
                cut += 1
            plan.append((lane, run[:cut], run[cut:]))
            batch.extend((lane, delivery) for delivery in run[:cut])
        error: Exception | None = None
        if batch:
            error = self._commit_batch(batch, [(lane, ran) for lane, ran, _ in plan if ran])
        if isinstance(error, InboxUnavailable):
            log.warning("inbox unavailable for a batch of %d, given back: %s", len(batch), error)
            return [(lane, Verdict.GIVE_BACK) for lane, _ in taken]
        if error is not None:
            log.info(
                "handler failed on a batch of %d, handled one by one: %s: %s",
                len(batch),
                type(error).__name__,
                error,
            )
            self._count("batches_split", 1)
        verdicts: list[tuple[Lane, Verdict | float]] = []
        for lane, ran, rest in plan:
            alone = ran + rest if error is not None else rest
            verdicts.append((lane, self._one_by_one(lane, alone, counts)))
        return verdicts

    def _count_batch(self, deliveries: list[Delivery]) -> dict[str, int] | None:
        """Count the attempt of each delivery the inbox counts (one statement), as
        :meth:`_count_attempt` does one; the counts by id (a handled id: 0). None when
        the inbox counts none of them."""
        inbox = self._batch_inbox
        if inbox is None or not self._count_in_inbox:
            return None
        counts: dict[str, int] = {}
        asked: dict[str, str] = {}
        for delivery in deliveries:
            message_id = delivery.message_id
            if message_id is None or delivery.attempt_from_broker:
                continue
            ahead = self._counted_ahead.pop(delivery, None)
            if ahead is not None:
                counts[message_id] = ahead
            elif message_id not in counts:
                asked.setdefault(message_id, delivery.destination)
        if not asked:
            return counts
        try:
            counted = inbox.record_attempts(list(asked.items()))
        except MsgsafeError as exc:  # the inbox's errors, or closed
            log.warning("attempts of a batch of %d counted in memory only: %s", len(asked), exc)
            return counts
        for message_id in asked:
            counts[message_id] = counted.get(message_id, 0)
        for delivery in deliveries:
            message_id = delivery.message_id
            count = counts.get(message_id, 0) if message_id is not None else 0
            if count > delivery.attempt and message_id is not None:
                delivery.attempt = count
                self._attempts.retried(message_id, count)
        return counts

    def _commit_batch(
        self, batch: list[tuple[Lane, Delivery]], runs: list[tuple[Lane, list[Delivery]]]
    ) -> Exception | None:
        """Call the handler with ``batch``'s deliveries new to the inbox and commit their
        ids with its writes; then acknowledge every delivery and take ``runs`` (the same,
        by lane) off their lanes. The error that rolled the batch back, if any (nothing
        acknowledged then)."""
        inbox = self._batch_inbox
        assert inbox is not None
        deliveries = [delivery for _, delivery in batch]
        records = [(str(d.message_id), d.destination, d.attempt) for d in deliveries]
        handler = self._handler

        def work(fresh: list[int], tx: Any) -> object:
            return handler([deliveries[i] for i in fresh], tx)

        self._count("in_flight", len(batch))
        try:
            processed = inbox.process_batch(records, work)
        except Exception as exc:
            return exc
        finally:
            self._count("in_flight", -len(batch))
        fresh = set(processed.fresh)
        self._count("batches", 1)
        # The ids and the handler's effects are committed: a crash before these acks
        # redelivers messages the inbox then skips.
        handled = skipped = 0
        forget = self._attempts.forget
        for index, (_, delivery) in enumerate(batch):
            if delivery.settled is None and _settle(delivery.ack):
                if index in fresh:
                    handled += 1
                else:
                    skipped += 1
            if not delivery.attempt_from_broker:
                forget(str(delivery.message_id))
        for lane, run in runs:
            self._pool.finished(lane, *run)
        if handled:
            self._count("handled", handled)
        if skipped:
            self._count("skipped", skipped)
        return None

    def _one_by_one(
        self, lane: Lane, deliveries: list[Delivery], counts: dict[str, int] | None
    ) -> Verdict | float:
        """Handle ``deliveries``, the first of ``lane``, alone each, in order, until one
        is not done: the verdict on it (DONE: all were)."""
        for index, delivery in enumerate(deliveries):
            if not lane.items or lane.items[0] is not delivery:
                return Verdict.DONE  # given back by a stop that did not wait for it
            if self._stopping:
                return Verdict.RELEASE  # no handler starts after stop(): never tried
            lane.current = delivery
            # Counted by the batch (or not counted in the inbox at all): not again.
            message_id = delivery.message_id
            counted = 0 if counts is None or message_id is None else counts.get(message_id, 0)
            verdict = self._handle(lane, delivery, counted=counted)
            if verdict is not Verdict.DONE:
                if counts is not None:
                    for later in deliveries[index + 1 :]:
                        if later.message_id is not None and later.message_id in counts:
                            self._counted_ahead[later] = counts[later.message_id]
                return verdict
            self._pool.finished(lane, delivery)
        return Verdict.DONE

    def _failed(self, lane: Lane, delivery: Delivery, error: Exception) -> Verdict | float:
        if isinstance(error, InboxUnavailable):
            # NOTE: the inbox's database took no writes for its whole write_timeout (down,
            # failing over): the handler is not at fault, so this is no attempt of its own
            # to count towards the dead-letter queue. Given back with the rest of its key,
            # to be handled on redelivery once the database is back.
            log.warning(
                "inbox unavailable for %s (attempt %d), given back: %s",
                delivery.message_id,
                delivery.attempt,
                error,
            )
            return Verdict.GIVE_BACK
        final_choice = self._dead_letter is not None or self._on_exhausted is not None
        if self._stopping or (self._retry is None and not final_choice):
            log.warning(
                "handler failed on %s (attempt %d), given back: %s: %s",
                delivery.message_id,
                delivery.attempt,
                type(error).__name__,
                error,
            )
            return Verdict.GIVE_BACK
        retry = self._retry
        started = lane.first_start if lane.first_start is not None else 0.0
        now = float(self._clock.now())
        if (
            retry is not None
            and not isinstance(error, (*self._permanent, _NoMessageId))
            and not retry.exhausted(delivery.attempt, now - started)
        ):
            delay = retry.wait(delivery.attempt, self._rng)
            log.info(
                "handler failed on %s (attempt %d), retrying in %.3fs: %s: %s",
                delivery.message_id,
                delivery.attempt,
                delay,
                type(error).__name__,
                error,
            )
            self._count("retried", 1)
            return now + delay
        return self._exhausted(delivery, error)

    def _exhausted(self, delivery: Delivery, error: Exception) -> Verdict:
        what = f"{delivery.message_id} after {delivery.attempt} attempt(s)"
        if self._dead_letter is not None and self._producer is not None:
            try:
                self._producer.send(
                    self._dead_letter,
                    delivery.body,
                    key=delivery.key,
                    headers=dead_letter_headers(delivery, error),
                )
            except Exception as exc:
                # NOTE: the original is the only copy the broker holds: never acknowledged
                # without the dead letter's receipt.
                log.error(
                    "cannot dead-letter %s to %r, given back: %s: %s",
                    what,
                    self._dead_letter,
                    type(exc).__name__,
                    exc,
                )
                return Verdict.GIVE_BACK
            log.warning("dead-lettered %s to %r: %s", what, self._dead_letter, error)
            if _settle(delivery.ack):
                self._count("dead_lettered", 1)
                self._forget(delivery)
            return Verdict.DONE
        if self._on_exhausted == "reject":
            log.warning("rejected %s: %s: %s", what, type(error).__name__, error)
            if _settle(lambda: delivery.nack(requeue=False)):
                self._forget(delivery)
            return Verdict.DONE
        log.error("stopping: %s failed: %s: %s", what, type(error).__name__, error)
        if self._error is None:
            self._error = error
        self.stop()
        return Verdict.GIVE_BACK

    def _forget(self, delivery: Delivery) -> None:
        if delivery.message_id is not None and not delivery.attempt_from_broker:
            self._attempts.forget(delivery.message_id)


class _NoMessageId(InvalidMessage):
    """A delivery without a message id met an inbox: no retry will give it one."""


def _batchable(delivery: Delivery, counts: dict[str, int] | None) -> bool:
    """Whether ``delivery`` may be handled in a batch: it has an id, is new to the inbox's
    count (none was taken, or it is 0: handled, or 1) and has not been tried before."""
    message_id = delivery.message_id
    if message_id is None or delivery.attempt > 1:
        return False
    return counts is None or counts.get(message_id, 1) <= 1


def _settle(settle: Callable[[], None]) -> bool:
    """Settle; False when the delivery cannot be settled any more (given back at a
    stop's deadline, or its connection is gone: the broker delivers it again)."""
    try:
        settle()
    except MsgsafeError as exc:
        log.info("cannot settle a delivery (it will be delivered again): %s", exc)
        return False
    return True


def _give_back(delivery: Delivery) -> None:
    """A delivery its handler ran on: the broker counts the attempt."""
    _settle(lambda: delivery.nack(requeue=True))


def _acknowledge(finished: list[Delivery]) -> None:
    """Deliveries whose handler returned, not settled yet (a worker acknowledges its
    run's together, after the run): acknowledged now (at a stop's deadline)."""
    for delivery in finished:
        if delivery.settled is None:
            _settle(delivery.ack)


def _release(delivery: Delivery) -> None:
    """A delivery no handler ran on: given back without counting an attempt."""
    _settle(delivery.release)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def _stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call ``stop`` while inside, on the main thread only (the only
    one Python lets install handlers); the previous handlers are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Nothing here that takes a lock (logging does): the main thread may hold it.
        stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

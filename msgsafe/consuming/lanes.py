"""Per-key lanes over a pool of worker threads.

Each key has one lane: its deliveries in arrival order, handled one at a time, the next
only once the one before is finished (its handler returned, or it was settled) — so a
key's order holds however many workers there are. A worker takes a run of a lane's
first deliveries at once (up to ``_RUN``) and hands the lane back after it, taking the
pool's lock once a run rather than once a delivery; the work settles a run's finished
deliveries before the worker books the run (a stop whose deadline passes inside a run
has them settled by ``acknowledge``, and gives back only the rest). An unkeyed delivery
is a lane of its own and runs freely. A lane
waiting out a retry's backoff holds its key only: no worker waits with it, other lanes
go on. Closing gives back everything not started, each key's deliveries in their order,
and what is running once it ends. A delivery whose handler ran (and failed, or is still
running at the deadline) goes back through ``give_back`` (``nack()``: the broker counts
the attempt); one never started through ``release`` (``release()``: it counts none, or a
stop with a full prefetch would spend an attempt of every message held).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from msgsafe.consuming.clock import RunClock
from msgsafe.message import Delivery

__all__ = ["Lane", "LanePool", "Verdict"]

log = logging.getLogger("msgsafe.consumer")


#: Deliveries of one lane a worker takes at once (a run): handled in order with no lock of
#: the pool's between them, taken off the lane together after the last. Also how many a
#: worker handles in a row while other lanes wait for one.
_RUN = 16


class Verdict(enum.Enum):
    """What became of a lane's head after one handler call (or a retry: a deadline)."""

    DONE = "done"  #: settled: the next delivery of the lane may start
    GIVE_BACK = "give_back"  #: to be given back, with the rest of its lane (their order kept)
    #: not started (stopped first): given back uncounted, with the rest of its lane
    RELEASE = "release"


@dataclass(eq=False, slots=True)
class Lane:
    """One key's deliveries not finished yet, the head first (an unkeyed delivery's
    lane holds it alone). ``first_start`` is when the head's first attempt in this
    process began (on the run's clock), None before it did."""

    key: bytes | None
    items: deque[Delivery] = field(default_factory=deque)
    first_start: float | None = None
    #: The delivery a worker is handling now (None while none is).
    current: Delivery | None = None
    #: How many of ``items``, from the head, the worker running the lane has finished
    #: (settled) in its current run and not taken off yet: written by that worker only.
    done: int = 0


#: Handles a run of a lane's first deliveries, in order, each only after the one before
#: it was finished (``lane.done`` counts them); returns the verdict on the one it stopped
#: at: DONE once all are (the run's every delivery settled), else GIVE_BACK, RELEASE or
#: the clock time to try that one again at (those before it settled, ``lane.done`` of
#: them).
Work = Callable[[Lane, list[Delivery]], "Verdict | float"]

#: Handles a batch: runs of the heads of lanes (each lane's first deliveries, in order),
#: finishing each delivery it is done with through :meth:`LanePool.finished`; returns,
#: per lane, the verdict on the head it stopped at (DONE: none, the lane goes on).
BatchWork = Callable[[list[tuple[Lane, list[Delivery]]]], list[tuple[Lane, "Verdict | float"]]]


class LanePool:
    """``concurrency`` worker threads serving lanes; see the module docstring.

    Thread-safe. :meth:`submit` is called by one fetching thread, :meth:`close` once.
    ``held`` counts the deliveries submitted and neither finished nor given back.
    """

    def __init__(
        self,
        work: Work,
        *,
        concurrency: int,
        clock: RunClock,
        give_back: Callable[[Delivery], None],
        release: Callable[[Delivery], None],
        acknowledge: Callable[[list[Delivery]], None] = lambda finished: None,
        batch_work: BatchWork | None = None,
        batch_size: int = 1,
        batch_wait: float = 0.0,
    ) -> None:
        self._work = work
        self._batch_work = batch_work
        self._batch_size = batch_size
        self._batch_wait = batch_wait
        self._clock = clock
        self._give_back = give_back
        self._release = release
        #: Settles what a worker finished (its handler returned) and had not settled yet.
        self._acknowledge = acknowledge
        #: Workers wait on it for a lane to handle.
        lock = threading.RLock()
        #: The lock of both conditions, taken directly on the paths of every delivery:
        #: a Condition's own ``with`` is two Python calls around it.
        self._mutex = lock
        self._cond = threading.Condition(lock)
        #: The fetcher (for room) and close (for the running handlers) wait on it, under
        #: the same lock: a finished delivery wakes them, not every idle worker.
        self._room = threading.Condition(lock)
        self._keyed: dict[bytes, Lane] = {}
        self._ready: deque[Lane] = deque()
        self._timed: list[tuple[float, int, Lane]] = []
        self._order = itertools.count()
        self._running: set[Lane] = set()
        self._closing = False
        # Set without the lock (from a signal handler too): checked before each take.
        self._halted = False
        self.held = 0
        #: Threads waiting on ``_room`` (the fetcher, close): a finished delivery wakes
        #: them only when there are any, and the fetcher only once ``held`` is down to
        #: ``_low`` (half its limit: one fetch of many, not one per delivery finished).
        self._room_waiters = 0
        self._low = 0
        self._threads = [
            threading.Thread(target=self._serve, name=f"msgsafe-run-{n}", daemon=True)
            for n in range(concurrency)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def halt(self) -> None:
        """Start no more handlers from now on (what waits stays until :meth:`close`).
        Takes no lock: safe in a signal handler."""
        self._halted = True

    def room(self, limit: int, timeout: float) -> int:
        """How many more deliveries may be submitted before ``limit`` are held, waiting up
        to ``timeout`` seconds for there to be any."""
        with self._room:
            if self.held >= limit:
                # NOTE: woken at half the limit, not at each delivery finished: waking for
                # one free place made a fetch (a poll) per delivery.
                low = self._low = (limit - 1) // 2
                self._room_waiters += 1
                try:
                    self._room.wait_for(lambda: self.held <= low or self._closing, timeout)
                finally:
                    self._room_waiters -= 1
            return 0 if self._closing else max(0, limit - self.held)

    def _freed(self) -> None:
        """Deliveries left ``held``: wake who waits for room, if anyone does and there is
        enough (called with the lock held)."""
        if self._room_waiters and (self.held <= self._low or self._closing):
            self._room.notify_all()

    def submit(self, *deliveries: Delivery) -> None:
        """Queue each of ``deliveries`` on its key's lane, in order (given back at once
        after close)."""
        with self._mutex:
            if not self._closing:
                self.held += len(deliveries)
                keyed, ready = self._keyed, self._ready
                made = 0
                for delivery in deliveries:
                    key = delivery.key
                    lane = None if key is None else keyed.get(key)
                    if lane is not None:
                        lane.items.append(delivery)  # the lane is ready, timed or running
                        continue
                    lane = Lane(key, deque((delivery,)))
                    if key is not None:
                        keyed[key] = lane
                    ready.append(lane)
                    made += 1
                if made:
                    self._cond.notify(made)
                return
        for delivery in deliveries:
            self._release(delivery)

    def _take(self) -> Lane | None:
        """The next lane to work on (None once halted); called with the lock held."""
        while not (self._closing or self._halted):
            now = self._clock.now()
            while self._timed and self._timed[0][0] <= now:
                self._ready.append(heapq.heappop(self._timed)[2])
            if self._ready:
                lane = self._ready.popleft()
                lane.current = lane.items[0]
                self._running.add(lane)
                return lane
            self._clock.wait(self._cond, self._timed[0][0] if self._timed else None)
        return None

    def _gather(self, lane: Lane) -> list[tuple[Lane, list[Delivery]]]:
        """``lane`` (taken, never tried yet) and more such lanes that are ready, each with
        a run of its first deliveries, at most ``batch_size`` in all, waiting up to
        ``batch_wait`` for more; called with the lock held."""
        lanes = [lane]
        deadline = self._clock.now() + self._batch_wait if self._batch_wait > 0 else None
        while True:
            room = self._batch_size - sum(len(taken.items) for taken in lanes)
            while room > 0 and self._ready and self._ready[0].first_start is None:
                more = self._ready.popleft()
                more.current = more.items[0]
                self._running.add(more)
                lanes.append(more)
                room -= len(more.items)
            if (
                room <= 0
                or deadline is None
                or self._closing
                or self._halted
                or self._clock.now() >= deadline
            ):
                break
            self._clock.wait(self._cond, deadline)
        left = self._batch_size
        batch: list[tuple[Lane, list[Delivery]]] = []
        for taken in lanes:
            if left <= 0:  # its lanes before it grew while waiting: not in this batch
                self._running.discard(taken)
                taken.current = None
                self._ready.append(taken)
                self._cond.notify()
                continue
            run = list(itertools.islice(taken.items, left))
            left -= len(run)
            batch.append((taken, run))
        return batch

    def finished(self, lane: Lane, *deliveries: Delivery) -> None:
        """``deliveries``, the first of ``lane`` (taken in a batch), are settled: the
        lane goes on with the next (nothing happens for those close gave back)."""
        with self._mutex:
            items = lane.items
            done = 0
            for delivery in deliveries:
                if not items or items[0] is not delivery:
                    break
                items.popleft()
                done += 1
            if done:
                lane.first_start = None
                self.held -= done
                self._freed()

    def _serve(self) -> None:
        lane: Lane | None = None
        run: list[Delivery] = []
        while True:
            if lane is None:
                with self._mutex:
                    lane = self._take()
                    if lane is None:
                        return
                    batch = None
                    if self._batch_work is None:
                        run = list(itertools.islice(lane.items, _RUN))
                    elif lane.first_start is None:
                        batch = self._gather(lane)
                    else:  # a retry, in a batched run: handled alone
                        run = [lane.items[0]]
                if batch is not None:
                    self._serve_batch(batch)
                    lane = None
                    continue
            try:
                verdict = self._work(lane, run)
            except BaseException:  # the work catches what handlers raise; this is a bug
                log.exception("consumer worker failed; the delivery is given back")
                verdict = Verdict.GIVE_BACK
            lane, run = self._after_run(lane, run, verdict)

    def _after_run(
        self, lane: Lane, run: list[Delivery], verdict: Verdict | float
    ) -> tuple[Lane | None, list[Delivery]]:
        """Take ``run``'s finished deliveries (``lane.done``) off ``lane`` and book the
        verdict on the one it stopped at. After a run all done, the worker keeps the lane
        with its next run when there is one and no other lane waits for a worker (the
        lane, the run); otherwise (None, []).

        One lock per run, not per delivery: a worker going on with its lane spares the
        lane a trip through the ready queue and a wake-up (each a lock, a deque and a
        Condition.notify); a key waits behind another's for at most one run."""
        with self._mutex:
            done, lane.done = lane.done, 0
            items = lane.items
            if done and items and items[0] is run[0]:  # else close gave the lane back
                # NOTE: first_start is the work's (reset after each delivery it finished):
                # the one it stopped at may be tried already, a retry due.
                for _ in range(done):
                    items.popleft()
                self.held -= done
                if (
                    verdict is Verdict.DONE
                    and items
                    and self._batch_work is None
                    and not self._ready
                    and not (self._closing or self._halted)
                ):
                    lane.current = items[0]
                    self._freed()
                    return lane, list(itertools.islice(items, _RUN))
            lane.current = run[done] if done < len(run) else None
            tried, back = self._after(lane, verdict, pop=False)
        self._return(tried, back)
        return None, []

    def _serve_batch(self, batch: list[tuple[Lane, list[Delivery]]]) -> None:
        assert self._batch_work is not None
        try:
            verdicts = self._batch_work(batch)
        except BaseException:  # the work catches what handlers raise; this is a bug
            log.exception("consumer worker failed; the batch's deliveries are given back")
            verdicts = [(lane, Verdict.GIVE_BACK) for lane, _ in batch]
        for lane, verdict in verdicts:
            self._return(*self._after(lane, verdict, pop=False))

    def _return(self, tried: list[Delivery], untried: list[Delivery]) -> None:
        """Give back ``tried`` (counted), then ``untried`` (released), each in order."""
        for delivery in tried:
            self._give_back(delivery)
        for delivery in untried:
            self._release(delivery)

    def _after(
        self, lane: Lane, verdict: Verdict | float, *, pop: bool = True
    ) -> tuple[list[Delivery], list[Delivery]]:
        """Book the verdict on ``lane``'s current head (``pop``: DONE takes it off the
        lane; a batch took its finished deliveries off already); what to give back (in
        order): the head its handler ran on, and the rest of the lane, never tried."""
        with self._mutex:
            self._running.discard(lane)
            current, lane.current = lane.current, None
            # An abandoned lane (close timed out) was emptied: its head is given back.
            still_held = bool(lane.items) and lane.items[0] is current
            tried: list[Delivery] = []
            if still_held and verdict is Verdict.DONE:
                if pop:
                    lane.items.popleft()
                    lane.first_start = None
                    self.held -= 1
            elif still_held and (
                verdict is Verdict.GIVE_BACK or (self._closing and verdict is not Verdict.RELEASE)
            ):
                # NOTE: failed (or due for a retry that a close cancels): the handler ran.
                tried.append(lane.items.popleft())
            elif still_held and isinstance(verdict, float) and not self._closing:
                heapq.heappush(self._timed, (verdict, next(self._order), lane))
                self._cond.notify()  # an idle worker times its wait by the new deadline
            back: list[Delivery] = []
            if verdict is Verdict.GIVE_BACK or verdict is Verdict.RELEASE or self._closing:
                # the rest, after the head
                back.extend(lane.items)
                lane.items.clear()
            if lane.items and not isinstance(verdict, float):
                self._ready.append(lane)
                self._cond.notify()
            elif not lane.items and lane.key is not None:
                self._keyed.pop(lane.key, None)
            self.held -= len(tried) + len(back)
            self._freed()
            return tried, back

    def close(self, timeout: float) -> list[Delivery]:
        """Stop taking work: give back every delivery not started (each key's in order),
        let the running handlers end within ``timeout`` seconds (their lanes' rest is
        given back after them), then give back those still running and their lanes.
        Returns the deliveries whose handler was still running (already given back)."""
        with self._cond:
            self._closing = True
            idle = list(self._ready) + [lane for _, _, lane in self._timed]
            self._ready.clear()
            self._timed.clear()
            # A lane's head was tried when its first attempt began (a retry was due).
            tried = [lane.items[0] for lane in idle if lane.first_start is not None]
            back = [
                delivery
                for lane in idle
                for delivery in itertools.islice(lane.items, lane.first_start is not None, None)
            ]
            for lane in idle:
                lane.items.clear()
                if lane.key is not None:
                    self._keyed.pop(lane.key, None)
            self.held -= len(tried) + len(back)
            self._cond.notify_all()
            self._room.notify_all()
        self._return(tried, back)
        deadline = time.monotonic() + timeout
        with self._room:
            self._room_waiters += 1
            try:
                self._room.wait_for(
                    lambda: not self._running, max(0.0, deadline - time.monotonic())
                )
            finally:
                self._room_waiters -= 1
            # NOTE: the first ``done`` of a running lane's items are settled (its worker
            # takes them off after its run): not given back, only dropped.
            running = [lane for lane in self._running if len(lane.items) > lane.done]
            late = [lane.items[lane.done] for lane in running]
            back = [
                delivery
                for lane in running
                for delivery in itertools.islice(lane.items, lane.done + 1, None)
            ]
            finished = [
                delivery
                for lane in running
                for delivery in itertools.islice(lane.items, 0, lane.done)
            ]
            for lane in running:
                lane.items.clear()
            self.held -= len(late) + len(back) + len(finished)
        # Their handlers returned; their worker, still in a handler of its run, has not
        # acknowledged them yet.
        self._acknowledge(finished)
        self._return(late, back)
        for thread in self._threads:
            if thread.ident is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return late

"""Per-key lanes over a pool of worker threads.

Each key has one lane: its deliveries in arrival order, handled one at a time, the next
only once the one before is finished (settled) — so a key's order holds however many
workers there are. An unkeyed delivery is a lane of its own and runs freely. A lane
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


class Verdict(enum.Enum):
    """What became of a lane's head after one handler call (or a retry: a deadline)."""

    DONE = "done"  #: settled: the next delivery of the lane may start
    GIVE_BACK = "give_back"  #: to be given back, with the rest of its lane (their order kept)


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


#: Handles the head of a lane: DONE, GIVE_BACK, or the clock time to try it again at.
Work = Callable[[Lane], "Verdict | float"]


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
    ) -> None:
        self._work = work
        self._clock = clock
        self._give_back = give_back
        self._release = release
        #: Workers wait on it for a lane to handle.
        lock = threading.RLock()
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
            self._room.wait_for(lambda: self.held < limit or self._closing, timeout)
            return 0 if self._closing else max(0, limit - self.held)

    def submit(self, delivery: Delivery) -> None:
        """Queue ``delivery`` on its key's lane (given back at once after close)."""
        with self._cond:
            if not self._closing:
                self.held += 1
                key = delivery.key
                lane = None if key is None else self._keyed.get(key)
                if lane is not None:
                    lane.items.append(delivery)  # the lane is already ready, timed or running
                    return
                lane = Lane(key, deque((delivery,)))
                if key is not None:
                    self._keyed[key] = lane
                self._ready.append(lane)
                self._cond.notify()
                return
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

    def _serve(self) -> None:
        while True:
            with self._cond:
                lane = self._take()
            if lane is None:
                return
            try:
                verdict = self._work(lane)
            except BaseException:  # the work catches what handlers raise; this is a bug
                log.exception("consumer worker failed; the delivery is given back")
                verdict = Verdict.GIVE_BACK
            self._return(*self._after(lane, verdict))

    def _return(self, tried: list[Delivery], untried: list[Delivery]) -> None:
        """Give back ``tried`` (counted), then ``untried`` (released), each in order."""
        for delivery in tried:
            self._give_back(delivery)
        for delivery in untried:
            self._release(delivery)

    def _after(self, lane: Lane, verdict: Verdict | float) -> tuple[list[Delivery], list[Delivery]]:
        """Book the verdict on ``lane``; what to give back (in order): the head its
        handler ran on, and the rest of the lane, never tried."""
        with self._cond:
            self._running.discard(lane)
            current, lane.current = lane.current, None
            # An abandoned lane (close timed out) was emptied: its head is given back.
            still_held = bool(lane.items) and lane.items[0] is current
            tried: list[Delivery] = []
            if still_held and verdict is Verdict.DONE:
                lane.items.popleft()
                lane.first_start = None
                self.held -= 1
            elif still_held and (verdict is Verdict.GIVE_BACK or self._closing):
                # NOTE: failed (or due for a retry that a close cancels): the handler ran.
                tried.append(lane.items.popleft())
            elif still_held and isinstance(verdict, float) and not self._closing:
                heapq.heappush(self._timed, (verdict, next(self._order), lane))
                self._cond.notify()  # an idle worker times its wait by the new deadline
            back: list[Delivery] = []
            if verdict is Verdict.GIVE_BACK or self._closing:  # the rest, after the head
                back.extend(lane.items)
                lane.items.clear()
            if lane.items and not isinstance(verdict, float):
                self._ready.append(lane)
                self._cond.notify()
            elif not lane.items and lane.key is not None:
                self._keyed.pop(lane.key, None)
            self.held -= len(tried) + len(back)
            self._room.notify_all()
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
            self._room.wait_for(lambda: not self._running, max(0.0, deadline - time.monotonic()))
            running = [lane for lane in self._running if lane.items]
            late = [lane.items[0] for lane in running]
            back = [
                delivery for lane in running for delivery in itertools.islice(lane.items, 1, None)
            ]
            for lane in running:
                lane.items.clear()
            self.held -= len(late) + len(back)
        self._return(late, back)
        for thread in self._threads:
            if thread.ident is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return late

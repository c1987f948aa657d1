"""Ending send spans off the thread that resolves their receipts.

A blocking ``send()`` returns when its receipt resolves, on the adapter's I/O thread. The
caller is notified first, but it runs only once that thread lets go of the interpreter:
whatever the receipt's callbacks do before (the span's outcome, its end, the span
processors' ``on_end``) is on the caller's critical path. So the callback only notes
the outcome and the time (:meth:`SpanFinisher.add`, a ``deque.append``), and one
daemon thread per process ends the spans a few milliseconds later, in bulk, while the
producers wait on their brokers. Each span ends with the time its receipt resolved: the
delay shows in no span.

Whoever reads spans gets them complete after ``Producer.flush()`` or ``close()`` (both
call :meth:`SpanFinisher.drain`) and at interpreter exit (an ``atexit`` drain, which
runs before the SDK's own shutdown flush when the SDK was installed first). An error in
a span processor or exporter is logged, never raised.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque
from queue import SimpleQueue
from typing import Any

__all__ = ["FINISHER", "SpanFinisher"]

log = logging.getLogger("msgsafe.telemetry")

#: How long the thread lets spans gather after the first one: long enough that it wakes
#: once for several blocking sends (a wake costs about what ending one span costs) and
#: runs while the producers wait on their brokers, short enough that an exporter sees
#: the spans soon.
_GATHER_S = 0.005
_ONE_STORED = {"msgsafe.stored": 1}


class SpanFinisher:
    """Spans whose send settled, ended on this object's thread (see the module).

    Thread-safe: :meth:`add` from any I/O thread, :meth:`drain` from any thread; each
    span is ended exactly once (``deque.popleft`` is atomic) and :meth:`drain` returns
    only when every span added before it was called is ended (the lock is held while
    one is being ended).
    """

    def __init__(self, gather_s: float = _GATHER_S) -> None:
        self._gather_s = gather_s
        self._pending: deque[tuple[Any, bool, int]] = deque()
        #: Tokens that wake the thread: a ``SimpleQueue`` put is one C call, cheaper on
        #: the I/O thread than an ``Event``'s Python-level condition.
        self._wake: SimpleQueue[None] = SimpleQueue()
        #: True while the thread waits for a token (or has not started).
        self._idle = True
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def add(self, span: Any, confirmed: bool, end_ns: int) -> None:
        """Span ``span`` of a single send settled at ``end_ns`` (``time.time_ns()``):
        ``confirmed`` by the broker, otherwise stored in the outbox. Cheap: one append,
        and a wake only when the thread sleeps."""
        self._pending.append((span, confirmed, end_ns))
        # Appended before the check: the thread marks itself idle before it drains, so a
        # span appended after its drain looked is seen here and wakes it (two racing
        # I/O threads may wake it twice: harmless).
        if self._idle:
            self._idle = False
            if self._thread is None:
                self._start()
            self._wake.put(None)

    def drain(self) -> None:
        """End every span added so far, on the calling thread."""
        with self._lock:
            pending = self._pending
            while pending:
                span, confirmed, end_ns = pending.popleft()
                try:
                    _end(span, confirmed, end_ns)
                except Exception:
                    log.warning("telemetry: cannot end a send span", exc_info=True)

    def forked(self) -> None:
        """In a forked child: the parent's thread is not there (and its lock may be held
        by a thread that is gone); spans the parent had not ended are its own."""
        self._pending = deque()
        self._wake = SimpleQueue()
        self._idle = True
        self._lock = threading.Lock()
        self._thread = None
        self._start_lock = threading.Lock()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="msgsafe-spans", daemon=True)
                thread.start()
                self._thread = thread

    def _run(self) -> None:
        wake, gather = self._wake, self._gather_s
        while True:
            wake.get()
            time.sleep(gather)  # not synchronisation: spans gather, then end in one go
            self._idle = True
            self.drain()


def _end(span: Any, confirmed: bool, end_ns: int) -> None:
    if span.is_recording():
        if confirmed:
            span.set_attribute("msgsafe.outcome", "CONFIRMED")
        else:
            span.set_attribute("msgsafe.outcome", "STORED")
            span.add_event("msgsafe.outbox.detour", _ONE_STORED, timestamp=end_ns)
    span.end(end_time=end_ns)


#: The process's finisher (its thread starts with the first traced send).
FINISHER = SpanFinisher()
atexit.register(FINISHER.drain)
os.register_at_fork(after_in_child=FINISHER.forked)

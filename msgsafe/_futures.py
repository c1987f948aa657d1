"""A ``concurrent.futures.Future`` that costs little while nobody waits on it.

A stock ``Future`` holds eleven objects the cyclic GC tracks: its ``Condition`` alone
stores five bound methods of its lock as instance attributes. With a hundred thousand
messages in flight, one future each, every garbage collection walks all of them, and
building them cost more CPU per message than building and publishing the message.

``LightFuture`` is the same class with the same behaviour (``result``,
``add_done_callback``, ``concurrent.futures.wait`` and ``as_completed``,
``asyncio.wrap_future``), built from one lock and its state: the ``Condition``, the
waiter list and the callback list are made only when something needs them (a thread
blocking in ``result()``, ``wait()``, a callback). A future resolved before anyone asks
for its result, the common case of a message's receipt, never makes them.

A thread blocked in ``result()`` sleeps on one lock of its own (:class:`_Sleeper`, kept
in the waiter list ``concurrent.futures.wait`` uses), not on the ``Condition``: a
blocking send waits for every message, and the condition's Python-level ``wait`` and
``notify_all`` cost both the caller and the thread that resolves the future.
"""

from __future__ import annotations

import logging
import threading
from _thread import RLock, allocate_lock
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
)
from typing import Any, TypeVar

__all__ = ["LightFuture"]

_T = TypeVar("_T")

#: The logger the stock Future reports a failing callback to.
_LOGGER = logging.getLogger("concurrent.futures")

#: States in which a future can no longer be resolved.
_SETTLED = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})


class _Sleeper:
    """A thread blocked in :meth:`LightFuture.result`: a lock it holds and waits to get
    again, released by whoever settles the future (a waiter of the kind
    ``concurrent.futures.wait`` keeps in ``_waiters``, called under the future's lock)."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = allocate_lock()
        self.lock.acquire()

    def wake(self, _future: object = None) -> None:
        # Under the future's lock; a cancel and its notification may both call it.
        if self.lock.locked():
            self.lock.release()

    add_result = add_exception = add_cancelled = wake


class LightFuture(Future[_T]):
    """A ``Future`` that makes its condition, waiter and callback lists on demand.

    Invariant: ``_mutex`` guards every change of state. The lazily made ``Condition``
    is built over that same lock, so a thread that registered as a waiter (under the
    lock) is always seen by a resolver (which notifies under the lock).
    """

    # Class-level defaults: an instance stores only what differs from them.
    _result: Any = None
    _exception: BaseException | None = None
    # What is made on demand; None until then. Read as attributes, not through
    # ``__dict__``, which would build the instance's dict for every future.
    _made_condition: threading.Condition | None = None
    _made_waiters: list[Any] | None = None
    _made_callbacks: list[Callable[[Future[_T]], object]] | None = None

    def __init__(self) -> None:
        # NOTE: Future.__init__ is not called: it is what builds the objects made lazily here.
        # _thread.RLock is the class threading.RLock() returns, without that function's frame.
        self._mutex = RLock()
        self._state = PENDING

    # --- what the stock Future and concurrent.futures.wait() reach for, made on demand ---

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        made: threading.Condition | None = self.__dict__.get("_made_condition")
        if made is None:
            # setdefault is atomic: racing threads end with the same condition.
            made = self.__dict__.setdefault("_made_condition", threading.Condition(self._mutex))
        return made

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        made: list[Any] | None = self.__dict__.get("_made_waiters")
        if made is None:
            made = self.__dict__.setdefault("_made_waiters", [])
        return made

    @property
    def _done_callbacks(self) -> list[Callable[[Future[_T]], object]]:
        made: list[Callable[[Future[_T]], object]] | None = self.__dict__.get("_made_callbacks")
        if made is None:
            made = self.__dict__.setdefault("_made_callbacks", [])
        return made

    # --- resolving: the stock steps, under the one lock, without making anything ---

    def set_result(self, result: _T) -> None:
        self._settle_with(True, result)

    def set_exception(self, exception: BaseException | None) -> None:
        self._settle_with(False, exception)

    def _settle_with(self, ok: bool, outcome: Any) -> None:
        with self._mutex:
            if self._state in _SETTLED:
                raise InvalidStateError(f"{self._state}: {self!r}")
            if ok:
                self._result = outcome
            else:
                self._exception = outcome
            self._state = FINISHED
            self._wake_waiters()
        self._run_callbacks()

    def _wake_waiters(self) -> None:
        # Under _mutex, once FINISHED: tell only what exists, a waiter of
        # concurrent.futures.wait() or a thread blocked in result().
        waiters = self._made_waiters
        if waiters:
            ok = self._exception is None
            for waiter in waiters:
                if ok:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
        condition = self._made_condition
        if condition is not None:
            condition.notify_all()

    def _run_callbacks(self) -> None:
        # The stock _invoke_callbacks, without its property reads and frame.
        callbacks = self._made_callbacks
        if callbacks:
            for callback in callbacks:
                try:
                    callback(self)
                except Exception:
                    _LOGGER.exception("exception calling callback for %r", self)

    # --- reading: no lock once resolved (a finished future never changes again) ---

    def done(self) -> bool:
        return self._state in _SETTLED

    def result(self, timeout: float | None = None) -> _T:
        if self._state != FINISHED:
            self._sleep(timeout)
            if self._state != FINISHED:
                # Cancelled (CancelledError) or still pending (TimeoutError): the stock errors.
                return super().result(0)
        if self._exception is not None:
            try:
                raise self._exception
            finally:
                # The stock Future breaks the same cycle (frame -> exception -> frame).
                self = None  # type: ignore[assignment]
        return self._result  # type: ignore[no-any-return]

    def _sleep(self, timeout: float | None) -> None:
        """Block until the future is settled (or cancelled), or ``timeout`` passed."""
        sleeper = _Sleeper()
        with self._mutex:
            if self._state in _SETTLED:
                return
            waiters = self._made_waiters
            if waiters is None:
                waiters = self.__dict__.setdefault("_made_waiters", [])
            waiters.append(sleeper)
        try:
            sleeper.lock.acquire(True, -1 if timeout is None else max(0.0, timeout))
        finally:
            with self._mutex:
                waiters.remove(sleeper)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def cancel(self) -> bool:
        cancelled = super().cancel()
        if cancelled:
            # The stock cancel() notifies the condition only: a thread in result() sleeps
            # on its own lock.
            with self._mutex:
                for waiter in self._made_waiters or ():
                    if type(waiter) is _Sleeper:
                        waiter.wake()
        return cancelled

    def add_done_callback(self, fn: Callable[[Future[_T]], object]) -> None:
        with self._mutex:
            if self._state not in _SETTLED:
                # What the _done_callbacks property does, without its frame.
                self.__dict__.setdefault("_made_callbacks", []).append(fn)
                return
        try:
            fn(self)
        except Exception:
            _LOGGER.exception("exception calling callback for %r", self)

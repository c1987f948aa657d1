"""The inbox's transaction, awaited from an event loop: the ``tx`` of
``AsyncConsumer.run(handler, inbox=...)``.

A transaction is one sequence of statements on one connection, and a connection belongs
to the thread that uses it: a SQLite connection refuses other threads (unless opened with
``check_same_thread=False``, and even then two threads must not use it at once), and a
blocking driver's call would stop the event loop for the whole round trip. So the inbox
opens the transaction on the run's worker thread (one per handler running, the key's
lane on it), the handler runs on the loop, and every statement it sends goes back to
that worker thread, which waits for the handler and runs them there, one at a time, in
the order they were asked for. The loop only ever waits for a future; the connection is
only ever used by the thread that opened it; the inbox commits (or rolls back) on that
same thread once the handler has returned (or raised).

Not a native asynchronous driver: each statement costs a hand-over between two threads
(tens of microseconds) besides its round trip to the database. In exchange the one
inbox, SQLite or PostgreSQL with its fail-over, serves both runs unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from msgsafe.errors import ClosedError

__all__ = ["AsyncTransaction", "Params"]

_R = TypeVar("_R")

#: A statement's parameters, as the driver takes them: a sequence for positional
#: markers (``?`` in sqlite3, ``%s`` in psycopg), a mapping for named ones.
Params = Sequence[Any] | Mapping[str, Any]

#: A call the handler asked for: what to run with the connection, and the loop's future
#: that gets its answer.
_Request = tuple[Callable[[Any], Any], "asyncio.Future[Any]"]


class AsyncTransaction:
    """``tx`` for an async inbox handler: the inbox's open transaction, used with
    ``await``; see the module docstring.

    ``await tx.execute(sql, params)`` runs one statement and returns its rows (a list,
    empty for a statement that returns none); ``await tx.executemany(sql, rows)`` runs one
    statement per parameter row; ``await tx.call(fn)`` runs ``fn(connection)`` — the
    driver's own connection (:class:`sqlite3.Connection`, :class:`psycopg.Connection`)
    — for whatever else the driver offers (``rowcount``, a cursor's other methods). All
    three run on the thread that holds the transaction, one at a time in the order they
    were asked for, while the event loop goes on; the driver's errors reach the handler
    unchanged. Write through them, never commit or roll back: msgsafe commits your
    writes with the message id once the handler has returned, and rolls them back if it
    raised. ``fn`` must not keep the connection.

    Valid while the handler runs: a call made after it has returned raises
    :class:`~msgsafe.errors.ClosedError`. Cancelling an ``await`` does not cancel its
    statement, which runs to its end inside the transaction (and is committed with it if
    the handler then returns).
    """

    __slots__ = ("_closed", "_conn", "_lock", "_requests")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False

    async def execute(self, sql: str, params: Params | None = None) -> list[Any]:
        """Run ``sql`` with ``params`` in the transaction; its rows (``[]`` when the
        statement returns none)."""
        return await self.call(lambda conn: _execute(conn, sql, params))

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Run ``sql`` once for each parameter row of ``rows``, in the transaction."""
        listed = list(rows)
        await self.call(lambda conn: _executemany(conn, sql, listed))

    async def call(self, fn: Callable[[Any], _R]) -> _R:
        """``fn(connection)``'s answer (or error), run on the transaction's thread."""
        future: asyncio.Future[_R] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._closed:
                raise ClosedError(
                    "the handler has returned: its inbox transaction is committed or rolled back"
                )
            self._requests.put((fn, future))
        return await future

    def serve(self, handling: Future[_R]) -> _R:
        """On the thread that holds the transaction: run the calls the handler asks for
        until ``handling`` (the handler's call, on the loop) is done; then close and
        return its answer, or raise its error (a cancelled handler raises
        :class:`concurrent.futures.CancelledError`)."""
        handling.add_done_callback(lambda _: self._close())
        while (request := self._requests.get()) is not None:
            fn, future = request
            try:
                value = fn(self._conn)
            except StopIteration as exc:  # a future cannot hold one (PEP 479's reason)
                _answer(future, None, RuntimeError(f"tx.call's function raised {exc!r}"))
            except BaseException as exc:
                _answer(future, None, exc)
            else:
                _answer(future, value, None)
        return handling.result()

    def _close(self) -> None:
        """No more calls: the ones asked for so far are run, later ones refused."""
        with self._lock:
            self._closed = True
            self._requests.put(None)


def _execute(conn: Any, sql: str, params: Params | None) -> list[Any]:
    # NOTE: params=None, not (): psycopg reads "%" in a statement given any params
    # (even none) as a placeholder.
    cursor = conn.cursor()
    try:
        if params is None:
            cursor.execute(sql)
        else:
            cursor.execute(sql, params)
        # DB-API: no description for a statement that returns no rows (fetchall raises).
        return list(cursor.fetchall()) if cursor.description is not None else []
    finally:
        cursor.close()


def _executemany(conn: Any, sql: str, rows: list[Params]) -> None:
    cursor = conn.cursor()
    try:
        cursor.executemany(sql, rows)
    finally:
        cursor.close()


def _answer(future: asyncio.Future[Any], value: object, error: BaseException | None) -> None:
    """Hand a call's answer to the loop its caller awaits on (nothing when that caller
    was cancelled, or the loop is closed: nobody waits)."""

    def settle() -> None:
        if future.done():
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    with contextlib.suppress(RuntimeError):  # the loop is closed
        future.get_loop().call_soon_threadsafe(settle)

"""Group commit: one thread, one SQLite connection, many callers sharing each fsync.

Callers submit jobs; the writer thread takes everything queued, runs it inside one
``BEGIN IMMEDIATE`` transaction and commits once (with ``synchronous=FULL`` that is one
fsync of the WAL), then resolves every job's future. Jobs of the same kind are handed to
their handler together so, for example, all puts of a group become one ``executemany``.

A handler failing rolls back only its own savepoint: the other jobs of the group still
commit. A failing ``COMMIT`` (a full disk) fails every job of the group and applies none
of their effects, so "all or none" holds per job.

Read-only jobs (``submit(..., read_only=True)``) run after the group's write transaction
in a read transaction of their own: a write failing on a full disk must not fail a
caller who only asked how deep the outbox is.

A blocking :meth:`GroupCommitWriter.call` that finds the writer idle and nothing queued
runs its job in the calling thread instead of handing it over: the hand-off (two thread
wake-ups per commit) cost about 40 µs of CPU per commit and a third of the rate of one
message per commit. Calls that arrive while a transaction runs queue up and the writer
thread commits them together, as before.

Why a producer's detours pass a batching thread of its own before they reach this one:
see :mod:`msgsafe._settlement`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from msgsafe._futures import LightFuture
from msgsafe.errors import ClosedError, MsgsafeError, OutboxError, OutboxFull
from msgsafe.outbox._schema import rollback

__all__ = ["HandlerResult", "GroupCommitWriter", "Handler"]

P = TypeVar("P")


@dataclass(slots=True)
class HandlerResult(Generic[P]):
    """What a handler returns: one result (or error) per payload, what to do in memory
    once the transaction is durable, and what to check then before any caller is told.

    ``verify`` runs after the commit (and after ``after_commit``: what was committed is
    in the file either way); an error it returns fails every payload of the handler in
    place of its results (a put whose file is no longer at its path: see
    :meth:`msgsafe.outbox.sqlite.SqliteOutbox.put`)."""

    results: list[object]
    after_commit: Callable[[], None] | None = None
    verify: Callable[[], MsgsafeError | None] | None = None


#: A handler gets the connection (inside the group's transaction) and the payloads of all
#: jobs of its kind in submission order.
Handler = Callable[[sqlite3.Connection, list[Any]], HandlerResult[Any]]


@dataclass(slots=True)
class _Job:
    handler: Handler
    payload: object
    future: Future[Any]
    read_only: bool = False


class GroupCommitWriter:
    """Runs jobs on ``conn`` from one daemon thread, one transaction per group.

    ``translate`` turns a :class:`sqlite3.Error` into a msgsafe error (full disk,
    corruption, lock). ``conn`` must be in autocommit mode; after :meth:`start` only the
    writer thread touches it.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        translate: Callable[[sqlite3.Error], MsgsafeError],
        *,
        name: str = "msgsafe-outbox-writer",
    ) -> None:
        self._conn = conn
        self._translate = translate
        #: Guards the queue and the flags. The hot paths take it directly (a C call);
        #: ``with`` on the condition would add two Python frames to every commit.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._jobs: list[_Job] = []
        self._closing = False
        self._busy = False  # a transaction runs (in the writer thread or a caller's)
        self._disk_full = False
        self._stopped = False  # the writer thread ended (set by the thread itself)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def submit(self, handler: Handler, payload: object, *, read_only: bool = False) -> Future[Any]:
        """Queue a job; the future resolves once its transaction committed (or failed).

        ``read_only`` jobs must not write; they never share a transaction with writes.
        """
        future: Future[Any] = LightFuture()
        with self._mutex:
            self._check_open()
            self._jobs.append(_Job(handler, payload, future, read_only))
            if len(self._jobs) == 1 and not self._busy:
                self._cond.notify_all()
        return future

    def call(self, handler: Handler, payload: object, *, read_only: bool = False) -> Any:
        """Run a job and wait for its result (re-raising its error).

        Runs in the calling thread when no transaction is running and nothing is queued
        (then the group holds this job alone, so no other caller's future is resolved,
        nor its callbacks run, in this thread); otherwise queues it for the writer thread.
        """
        with self._mutex:
            if self._closing or self._stopped:
                self._check_open()  # raises the error that says which
            lead = not self._busy and not self._jobs
            if lead:
                self._busy = True
            else:
                future: Future[Any] = LightFuture()
                self._jobs.append(_Job(handler, payload, future, read_only))
                if len(self._jobs) == 1 and not self._busy:
                    self._cond.notify_all()
        if not lead:
            return future.result()
        try:
            return self._run_alone(handler, payload, read_only)
        finally:
            self._idle()

    def _check_open(self) -> None:
        if self._closing:
            raise ClosedError("the outbox is closed")
        if self._stopped:
            raise OutboxError("the outbox writer thread stopped; reopen the outbox")

    def _run_alone(self, handler: Handler, payload: object, read_only: bool) -> Any:
        """One job in a transaction of its own, in the calling thread: what
        :meth:`_run_group` does for a group of one, without a future, a job object or
        the grouping (one message per commit pays for every step here)."""
        conn = self._conn
        if read_only:
            begin = "BEGIN"
        else:
            begin = "BEGIN IMMEDIATE"
            if self._disk_full:
                self._compact()
        try:
            conn.execute(begin)
            try:
                done = handler(conn, [payload])
                conn.execute("COMMIT")
            except BaseException:
                rollback(conn)
                raise
        except sqlite3.Error as exc:
            raise self._translate_error(exc) from exc
        finally:
            if self._disk_full and not read_only:
                self._compact()
        if done.after_commit is not None:
            done.after_commit()
        if done.verify is not None:
            failed = done.verify()
            if failed is not None:
                raise failed
        result = done.results[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _idle(self) -> None:
        with self._mutex:
            self._busy = False
            if self._jobs or self._closing:
                # What queued meanwhile is the writer thread's. Not woken otherwise: a
                # wake-up for nothing costs as much as the hand-off this path avoids.
                self._cond.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Finish the queued jobs, then stop the thread. Idempotent."""
        with self._mutex:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # --- writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._stopped = True

    def _serve(self) -> None:
        while True:
            with self._mutex:
                while self._busy or not (self._jobs or self._closing):
                    self._cond.wait()
                jobs, self._jobs = self._jobs, []
                if not jobs:  # closing, and everything queued is done
                    return
                self._busy = True
            try:
                self._run_group(jobs)
            finally:
                self._idle()

    def _run_group(self, jobs: Sequence[_Job]) -> None:
        writes = [job for job in jobs if not job.read_only]
        reads = [job for job in jobs if job.read_only]
        if writes:
            if self._disk_full:
                self._compact()
            self._run_transaction(writes, "BEGIN IMMEDIATE")
            if self._disk_full:
                self._compact()
        if reads:
            # A deferred transaction that only reads takes no write lock and writes nothing.
            self._run_transaction(reads, "BEGIN")

    def _compact(self) -> None:
        # NOTE: on a full disk the WAL only grows (the automatic checkpoint waits for 1000
        # pages) and soon even deletes fail; whatever space is freed, the next write would
        # eat it. Copying the WAL into the database and truncating it first gives its
        # space back. If that fails too, the WAL stays intact: nothing committed is lost.
        try:
            busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            return
        if not busy:
            self._disk_full = False

    def _translate_error(self, exc: sqlite3.Error) -> MsgsafeError:
        # Remembered until a checkpoint succeeds (see _compact).
        err = self._translate(exc)
        if isinstance(err, OutboxFull):
            self._disk_full = True
        return err

    def _run_transaction(self, jobs: Sequence[_Job], begin: str) -> None:
        groups: dict[Handler, list[_Job]] = {}
        for job in jobs:
            groups.setdefault(job.handler, []).append(job)
        outcomes: list[tuple[list[_Job], list[object]]] = []
        after: list[Callable[[], None]] = []
        checks: list[tuple[int, Callable[[], MsgsafeError | None]]] = []
        conn = self._conn
        try:
            conn.execute(begin)
        except sqlite3.Error as exc:
            self._fail_all(jobs, self._translate_error(exc), exc)
            return
        # Savepoints only matter when jobs of several kinds share the transaction: then one
        # kind failing must not undo the others. Alone, a failure rolls everything back.
        # (Fewer statements also means fewer GIL hand-offs, which busy threads make slow.)
        isolate = len(groups) > 1
        try:
            for handler, members in groups.items():
                if isolate:
                    conn.execute("SAVEPOINT job")
                try:
                    batch = handler(conn, [job.payload for job in members])
                except Exception as exc:
                    if not isolate:
                        raise
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                    err: BaseException = exc
                    if isinstance(exc, sqlite3.Error):
                        err = self._translate_error(exc)
                        err.__cause__ = exc
                    outcomes.append((members, [err] * len(members)))
                    continue
                if isolate:
                    conn.execute("RELEASE job")
                outcomes.append((members, batch.results))
                if batch.after_commit is not None:
                    after.append(batch.after_commit)
                if batch.verify is not None:
                    checks.append((len(outcomes) - 1, batch.verify))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            rollback(conn)
            self._fail_all(jobs, self._translate_error(exc), exc)
            return
        except Exception as exc:
            rollback(conn)
            self._fail_all(jobs, exc, exc)
            return
        except BaseException as exc:  # never leave callers waiting forever
            rollback(conn)
            self._fail_all(jobs, exc, exc)
            raise
        for apply in after:
            apply()
        for index, verify in checks:
            failed = verify()
            if failed is not None:
                members = outcomes[index][0]
                outcomes[index] = (members, [failed] * len(members))
        for members, results in outcomes:
            for job, result in zip(members, results, strict=True):
                if isinstance(result, BaseException):
                    job.future.set_exception(result)
                else:
                    job.future.set_result(result)

    @staticmethod
    def _fail_all(jobs: Sequence[_Job], error: BaseException, cause: BaseException) -> None:
        if error is not cause:
            error.__cause__ = cause
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(error)

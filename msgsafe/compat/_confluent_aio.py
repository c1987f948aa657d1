"""``confluent_kafka.aio.AIOProducer`` with msgsafe's promise: the asyncio producer of
:mod:`msgsafe.compat.confluent_kafka` (exported there as ``AIOProducer``).

It is built on the wrapper's own :class:`~msgsafe.compat.confluent_kafka.Producer`:
``produce()`` hands the message to it at once (no Python-side batch buffer: the
librdkafka queue of its fast path is the buffer) and returns an ``asyncio.Future``
that resolves to the delivered message, or fails with ``KafkaException``. A thread of
the producer serves the delivery reports (the sync producer's ``poll()``) and hands
them to the event loop in one ``call_soon_threadsafe`` per batch of reports, so the
future of a message resolves as soon as it is confirmed or stored, without waiting for
a ``poll()``/``flush()`` of the application.

As with the sync wrapper, a message the brokers cannot take in time is stored in the
outbox: its future resolves with a message whose ``stored()`` is True and whose
``offset()`` is ``OFFSET_INVALID``. Calls that may block (``flush``, ``poll``,
``purge``, ``list_topics``, the first ``produce`` to a topic, which checks it) run in
the producer's executor, never on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from confluent_kafka import KafkaError, KafkaException

if TYPE_CHECKING:
    from msgsafe.compat.confluent_kafka import Producer

__all__ = ["AIOProducer", "LoopReports"]

log = logging.getLogger("msgsafe.compat")

#: Longest single wait of the report thread in the producer's poll().
_POLL_SLICE_S = 0.1
#: Global callbacks of the config that the event loop runs (as confluent-kafka's aio does).
_LOOP_CALLBACKS = ("error_cb", "throttle_cb", "stats_cb")


#: Callback tasks still running (see _on_loop).
_running: set[asyncio.Future[Any]] = set()


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any]) -> Callable[..., None]:
    """``callback`` run on ``loop`` when librdkafka calls it on the report thread (a
    coroutine function is scheduled as a task, as confluent-kafka's aio awaits it)."""

    def run(*args: Any) -> None:
        result = callback(*args)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            _running.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(_running.discard)

    def call(*args: Any) -> None:
        try:
            loop.call_soon_threadsafe(run, *args)
        except RuntimeError:  # the loop is closed: nobody is there to call
            log.debug("event loop closed; %r not called", callback)

    return call


def _serve_reports(producer: Producer, stop: threading.Event) -> None:
    """The report thread: the sync producer's poll() until ``stop`` (it holds the sync
    producer, not the AIOProducer, so a dropped AIOProducer is still collected)."""
    while not stop.is_set():
        try:
            producer.poll(_POLL_SLICE_S)
        except RuntimeError:  # closed
            return
        except Exception:
            # NOTE: the callbacks run here are the wrapper's own (they queue results for
            # the loop) and never raise; an exception is a bug to see, not to stop on.
            log.exception("serving delivery reports")


class LoopReports:
    """Delivery reports of a sync :class:`~msgsafe.compat.confluent_kafka.Producer`,
    settled on an event loop: a thread serves the producer's ``poll()``; each report
    is queued and the loop woken once per batch of reports (``call_soon_threadsafe``
    writes to the loop's self-pipe: once per message would cost a syscall each).

    ``report(future)`` is the delivery callback to produce with. On the loop, for each
    report whose future is not done (cancelled): a delivered message's future gets
    ``result(msg)`` (None: the message itself), a failed one's ``error(err)``.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        producer: Producer,
        error: Callable[[KafkaError], BaseException],
        result: Callable[[Any], Any] | None = None,
    ):
        self._loop = loop
        self._error = error
        self._result = result
        self._ready: deque[tuple[asyncio.Future[Any], KafkaError | None, Any]] = deque()
        self._wake_pending = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_serve_reports,
            args=(producer, self._stop),
            name="msgsafe-aio-reports",
            daemon=True,
        )
        self._thread.start()

    def report(self, future: asyncio.Future[Any]) -> Callable[[Any, Any], None]:
        """The delivery callback of the message ``future`` stands for."""
        return functools.partial(self._arrived, future)

    def _arrived(self, future: asyncio.Future[Any], err: KafkaError | None, msg: Any) -> None:
        # On a thread serving reports (this one's, or one in flush()).
        self._ready.append((future, err, msg))
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._resolve)
            except RuntimeError:  # the loop is closed: nobody awaits these futures
                self._ready.clear()

    def _resolve(self) -> None:
        # On the loop. NOTE: the flag goes down before the queue is read, so a report
        # queued after the last read wakes the loop again.
        self._wake_pending = False
        ready = self._ready
        result = self._result
        while ready:
            future, err, msg = ready.popleft()
            if future.done():  # a cancelled one is left alone
                continue
            if err is not None:
                future.set_exception(self._error(err))
            else:
                future.set_result(msg if result is None else result(msg))

    def stop(self) -> None:
        """Let the thread end (after its current poll slice); see :meth:`join`."""
        self._stop.set()

    def join(self) -> None:
        """Stop, and wait for the thread to end (blocking: run it off the loop)."""
        self._stop.set()
        self._thread.join()


class AIOProducer:
    """A ``confluent_kafka.aio.AIOProducer`` that confirms with ``acks=all`` or stores.

    ``AIOProducer(producer_conf, max_workers=4, executor=None, batch_size=1000,
    buffer_timeout=1.0)``, made inside a running event loop, as confluent-kafka's.
    ``producer_conf`` is what :class:`~msgsafe.compat.confluent_kafka.Producer` takes;
    ``error_cb``, ``stats_cb`` and ``throttle_cb`` in it run on the event loop
    (coroutine functions as tasks). ``batch_size`` and ``buffer_timeout`` are accepted
    and have nothing to act on: there is no Python-side buffer to fill or time out.
    ``_url`` replaces the broker URL, as the sync producer's (tests: ``memory://``).
    """

    def __init__(
        self,
        producer_conf: Mapping[str, Any],
        max_workers: int = 4,
        executor: concurrent.futures.Executor | None = None,
        batch_size: int = 1000,
        buffer_timeout: float = 1.0,
        *,
        _url: str | None = None,
    ) -> None:
        from msgsafe.compat.confluent_kafka import Producer

        self._loop = asyncio.get_running_loop()
        self.executor = (
            executor
            if executor is not None
            else concurrent.futures.ThreadPoolExecutor(max_workers=max_workers)
        )
        conf = dict(producer_conf)
        for name in _LOOP_CALLBACKS:
            if callable(conf.get(name)):
                conf[name] = _on_loop(self._loop, conf[name])
        self._producer = Producer(conf, _url=_url)
        self._batch_size = batch_size
        self._is_closed = False
        #: Topics produced to once (the first produce of a topic runs in the executor).
        self._topics: set[str] = set()
        self._reports = LoopReports(self._loop, self._producer, KafkaException)
        weakref.finalize(self, self._reports.stop)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- producing ----------------------------------------------------------------------

    async def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        *,
        partition: int = -1,
        timestamp: int = 0,
        headers: Mapping[str, object] | Iterable[tuple[str, object]] | None = None,
    ) -> asyncio.Future[Any]:
        """Queue one message; the returned future resolves to the delivered message
        (``msg.stored()`` True when it waits in the outbox) or fails with
        ``KafkaException``. A message refused before it is queued (too large, the
        local queue full) fails its future, as a failed batch entry does with
        confluent-kafka's; bad argument types raise ``TypeError`` here."""
        future: asyncio.Future[Any] = self._loop.create_future()
        report = self._reports.report(future)
        try:
            if topic in self._topics:
                self._producer.produce(topic, value, key, partition, report, timestamp, headers)
            else:
                # The first message of a topic: the producer checks the topic once
                # (metadata from the brokers), off the event loop.
                await self._call(
                    self._producer.produce,
                    topic,
                    value,
                    key,
                    partition,
                    report,
                    timestamp,
                    headers,
                )
                if isinstance(topic, str):
                    self._topics.add(topic)
        except KafkaException as exc:
            future.set_exception(exc)
        except BufferError as exc:
            future.set_exception(KafkaException(KafkaError(KafkaError._QUEUE_FULL, str(exc))))
        return future

    async def poll(self, timeout: float = 0, *args: Any, **kwargs: Any) -> int:
        """Serve delivery callbacks (the futures are resolved by the producer's own
        thread already; this also serves ``error_cb`` and log lines)."""
        return int(await self._call(self._producer.poll, timeout, *args, **kwargs))

    async def flush(self, *args: Any, **kwargs: Any) -> Any:
        """Wait until every produced message is confirmed or stored (the sync
        ``flush``, in the executor); returns the number not yet reported."""
        return await self._call(self._producer.flush, *args, **kwargs)

    async def purge(self, *args: Any, **kwargs: Any) -> Any:
        """The sync ``purge``: nothing handed to the brokers is dropped."""
        return await self._call(self._producer.purge, *args, **kwargs)

    async def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self._producer.list_topics, *args, **kwargs)

    async def cluster_id(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self._producer.cluster_id, *args, **kwargs)

    async def set_sasl_credentials(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self._producer.set_sasl_credentials, *args, **kwargs)

    # --- transactions: not wrapped (KafkaException _NOT_CONFIGURED, as the sync one) ----

    async def init_transactions(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self._producer.init_transactions, *args, **kwargs)

    async def begin_transaction(self, *args: Any, **kwargs: Any) -> Any:
        await self.flush()
        return await self._call(self._producer.begin_transaction, *args, **kwargs)

    async def send_offsets_to_transaction(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self._producer.send_offsets_to_transaction, *args, **kwargs)

    async def commit_transaction(self, *args: Any, **kwargs: Any) -> Any:
        await self.flush()
        return await self._call(self._producer.commit_transaction, *args, **kwargs)

    async def abort_transaction(self, *args: Any, **kwargs: Any) -> Any:
        await self.flush()
        return await self._call(self._producer.abort_transaction, *args, **kwargs)

    # --- closing ------------------------------------------------------------------------

    async def close(self) -> None:
        """Flush (every future resolved: confirmed or stored), stop the report thread,
        close the producer and shut the executor down (a given one too, as
        confluent-kafka's does). Calling it again does nothing."""
        if self._is_closed:
            return
        self._is_closed = True
        try:
            await self.flush()
        finally:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self._reports.join)
            await self._call(self._producer.close)
            await loop.run_in_executor(None, self.executor.shutdown, True)

    def __len__(self) -> int:
        """Messages produced and not yet confirmed or stored (0 once closed)."""
        return 0 if self._is_closed else len(self._producer)

    def pending(self) -> int:
        """msgsafe addition: messages waiting in the outbox to be forwarded."""
        return self._producer.pending()

    async def _call(self, blocking: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self._loop.run_in_executor(
            self.executor, functools.partial(blocking, *args, **kwargs)
        )

    def __repr__(self) -> str:
        return f"<msgsafe.compat.confluent_kafka.AIOProducer {self._producer!r}>"

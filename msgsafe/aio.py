"""The asyncio face of the producer and the consumer: the same objects, awaited.

Nothing here talks to a broker: :class:`AsyncProducer` wraps a :class:`Producer` and
:class:`AsyncConsumer` a :class:`Consumer`, whose adapter I/O runs on its own thread;
what could block (a poll, a settle, an inbox's statement: :class:`AsyncTransaction`)
runs in a worker thread, so the loop never waits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Self, cast

from msgsafe.consumer import Consumer
from msgsafe.consuming.async_tx import AsyncTransaction
from msgsafe.errors import ClosedError, ConfigurationError, SendTimeout, TransientError
from msgsafe.message import BatchReceipt, Delivery, Envelope, Outcome, Receipt
from msgsafe.ports import AttemptCounter, InboxStore
from msgsafe.producer import OutboxSpec, Producer
from msgsafe.retry import RetryPolicy
from msgsafe.schemas import Deserializer, Serializer
from msgsafe.telemetry.stats import ConsumerStats, ProducerStats

__all__ = ["AsyncConsumer", "AsyncDelivery", "AsyncProducer", "AsyncTransaction"]

#: Deliveries fetched per poll, and the longest a poll waits in its worker thread (so
#: that close() and cancellation are seen soon).
_FETCH = 64
_POLL_SLICE_S = 0.5


class AsyncProducer:
    """``await producer.send(...)`` with the promise of :class:`Producer`."""

    def __init__(
        self,
        url: str,
        *,
        outbox: OutboxSpec = True,
        send_timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        telemetry: bool = False,
        require: str = "durable",
        check_every: float = 300.0,
        forward: bool = True,
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
        **options: object,
    ) -> None:
        self._send_timeout = send_timeout
        self._checked_destinations: set[str] = set()
        #: Destinations whose first message was serialized (off the loop: its
        #: serializer may ask the registry; later ones answer from its cache).
        self._serialized_destinations: set[str] = set()
        self._serializes = serializer is not None or key_serializer is not None
        self._producer = Producer(
            url,
            outbox=outbox,
            send_timeout=send_timeout,
            retry=retry,
            telemetry=telemetry,
            require=require,
            check_every=check_every,
            forward=forward,
            serializer=serializer,
            key_serializer=key_serializer,
            **options,
        )

    @property
    def sync(self) -> Producer:
        """The underlying thread-safe producer."""
        return self._producer

    async def send(
        self,
        destination: str,
        body: bytes | Any | None,
        *,
        key: str | bytes | Any | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
    ) -> Receipt:
        """Send and wait until the message is safe; errors as :meth:`Producer.send`.

        With a ``serializer``, the first message to each destination is serialized in a
        worker thread (its serializer may ask the schema registry), later ones on the
        loop (confluent-kafka's serializers answer from their cache then)."""
        if self._serializes:
            body, key = await self._serialized(destination, body, key, headers, message_id)
        envelope = Envelope.build(
            destination, body, key=key, headers=headers, message_id=message_id
        )
        await self._checked(destination)
        future = self._producer.send_envelope(envelope, check_id=True)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self._send_timeout)
        except TimeoutError:
            raise self._producer.timed_out(future, envelope) from None

    async def _serialized(
        self,
        destination: str,
        body: Any,
        key: Any,
        headers: Mapping[str, str] | None,
        message_id: str | None,
    ) -> tuple[Any, Any]:
        serialized = self._producer.serialized
        if destination in self._serialized_destinations:
            return serialized(destination, body, key, headers, message_id)
        result = await asyncio.to_thread(serialized, destination, body, key, headers, message_id)
        self._serialized_destinations.add(destination)
        return result

    async def send_batch(
        self,
        destination: str,
        bodies: Iterable[bytes] | Iterable[Any],
        *,
        keys: Iterable[str | bytes | None] | Iterable[Any] | None = None,
        headers: Mapping[str, str] | None = None,
        message_ids: Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> BatchReceipt:
        """Send many messages and wait until every one is safe; errors as
        :meth:`Producer.send_batch` (``timeout`` defaults to ``send_timeout``)."""
        await self._checked(destination)
        send_batch = self._producer.send_batch_async
        if self._serializes:
            # The serializers run over the whole batch: off the loop.
            future = await asyncio.to_thread(
                send_batch, destination, bodies, keys=keys, headers=headers, message_ids=message_ids
            )
        else:
            future = send_batch(
                destination, bodies, keys=keys, headers=headers, message_ids=message_ids
            )
        limit = self._send_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), limit)
        except TimeoutError:
            raise SendTimeout(
                f"batch not confirmed or stored within {limit}s", endpoint=self._producer.target
            ) from None

    async def _checked(self, destination: str) -> None:
        """The destination check of a first send, off the loop (it is one blocking
        connection): UnsafeDestination raises here; an unreachable broker is left to the
        send, which stores."""
        if destination in self._checked_destinations:
            return
        try:
            await asyncio.to_thread(self._producer.guarantee, destination)
        except TransientError:
            return
        self._checked_destinations.add(destination)

    async def drain(self, timeout: float | None = None) -> int:
        """Forward the outbox now; returns how many remain."""
        return await asyncio.to_thread(self._producer.drain, timeout)

    def pending(self) -> int:
        """How many messages wait in the outbox."""
        return self._producer.pending()

    def stats(self) -> ProducerStats:
        """The producer's figures (see :meth:`Producer.stats`)."""
        return self._producer.stats()

    async def close(self, timeout: float | None = 30.0) -> None:
        """Close the underlying producer without blocking the loop."""
        await asyncio.to_thread(self._producer.close, timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncDelivery:
    """A received message whose settling is awaited: ``await delivery.ack()``.

    The same contract as :class:`~msgsafe.message.Delivery` (settle exactly once; a
    second settle raises :class:`~msgsafe.errors.ClosedError`); the settle runs in a
    worker thread because an adapter may wait for its I/O thread there.
    """

    __slots__ = ("_delivery",)

    def __init__(self, delivery: Delivery) -> None:
        self._delivery = delivery

    @property
    def body(self) -> bytes:
        return self._delivery.body

    @property
    def destination(self) -> str:
        return self._delivery.destination

    @property
    def message_id(self) -> str | None:
        return self._delivery.message_id

    @property
    def key(self) -> bytes | None:
        return self._delivery.key

    @property
    def headers(self) -> Mapping[str, str]:
        return self._delivery.headers

    @property
    def value(self) -> Any:
        """The body through the consumer's ``deserializer`` (see
        :attr:`Delivery.value <msgsafe.message.Delivery.value>`)."""
        return self._delivery.value

    @property
    def key_value(self) -> Any:
        """The key through the consumer's ``key_deserializer``."""
        return self._delivery.key_value

    @property
    def redelivered(self) -> bool:
        return self._delivery.redelivered

    @property
    def attempt(self) -> int:
        """Which delivery of the message this is, 1 on the first (see
        :class:`~msgsafe.message.Delivery`)."""
        return self._delivery.attempt

    @property
    def settled(self) -> Outcome | None:
        """The outcome given, or None while unsettled."""
        return self._delivery.settled

    @property
    def sync(self) -> Delivery:
        """The underlying delivery (its ``ack()`` blocks)."""
        return self._delivery

    async def settle(self, outcome: Outcome) -> None:
        """Settle with an explicit outcome."""
        await asyncio.to_thread(self._delivery.settle, outcome)

    async def ack(self) -> None:
        """The message was processed: remove it from the broker."""
        await self.settle(Outcome.ACCEPT)

    async def nack(self, requeue: bool = True) -> None:
        """Not processed: redeliver it, or (``requeue=False``) reject it."""
        await self.settle(Outcome.REQUEUE if requeue else Outcome.REJECT)

    async def release(self) -> None:
        """Not tried: redeliver it without counting a failed attempt (see
        :meth:`msgsafe.message.Delivery.release`)."""
        await self.settle(Outcome.RELEASE)

    def __repr__(self) -> str:
        return f"Async{self._delivery!r}"


class AsyncConsumer:
    """``async for delivery in consumer`` with the guarantees of :class:`Consumer`:
    at least once, unsettled deliveries go back to the broker on close, optional dedup.

    Arguments as :class:`Consumer`. Cancelling a task that waits for a delivery loses
    nothing: what its poll fetched is handed out by the next wait.
    """

    def __init__(
        self,
        url: str,
        *,
        group: str | None = None,
        dedup: bool | int = False,
        telemetry: bool = False,
        connect_window: float = 10.0,
        attempts: AttemptCounter | None = None,
        deserializer: Deserializer | None = None,
        key_deserializer: Deserializer | None = None,
        **options: object,
    ) -> None:
        self._consumer = Consumer(
            url,
            group=group,
            dedup=dedup,
            telemetry=telemetry,
            connect_window=connect_window,
            attempts=attempts,
            deserializer=deserializer,
            key_deserializer=key_deserializer,
            **options,
        )
        self._ready: deque[AsyncDelivery] = deque()
        #: A poll running in a worker thread; kept across a cancelled wait.
        self._polling: asyncio.Future[list[Delivery]] | None = None
        self._closed = False

    @property
    def sync(self) -> Consumer:
        """The underlying thread-safe consumer."""
        return self._consumer

    async def subscribe(self, destination: str) -> Self:
        """Consume from ``destination`` (a queue, topic or address). Returns self."""
        await asyncio.to_thread(self._consumer.subscribe, destination)
        return self

    async def poll(
        self, timeout: float | None = None, *, max_messages: int = 1
    ) -> list[AsyncDelivery]:
        """Up to ``max_messages`` deliveries, waiting at most ``timeout`` seconds for the
        first (None: until one arrives). Arguments as :meth:`Consumer.poll`: ``timeout``
        first, ``max_messages`` keyword-only."""
        if max_messages < 1:
            raise ConfigurationError("max_messages must be >= 1")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._ready or self._closed:
            if self._closed:
                raise ClosedError("consumer is closed")
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return []
            await self._fetch(_POLL_SLICE_S if left is None else min(left, _POLL_SLICE_S))
        count = min(max_messages, len(self._ready))
        return [self._ready.popleft() for _ in range(count)]

    async def _fetch(self, timeout: float) -> None:
        if self._polling is None:
            self._polling = asyncio.ensure_future(
                asyncio.to_thread(self._consumer.poll, timeout, max_messages=_FETCH)
            )
        # NOTE: shielded: a cancelled wait leaves the poll running, and its deliveries
        # are handed out by the next wait instead of being stranded unsettled.
        polling = self._polling
        try:
            batch = await asyncio.shield(polling)
        except ClosedError:
            self._polling = None
            self._closed = True
            return
        self._polling = None
        self._ready.extend(AsyncDelivery(delivery) for delivery in batch)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> AsyncDelivery:
        """The next delivery; the iteration ends when the consumer is closed."""
        try:
            return (await self.poll(None))[0]
        except ClosedError:
            raise StopAsyncIteration from None

    async def run(
        self,
        handler: Callable[[AsyncDelivery], Awaitable[object]]
        | Callable[[AsyncDelivery, AsyncTransaction], Awaitable[object]],
        *,
        inbox: str | InboxStore | None = None,
        dead_letter_producer: Producer | AsyncProducer | None = None,
        handle_signals: bool = True,
        **options: Any,
    ) -> None:
        """:meth:`Consumer.run` with a coroutine function as the handler, awaited on this
        event loop; the same options and promises (``concurrency`` handlers at once, one
        key at a time, retries on ``clock``, the dead letter, a lossless stop, the
        figures of :meth:`stats`). The fetching and the per-key lanes run on threads of
        their own; each handler call runs here. ``dead_letter_producer`` may be an
        :class:`AsyncProducer` (its :attr:`~AsyncProducer.sync` producer sends).

        With ``inbox`` (a URL or an :class:`~msgsafe.ports.InboxStore`, as for
        :meth:`Consumer.run`) each message's effects are applied once: the handler is
        called as ``await handler(delivery, tx)``, ``tx`` an :class:`AsyncTransaction`
        on the inbox's open transaction — ``await tx.execute(sql, params)``. The
        transaction lives on the worker thread that handles the delivery's key: the
        inbox opens it there (waiting there, not on the loop, for SQLite's write lock or
        a PostgreSQL fail-over), the statements the handler awaits run there one after
        the other, and once the handler has returned msgsafe records the message id in
        that transaction, commits, then acknowledges; a handler that raises (or is
        cancelled) is rolled back with the record and retried as the options say. So
        the loop never waits for the database, and the connection is never used by two
        threads. A message the inbox recorded already (its earlier run committed, and
        the process died before the acknowledgement) is acknowledged without calling
        the handler (``stats().skipped``). Do not settle the delivery yourself in an
        inbox handler: the acknowledgement must come after the commit.

        :meth:`stop`, SIGTERM or SIGINT (through the loop's signal handlers, when this
        loop runs on the main thread and ``handle_signals`` is true; the previous
        handlers are restored after), or cancelling the awaiting task, stop the run;
        cancelling waits for the clean stop, then raises ``CancelledError``. The
        consumer is closed when it returns.
        """
        loop = asyncio.get_running_loop()
        if isinstance(dead_letter_producer, AsyncProducer):
            dead_letter_producer = dead_letter_producer.sync
        call: Callable[..., object]
        if inbox is None:
            plain = cast(Callable[[AsyncDelivery], Awaitable[object]], handler)

            def call(delivery: Delivery) -> object:
                return _on_loop(loop, lambda: plain(AsyncDelivery(delivery))).result()

        else:
            with_tx = cast(Callable[[AsyncDelivery, AsyncTransaction], Awaitable[object]], handler)

            def call(delivery: Delivery, conn: Any) -> object:
                # On the worker thread, inside the inbox's transaction: this thread runs
                # the handler's statements until the handler ends, then the inbox commits.
                tx = AsyncTransaction(conn)
                return tx.serve(_on_loop(loop, lambda: with_tx(AsyncDelivery(delivery), tx)))

        consumer = self._consumer
        running = asyncio.ensure_future(
            asyncio.to_thread(
                consumer.run,
                call,
                inbox=inbox,
                dead_letter_producer=dead_letter_producer,
                handle_signals=False,
                **options,
            )
        )
        with _loop_signals(loop, consumer.stop, enabled=handle_signals):
            try:
                await asyncio.shield(running)
            except asyncio.CancelledError:
                consumer.stop()
                await asyncio.gather(running, return_exceptions=True)
                raise
            finally:
                self._closed = consumer.closed

    def stop(self) -> None:
        """Ask :meth:`run` to stop; it returns once it has shut down."""
        self._consumer.stop()

    def stats(self) -> ConsumerStats:
        """The consumer's figures (see :meth:`Consumer.stats`)."""
        return self._consumer.stats()

    async def close(self, timeout: float | None = 10.0) -> None:
        """Stop consuming; unsettled deliveries go back to the broker. Idempotent."""
        self._closed = True
        # Fetched and not handed out: unsettled, so the broker delivers them again.
        self._ready.clear()
        polling, self._polling = self._polling, None
        if polling is not None:
            # The poll ends within its slice; what it fetched is unsettled and goes back.
            await asyncio.gather(polling, return_exceptions=True)
        await asyncio.to_thread(self._consumer.close, timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _on_loop(
    loop: asyncio.AbstractEventLoop, call: Callable[[], Awaitable[object]]
) -> concurrent.futures.Future[object]:
    """``await call()`` (a handler's call) run on ``loop``, from a worker thread."""

    async def handle() -> object:
        return await call()

    return asyncio.run_coroutine_threadsafe(handle(), loop)


@contextlib.contextmanager
def _loop_signals(
    loop: asyncio.AbstractEventLoop, stop: Callable[[], None], *, enabled: bool
) -> Iterator[None]:
    """SIGTERM and SIGINT call ``stop`` on ``loop`` while inside (main thread only); the
    handlers of before are put back after."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
            handler = previous[sig]
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

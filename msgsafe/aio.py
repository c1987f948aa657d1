"""The asyncio face of the producer: the same futures, awaited.

Nothing here talks to a broker: :class:`AsyncProducer` wraps a :class:`Producer`,
whose adapter I/O runs on its own thread, so awaiting a send never blocks the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Self

from msgsafe.errors import SendTimeout
from msgsafe.message import BatchReceipt, Envelope, Receipt
from msgsafe.producer import OutboxSpec, Producer
from msgsafe.retry import RetryPolicy

__all__ = ["AsyncProducer"]


class AsyncProducer:
    """``await producer.send(...)`` with the promise of :class:`Producer`."""

    def __init__(
        self,
        url: str,
        *,
        outbox: OutboxSpec = True,
        send_timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        **options: object,
    ) -> None:
        self._send_timeout = send_timeout
        self._producer = Producer(
            url, outbox=outbox, send_timeout=send_timeout, retry=retry, **options
        )

    @property
    def sync(self) -> Producer:
        """The underlying thread-safe producer."""
        return self._producer

    async def send(
        self,
        destination: str,
        body: bytes,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
    ) -> Receipt:
        """Send and wait until the message is safe; errors as :meth:`Producer.send`."""
        envelope = Envelope.build(
            destination, body, key=key, headers=headers, message_id=message_id
        )
        future = self._producer.send_envelope(envelope)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self._send_timeout)
        except TimeoutError:
            raise SendTimeout(
                f"not confirmed or stored within send_timeout={self._send_timeout}s",
                endpoint=self._producer.target,
                message_id=envelope.message_id,
            ) from None

    async def send_batch(
        self,
        destination: str,
        bodies: Iterable[bytes],
        *,
        keys: Iterable[str | bytes | None] | None = None,
        headers: Mapping[str, str] | None = None,
        message_ids: Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> BatchReceipt:
        """Send many messages and wait until every one is safe; errors as
        :meth:`Producer.send_batch` (``timeout`` defaults to ``send_timeout``)."""
        future = self._producer.send_batch_async(
            destination, bodies, keys=keys, headers=headers, message_ids=message_ids
        )
        limit = self._send_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), limit)
        except TimeoutError:
            raise SendTimeout(
                f"batch not confirmed or stored within {limit}s", endpoint=self._producer.target
            ) from None

    async def drain(self, timeout: float | None = None) -> int:
        """Forward the outbox now; returns how many remain."""
        return await asyncio.to_thread(self._producer.drain, timeout)

    def pending(self) -> int:
        """How many messages wait in the outbox."""
        return self._producer.pending()

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

"""The asyncio producer awaits the same futures as the thread-safe one."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from msgsafe import AsyncProducer, Status
from msgsafe.errors import Refused, SendTimeout
from msgsafe.message import BatchReceipt
from msgsafe.testing import MemoryBroker


def test_async_send_confirms_and_raises_typed_errors() -> None:
    broker = MemoryBroker.install(MemoryBroker(f"aio-{uuid.uuid4().hex[:8]}"))

    async def main() -> None:
        async with AsyncProducer(f"memory://{broker.name}", outbox=False) as p:
            receipts = await asyncio.gather(*(p.send("q", b"%d" % i) for i in range(50)))
            assert all(r.status is Status.CONFIRMED for r in receipts)
            broker.refuse_writes()
            with pytest.raises(Refused):
                await p.send("q", b"x")
        async with AsyncProducer(
            f"memory://{broker.name}", outbox=False, send_timeout=0.1, confirm_timeout=5
        ) as slow:
            broker.accept_writes()
            broker.delay_confirms(1.0)
            with pytest.raises(SendTimeout):
                await slow.send("q", b"late")
            broker.delay_confirms(0)

    try:
        asyncio.run(main())
        assert len(broker.ids("q")) == 51
    finally:
        MemoryBroker.forget(broker.name)


def test_async_send_batch_is_safe_per_message(tmp_path: Path) -> None:
    broker = MemoryBroker.install(MemoryBroker(f"aio-batch-{uuid.uuid4().hex[:8]}"))

    async def go() -> BatchReceipt:
        async with AsyncProducer(f"memory://{broker.name}", outbox=tmp_path / "o.db") as p:
            return await p.send_batch("q", [b"a", b"b", b"c"], keys=["k", "k", None])

    try:
        receipt = asyncio.run(go())
        assert receipt.confirmed == 3
        assert list(receipt.message_ids) == broker.ids("q")
    finally:
        MemoryBroker.forget(broker.name)

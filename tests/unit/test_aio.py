"""The asyncio producer awaits the same futures as the thread-safe one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from msgsafe import AsyncProducer, Status
from msgsafe.errors import Refused, SendTimeout
from msgsafe.message import BatchReceipt
from msgsafe.testing import MemoryBroker


def test_async_send_confirms_and_raises_typed_errors(memory_broker: MemoryBroker) -> None:
    async def main() -> None:
        async with AsyncProducer(f"memory://{memory_broker.name}", outbox=False) as p:
            receipts = await asyncio.gather(*(p.send("q", b"%d" % i) for i in range(50)))
            assert all(r.status is Status.CONFIRMED for r in receipts)
            memory_broker.refuse_writes()
            with pytest.raises(Refused):
                await p.send("q", b"x")
        async with AsyncProducer(
            f"memory://{memory_broker.name}", outbox=False, send_timeout=0.1, confirm_timeout=5
        ) as slow:
            memory_broker.accept_writes()
            memory_broker.delay_confirms(1.0)
            with pytest.raises(SendTimeout):
                await slow.send("q", b"late")
            memory_broker.delay_confirms(0)

    asyncio.run(main())
    assert len(memory_broker.ids("q")) == 51


def test_async_send_batch_is_safe_per_message(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    async def go() -> BatchReceipt:
        async with AsyncProducer(f"memory://{memory_broker.name}", outbox=tmp_path / "o.db") as p:
            return await p.send_batch("q", [b"a", b"b", b"c"], keys=["k", "k", None])

    receipt = asyncio.run(go())
    assert receipt.confirmed == 3
    assert list(receipt.message_ids) == memory_broker.ids("q")

"""AsyncConsumer: ``async for`` over deliveries, ``await delivery.ack()``, the same
guarantees as Consumer (at least once; unsettled deliveries go back on close)."""

from __future__ import annotations

import asyncio
import random

import pytest

from msgsafe import AsyncConsumer, AsyncDelivery, Producer, RetryPolicy
from msgsafe.errors import ClosedError
from msgsafe.testing import MemoryBroker


def _send(broker: MemoryBroker, count: int) -> set[str]:
    with Producer(f"memory://{broker.name}", outbox=False) as producer:
        return set(producer.send_batch("q", [b"%d" % i for i in range(count)]).message_ids)


def test_async_for_acks_every_message_once(memory_broker: MemoryBroker) -> None:
    sent = _send(memory_broker, 200)

    async def main() -> list[str]:
        got: list[str] = []
        async with AsyncConsumer(f"memory://{memory_broker.name}") as consumer:
            await consumer.subscribe("q")
            async for delivery in consumer:
                got.append(str(delivery.message_id))
                await delivery.ack()
                if len(got) == len(sent):
                    break
            stats = consumer.stats()
            assert stats.received == stats.acked == len(sent)
            with pytest.raises(ClosedError):
                await delivery.ack()  # settled once only
        async with AsyncConsumer(f"memory://{memory_broker.name}") as again:
            await again.subscribe("q")
            assert await again.poll(0.2, max_messages=1) == []  # every one was acknowledged
        return got

    got = asyncio.run(main())
    assert sorted(got) == sorted(sent)


def test_unsettled_and_cancelled_deliveries_are_not_lost(memory_broker: MemoryBroker) -> None:
    sent: set[str] = set()

    async def first_pass() -> set[str]:
        acked: set[str] = set()
        consumer = AsyncConsumer(f"memory://{memory_broker.name}")
        await consumer.subscribe("q")
        # A wait cancelled while its poll runs (nothing there yet): what that poll then
        # fetches is handed to the next wait, not stranded.
        waiting = asyncio.ensure_future(consumer.poll(5, max_messages=5))
        for _ in range(3):
            await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert consumer._polling is not None
        sent.update(await asyncio.to_thread(_send, memory_broker, 50))
        for delivery in await consumer.poll(5, max_messages=10):
            await delivery.ack()
            acked.add(str(delivery.message_id))
        for delivery in await consumer.poll(5, max_messages=5):
            await delivery.ack()
            acked.add(str(delivery.message_id))
        await consumer.poll(5, max_messages=5)  # taken, never settled: back on close
        await consumer.close()
        with pytest.raises(ClosedError):
            await consumer.poll(0.1, max_messages=1)
        return acked

    async def second_pass(expected: int) -> set[str]:
        got: set[str] = set()
        async with AsyncConsumer(f"memory://{memory_broker.name}") as consumer:
            await consumer.subscribe("q")
            while len(got) < expected:
                for delivery in await consumer.poll(5, max_messages=64):
                    got.add(str(delivery.message_id))
                    await delivery.ack()
        return got

    acked = asyncio.run(first_pass())
    assert len(acked) == 15
    rest = asyncio.run(second_pass(len(sent) - len(acked)))
    assert acked | rest == sent and not acked & rest


def test_poll_takes_the_timeout_first_as_the_sync_consumer(memory_broker: MemoryBroker) -> None:
    import inspect

    parameters = inspect.signature(AsyncConsumer.poll).parameters
    assert list(parameters) == ["self", "timeout", "max_messages"]
    assert parameters["max_messages"].kind is inspect.Parameter.KEYWORD_ONLY

    async def main() -> None:
        async with AsyncConsumer(f"memory://{memory_broker.name}") as consumer:
            await consumer.subscribe("q")
            assert await consumer.poll(0.05) == []  # a timeout, not max_messages=0.05
            sent = await asyncio.to_thread(_send, memory_broker, 3)
            [first] = await consumer.poll(10)  # one message, not a wait for 10
            rest = await consumer.poll(2, max_messages=10)
            assert {str(d.message_id) for d in [first, *rest]} == sent
            for delivery in [first, *rest]:
                await delivery.ack()

    asyncio.run(main())


def test_run_awaits_async_handlers_one_key_at_a_time(memory_broker: MemoryBroker) -> None:
    rng = random.Random(7)
    with Producer(f"memory://{memory_broker.name}", outbox=False) as producer:
        poison = producer.send("q", b"poison", key="k0").message_id
        sent = [producer.send("q", b"%d" % i, key=f"k{i % 4}").message_id for i in range(60)]
    order = {message_id: n for n, message_id in enumerate(sent)}

    async def main() -> None:
        handled: dict[bytes, list[str]] = {}
        active: set[bytes] = set()
        overlaps: list[bytes] = []
        attempts: list[int] = []
        consumer = AsyncConsumer(f"memory://{memory_broker.name}")
        await consumer.subscribe("q")

        async def handler(delivery: AsyncDelivery) -> None:
            key = delivery.key or b""
            if key in active:
                overlaps.append(key)
            active.add(key)
            await asyncio.sleep(rng.random() * 0.002)  # the handler's work
            active.discard(key)
            if delivery.body == b"poison":
                attempts.append(delivery.attempt)
                raise ValueError("poison")
            handled.setdefault(key, []).append(str(delivery.message_id))
            if sum(map(len, handled.values())) == len(sent):
                consumer.stop()

        dead_letters = Producer(f"memory://{memory_broker.name}", outbox=False)
        await consumer.run(
            handler,
            concurrency=4,
            retry=RetryPolicy(initial=0.0, max_attempts=2),
            dead_letter="dlq",
            dead_letter_producer=dead_letters,
        )
        dead_letters.close()
        assert overlaps == [] and attempts == [1, 2]
        for ids in handled.values():
            assert ids == sorted(ids, key=order.__getitem__)
        stats = consumer.stats()
        assert (stats.handled, stats.dead_lettered, stats.acked) == (60, 1, 61)
        with pytest.raises(ClosedError):
            await consumer.poll(0.1)  # run() closed it

    asyncio.run(main())
    assert memory_broker.messages("dlq")[0].headers["x-msgsafe-dlq-message-id"] == poison


def test_cancelling_run_stops_it_and_gives_back_the_unhandled(memory_broker: MemoryBroker) -> None:
    sent = _send(memory_broker, 20)

    async def main() -> set[str]:
        handled: set[str] = set()
        started = asyncio.Event()
        consumer = AsyncConsumer(f"memory://{memory_broker.name}")
        await consumer.subscribe("q")

        async def handler(delivery: AsyncDelivery) -> None:
            started.set()
            await asyncio.sleep(0.05)  # the handler's work
            handled.add(str(delivery.message_id))

        running = asyncio.ensure_future(consumer.run(handler, concurrency=2, prefetch=8))
        await asyncio.wait_for(started.wait(), 10)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert consumer.stats().acked == len(handled)
        return handled

    handled = asyncio.run(main())
    assert 0 < len(handled) < len(sent)

    async def rest() -> set[str]:
        async with AsyncConsumer(f"memory://{memory_broker.name}") as again:
            await again.subscribe("q")
            found: set[str] = set()
            while batch := await again.poll(0.2, max_messages=50):
                found |= {str(d.message_id) for d in batch}
                for d in batch:
                    await d.ack()
            return found

    assert asyncio.run(rest()) == sent - handled

"""msgsafe.compat.aiokafka: aiokafka's argument checks, the send / batch / stop contract
against the memory broker (RecordMetadata, stored results, aiokafka's errors), and the
report and error translation on their own."""

from __future__ import annotations

import asyncio
import gc
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import (
    IllegalOperation,
    KafkaConfigurationError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    ProducerClosed,
)
from aiokafka.structs import RecordMetadata
from confluent_kafka import KafkaError

from msgsafe.compat import CompatWarning
from msgsafe.compat._aiokafka_config import aiokafka_error, delivered_record
from msgsafe.compat._kafka_report import DeliveredMessage
from msgsafe.compat.aiokafka import AIOKafkaProducer, DeliveredRecord
from msgsafe.message import Status
from msgsafe.testing import MemoryBroker


def _producer(broker: MemoryBroker, tmp_path: Path, **kwargs: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers="127.0.0.1:1",
        request_timeout_ms=2000,
        msgsafe_outbox=str(tmp_path / "outbox.sqlite3"),
        _url=f"memory://{broker.name}",
        **kwargs,
    )


def test_arguments_are_checked_as_aiokafka_checks_them() -> None:
    async def scenario() -> None:
        bad: list[dict[str, Any]] = [
            {"acks": 122},
            {"compression_type": "my_custom"},
            {"acks": 1, "enable_idempotence": True},
            {"security_protocol": "SOME"},
            {"security_protocol": "SSL", "ssl_context": None},
        ]
        for kwargs in bad:
            with pytest.raises(ValueError):
                AIOKafkaProducer(**kwargs)
        with pytest.raises(KafkaConfigurationError, match="transactions"):
            AIOKafkaProducer(transactional_id="t")
        with pytest.warns(CompatWarning, match="acks"):
            producer = AIOKafkaProducer(acks=1)
        await producer.stop()  # never started: nothing to close

    asyncio.run(scenario())


def test_send_resolves_to_record_metadata(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    async def scenario() -> list[RecordMetadata]:
        async with _producer(memory_broker, tmp_path) as producer:
            futures = [await producer.send("t", b"v%d" % i, key=b"k") for i in range(10)]
            results = list(await asyncio.wait_for(asyncio.gather(*futures), 10))
            results.append(await producer.send_and_wait("t", b"last", headers=[("h", b"1")]))
        assert producer._closed
        with pytest.raises(ProducerClosed):
            await producer.send("t", b"late")
        await producer.stop()  # again: nothing
        return results

    results = asyncio.run(scenario())
    assert all(isinstance(r, RecordMetadata) and isinstance(r, DeliveredRecord) for r in results)
    assert all(r.topic == "t" and not r.stored for r in results)  # type: ignore[attr-defined]
    assert memory_broker.ids("t") == [r.message_id for r in results]  # type: ignore[attr-defined]


def test_a_stored_message_resolves_with_offset_minus_one(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def scenario() -> Any:
        producer = _producer(memory_broker, tmp_path)
        await producer.start()
        memory_broker.refuse_writes()
        record = await asyncio.wait_for(await producer.send("t", b"kept"), 10)
        assert producer.pending() == 1
        memory_broker.accept_writes()
        await producer.flush()
        await producer.stop()
        return record

    record = asyncio.run(scenario())
    assert record.stored and record.offset == -1 and record.partition == -1
    assert memory_broker.ids("t") == [record.message_id]


def test_send_refuses_what_aiokafka_refuses(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    async def scenario() -> None:
        producer = _producer(
            memory_broker,
            tmp_path,
            max_request_size=1000,
            value_serializer=lambda v: json.dumps(v).encode(),
        )
        with pytest.raises(IllegalOperation):
            await producer.send("t", {"a": 1})  # not started
        await producer.start()
        with pytest.raises(MessageSizeTooLargeError):
            await producer.send("t", {"a": "x" * 2000})
        plain = _producer(memory_broker, tmp_path)
        await plain.start()
        with pytest.raises(TypeError):
            await plain.send("t", "not bytes")
        with pytest.raises(AssertionError):
            await plain.send("t")
        with pytest.warns(CompatWarning, match="partition"):
            await (await plain.send("t", b"p", partition=1))
        with pytest.raises(IllegalOperation):
            await plain.begin_transaction()
        await plain.stop()
        await producer.stop()

    asyncio.run(scenario())


def test_batches_fill_as_aiokafka_batches_do(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    async def scenario() -> tuple[int, RecordMetadata]:
        async with _producer(memory_broker, tmp_path, max_batch_size=1000) as producer:
            batch = producer.create_batch()
            count = 0
            while batch.append(key=b"k", value=b"v" * 50, timestamp=None) is not None:
                count += 1
            assert batch.record_count() == count > 0 and batch.closed()
            first = producer.create_batch()
            assert first.append(key=None, value=b"m" * 5000, timestamp=None) is not None
            with pytest.warns(CompatWarning, match="partition"):
                future = await producer.send_batch(batch, "t", partition=0)
            return count, await asyncio.wait_for(future, 10)

    count, record = asyncio.run(scenario())
    assert len(memory_broker.ids("t")) == count
    assert record.message_id == memory_broker.ids("t")[0]  # type: ignore[attr-defined]


def test_unclosed_producer_warns_and_loop_argument_is_deprecated() -> None:
    async def scenario() -> None:
        with pytest.deprecated_call():
            AIOKafkaProducer(loop=asyncio.get_running_loop()).__del__()
        producer = AIOKafkaProducer()
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: None)
        with pytest.warns(ResourceWarning, match="Unclosed AIOKafkaProducer"):
            del producer
            gc.collect()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        asyncio.run(scenario())


def test_reports_and_errors_translate() -> None:
    stored = DeliveredMessage(
        topic="t",
        value=b"v",
        key=None,
        headers=[],
        message_id="id-1",
        status=Status.STORED,
        error=None,
    )
    record = delivered_record(stored)
    assert (record.topic, record.partition, record.offset, record.stored) == ("t", -1, -1, True)
    assert record.topic_partition.topic == "t" and record.message_id == "id-1"
    assert isinstance(aiokafka_error(KafkaError(KafkaError._MSG_TIMED_OUT)), KafkaTimeoutError)
    assert isinstance(aiokafka_error(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)), Exception)
    assert isinstance(
        aiokafka_error(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)),
        NotLeaderForPartitionError,
    )

"""msgsafe.compat.confluent_kafka: what confluent-kafka's test_log.py / test_misc.py /
test_Producer.py found (the logger, brokerless statistics, set_sasl_credentials checks,
an uninitialised subclass, transactions), and ``AIOProducer`` against the memory broker."""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from msgsafe.compat import CompatWarning
from msgsafe.compat.confluent_kafka import OFFSET_INVALID, AIOProducer, Producer
from msgsafe.testing import MemoryBroker


def _until(condition: Callable[[], bool], step: Callable[[], object], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        step()
    return True


def _string_logger(name: str) -> tuple[io.StringIO, logging.Logger]:
    buffer = io.StringIO()
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(name)s Logger | %(message)s"))
    logger.addHandler(handler)
    return buffer, logger


# --- the sync producer -------------------------------------------------------------------


def test_logger_gets_librdkafka_lines_without_brokers() -> None:
    buffer, logger = _string_logger("msgsafe-test-brokerless")
    producer = Producer({"debug": "all"}, logger=logger)
    assert _until(lambda: "INIT" in buffer.getvalue(), lambda: producer.poll(0.2), 10)
    producer.close()


def test_logger_gets_the_direct_lanes_lines_from_flush(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    buffer, logger = _string_logger("msgsafe-test-lane")
    producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "logger": logger,
            "debug": "msg,broker",
            "msgsafe.outbox": str(tmp_path / "o.db"),
        }
    )
    # The refused connection's FAIL line (level 3, above the debug lines) comes from
    # the lane's broker thread at once; it is the logger's, like every other line.
    assert _until(lambda: "FAIL" in buffer.getvalue(), lambda: producer.poll(0.1), 10)
    assert producer.flush() == 0
    assert "msgsafe-test-lane Logger | INIT" in buffer.getvalue()
    producer.close(0)
    # No librdkafka client of the wrapper wrote to stderr: with a logger, none exists
    # without it (librdkafka's own format is "%LEVEL|time|FAC|name| ...").
    assert "|FAIL|" not in capfd.readouterr().err


def test_statistics_without_brokers_reach_stats_cb() -> None:
    seen: list[str] = []
    producer = Producer(
        {"bootstrap.servers": None, "statistics.interval.ms": 10, "stats_cb": seen.append}
    )
    assert _until(lambda: bool(seen), lambda: producer.poll(0.1), 10)
    assert '"brokers":{}' in seen[0].replace(" ", "")
    producer.close()


def test_set_sasl_credentials_takes_strings_only() -> None:
    producer = Producer({})
    with pytest.warns(CompatWarning, match="list_topics"):
        producer.set_sasl_credentials("username", "password")
    for args in ((None, "password"), ("username", None)):
        with pytest.raises(TypeError, match="must be str"):
            producer.set_sasl_credentials(*args)  # type: ignore[arg-type]
    producer.close()


class _Uninitialised(Producer):
    def __init__(self, config: dict[str, object]) -> None:  # no super().__init__()
        pass


def test_an_uninitialised_subclass_is_a_closed_producer() -> None:
    producer = _Uninitialised({})
    calls: list[Callable[[], object]] = [
        lambda: producer.produce("topic", value=b"test"),
        producer.poll,
        producer.flush,
        producer.purge,
        lambda: producer.produce_batch("topic", [{"value": b"test"}]),
        producer.init_transactions,
        producer.begin_transaction,
        lambda: producer.send_offsets_to_transaction([], None),
        producer.commit_transaction,
        producer.abort_transaction,
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="Producer has been closed"):
            call()
    assert len(producer) == 0
    assert producer.close() is True


def test_transactions_are_not_configured(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    producer = Producer(
        {"bootstrap.servers": "127.0.0.1:1", "msgsafe.outbox": str(tmp_path / "o.db")},
        _url=f"memory://{memory_broker.name}",
    )
    for call in (producer.init_transactions, producer.begin_transaction):
        with pytest.raises(KafkaException) as info:
            call()
        assert info.value.args[0].code() == KafkaError._NOT_CONFIGURED
    producer.close()


# --- AIOProducer ---------------------------------------------------------------------------


def _aio(broker: MemoryBroker, tmp_path: Path, **conf: object) -> AIOProducer:
    config: dict[str, object] = {
        "bootstrap.servers": "127.0.0.1:1",
        "msgsafe.outbox": str(tmp_path / "outbox.sqlite3"),
        "message.timeout.ms": 2000,
        **conf,
    }
    return AIOProducer(config, _url=f"memory://{broker.name}")


def test_aio_produce_resolves_to_the_delivered_message(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def scenario() -> list[Any]:
        async with _aio(memory_broker, tmp_path) as producer:
            futures = [await producer.produce("t", b"v%d" % i, key=b"k") for i in range(20)]
            messages = await asyncio.wait_for(asyncio.gather(*futures), 10)
            # The report resolves the future before the wrapper's count of what it holds
            # drops (on the transport's thread): poll the count, with a deadline.
            deadline = time.monotonic() + 5
            while len(producer) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert len(producer) == 0
        assert producer._is_closed and len(producer) == 0
        await producer.close()  # again: nothing
        return messages

    messages = asyncio.run(scenario())
    assert [m.value() for m in messages] == [b"v%d" % i for i in range(20)]
    assert not any(m.stored() for m in messages)
    assert memory_broker.ids("t") == [m.message_id() for m in messages]


def test_aio_a_stored_message_resolves_successfully(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def scenario() -> Any:
        producer = _aio(memory_broker, tmp_path)
        memory_broker.refuse_writes()
        future = await producer.produce("t", b"kept")
        msg = await asyncio.wait_for(future, 10)
        assert producer.pending() == 1
        memory_broker.accept_writes()
        assert await producer.flush(10) == 0
        await producer.close()
        return msg

    msg = asyncio.run(scenario())
    assert msg.stored() and msg.offset() == OFFSET_INVALID
    assert memory_broker.ids("t") == [msg.message_id()]


def test_aio_refused_before_queueing_fails_the_future(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with _aio(memory_broker, tmp_path) as producer:
            future = await producer.produce("t", b"x" * 2_000_000)
            with pytest.raises(KafkaException) as info:
                await future
            assert info.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
            with pytest.raises(TypeError):
                await producer.produce("t", 123)
            with pytest.raises(KafkaException):
                await producer.init_transactions()

    asyncio.run(scenario())


def test_aio_needs_a_running_loop_and_runs_callbacks_on_it(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError):
        _aio(memory_broker, tmp_path)

    async def scenario() -> None:
        producer = _aio(memory_broker, tmp_path, error_cb=lambda err: None)
        assert await producer.poll(0) >= 0
        await producer.close()

    asyncio.run(scenario())

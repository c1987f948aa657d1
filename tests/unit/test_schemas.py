"""serializer= / deserializer= on the memory broker (msgsafe.schemas): called once per
message before anything is sent or stored, STORED rows hold the final bytes, failures map
to the SchemaError tree with nothing sent. The real registry's failures are in
tests/integration/schemas/."""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path
from typing import Any

import httpx2
import pytest

from msgsafe import Consumer, Producer, Status
from msgsafe.aio import AsyncConsumer, AsyncProducer
from msgsafe.errors import (
    PermanentError,
    SchemaError,
    SchemaIncompatible,
    SchemaRegistryUnavailable,
    SerializationFailed,
    TransientError,
)
from msgsafe.schemas import KEY, VALUE, SerializationContext, schema_error
from msgsafe.testing import MemoryBroker


def url(b: MemoryBroker) -> str:
    return f"memory://{b.name}"


class Recorder:
    """A serializer of confluent's shape: JSON with a one-byte 'schema id' prefix; counts
    its calls and the contexts it saw."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, str, str]] = []

    def __call__(self, obj: Any, ctx: Any) -> bytes | None:
        self.calls.append((obj, ctx.topic, ctx.field))
        if obj is None:
            return None
        return b"\x07" + json.dumps(obj, sort_keys=True).encode()


def decode(data: bytes | None, ctx: Any) -> Any:
    assert data is not None and data[:1] == b"\x07", data
    return json.loads(data[1:])


class Refusal(Exception):
    """What confluent's SchemaRegistryError looks like to msgsafe: an http status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.http_status_code = status


class FakeClient:
    def __init__(self) -> None:
        self.asked: list[str | None] = []

    def get_compatibility(self, subject: str | None = None) -> str:
        self.asked.append(subject)
        if subject is not None:
            raise Refusal(404, "No rule named COMPATIBILITY")
        return "BACKWARD"


class Raising:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self._registry = FakeClient()
        self.calls = 0

    def __call__(self, obj: Any, ctx: Any) -> bytes:
        self.calls += 1
        raise self.exc


def test_serializer_runs_once_per_message_and_stored_rows_hold_final_bytes(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    value, key = Recorder(), Recorder()
    orders = [{"id": f"o-{i}", "amount": i} for i in range(20)]
    with Producer(
        url(memory_broker),
        outbox=tmp_path / "outbox.db",
        serializer=value,
        key_serializer=key,
    ) as producer:
        confirmed = [producer.send("orders", o, key={"k": o["id"]}) for o in orders[:10]]
        memory_broker.down()
        stored = [producer.send("orders", o, key={"k": o["id"]}) for o in orders[10:]]
        assert {r.status for r in confirmed} == {Status.CONFIRMED}
        assert {r.status for r in stored} == {Status.STORED}
        # What waits in the outbox is already the serialized bytes. Listed, not claimed:
        # the producer's own forwarder may hold a lease on a row meanwhile.
        rows = [e.envelope for e in producer.outbox.list(limit=100)]  # type: ignore[union-attr]
        assert sorted(r.body for r in rows) == sorted(
            b"\x07" + json.dumps(o, sort_keys=True).encode() for o in orders[10:]
        )
        memory_broker.up()
        assert producer.drain(10) == 0
    # Once per message and field, with the destination as the topic.
    assert len(value.calls) == len(key.calls) == 20
    assert {(t, f) for _, t, f in value.calls} == {("orders", VALUE)}
    assert {(t, f) for _, t, f in key.calls} == {("orders", KEY)}
    sent = {r.message_id for r in confirmed + stored}
    with Consumer(url(memory_broker), deserializer=decode, key_deserializer=decode) as consumer:
        consumer.subscribe("orders")
        got: dict[str, Any] = {}
        while len(got) < 20:
            batch = consumer.poll(2, max_messages=50)
            assert batch, f"lost: {sorted(sent - set(got))}"
            for d in batch:
                assert d.body[:1] == b"\x07"  # the bytes stay in .body
                assert d.key_value == {"k": d.value["id"]}
                got[d.message_id] = d.value  # type: ignore[index]
                d.ack()
    assert set(got) == sent, "lost or unknown ids"
    assert sorted(got.values(), key=lambda o: o["amount"]) == orders


def test_send_async_batch_and_asyncio(memory_broker: MemoryBroker) -> None:
    value = Recorder()
    with Producer(url(memory_broker), outbox=False, serializer=value) as producer:
        futures = [producer.send_async("orders", {"n": i}) for i in range(5)]
        batch = producer.send_batch("orders", [{"n": i} for i in range(5, 10)])
        ids = [f.result(5).message_id for f in futures] + list(batch.message_ids)

    async def run() -> list[str]:
        async with AsyncProducer(url(memory_broker), outbox=False, serializer=value) as aio:
            sent = [(await aio.send("orders", {"n": i})).message_id for i in range(10, 13)]
            batch = await aio.send_batch("orders", [{"n": 13}, {"n": 14}])
            return sent + list(batch.message_ids)

    ids += asyncio.run(run())
    assert len(value.calls) == 15
    bodies = {m.message_id: m.body for m in memory_broker.messages("orders")}
    assert set(bodies) == set(ids)
    assert sorted(json.loads(b[1:])["n"] for b in bodies.values()) == list(range(15))

    async def receive() -> list[Any]:
        async with AsyncConsumer(url(memory_broker), deserializer=decode) as consumer:
            await consumer.subscribe("orders")
            values = []
            while len(values) < 15:
                [d] = await consumer.poll(2)
                values.append(d.value)
                await d.ack()
            return values

    assert sorted(v["n"] for v in asyncio.run(receive())) == list(range(15))


@pytest.mark.parametrize(
    ("exc", "error", "kind"),
    [
        (httpx2.ConnectError("connection refused"), SchemaRegistryUnavailable, TransientError),
        (Refusal(503, "unavailable"), SchemaRegistryUnavailable, TransientError),
        (Refusal(409, "Incompatible artifact: orders-value"), SchemaIncompatible, PermanentError),
        (Refusal(422, "invalid schema"), SerializationFailed, PermanentError),
        (TypeError("amount: long expected"), SerializationFailed, PermanentError),
    ],
)
def test_serializer_failures_raise_before_anything_is_sent_or_stored(
    memory_broker: MemoryBroker,
    tmp_path: Path,
    exc: BaseException,
    error: type[SchemaError],
    kind: type[Exception],
) -> None:
    serializer = Raising(exc)
    with Producer(url(memory_broker), outbox=tmp_path / "o.db", serializer=serializer) as producer:
        with pytest.raises(error) as raised:
            producer.send("orders", {"id": 1}, message_id="0190a0a0-0000-7000-8000-000000000001")
        with pytest.raises(error):
            producer.send_async("orders", {"id": 2})
        with pytest.raises(error):
            producer.send_batch("orders", [{"id": 3}])
        memory_broker.down()  # a broker outage changes nothing: nothing reaches the store
        with pytest.raises(error):
            producer.send("orders", {"id": 4})
        assert producer.pending() == 0
    assert memory_broker.count("orders") == 0
    assert serializer.calls == 4
    err = raised.value
    assert isinstance(err, kind)
    assert err.subject == "orders-value"
    assert err.message_id == "0190a0a0-0000-7000-8000-000000000001"
    assert err.__cause__ is exc
    if error is SchemaIncompatible:
        assert err.rule == "BACKWARD (the registry's default)"  # type: ignore[attr-defined]
        assert "BACKWARD" in str(err) and "orders-value" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert (type(again), again.subject, str(again)) == (type(err), err.subject, str(err))


def test_confluent_wrappers_are_unwrapped() -> None:
    # confluent's SerializingProducer wraps as ValueSerializationError(inner): the
    # registry's answer inside decides.
    inner = Refusal(409, "Incompatible")
    try:
        try:
            raise inner
        except Refusal as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as outer:
        err = schema_error(outer, SerializationContext("t", VALUE))
    assert isinstance(err, SchemaIncompatible) and err.rule is None
    assert "unknown" in str(err)


def test_a_serializer_that_writes_headers_is_refused(memory_broker: MemoryBroker) -> None:
    def in_header(obj: Any, ctx: Any) -> bytes:
        ctx.headers["__value_schema_id"] = "x"
        return b"x"

    def not_bytes(obj: Any, ctx: Any) -> Any:
        return {"a": 1}

    for serializer in (in_header, not_bytes):
        with (
            Producer(url(memory_broker), outbox=False, serializer=serializer) as producer,
            pytest.raises(SerializationFailed),
        ):
            producer.send("orders", {"id": 1})
    assert memory_broker.count("orders") == 0


def test_value_that_does_not_decode_raises_and_body_stays(memory_broker: MemoryBroker) -> None:
    with Producer(url(memory_broker), outbox=False) as producer:
        sent = producer.send("orders", b"not json").message_id
    with Consumer(url(memory_broker), deserializer=decode) as consumer:
        consumer.subscribe("orders")
        [d] = consumer.poll(2)
        assert d.message_id == sent and d.body == b"not json"
        with pytest.raises(SerializationFailed) as raised:
            _ = d.value
        assert raised.value.subject == "orders-value"
        assert d.key_value is None  # no key, no key deserializer: as received
        d.ack()


def test_without_serializers_value_is_the_body(memory_broker: MemoryBroker) -> None:
    with Producer(url(memory_broker), outbox=False) as producer:
        producer.send("q", b"raw", key="k")
    with Consumer(url(memory_broker)) as consumer:
        consumer.subscribe("q")
        [d] = consumer.poll(2)
        assert (d.value, d.key_value) == (b"raw", b"k")
        d.ack()

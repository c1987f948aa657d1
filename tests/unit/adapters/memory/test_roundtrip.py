"""Round trips through memory://: send, poll, ack, nack, redelivery, groups, dedup."""

from __future__ import annotations

import threading
import time

import pytest

from msgsafe import Consumer, Producer, Status
from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    ConnectError,
    InvalidMessage,
    MessageTooLarge,
    MsgsafeError,
)
from msgsafe.testing import MemoryBroker


def url(b: MemoryBroker) -> str:
    return f"memory://{b.name}"


def test_send_poll_ack(memory_broker: MemoryBroker) -> None:
    with Producer(url(memory_broker), outbox=False) as p, Consumer(url(memory_broker)) as c:
        receipt = p.send("q", b"hello", key="k1", headers={"h": "v"})
        assert receipt.status is Status.CONFIRMED and receipt.destination == "q"
        c.subscribe("q")
        [d] = c.poll(timeout=2)
        assert (d.body, d.key, d.headers["h"], d.message_id) == (
            b"hello",
            b"k1",
            "v",
            receipt.message_id,
        )
        assert d.headers["msgsafe-id"] == receipt.message_id
        assert not d.redelivered
        d.ack()
        assert c.poll(timeout=0.05) == []
        with pytest.raises(ClosedError):
            d.ack()  # never acknowledged twice


def test_nack_requeue_redelivers_and_reject_drops(memory_broker: MemoryBroker) -> None:
    with Producer(url(memory_broker), outbox=False) as p, Consumer(url(memory_broker)) as c:
        p.send("q", b"one")
        c.subscribe("q")
        [d] = c.poll(timeout=2)
        d.nack(requeue=True)
        [again] = c.poll(timeout=2)
        assert again.redelivered and again.message_id == d.message_id
        again.nack(requeue=False)
        assert c.poll(timeout=0.05) == []


def test_unsettled_deliveries_return_when_consumer_closes(memory_broker: MemoryBroker) -> None:
    with Producer(url(memory_broker), outbox=False) as p:
        ids = [p.send("q", str(i).encode()).message_id for i in range(5)]
    first = Consumer(url(memory_broker)).subscribe("q")
    got = first.poll(max_messages=5, timeout=2)
    assert [d.message_id for d in got] == ids
    first.close()
    with Consumer(url(memory_broker)) as second:
        second.subscribe("q")
        again = second.poll(max_messages=5, timeout=2)
        assert [d.message_id for d in again] == ids
        assert all(d.redelivered for d in again)


def test_groups_each_see_every_message_and_members_share(memory_broker: MemoryBroker) -> None:
    with Producer(url(memory_broker), outbox=False) as p:
        ids = {p.send("topic", b"x").message_id for _ in range(10)}
    a1 = Consumer(url(memory_broker), group="A").subscribe("topic")
    a2 = Consumer(url(memory_broker), group="A").subscribe("topic")
    b = Consumer(url(memory_broker), group="B").subscribe("topic")
    got_a = a1.poll(max_messages=4, timeout=1) + a2.poll(max_messages=10, timeout=1)
    got_b = b.poll(max_messages=10, timeout=1)
    assert {d.message_id for d in got_a} == ids and len(got_a) == 10
    assert {d.message_id for d in got_b} == ids
    for c in (a1, a2, b):
        c.close()


def test_dedup_drops_known_ids(memory_broker: MemoryBroker) -> None:
    with Producer(url(memory_broker), outbox=False) as p:
        r = p.send("q", b"x", message_id="fixed-id")
        p.send("q", b"x", message_id="fixed-id")  # a retry after an unknown outcome
        p.send("q", b"y")
    with Consumer(url(memory_broker), dedup=True) as c:
        c.subscribe("q")
        got = c.poll(max_messages=10, timeout=1)
        for d in got:
            d.ack()
        got += c.poll(max_messages=10, timeout=0.1)
        assert [d.message_id for d in got].count(r.message_id) == 1
        assert c.duplicates_dropped == 1


def test_bad_input_is_typed(memory_broker: MemoryBroker) -> None:
    with Producer(url(memory_broker), outbox=False, max_message_size=10) as p:
        with pytest.raises(InvalidMessage):
            p.send("q", "text")  # type: ignore[arg-type]
        with pytest.raises(InvalidMessage):
            p.send("q", b"x", key=3)  # type: ignore[arg-type]
        with pytest.raises(InvalidMessage):
            p.send("q", b"x", headers={"a": 1})  # type: ignore[dict-item]
        with pytest.raises(InvalidMessage):
            p.send("", b"x")
        with pytest.raises(MessageTooLarge):
            p.send("q", b"x" * 11)
    with pytest.raises(ConfigurationError, match="unknown option"):
        Producer(url(memory_broker), outbox=False, confirm_timout=3)
    with pytest.raises(ConfigurationError, match="must be a number"):
        Producer(url(memory_broker) + "?confirm_timeout=soon", outbox=False)


def test_closed_producer_and_consumer(memory_broker: MemoryBroker) -> None:
    p = Producer(url(memory_broker), outbox=False)
    p.close()
    p.close()  # idempotent
    with pytest.raises(ClosedError):
        p.send("q", b"x")
    c = Consumer(url(memory_broker))
    c.close()
    with pytest.raises(ClosedError):
        c.poll()


def test_iteration_stops_on_close(memory_broker: MemoryBroker) -> None:
    with Producer(url(memory_broker), outbox=False) as p:
        for i in range(3):
            p.send("q", str(i).encode())
    c = Consumer(url(memory_broker)).subscribe("q")
    seen = []
    for d in c:
        seen.append(d.body)
        d.ack()
        if len(seen) == 3:
            c.close()
    assert seen == [b"0", b"1", b"2"]


def test_poll_waits_past_dropped_duplicates(memory_broker: MemoryBroker) -> None:
    with (
        Producer(url(memory_broker), outbox=False) as p,
        Consumer(url(memory_broker), dedup=True) as c,
    ):
        c.subscribe("q")
        p.send("q", b"x", message_id="same")
        [d] = c.poll(timeout=2)
        d.ack()
        p.send("q", b"x", message_id="same")  # a duplicate only
        threading.Timer(0.3, lambda: p.send("q", b"new")).start()
        [fresh] = c.poll(timeout=5)
        assert fresh.body == b"new" and c.duplicates_dropped == 1


def test_poll_takes_the_timeout_first_as_confluent_kafka_does(memory_broker: MemoryBroker) -> None:
    """``poll(10)`` waits up to 10 s for one message (confluent-kafka's ``poll(timeout)``),
    never for 10 messages; ``max_messages`` is keyword-only."""
    import inspect

    parameters = inspect.signature(Consumer.poll).parameters
    assert list(parameters) == ["self", "timeout", "max_messages"]
    assert parameters["max_messages"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["max_messages"].default == 1
    with Producer(url(memory_broker), outbox=False) as p, Consumer(url(memory_broker)) as c:
        c.subscribe("q")
        assert c.poll(0.05) == []  # a timeout, not max_messages=0.05
        ids = [p.send("q", str(i).encode()).message_id for i in range(3)]
        [first] = c.poll(10)  # one message, at once: not a wait for 10 of them
        rest = c.poll(2, max_messages=10)
        assert [d.message_id for d in [first, *rest]] == ids
        with pytest.raises(TypeError):
            c.poll(2, 10)  # type: ignore[misc]


def test_a_consumer_that_never_reached_its_broker_raises_after_its_window(
    memory_broker: MemoryBroker,
) -> None:
    """As the producer raises ConnectError for a broker it cannot reach, so does a
    consumer that never reached one, once its connect_window has passed; before, poll
    returns nothing."""
    memory_broker.down()
    with Consumer(f"memory://{memory_broker.name}", connect_window=0.5) as consumer:
        consumer.subscribe("q")
        assert consumer.poll(0.05) == []
        error = _first_error(consumer, within=5.0)
    assert isinstance(error, ConnectError) and "connect_window=0.5s" in str(error), error


def test_a_consumer_that_reached_its_broker_once_waits_through_an_outage(
    memory_broker: MemoryBroker,
) -> None:
    with Consumer(f"memory://{memory_broker.name}", connect_window=0.2) as consumer:
        consumer.subscribe("q")
        assert consumer.poll(0.05) == []
        memory_broker.down()
        start = time.monotonic()
        while time.monotonic() - start < 0.6:
            assert consumer.poll(0.05) == []  # an outage after the first answer: waits


def test_a_closed_port_consumer_raises_connect_error_after_its_window() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Consumer(f"kafka://127.0.0.1:{port}", group="g", connect_window=1.0) as consumer:
        consumer.subscribe("orders")
        error = _first_error(consumer, within=10.0)
    assert isinstance(error, ConnectError), error


def _first_error(consumer: Consumer, *, within: float) -> MsgsafeError:
    """What ``poll`` raises first, polling for at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            consumer.poll(0.05)
        except MsgsafeError as exc:
            return exc
    raise AssertionError(f"poll raised nothing within {within:g} s")

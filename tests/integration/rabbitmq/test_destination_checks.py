"""CONFIRMED survives a clean restart, or nothing is sent: the destination checks on one
real RabbitMQ 3.10 node (started through ``msgsafe.cluster``), over AMQP 0-9-1 and the
AMQP 1.0 plugin on the same port.

Each unsafe queue (non-durable, exclusive, auto-delete; over AMQP 1.0 a transient queue
the plugin would create, a missing ``/amq/queue/`` queue it would accept and drop, an
exchange route it cannot vouch for) raises ``UnsafeDestination`` before anything is
sent; each safe one confirms with its guarantee on the receipt, and a clean restart of
the node keeps every confirmed message (counted: lost == 0).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pika
import pika.exceptions
import pytest

from msgsafe import Guarantee, Producer, Status
from msgsafe.cluster.rabbitmq import INSTALL_HINT, RabbitCluster
from msgsafe.errors import Unroutable, UnsafeDestination
from msgsafe.message import new_message_id

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    """One node of its own: the tests restart it."""
    cluster = RabbitCluster(nodes=1, dir=tmp_path_factory.mktemp("rabbit1"))
    try:
        cluster.start()
    except RuntimeError as exc:
        pytest.fail(f"cannot start RabbitMQ ({INSTALL_HINT} if missing): {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


def _channel(node: RabbitCluster) -> tuple[pika.BlockingConnection, object]:
    params = pika.ConnectionParameters("127.0.0.1", node.port(0))
    connection = pika.BlockingConnection(params)
    return connection, connection.channel()


def _declare(node: RabbitCluster, name: str, **kwargs: object) -> None:
    connection, channel = _channel(node)
    try:
        channel.queue_declare(name, **kwargs)  # type: ignore[attr-defined]
    finally:
        connection.close()


def _depth(node: RabbitCluster, name: str) -> int | None:
    """Messages in ``name``, or None when the queue does not exist."""
    connection, channel = _channel(node)
    try:
        return int(channel.queue_declare(name, passive=True).method.message_count)  # type: ignore[attr-defined]
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return None
    finally:
        if connection.is_open:
            connection.close()


def _ids(node: RabbitCluster, name: str) -> list[str]:
    """Every message id in ``name``, read with plain pika (acked)."""
    connection, channel = _channel(node)
    ids: list[str] = []
    try:
        while True:
            method, props, _ = channel.basic_get(name, auto_ack=True)  # type: ignore[attr-defined]
            if method is None:
                return ids
            ids.append(props.message_id or (props.headers or {}).get("msgsafe-id"))
    finally:
        connection.close()


def _clean_restart(node: RabbitCluster) -> None:
    node.stop_node(0)
    node.restart(0)


def _amqp10(node: RabbitCluster) -> str:
    return node.amqp10_url(0)


# --- unsafe: refused before anything is sent ----------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "setting"),
    [
        ({"durable": False}, "durable"),
        ({"durable": True, "auto_delete": True}, "auto-delete"),
    ],
)
def test_an_unsafe_queue_is_refused_before_anything_is_sent(
    node: RabbitCluster, arguments: dict[str, object], setting: str
) -> None:
    queue = f"unsafe-{new_message_id()}"
    _declare(node, queue, **arguments)
    with Producer(node.node_url(0), outbox=False) as producer:
        ids = [new_message_id() for _ in range(5)]
        for message_id in ids:
            with pytest.raises(UnsafeDestination) as caught:
                producer.send(queue, b"x", message_id=message_id)
            error = caught.value
            assert error.message_id == message_id
            assert error.destination == queue
            assert error.guarantee == "none"
            assert error.required == "durable"
            assert setting in str(error) and error.fix
    assert _depth(node, queue) == 0


def test_an_exclusive_queue_of_another_connection_is_refused(node: RabbitCluster) -> None:
    queue = f"exclusive-{new_message_id()}"
    connection, channel = _channel(node)
    try:
        channel.queue_declare(queue, durable=True, exclusive=True)  # type: ignore[attr-defined]
        with (
            Producer(node.node_url(0), outbox=False) as producer,
            pytest.raises(UnsafeDestination, match="exclusive"),
        ):
            producer.send(queue, b"x")
    finally:
        connection.close()


def test_issue_case_2_non_durable_classic_queue_keeps_the_promise(node: RabbitCluster) -> None:
    """The reported loss: CONFIRMED five times into a ``durable=False`` queue, 0 of 5
    after a clean restart. Now: five typed errors, and the caller still owns all five."""
    queue = f"orders-{new_message_id()}"
    _declare(node, queue, durable=False)
    confirmed: list[str] = []
    refused: list[str] = []
    with Producer(node.node_url(0), outbox=True) as producer:
        for _ in range(5):
            message_id = new_message_id()
            try:
                receipt = producer.send(queue, b"order", message_id=message_id)
            except UnsafeDestination:
                refused.append(message_id)
            else:
                confirmed.append(receipt.message_id)
        assert producer.pending() == 0  # nothing went to the outbox either
    _clean_restart(node)
    survived = set(_ids(node, queue)) if _depth(node, queue) is not None else set()
    lost = [m for m in confirmed if m not in survived]
    assert (len(confirmed), len(refused), len(lost)) == (0, 5, 0)


def test_issue_case_1_amqp10_to_an_undeclared_queue_creates_nothing(node: RabbitCluster) -> None:
    """The reported loss: ``amqp10://`` to a queue nobody declared made the plugin create a
    transient queue, CONFIRMED five times, gone after a restart. Now every address form
    that would lose is refused, and no queue is created."""
    name = f"orders-{new_message_id()}"
    with Producer(_amqp10(node), outbox=False) as producer:
        for address in (name, f"/queue/{name}", f"/amq/queue/{name}"):
            for _ in range(5):
                with pytest.raises(UnsafeDestination) as caught:
                    producer.send(address, b"order")
                assert caught.value.guarantee == "none"
                assert "declare" in (caught.value.fix or "") or "/amq/queue/" in str(caught.value)
        with pytest.raises(UnsafeDestination, match="drops"):
            producer.send(f"/exchange/amq.direct/{name}", b"order")
    assert _depth(node, name) is None
    # The name is still free for a quorum queue (the report's later 406).
    with Producer(node.node_url(0), outbox=False, declare="quorum") as producer:
        assert producer.send(name, b"x").guarantee is Guarantee.REPLICATED


def test_amqp10_declare_makes_a_missing_queue_durable_and_keeps_it(node: RabbitCluster) -> None:
    name = f"orders-{new_message_id()}"
    with Producer(_amqp10(node), outbox=False, declare="quorum") as producer:
        receipts = [producer.send(f"/amq/queue/{name}", b"order") for _ in range(5)]
    assert {r.status for r in receipts} == {Status.CONFIRMED}
    assert {r.guarantee for r in receipts} == {Guarantee.REPLICATED}
    _clean_restart(node)
    survived = set(_ids(node, name))
    lost = [r.message_id for r in receipts if r.message_id not in survived]
    assert lost == []


def test_amqp10_to_an_existing_non_durable_queue_is_refused(node: RabbitCluster) -> None:
    name = f"orders-{new_message_id()}"
    _declare(node, name, durable=False)
    with (
        Producer(_amqp10(node), outbox=False) as producer,
        pytest.raises(UnsafeDestination, match="durable"),
    ):
        producer.send(f"/amq/queue/{name}", b"order")
    assert _depth(node, name) == 0


# --- safe: confirmed with the guarantee, and kept by a clean restart (counted) --------------


@pytest.mark.parametrize(
    ("arguments", "guarantee", "scheme"),
    [
        ({"durable": True}, Guarantee.DURABLE, "amqp"),
        ({"durable": True, "arguments": {"x-queue-type": "quorum"}}, Guarantee.REPLICATED, "amqp"),
        ({"durable": True}, Guarantee.DURABLE, "amqp10"),
        (
            {"durable": True, "arguments": {"x-queue-type": "quorum"}},
            Guarantee.REPLICATED,
            "amqp10",
        ),
    ],
)
def test_confirmed_messages_survive_a_clean_restart(
    node: RabbitCluster,
    arguments: dict[str, object],
    guarantee: Guarantee,
    scheme: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = f"safe-{new_message_id()}"
    _declare(node, queue, **arguments)
    url = node.node_url(0) if scheme == "amqp" else _amqp10(node)
    destination = queue if scheme == "amqp" else f"/amq/queue/{queue}"
    caplog.set_level(logging.WARNING, logger="msgsafe.checks")
    with Producer(url, outbox=False) as producer:
        receipts = [producer.send(destination, f"m{i}".encode()) for i in range(200)]
        batch = producer.send_batch(destination, [b"b"] * 300)
    sent = [r.message_id for r in receipts] + list(batch.message_ids)
    assert {r.guarantee for r in receipts} == {guarantee} and batch.guarantee is guarantee
    warnings = [r for r in caplog.records if r.name == "msgsafe.checks"]
    # Below replicated: one WARNING for the destination, not one per message.
    assert len(warnings) == (0 if guarantee is Guarantee.REPLICATED else 1), warnings
    _clean_restart(node)
    received = _ids(node, queue)
    lost = set(sent) - set(received)
    assert (len(sent), len(lost)) == (500, 0)
    assert len(received) == len(set(received)) == 500


def test_require_replicated_refuses_a_classic_queue(node: RabbitCluster) -> None:
    classic, quorum = f"classic-{new_message_id()}", f"quorum-{new_message_id()}"
    _declare(node, classic, durable=True)
    _declare(node, quorum, durable=True, arguments={"x-queue-type": "quorum"})
    with Producer(node.node_url(0), outbox=False, require="replicated") as producer:
        with pytest.raises(UnsafeDestination, match="classic") as caught:
            producer.send(classic, b"x")
        assert caught.value.guarantee == "durable"
        assert producer.send(quorum, b"x").guarantee is Guarantee.REPLICATED
    assert _depth(node, classic) == 0


def test_require_any_sends_and_says_so(node: RabbitCluster) -> None:
    queue = f"any-{new_message_id()}"
    _declare(node, queue, durable=False)
    with Producer(node.node_url(0), outbox=False, require="any") as producer:
        receipt = producer.send(queue, b"x")
    assert receipt.status is Status.CONFIRMED and receipt.guarantee is Guarantee.NONE


def test_an_exchange_route_is_unknown_not_safe(node: RabbitCluster) -> None:
    queue = f"bound-{new_message_id()}"
    _declare(node, queue, durable=True, arguments={"x-queue-type": "quorum"})
    connection, channel = _channel(node)
    try:
        channel.queue_bind(queue, "amq.direct", routing_key=queue)  # type: ignore[attr-defined]
    finally:
        connection.close()
    with Producer(node.node_url(0), outbox=False) as producer:
        assert producer.send(f"amq.direct/{queue}", b"x").guarantee is Guarantee.UNKNOWN
    with (
        Producer(node.node_url(0), outbox=False, require="replicated") as producer,
        pytest.raises(UnsafeDestination, match="bindings"),
    ):
        producer.send(f"amq.direct/{queue}", b"x")


def test_a_missing_queue_declared_later_is_checked_again(node: RabbitCluster) -> None:
    queue = f"later-{new_message_id()}"
    with Producer(node.node_url(0), outbox=False, confirm_timeout=10.0) as producer:
        with pytest.raises(Unroutable):
            producer.send(queue, b"x")
        _declare(node, queue, durable=False)
        # The "missing" answer is kept about a second: poll until the check sees the queue.
        deadline = time.monotonic() + 10.0
        while True:
            try:
                producer.send(queue, b"x")
            except UnsafeDestination:
                break
            except Unroutable:
                assert time.monotonic() < deadline, "the queue was never checked again"
                time.sleep(0.2)  # polling the producer's re-check against the deadline

"""pika and msgsafe.compat.pika side by side on the session RabbitMQ cluster: each
scenario runs with each client and the wrapper must observe what pika observes (see
``differential.py``). Publishing and consuming go through the side's own channel."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pika as real_pika
import pytest

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat import pika as wrapped_pika
from msgsafe.message import MESSAGE_ID_HEADER
from tests.integration.compat.differential import Side, differ, rabbit_params, sides

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _side(name: str, cluster: RabbitCluster, tmp_path: Path) -> Side:
    params = rabbit_params(cluster)
    if name == "real":
        return Side("real", real_pika, lambda: real_pika.BlockingConnection(params), params)
    outbox = tmp_path / f"outbox-{uuid.uuid4().hex[:6]}.sqlite3"
    return Side(
        "wrapper",
        wrapped_pika,
        lambda: wrapped_pika.BlockingConnection(params, outbox=outbox),
        params,
    )


side, real = sides(_side, "rabbit_cluster")


def _fresh(name: str) -> str:
    return f"diff-{name}-{uuid.uuid4().hex[:8]}"


def _count(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def _cleanup(s: Side, *queues: str) -> None:
    conn = real_pika.BlockingConnection(s.config)
    ch = conn.channel()
    for queue in queues:
        ch.queue_delete(queue)
    conn.close()


# --- blocking publish, Unroutable, Nack ---------------------------------------------------


def test_confirmed_publish_and_unroutable_raised_for_that_message(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    def scenario(s: Side) -> Any:
        queue, exchange = _fresh("q"), _fresh("ex")
        seen: list[Any] = []
        conn = s.make()
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.exchange_declare(exchange, exchange_type="direct", auto_delete=True)
        ch.queue_bind(queue, exchange, routing_key="bound")
        ch.add_on_return_callback(
            lambda c, method, props, body: seen.append(
                ("returned", c is ch, method.reply_code, method.routing_key, body)
            )
        )
        ch.confirm_delivery()
        seen.append(("publish", ch.basic_publish(exchange, "bound", b"one")))
        seen.append(("count", _count(ch, queue)))  # confirmed: already in the queue
        try:
            ch.basic_publish(exchange, "nobody", b"two", mandatory=True)
        except s.module.exceptions.UnroutableError as exc:
            returned = [(m.method.routing_key, m.body) for m in exc.messages]
            seen.append(("raised", type(exc).__name__, returned))
        seen.append("process_data_events")
        conn.process_data_events(0)
        seen.append(("count", _count(ch, queue)))
        ch.queue_delete(queue)
        conn.close()
        return seen

    differ(request, side, real, scenario)


def test_a_message_the_broker_nacks(request: pytest.FixtureRequest, side: Side, real: Side) -> None:
    """Intended difference: pika raises NackError and the message is gone; the wrapper
    stores it in the outbox and forwards it once the queue has room."""

    def scenario(s: Side) -> Any:
        queue = _fresh("full")
        conn = s.make()
        ch = conn.channel()
        args = {"x-max-length": 1, "x-overflow": "reject-publish"}
        ch.queue_declare(queue, durable=True, arguments=args)
        ch.confirm_delivery()
        seen: list[Any] = [ch.basic_publish("", queue, b"fits")]
        try:
            ch.basic_publish("", queue, b"nacked")
            seen.append("returned")
        except s.module.exceptions.NackError as exc:
            seen.append(("NackError", [m.body for m in exc.messages]))
        seen.append(("pending", conn.producer.pending() if s.wrapped else 0))
        ch.queue_purge(queue)
        conn.close()  # the wrapper forwards the stored message now there is room
        check = real_pika.BlockingConnection(s.config)
        seen.append(("left", _count(check.channel(), queue)))
        check.close()
        _cleanup(s, queue)
        return seen

    def stored(real_observed: Any) -> Any:
        """Stored (pending 1), then forwarded (left 1), where pika raised NackError."""
        return [None, "returned", ("pending", 1), ("left", 1)]

    observed = differ(request, side, real, scenario, intended=stored)
    if not side.wrapped:
        assert observed == [None, ("NackError", []), ("pending", 0), ("left", 0)]


def test_the_broker_down_at_connect(request: pytest.FixtureRequest, side: Side, real: Side) -> None:
    def scenario(s: Side) -> Any:
        params = real_pika.ConnectionParameters(
            "127.0.0.1", 1, connection_attempts=1, socket_timeout=1
        )
        try:
            s.module.BlockingConnection(params)
        except s.module.exceptions.AMQPConnectionError as exc:
            return ("raised", isinstance(exc, real_pika.exceptions.AMQPConnectionError))
        return ("connected",)

    differ(request, side, real, scenario)


def test_lazy_connect_stores_while_the_broker_is_down(tmp_path: Path) -> None:
    """Intended difference (opt-in): with lazy=True the constructor does not need a broker
    and a publish while none answers is stored in the outbox."""
    params = real_pika.ConnectionParameters("127.0.0.1", 1, connection_attempts=1)
    conn = wrapped_pika.BlockingConnection(params, outbox=str(tmp_path / "o.db"), lazy=True)
    channel = conn.channel()
    channel.basic_publish("", "nowhere", b"kept", real_pika.BasicProperties(message_id="k-1"))
    assert conn.producer.pending() == 1
    conn.close()


# --- data in transit ------------------------------------------------------------------------


def _all_properties(username: str) -> real_pika.BasicProperties:
    return real_pika.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={
            "none": None,
            "int": 7,
            "negative": -40000,
            "bool": True,
            "text": "é",
            "raw": b"\xff\x00\xfe",
            "nested": {"a": [1, "b", None]},
            "list": [1, 2, 3],
        },
        delivery_mode=2,
        priority=5,
        correlation_id="corr-1",
        reply_to="replies",
        expiration="60000",
        message_id="legacy-id-1",
        timestamp=1_700_000_000,
        type="order.created",
        user_id=username,
        app_id="legacy-app",
    )


def _seen_properties(props: Any) -> dict[str, Any]:
    fields = [
        "content_type",
        "content_encoding",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
    ]
    seen = {name: getattr(props, name) for name in fields}
    headers = dict(props.headers or {})
    # Intended addition: msgsafe's id header, equal to message_id (checked below).
    seen["id-header"] = headers.pop(MESSAGE_ID_HEADER, props.message_id)
    seen["headers"] = headers
    return seen


def test_every_property_and_header_value_as_consumed(
    request: pytest.FixtureRequest, side: Side, real: Side, rabbit_cluster: RabbitCluster
) -> None:
    def scenario(s: Side) -> Any:
        queue = _fresh("props")
        conn = s.make()
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        got: list[Any] = []
        try:
            ch.basic_publish("", queue, b"x", real_pika.BasicProperties(headers={"f": 1.5}))
        except s.module.exceptions.UnsupportedAMQPFieldException as exc:
            got.append(type(exc).__name__)  # pika encodes no float: nothing is sent
        ch.basic_publish("", queue, b"body", _all_properties(rabbit_cluster.username))
        for method, props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=5):
            if method is None:
                break
            got.append((body, _seen_properties(props)))
            break
        ch.cancel()
        ch.queue_delete(queue)
        conn.close()
        return got

    [_refused, (body, seen)] = differ(request, side, real, scenario)
    assert body == b"body" and seen["id-header"] == "legacy-id-1"


def test_a_transient_message_without_properties(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    """Intended difference: the wrapper publishes every message persistent
    (delivery_mode 2), with its id in message_id, and a send timestamp."""

    def scenario(s: Side) -> Any:
        queue = _fresh("plain")
        conn = s.make()
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.basic_publish("", queue, "text body")  # no confirm mode, no properties
        deadline = time.monotonic() + 10
        while (got := ch.basic_get(queue, auto_ack=True))[0] is None:
            assert time.monotonic() < deadline, "the message never arrived"
            conn.process_data_events(0.05)
        _method, props, body = got
        ch.queue_delete(queue)
        conn.close()
        return (
            body,
            props.delivery_mode,
            props.message_id is not None,
            props.timestamp is not None,
            props.headers,  # None on both: the wrapper adds no header
        )

    differ(request, side, real, scenario, intended=lambda r: (r[0], 2, True, True, r[4]))


# --- the rest of the channel and connection ----------------------------------------------


def test_declares_binds_qos_and_their_results(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    def scenario(s: Side) -> Any:
        queue, ex1, ex2 = _fresh("q"), _fresh("ex1"), _fresh("ex2")
        conn = s.make()
        ch = conn.channel()
        blocking = real_pika.adapters.blocking_connection.BlockingChannel

        def name(result: Any) -> Any:
            return type(result.method).__name__ if result is not None else None

        seen = [
            isinstance(ch, blocking),
            conn.publisher_confirms_supported,
            conn.add_on_connection_blocked_callback(lambda *_: None),
            conn.add_on_connection_unblocked_callback(lambda *_: None),
            name(ch.queue_declare(queue, durable=True)),
            name(ch.exchange_declare(ex1, exchange_type="fanout", auto_delete=False)),
            name(ch.exchange_declare(ex2, exchange_type="fanout", auto_delete=False)),
            name(ch.exchange_bind(ex2, ex1)),
            name(ch.queue_bind(queue, ex2)),
            ch.basic_qos(prefetch_count=10),
        ]
        ch.confirm_delivery()
        ch.basic_publish(ex1, "", b"through two exchanges")
        seen.append(_count(ch, queue))
        seen.append(name(ch.queue_unbind(queue, ex2)))
        seen.append(name(ch.exchange_unbind(ex2, ex1)))
        try:
            ch.basic_publish(ex1, "", b"unbound", mandatory=True)
        except s.module.exceptions.UnroutableError:
            seen.append("unroutable after unbind")
        seen.append(name(ch.exchange_delete(ex1)))
        seen.append(name(ch.exchange_delete(ex2)))
        seen.append(name(ch.queue_purge(queue)))
        seen.append(name(ch.queue_delete(queue)))
        conn.close()
        return seen

    differ(request, side, real, scenario)


def test_transactions(request: pytest.FixtureRequest, side: Side, real: Side) -> None:
    def scenario(s: Side) -> Any:
        queue = _fresh("tx")
        conn = s.make()
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        seen: list[Any] = [type(ch.tx_select().method).__name__]
        ch.basic_publish("", queue, b"rolled back")
        seen.append(_count(ch, queue))
        seen.append(type(ch.tx_rollback().method).__name__)
        ch.basic_publish("", queue, b"committed")
        seen.append(_count(ch, queue))
        seen.append(type(ch.tx_commit().method).__name__)
        seen.append(_count(ch, queue))
        seen.append(ch.basic_get(queue, auto_ack=True)[2])
        ch.queue_delete(queue)
        conn.close()
        return seen

    differ(request, side, real, scenario)


def test_consume_generator_and_callbacks(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    def scenario(s: Side) -> Any:
        queue = _fresh("consume")
        conn = s.make()
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for i in range(4):
            ch.basic_publish("", queue, f"m{i}".encode())
        seen: list[Any] = []
        for method, _props, body in ch.consume(queue, inactivity_timeout=5):
            if method is None:
                break
            seen.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(seen) == 2:
                break
        seen.append(("requeued", ch.cancel()))
        got: list[Any] = []

        def on_message(c: Any, method: Any, _props: Any, body: bytes) -> None:
            got.append((c is ch, body))
            c.basic_ack(method.delivery_tag)
            if len(got) == 2:
                c.stop_consuming()

        ch.basic_consume(queue, on_message)
        ch.start_consuming()
        seen.append(got)
        ch.queue_delete(queue)
        conn.close()
        return seen

    differ(request, side, real, scenario)


def test_sleep_process_data_events_and_closing_twice(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    def scenario(s: Side) -> Any:
        conn = s.make()
        ch = conn.channel()
        started = time.monotonic()
        conn.sleep(0.3)
        slept = time.monotonic() - started >= 0.3
        started = time.monotonic()
        conn.process_data_events(time_limit=0.3)
        waited = time.monotonic() - started >= 0.3
        seen: list[Any] = [slept, waited, ch.close(), ch.is_closed]
        try:
            ch.close()
        except s.module.exceptions.ChannelWrongStateError as exc:
            seen.append(type(exc).__name__)
        seen.append(conn.close())
        try:
            conn.close()
        except s.module.exceptions.ConnectionWrongStateError as exc:
            seen.append(type(exc).__name__)
        with conn:
            pass  # leaving the block of a closed connection does not raise
        seen.append(conn.is_closed)
        return seen

    differ(request, side, real, scenario)


def test_unroutable_by_confirm_mode_and_mandatory(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    """Equal as seen by the code; beyond it, an unroutable message published without
    mandatory (which RabbitMQ drops for pika) is kept in the wrapper's outbox."""

    def scenario(s: Side) -> Any:
        exchange = _fresh("ex")
        seen: list[Any] = []
        conn = s.make()
        for confirm in (False, True):
            for mandatory in (True, False):
                ch = conn.channel()
                ch.exchange_declare(exchange, exchange_type="direct", auto_delete=True)
                ch.add_on_return_callback(lambda c, m, p, b: seen.append(("returned", b)))
                if confirm:
                    ch.confirm_delivery()
                body = f"confirm={confirm} mandatory={mandatory}".encode()
                try:
                    result = ch.basic_publish(exchange, "nobody", body, None, mandatory)
                    seen.append(("publish", result))
                except s.module.exceptions.UnroutableError as exc:
                    seen.append(("UnroutableError", [m.body for m in exc.messages]))
                conn.process_data_events(0.2)
                ch.close()
        stats = conn.producer.outbox.stats() if s.wrapped else None
        kept = None if stats is None else stats.depth + stats.quarantined
        conn.close()
        return seen, kept

    (_seen, kept) = differ(request, side, real, scenario, intended=lambda r: (r[0], 2))
    assert kept == (2 if side.wrapped else None)  # the two published without mandatory


def test_publish_to_a_missing_exchange(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    def scenario(s: Side) -> Any:
        conn = s.make()
        ch = conn.channel()
        ch.confirm_delivery()
        seen: list[Any] = []
        try:
            ch.basic_publish(_fresh("missing"), "rk", b"x")
            seen.append("returned")
        except s.module.exceptions.AMQPError as exc:
            seen.append((type(exc).__name__, getattr(exc, "reply_code", None)))
        seen.append(("channel open", ch.is_open))
        conn.close()
        return seen

    differ(request, side, real, scenario)

"""aio-pika and msgsafe.compat.aio_pika side by side on the session RabbitMQ cluster: each
scenario runs with each client and the wrapper must observe what aio-pika observes (see
``differential.py``). Declares, publishing and consuming go through the side's own
connection (``connect_robust``, as the issue's applications use it)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import aio_pika as real_aio_pika
import pytest
from pamqp.commands import Basic

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat import aio_pika as wrapped_aio_pika
from msgsafe.testing.faultproxy import FaultProxy
from tests.integration.compat.differential import Side, differ, sides

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Scenario = Callable[[Side], Awaitable[Any]]


def _url(cluster: RabbitCluster, node: int = 0) -> str:
    return f"{cluster.node_url(node)}/"


def _side(name: str, cluster: RabbitCluster, tmp_path: Path) -> Side:
    url = _url(cluster)
    if name == "real":
        return Side(
            "real", real_aio_pika, lambda **kw: real_aio_pika.connect_robust(url, **kw), url
        )
    outbox = tmp_path / f"outbox-{uuid.uuid4().hex[:6]}.sqlite3"
    return Side(
        "wrapper",
        wrapped_aio_pika,
        lambda **kw: wrapped_aio_pika.connect_robust(url, outbox=outbox, **kw),
        url,
    )


side, real = sides(_side, "rabbit_cluster")


def _sync(scenario: Scenario) -> Callable[[Side], Any]:
    return lambda s: asyncio.run(scenario(s))  # type: ignore[arg-type]


def _fresh(name: str) -> str:
    return f"aiodiff-{name}-{uuid.uuid4().hex[:8]}"


async def _drain(queue: Any, count: int) -> list[Any]:
    """``count`` messages of ``queue`` (acknowledged), polled with a deadline."""
    got: list[Any] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while len(got) < count:
        assert loop.time() < deadline, f"{len(got)} of {count} messages consumed"
        message = await queue.get(fail=False, timeout=5)
        if message is None:
            await asyncio.sleep(0.05)  # the polling period of this wait
            continue
        await message.ack()
        got.append(message)
    return got


def _seen(message: Any) -> dict[str, Any]:
    return {
        "body": message.body,
        "headers": message.headers,
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        "delivery_mode": int(message.delivery_mode),
        "priority": message.priority,
        "correlation_id": message.correlation_id,
        "reply_to": message.reply_to,
        "expiration": message.expiration,
        "message_id": message.message_id,
        "timestamp": message.timestamp,
        "type": message.type,
        "user_id": message.user_id,
        "app_id": message.app_id,
        "routing_key": message.routing_key if message.exchange else "(the queue)",
        "exchange": (message.exchange or "")[:10],
    }


# --- publishing, confirmed ------------------------------------------------------------------


def test_publish_through_exchanges_and_consume_every_property(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    async def scenario(s: Side) -> Any:
        seen: list[Any] = []
        connection = await s.make()
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(_fresh("q"), durable=True)
            exchange = await channel.declare_exchange(_fresh("ex"), "topic", auto_delete=True)
            await queue.bind(exchange, "orders.*")
            message = s.module.Message(
                b"\x00body\xff",
                headers={
                    "none": None,
                    "int": 7,
                    "negative": -40000,
                    "big": 2**40,
                    "bool": True,
                    "text": "é",
                    "raw": bytearray(b"\xff\x00"),
                    "decimal": Decimal("1.25"),
                    "when": datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
                    "nested": {"a": [1, "b", None]},
                },
                content_type="application/json",
                content_encoding="gzip",
                delivery_mode=s.module.DeliveryMode.PERSISTENT,
                priority=5,
                correlation_id="corr-1",
                reply_to="replies",
                expiration=60,
                message_id="legacy-id-1",
                timestamp=1_700_000_000,
                type="order.created",
                user_id="guest",
                app_id="legacy-app",
            )
            ack = await exchange.publish(message, "orders.created")
            seen.append(("ack", isinstance(ack, Basic.Ack), ack.delivery_tag > 0))
            plain = await channel.default_exchange.publish(
                s.module.Message(b"plain", message_id="m2", timestamp=1_700_000_001),
                queue.name,
                timeout=5,
            )
            seen.append(("ack", isinstance(plain, Basic.Ack)))
            for got in await _drain(queue, 2):
                seen.append(_seen(got))
            await queue.delete(if_unused=False, if_empty=False)
        return seen

    differ(
        request,
        side,
        real,
        _sync(scenario),
        intended=_persistent_plain,
    )


def _persistent_plain(observed: Any) -> Any:
    """The wrapper publishes every message persistent (delivery_mode 2), also one
    published with aio-pika's default NOT_PERSISTENT."""
    out = list(observed)
    last = dict(out[-1])
    last["delivery_mode"] = 2
    out[-1] = last
    return out


def test_many_concurrent_publishes_keep_nothing_back(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    async def scenario(s: Side) -> Any:
        connection = await s.make()
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(_fresh("many"), durable=True)
            acks = await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        s.module.Message(b"%d" % i, delivery_mode=2), queue.name
                    )
                    for i in range(300)
                )
            )
            bodies = sorted(int(m.body) for m in await _drain(queue, 300))
            await queue.delete(if_unused=False, if_empty=False)
        return [len(acks), bodies == list(range(300))]

    differ(request, side, real, _sync(scenario))


# --- unroutable, missing exchange, nack ---------------------------------------------------------


def test_an_unroutable_message_goes_to_the_return_callbacks(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    async def scenario(s: Side) -> Any:
        seen: list[Any] = []
        connection = await s.make()
        async with connection:
            channel = await connection.channel()
            exchange = await channel.declare_exchange(_fresh("ex"), auto_delete=True)
            channel.return_callbacks.add(
                lambda ch, message: seen.append(
                    ("returned", ch is channel, message.body, message.routing_key)
                )
            )
            result = await exchange.publish(
                s.module.Message(b"lost", delivery_mode=2, message_id="r1"), "nobody"
            )
            seen.append(("result", type(result).__name__, result.body))
            strict = await connection.channel(on_return_raises=True)
            exchange2 = await strict.get_exchange(exchange.name)
            try:
                await exchange2.publish(s.module.Message(b"lost2", delivery_mode=2), "nobody")
            except s.module.exceptions.PublishError as exc:
                seen.append(("raised", type(exc).__name__, exc.message.body))
        return seen

    differ(request, side, real, _sync(scenario))


def test_publishing_to_a_missing_exchange(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    async def scenario(s: Side) -> Any:
        connection = await s.make()
        async with connection:
            channel = await connection.channel()
            exchange = await channel.get_exchange(_fresh("missing"), ensure=False)
            try:
                await exchange.publish(s.module.Message(b"x", delivery_mode=2), "rk")
            except s.module.exceptions.ChannelNotFoundEntity as exc:
                return ("raised", type(exc).__name__, "NOT_FOUND" in str(exc))
        return ("returned",)

    differ(request, side, real, _sync(scenario))


def test_a_message_the_broker_nacks(request: pytest.FixtureRequest, side: Side, real: Side) -> None:
    async def scenario(s: Side) -> Any:
        seen: list[Any] = []
        connection = await s.make()
        async with connection:
            channel = await connection.channel()
            args = {"x-max-length": 1, "x-overflow": "reject-publish"}
            queue = await channel.declare_queue(_fresh("full"), durable=True, arguments=args)
            await channel.default_exchange.publish(s.module.Message(b"fits"), queue.name)
            try:
                await channel.default_exchange.publish(s.module.Message(b"nacked"), queue.name)
                seen.append("returned")
            except s.module.exceptions.DeliveryError as exc:
                seen.append(("DeliveryError", exc.frame.name))
            seen.append(("pending", connection.producer.pending() if s.wrapped else 0))
            await queue.purge()
        # The wrapper's close() forwards the stored message now that there is room.
        check = await real_aio_pika.connect(s.config)
        async with check:
            ch = await check.channel()
            again = await ch.declare_queue(queue.name, passive=True)
            seen.append(("left", again.declaration_result.message_count))
            await again.delete(if_unused=False, if_empty=False)
        return seen

    def stored(real_observed: Any) -> Any:
        """Stored in the outbox (pending 1) and forwarded at close (left 1), where
        aio-pika raised DeliveryError and the message was gone."""
        return ["returned", ("pending", 1), ("left", 1)]

    observed = differ(request, side, real, _sync(scenario), intended=stored)
    if not side.wrapped:
        assert observed == [("DeliveryError", "Basic.Nack"), ("pending", 0), ("left", 0)]


# --- connecting, consuming ------------------------------------------------------------------------


def test_the_broker_down_at_connect(request: pytest.FixtureRequest, side: Side, real: Side) -> None:
    async def scenario(s: Side) -> Any:
        try:
            await s.module.connect_robust("amqp://guest:guest@127.0.0.1:1/", timeout=2)
        except ConnectionError as exc:
            return ("raised", isinstance(exc, real_aio_pika.exceptions.AMQPConnectionError))
        return ("connected",)

    differ(request, side, real, _sync(scenario))


def test_consuming_on_the_same_connection(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    async def scenario(s: Side) -> Any:
        connection = await s.make()
        async with connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=10)
            queue = await channel.declare_queue(_fresh("consume"), durable=True)
            for i in range(5):
                await channel.default_exchange.publish(
                    s.module.Message(b"%d" % i, delivery_mode=2), queue.name
                )
            bodies = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        bodies.append(message.body)
                    if len(bodies) == 5:
                        break
            await queue.delete(if_unused=False, if_empty=False)
        return bodies

    differ(request, side, real, _sync(scenario))


def test_publish_after_the_channel_was_closed(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    async def scenario(s: Side) -> Any:
        connection = await s.make()
        await connection.close()
        try:
            channel = connection.channel()
            await channel
        except Exception as exc:
            return ("raised", type(exc).__name__)
        return ("opened",)

    differ(request, side, real, _sync(scenario))


# --- the issue: an outage ------------------------------------------------------------------------


def test_a_black_holed_broker_and_a_publish_with_a_deadline(
    request: pytest.FixtureRequest,
    side: Side,
    real: Side,
    rabbit_cluster: RabbitCluster,
    tmp_path: Path,
) -> None:
    """The broker stops answering (bytes vanish, the connection stays open) while a
    publish waits: aio-pika raises TimeoutError at the deadline and the message is the
    caller's problem; the wrapper returns within the deadline, the message stored."""

    async def scenario(s: Side) -> Any:
        seen: list[Any] = []
        with FaultProxy("127.0.0.1", rabbit_cluster.port(0)) as proxy:
            url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/"
            kwargs = {"outbox": tmp_path / f"hole-{uuid.uuid4().hex[:6]}.db"} if s.wrapped else {}
            connection = await s.module.connect_robust(url, **kwargs)
            channel = await connection.channel()
            queue = await channel.declare_queue(_fresh("hole"), durable=True)
            await channel.default_exchange.publish(s.module.Message(b"before"), queue.name)
            proxy.blackhole()
            loop = asyncio.get_running_loop()
            start = loop.time()
            try:
                ack = await channel.default_exchange.publish(
                    s.module.Message(b"during"), queue.name, timeout=1.5
                )
                seen.append(("returned", ack.receipt.status.value))
            except TimeoutError:
                seen.append("TimeoutError")
            seen.append(("within deadline", loop.time() - start < 1.5 + 0.3))
            proxy.heal()
            if s.wrapped:
                # close() forwards the stored message (msgsafe's own connection).
                await asyncio.to_thread(connection.publisher.close, 10.0)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 5)
        check = await real_aio_pika.connect(s.config)
        async with check:
            ch = await check.channel()
            again = await ch.declare_queue(queue.name, passive=True)
            got = await _drain(again, again.declaration_result.message_count)
            # A message stored after its confirm was lost may arrive twice: same id.
            by_id = {m.message_id: m.body for m in got}
            assert len(by_id) == len({m.body for m in got}), "a duplicate with a new id"
            bodies = sorted(by_id.values())
            seen.append(("in the queue", bodies))
            await again.delete(if_unused=False, if_empty=False)
        return seen

    def stored(real_observed: Any) -> Any:
        """Stored within the deadline and forwarded later (possibly twice, with one
        message_id), where aio-pika raised TimeoutError and only the first message
        reached the queue."""
        return [
            ("returned", "stored"),
            ("within deadline", True),
            ("in the queue", [b"before", b"during"]),
        ]

    observed = differ(request, side, real, _sync(scenario), intended=stored)
    if not side.wrapped:
        assert observed[0] == "TimeoutError"

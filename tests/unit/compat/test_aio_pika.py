"""msgsafe.compat.aio_pika without a broker: the module is aio-pika with the publishing
classes replaced, and ``Exchange.publish`` against the memory broker returns within its
deadline, confirmed or stored, with aio-pika's exceptions for a failed message.

The aio-pika objects are built directly (no broker to connect to): a connection given
msgsafe's publisher as ``connect()`` would, a channel of it, an exchange of that.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aio_pika as real_aio_pika
import aiormq
import pika
import pytest
from pamqp import commands as pamqp_commands
from yarl import URL

from msgsafe.compat import aio_pika
from msgsafe.compat._aio_pika_publish import (
    PublishAck,
    Publisher,
    envelope_of,
    publish_error,
    returned_message,
)
from msgsafe.compat.aio_pika import msgsafe_url
from msgsafe.errors import (
    AuthenticationError,
    ConfigurationError,
    MessageTooLarge,
    Rejected,
    Unroutable,
    UnsafeDestination,
)
from msgsafe.message import AMQP_PROPERTIES_HEADER, Guarantee, Status
from msgsafe.producer import Producer
from msgsafe.testing import MemoryBroker

T = TypeVar("T")


def _run(make: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(make())  # type: ignore[arg-type]


async def _exchange(
    broker: MemoryBroker,
    tmp_path: Path | None,
    name: str = "",
    *,
    deadline: float = 5.0,
    robust: bool = False,
    on_return_raises: bool = False,
    publisher_confirms: bool = True,
) -> Any:
    conn_cls = aio_pika.RobustConnection if robust else aio_pika.Connection
    conn = conn_cls(URL("amqp://guest:guest@127.0.0.1:1/"))
    outbox: Any = False if tmp_path is None else tmp_path / "outbox.sqlite3"
    producer = await asyncio.to_thread(Producer, f"memory://{broker.name}", outbox=outbox)
    conn.attach(Publisher(producer, deadline=deadline, window=100))
    # conn.channel() needs an open aio-pika transport: the channel is made directly.
    channel = conn.CHANNEL_CLASS(
        conn, publisher_confirms=publisher_confirms, on_return_raises=on_return_raises
    )
    exchange_cls = aio_pika.RobustExchange if robust else aio_pika.Exchange
    return exchange_cls(channel, name)


async def _close(exchange: Any, wait: float | None = None) -> None:
    connection = exchange.channel._connection
    if wait is None:
        await connection._close_publisher()
    else:
        await asyncio.to_thread(connection.publisher.close, wait)


# --- the module ----------------------------------------------------------------------------


def test_the_module_is_aio_pika_with_the_publishing_classes_replaced() -> None:
    assert aio_pika.Message is real_aio_pika.Message
    assert aio_pika.DeliveryMode is real_aio_pika.DeliveryMode
    assert aio_pika.exceptions is real_aio_pika.exceptions
    # Names it does not list are aio-pika's too (annotations such as aio_pika.message.X).
    assert aio_pika.message is real_aio_pika.message  # type: ignore[attr-defined]
    for name in ("Connection", "RobustConnection", "Channel", "RobustChannel"):
        assert issubclass(getattr(aio_pika, name), getattr(real_aio_pika, name))
    assert issubclass(aio_pika.Exchange, real_aio_pika.Exchange)
    assert issubclass(aio_pika.RobustExchange, real_aio_pika.RobustExchange)
    assert aio_pika.Connection.CHANNEL_CLASS is aio_pika.Channel
    assert aio_pika.RobustConnection.CHANNEL_CLASS is aio_pika.RobustChannel
    assert aio_pika.Channel.EXCHANGE_CLASS is aio_pika.Exchange
    assert aio_pika.RobustChannel.EXCHANGE_CLASS is aio_pika.RobustExchange
    assert aio_pika.__all__ == sorted(aio_pika.__all__)
    assert aio_pika.Connection.__module__ == "msgsafe.compat.aio_pika"


def test_the_url_lists_failover_hosts_and_keeps_credentials_and_vhost() -> None:
    url, options = msgsafe_url(
        URL("amqp://u:p%40ss@h1:5673/my%2Fvh?heartbeat=7&name=app"), ["h2:5674"]
    )
    assert url == "amqp://u:p%40ss@h1:5673,h2:5674/my%2Fvh"
    assert options == {"heartbeat": 7, "client_name": "app"}
    assert msgsafe_url(URL("amqp://h/"))[0] == "amqp://guest:guest@h:5672/%2F"
    assert msgsafe_url(URL("amqps://h"))[0] == "amqps://guest:guest@h:5671/%2F"
    with pytest.raises(ConfigurationError):
        msgsafe_url(URL("amqp://h/"), ["nohost"])
    with pytest.raises(ConfigurationError):
        msgsafe_url(URL("http://h/"))


# --- the envelope ---------------------------------------------------------------------------


def test_every_property_is_carried_as_aio_pika_encodes_it() -> None:
    message = aio_pika.Message(
        b"body",
        headers={"n": 3, "s": "x", "big": 2**40, "list": [1, "a"], "table": {"k": None}},
        content_type="text/plain",
        priority=4,
        correlation_id="c1",
        reply_to="r",
        expiration=5,
        timestamp=1_700_000_000,
        type="t",
        app_id="app",
        message_id="m-1",
    )
    envelope = envelope_of("ex", "rk", message)
    assert envelope.destination == "ex/rk" and envelope.body == b"body"
    assert envelope.message_id == "m-1"
    raw = base64.b64decode(envelope.headers[AMQP_PROPERTIES_HEADER])
    assert raw == message.properties.marshal()
    props = pika.BasicProperties()
    props.decode(raw)  # what msgsafe's RabbitMQ adapter reads
    assert props.headers == {"n": 3, "s": "x", "big": 2**40, "list": [1, "a"], "table": {"k": None}}
    assert (props.priority, props.expiration, props.type, props.timestamp) == (
        4,
        "5000",
        "t",
        1_700_000_000,
    )
    assert message.message_id == "m-1"


def test_a_message_without_id_gets_a_new_one_and_is_not_changed() -> None:
    message = aio_pika.Message(b"x")
    first, second = envelope_of("", "q", message), envelope_of("", "q", message)
    assert first.message_id != second.message_id and first.destination == "q"
    assert message.message_id is None


def test_float_headers_are_refused_before_anything_is_sent() -> None:
    with pytest.raises(TypeError, match="float"):
        envelope_of("", "q", aio_pika.Message(b"x", headers={"a": {"b": [1.5]}}))
    with pytest.raises(TypeError):  # pamqp's own refusal, as aio-pika's publish
        envelope_of("", "q", aio_pika.Message(b"x", headers={"a": object()}))  # type: ignore[dict-item]


def test_errors_map_to_the_exceptions_aio_pika_raises() -> None:
    missing = publish_error(Unroutable("no such exchange: 'nope'"))
    assert isinstance(missing, aiormq.exceptions.ChannelNotFoundEntity)
    assert "no exchange 'nope'" in str(missing)
    too_big = publish_error(MessageTooLarge("big"))
    assert isinstance(too_big, aiormq.exceptions.ChannelPreconditionFailed)
    assert isinstance(
        publish_error(AuthenticationError("no")), aiormq.exceptions.ProbableAuthenticationError
    )
    nacked = publish_error(Rejected("no"))
    assert type(nacked) is aiormq.exceptions.DeliveryError
    unsafe = UnsafeDestination("not durable")
    assert publish_error(unsafe) is unsafe


def test_a_returned_message_is_what_aio_pika_hands_return_callbacks() -> None:
    message = aio_pika.Message(b"back", headers={"h": "v"}, message_id="m-2")
    returned = returned_message(envelope_of("ex", "rk", message), "ex", "rk")
    incoming = aio_pika.IncomingMessage(returned, no_ack=True)
    assert (incoming.body, incoming.headers, incoming.message_id) == (b"back", {"h": "v"}, "m-2")
    assert (incoming.exchange, incoming.routing_key) == ("ex", "rk")
    assert isinstance(returned.delivery, aiormq.spec.Basic.Return)
    assert returned.delivery.reply_code == 312


# --- publishing on the memory broker ----------------------------------------------------------


def test_publish_is_confirmed_and_returns_an_ack_with_the_receipt(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def main() -> Any:
        exchange = await _exchange(memory_broker, tmp_path)
        try:
            first = await exchange.publish(aio_pika.Message(b"one"), "q")
            second = await exchange.publish(aio_pika.Message(b"two"), "q", timeout=2)
            return first, second
        finally:
            await _close(exchange)

    first, second = _run(main)
    assert isinstance(first, aiormq.spec.Basic.Ack) and isinstance(first, PublishAck)
    assert (first.delivery_tag, second.delivery_tag) == (1, 2)
    assert first.receipt.status is Status.CONFIRMED
    assert [m.body for m in memory_broker.messages("q")] == [b"one", b"two"]


def test_many_concurrent_publishes_all_confirmed(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def main() -> list[Any]:
        exchange = await _exchange(memory_broker, tmp_path, robust=True)
        try:
            return await asyncio.gather(
                *(exchange.publish(aio_pika.Message(str(i).encode()), "q") for i in range(500))
            )
        finally:
            await _close(exchange)

    acks = _run(main)
    assert all(a.receipt.status is Status.CONFIRMED for a in acks)
    assert sorted(int(m.body) for m in memory_broker.messages("q")) == list(range(500))


def test_a_hanging_broker_costs_at_most_the_deadline_and_the_message_is_stored(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    memory_broker.delay_confirms(3.0)

    async def main() -> tuple[list[Any], list[float], int]:
        exchange = await _exchange(memory_broker, tmp_path, robust=True)
        acks, took = [], []
        try:
            for i in range(3):
                start = time.monotonic()
                acks.append(await exchange.publish(aio_pika.Message(b"%d" % i), "q", timeout=1.0))
                took.append(time.monotonic() - start)
            return acks, took, exchange.channel._connection.producer.pending()
        finally:
            memory_broker.delay_confirms(0)
            await _close(exchange, wait=0.1)

    acks, took, pending = _run(main)
    assert [a.receipt.status for a in acks] == [Status.STORED] * 3
    # Within the 1 s timeout, far from the 3 s the broker hangs (slack: the scheduler's).
    assert max(took) < 1.5, took
    assert pending >= 3


def test_no_timeout_means_the_connection_deadline(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    memory_broker.delay_confirms(3.0)

    async def main() -> tuple[Any, float]:
        exchange = await _exchange(memory_broker, tmp_path, deadline=1.0)
        try:
            start = time.monotonic()
            ack = await exchange.publish(aio_pika.Message(b"x"), "q")
            return ack, time.monotonic() - start
        finally:
            memory_broker.delay_confirms(0)
            await _close(exchange, wait=0.1)

    ack, took = _run(main)
    assert ack.receipt.status is Status.STORED and took < 1.5, took  # not the 3 s hang


def test_a_broker_that_is_down_stores_at_once_and_the_outbox_forwards_later(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    memory_broker.refuse_writes()

    async def main() -> list[Any]:
        exchange = await _exchange(memory_broker, tmp_path, robust=True)
        try:
            acks = [
                await exchange.publish(aio_pika.Message(b"%d" % i), "q", timeout=2)
                for i in range(20)
            ]
            assert memory_broker.ids("q") == []
            memory_broker.accept_writes()
            return acks
        finally:
            await _close(exchange)  # drains the outbox

    acks = _run(main)
    assert {a.receipt.status for a in acks} == {Status.STORED}
    assert sorted(int(m.body) for m in memory_broker.messages("q")) == list(range(20))


def test_a_rejected_message_raises_delivery_error(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    memory_broker.reject_next(1)

    async def main() -> BaseException | None:
        exchange = await _exchange(memory_broker, tmp_path)
        try:
            try:
                await exchange.publish(aio_pika.Message(b"bad"), "q")
            except aio_pika.exceptions.DeliveryError as exc:
                return exc
            return None
        finally:
            await _close(exchange)

    error = _run(main)
    assert type(error) is aiormq.exceptions.DeliveryError
    assert isinstance(error.frame, aiormq.spec.Basic.Nack)


def test_without_an_outbox_a_missed_deadline_raises_timeout_error(
    memory_broker: MemoryBroker,
) -> None:
    memory_broker.delay_confirms(3.0)

    async def main() -> None:
        exchange = await _exchange(memory_broker, None)
        try:
            with pytest.raises(TimeoutError):
                await exchange.publish(aio_pika.Message(b"x"), "q", timeout=0.2)
        finally:
            memory_broker.delay_confirms(0)
            await _close(exchange, wait=0.1)

    _run(main)


def test_without_publisher_confirms_publish_returns_none(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def main() -> Any:
        exchange = await _exchange(memory_broker, tmp_path, publisher_confirms=False)
        try:
            return await exchange.publish(aio_pika.Message(b"x"), "q")
        finally:
            await _close(exchange)

    assert _run(main) is None
    assert memory_broker.count("q") == 1


def test_an_internal_exchange_and_a_closed_connection_refuse_as_aio_pika(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def main() -> None:
        exchange = await _exchange(memory_broker, tmp_path, "ex")
        exchange.internal = True
        with pytest.raises(ValueError, match="internal"):
            await exchange.publish(aio_pika.Message(b"x"), "rk")
        exchange.internal = False
        await exchange.channel._connection.close()
        with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
            await exchange.publish(aio_pika.Message(b"x"), "rk")

    _run(main)


def test_an_unsafe_destination_raises_before_anything_is_sent(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    memory_broker.set_guarantee("temp", Guarantee.NONE)

    async def main() -> None:
        exchange = await _exchange(memory_broker, tmp_path)
        try:
            with pytest.raises(UnsafeDestination):
                await exchange.publish(aio_pika.Message(b"x"), "temp")
        finally:
            await _close(exchange)

    _run(main)
    assert memory_broker.count("temp") == 0


def test_a_connection_made_by_aio_pika_is_refused() -> None:
    async def main() -> None:
        conn = aio_pika.Connection(URL("amqp://127.0.0.1:1/"))
        channel = conn.channel() if conn.transport else aio_pika.Channel(conn)
        with pytest.raises(RuntimeError, match="connect"):
            await aio_pika.Exchange(channel, "").publish(aio_pika.Message(b"x"), "q")

    _run(main)


def test_connect_refuses_a_non_positive_deadline() -> None:
    async def main() -> None:
        with pytest.raises(ConfigurationError):
            await aio_pika.connect("amqp://127.0.0.1:1/", publish_timeout=0)

    _run(main)


# --- the direct path (the caller's own channel) -------------------------------------------
#
# A stand-in for aio-pika's channel: the real one needs a broker (the integration tests
# run it on RabbitMQ); here each answer the channel can give is made on purpose.


class _Underlay:
    """aiormq's channel as the direct path uses it: ``basic_publish`` with an answer."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.published: list[tuple[bytes, str, str, Any, bool]] = []

    async def basic_publish(
        self,
        body: bytes,
        *,
        exchange: str,
        routing_key: str,
        properties: Any,
        mandatory: bool,
    ) -> Any:
        self.published.append((body, exchange, routing_key, properties, mandatory))
        if self.answer == "hang":
            # No timeout is passed: the publish's own deadline must end this wait.
            await asyncio.Event().wait()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


_Publish = Callable[[bytes], Awaitable[Any]]


def _direct_scenario(
    broker: MemoryBroker,
    tmp_path: Path,
    answer: Any,
    scenario: Callable[[Publisher, _Underlay, _Publish], Awaitable[None]],
    *,
    deadline: float = 5.0,
    expose: Callable[[Callable[[bytes, float], Awaitable[Any]]], None] | None = None,
) -> None:
    """Run ``scenario`` on an exchange whose channel answers the direct path with
    ``answer`` (its underlay; the scenario may change it); ``publish`` returns the
    receipt, or what the exchange returned when it is not a ``PublishAck``.
    ``expose`` receives ``publish(body, timeout)``, the exchange's own publish."""

    async def main() -> None:
        exchange = await _exchange(broker, tmp_path, deadline=deadline)
        underlay = _Underlay(answer)
        channel = exchange.channel

        async def get_underlay_channel() -> _Underlay:
            return underlay

        channel.can_publish = lambda: True
        channel.get_underlay_channel = get_underlay_channel
        publisher: Publisher = channel._connection.publisher

        async def publish(body: bytes) -> Any:
            result = await exchange.publish(aio_pika.Message(body), "q")
            return result.receipt if isinstance(result, PublishAck) else result

        if expose is not None:
            expose(
                lambda body, timeout: exchange.publish(aio_pika.Message(body), "q", timeout=timeout)
            )

        try:
            await scenario(publisher, underlay, publish)
        finally:
            broker.accept_writes()
            await asyncio.to_thread(publisher.close, 5.0)

    _run(main)


def test_a_confirmed_publish_goes_out_on_the_callers_channel_once_admitted(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def scenario(publisher: Publisher, underlay: _Underlay, publish: _Publish) -> None:
        first = await publish(b"one")  # the destination's check: msgsafe's path
        second = await publish(b"two")
        assert first.status is Status.CONFIRMED and second.status is Status.CONFIRMED
        assert [p[0] for p in underlay.published] == [b"two"]
        _body, exchange, routing_key, props, mandatory = underlay.published[0]
        assert (exchange, routing_key, mandatory) == ("", "q", True)
        assert props.delivery_mode == 2 and props.message_id == second.message_id
        assert props.timestamp is not None
        assert publisher.fast.accepted == 1

    _direct_scenario(memory_broker, tmp_path, pamqp_commands.Basic.Ack(delivery_tag=1), scenario)
    assert [m.body for m in memory_broker.messages("q")] == [b"one"]


def test_a_nack_on_the_callers_channel_goes_through_msgsafe_with_the_same_id(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def scenario(publisher: Publisher, underlay: _Underlay, publish: _Publish) -> None:
        await publish(b"one")
        second = await publish(b"two")
        assert second.status is Status.CONFIRMED
        assert underlay.published[0][3].message_id == second.message_id
        # msgsafe confirmed it with nothing in the outbox: the direct path is back.
        assert not publisher.fast.resting
        underlay.answer = pamqp_commands.Basic.Ack(delivery_tag=2)
        await publish(b"three")
        assert publisher.fast.accepted == 1

    nack = aiormq.exceptions.DeliveryError(None, pamqp_commands.Basic.Nack())
    _direct_scenario(memory_broker, tmp_path, nack, scenario)
    assert [m.body for m in memory_broker.messages("q")] == [b"one", b"two"]


def test_a_lost_channel_rests_the_direct_path_while_the_outbox_holds_messages(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def scenario(publisher: Publisher, underlay: _Underlay, publish: _Publish) -> None:
        await publish(b"one")
        memory_broker.refuse_writes()
        stored = await publish(b"two")
        assert stored.status is Status.STORED
        assert publisher.fast.resting
        underlay.answer = pamqp_commands.Basic.Ack(delivery_tag=2)
        third = await publish(b"three")  # resting: msgsafe's path, stored behind two
        assert third.status is Status.STORED
        assert len(underlay.published) == 1

    lost = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED")
    _direct_scenario(memory_broker, tmp_path, lost, scenario, deadline=1.0)
    assert [m.body for m in memory_broker.messages("q")] == [b"one", b"two", b"three"]


def test_no_confirm_on_the_callers_channel_by_the_deadline_stores_the_message(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def scenario(publisher: Publisher, underlay: _Underlay, publish: _Publish) -> None:
        await publish(b"one")
        started = time.monotonic()
        stored = await publish(b"two")
        assert time.monotonic() - started < 1.0
        assert stored.status is Status.STORED
        assert len(underlay.published) == 1

    _direct_scenario(memory_broker, tmp_path, "hang", scenario, deadline=0.5)
    assert [m.body for m in memory_broker.messages("q")] == [b"one", b"two"]


def test_the_deadline_keeps_each_publish_and_leaves_the_callers_cancellation_alone(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def scenario(publisher: Publisher, underlay: _Underlay, publish: _Publish) -> None:
        await publish(b"one")
        underlay.answer = "hang"
        # Publishes in flight with different deadlines (one timer serves them all):
        # each is stored when its own deadline passes, not at the earliest's.
        started = time.monotonic()
        done_at: dict[bytes, float] = {}

        async def timed(body: bytes, timeout: float) -> Any:
            result = await exchange_publish(body, timeout)
            done_at[body] = time.monotonic() - started
            return result

        exchange_publish = publisher_exchange[0]
        # NOTE: deadlines of 0.6 and 1.6 s: each keeps a fifth for the outbox write
        # (0.12 and 0.32 s); at 0.3 s a CI machine's late loop once left 0.35 ms of it.
        results = await asyncio.gather(timed(b"late", 1.6), timed(b"soon", 0.6))
        assert [r.receipt.status for r in results] == [Status.STORED, Status.STORED]
        assert done_at[b"soon"] < 1.2 <= done_at[b"late"] < 3.0
        assert not publisher.deadlines._watched  # nothing left watched
        # The caller's own cancellation propagates (nothing of it is taken back).
        publisher.fast.resting = False
        publisher._missed_until = 0.0
        sent = len(underlay.published)
        task = asyncio.ensure_future(exchange_publish(b"cancelled", 5.0))
        deadline = time.monotonic() + 5.0
        while len(underlay.published) == sent and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        assert len(underlay.published) == sent + 1  # awaiting on the caller's channel
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not publisher.deadlines._watched

    publisher_exchange: list[Callable[[bytes, float], Awaitable[Any]]] = []
    _direct_scenario(
        memory_broker,
        tmp_path,
        pamqp_commands.Basic.Ack(delivery_tag=1),
        scenario,
        expose=publisher_exchange.append,
    )
    # Stored as each deadline passed; the cancelled publish is the caller's to repeat.
    assert [m.body for m in memory_broker.messages("q")] == [b"one", b"soon", b"late"]


def test_a_return_on_the_callers_channel_is_the_callers_as_in_aio_pika(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    returned = returned_message(envelope_of("", "q", aio_pika.Message(b"x")), "", "q")

    async def scenario(publisher: Publisher, underlay: _Underlay, publish: _Publish) -> None:
        await publish(b"one")
        assert await publish(b"two") is returned
        underlay.answer = aiormq.exceptions.PublishError(returned, returned.delivery)
        with pytest.raises(aiormq.exceptions.PublishError):
            await publish(b"three")
        assert not publisher.fast.resting

    _direct_scenario(memory_broker, tmp_path, returned, scenario)
    assert [m.body for m in memory_broker.messages("q")] == [b"one"]


def test_a_message_over_the_size_limit_is_refused_whichever_path_it_would_take(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    async def scenario(publisher: Publisher, underlay: _Underlay, publish: _Publish) -> None:
        await publish(b"one")
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):  # MessageTooLarge
            await publish(b"x" * (9 << 20))
        assert underlay.published == []

    _direct_scenario(memory_broker, tmp_path, pamqp_commands.Basic.Ack(delivery_tag=1), scenario)

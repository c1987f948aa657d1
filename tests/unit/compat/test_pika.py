"""msgsafe.compat.pika: parameters to URL, and basic_publish against the memory broker
(blocking until confirmed or stored, properties carried whole, failures raised as pika's
exceptions for that message; the pipelined opt-in reports them later)."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pika as real_pika
import pytest

from msgsafe.adapters.rabbitmq._wire import carried_properties
from msgsafe.compat import pika
from msgsafe.compat._pika_config import connection_url, publish_error
from msgsafe.compat.pika._channel import encode_properties
from msgsafe.compat.pika._fast import FastPublisher, fast_properties
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError, MessageTooLarge, Rejected, Unroutable
from msgsafe.message import AMQP_PROPERTIES_HEADER, Envelope
from msgsafe.testing import MemoryBroker


def _connection(
    broker: MemoryBroker, tmp_path: Path, *, pipelined: bool = False
) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(host="127.0.0.1", port=1)
    return pika.BlockingConnection(
        params,
        outbox=tmp_path / "outbox.sqlite3",
        pipelined=pipelined,
        _url=f"memory://{broker.name}",
    )


def _props(envelope: Envelope) -> real_pika.BasicProperties:
    props = real_pika.BasicProperties()
    props.decode(base64.b64decode(envelope.headers[AMQP_PROPERTIES_HEADER]))
    return props


# --- parameters ----------------------------------------------------------------------------


def test_the_module_is_pika_with_one_class_replaced() -> None:
    assert pika.BasicProperties is real_pika.BasicProperties
    assert pika.exceptions.UnroutableError is real_pika.exceptions.UnroutableError
    assert pika.BlockingConnection is not real_pika.BlockingConnection
    from msgsafe.compat.pika import exceptions

    assert exceptions.NackError is real_pika.exceptions.NackError
    assert set(exceptions.__all__) >= {"AMQPError", "ChannelWrongStateError", "UnroutableError"}


def test_the_channel_is_a_pika_blocking_channel_overriding_every_public_name() -> None:
    real = real_pika.adapters.blocking_connection.BlockingChannel
    assert issubclass(pika.BlockingChannel, real)
    public = {n for n in dir(real) if not n.startswith("_")} | {"__enter__", "__exit__", "__int__"}
    inherited = sorted(n for n in public if getattr(pika.BlockingChannel, n) is getattr(real, n))
    assert inherited == []


@pytest.mark.parametrize(
    "props",
    [
        real_pika.BasicProperties(),
        real_pika.BasicProperties(
            content_type="a/b",
            headers={"int": 1, "none": None, "bytes": b"\xff", "list": [1, "x"]},
            timestamp=5,
            priority=3,
            correlation_id="c",
            app_id="a",
            delivery_mode=1,
            message_id="theirs",
        ),
    ],
)
def test_the_direct_path_publishes_the_properties_the_adapter_would(
    props: real_pika.BasicProperties,
) -> None:
    envelope = Envelope.build(
        "q",
        b"x",
        headers={AMQP_PROPERTIES_HEADER: encode_properties(props)},
        message_id="m-1",
    )
    direct = fast_properties(props, "m-1", envelope.created_at)
    assert direct.__dict__ == carried_properties(envelope).__dict__
    assert props.message_id in (None, "theirs") and props.delivery_mode in (None, 1)  # unchanged


def test_a_list_of_parameters_becomes_a_host_list() -> None:
    creds = pika.PlainCredentials("u", "p@ss/word")
    params = [
        pika.ConnectionParameters("h1", 5673, credentials=creds, heartbeat=5),
        pika.ConnectionParameters("h2", 5674, credentials=creds),
        pika.ConnectionParameters("h1", 5673, credentials=creds),  # repeated: once
    ]
    url, options = connection_url(params)
    parsed = parse_url(url)
    assert [str(e) for e in parsed.endpoints] == ["h1:5673", "h2:5674"]
    assert parsed.path == "/" and parsed.username == "u"
    assert parsed.password is not None and parsed.password.reveal() == "p@ss/word"
    assert options["heartbeat"] == 5


def test_url_parameters_and_vhost() -> None:
    url, _ = connection_url([pika.URLParameters("amqp://a:b@h:1234/prod")])
    assert url == "amqp://a:b@h:1234/prod"


def test_mixed_credentials_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="same credentials"):
        connection_url(
            [
                pika.ConnectionParameters("h1", credentials=pika.PlainCredentials("a", "b")),
                pika.ConnectionParameters("h2", credentials=pika.PlainCredentials("c", "d")),
            ]
        )


def test_error_mapping() -> None:
    assert isinstance(publish_error(Unroutable("x"), []), pika.exceptions.UnroutableError)
    assert isinstance(publish_error(Rejected("x"), []), pika.exceptions.NackError)
    assert isinstance(publish_error(MessageTooLarge("x"), []), pika.exceptions.NackError)


# --- publishing ----------------------------------------------------------------------------


def test_publish_blocks_until_confirmed_and_carries_every_property(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    conn = _connection(memory_broker, tmp_path)
    ch = conn.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(
        content_type="application/json",
        correlation_id="c-1",
        app_id="legacy",
        priority=3,
        headers={"n": 1, "none": None, "raw": b"\xff\xfe", "nested": {"a": [1, 2]}},
        message_id="order-1",
        delivery_mode=1,
    )
    ch.basic_publish("", "tasks", b"one", properties=props)
    [one] = memory_broker.messages("tasks")  # there when basic_publish returned
    assert one.message_id == "order-1" and one.body == b"one"
    carried = _props(one)
    assert carried.content_type == "application/json" and carried.priority == 3
    assert carried.correlation_id == "c-1" and carried.app_id == "legacy"
    assert carried.headers == {"n": 1, "none": None, "raw": b"\xff\xfe", "nested": {"a": [1, 2]}}
    ch.basic_publish("ex", "rk", "two")  # str body, exchange/routing-key destination
    assert [m.body for m in memory_broker.messages("ex/rk")] == [b"two"]
    conn.close()
    assert conn.is_closed and ch.is_closed


def test_refused_messages_are_stored_without_an_exception_and_forwarded_on_close(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    conn = _connection(memory_broker, tmp_path)
    ch = conn.channel()
    memory_broker.refuse_writes()
    for i in range(20):
        ch.basic_publish("", "q", str(i).encode())
    assert conn.producer.pending() == 20 and memory_broker.ids("q") == []  # stored on return
    memory_broker.accept_writes()
    conn.close()  # the outbox gets its chance to forward
    assert sorted(int(m.body) for m in memory_broker.messages("q")) == list(range(20))


def test_rejected_message_raises_nack_error_from_its_own_publish(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    conn = _connection(memory_broker, tmp_path)
    ch = conn.channel()
    memory_broker.reject_next(1)
    with pytest.raises(pika.exceptions.NackError) as info:
        ch.basic_publish("", "q", b"bad")
    assert info.value.messages == []  # as pika: only returned messages are listed
    assert isinstance(info.value.__cause__, Rejected)
    ch.basic_publish("", "q", b"good")
    conn.close()
    assert [m.body for m in memory_broker.messages("q")] == [b"good"]


def test_pipelined_mode_reports_a_failure_from_a_later_call(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    conn = _connection(memory_broker, tmp_path, pipelined=True)
    ch = conn.channel()
    memory_broker.reject_next(1)
    ch.basic_publish("", "q", b"bad")
    with pytest.raises(pika.exceptions.NackError):
        ch.wait_for_confirms(5)
    memory_broker.reject_next(1)
    ch.basic_publish("", "q", b"bad again")
    with pytest.raises(pika.exceptions.NackError):
        conn.close()
    assert conn.is_closed
    with pytest.raises(pika.exceptions.ChannelWrongStateError):
        ch.basic_publish("", "q", b"x")


def test_transactions_hold_messages_until_commit(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    conn = _connection(memory_broker, tmp_path)
    ch = conn.channel()
    assert isinstance(ch.tx_select().method, pika.spec.Tx.SelectOk)
    ch.basic_publish("", "q", b"dropped")
    assert isinstance(ch.tx_rollback().method, pika.spec.Tx.RollbackOk)
    ch.basic_publish("", "q", b"kept")
    assert memory_broker.ids("q") == []
    assert isinstance(ch.tx_commit().method, pika.spec.Tx.CommitOk)
    assert [m.body for m in memory_broker.messages("q")] == [b"kept"]
    conn.close()


def test_closing_twice_raises_wrong_state_like_pika(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    conn = _connection(memory_broker, tmp_path)
    ch = conn.channel()
    ch.close()
    with pytest.raises(pika.exceptions.ChannelWrongStateError):
        ch.close()
    conn.close()
    with pytest.raises(pika.exceptions.ConnectionWrongStateError):
        conn.close()
    with conn:  # like pika, leaving a closed connection's block does not raise
        pass


def test_sleep_and_process_data_events_wait(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    conn = _connection(memory_broker, tmp_path)
    started = time.monotonic()
    conn.sleep(0.2)
    conn.process_data_events(time_limit=0.2)
    assert time.monotonic() - started >= 0.4
    assert conn.publisher_confirms_supported
    conn.close()


def test_bad_input_raises_like_pika(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    conn = _connection(memory_broker, tmp_path)
    ch = conn.channel()
    with pytest.raises(TypeError):
        ch.basic_publish("", "q", 42)  # type: ignore[arg-type]
    with pytest.raises(pika.exceptions.UnsupportedAMQPFieldException):
        ch.basic_publish("", "q", b"x", pika.BasicProperties(headers={"t": object()}))
    conn.close()


def test_a_queue_that_loses_confirmed_messages_is_refused_unless_require_any(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    from msgsafe.errors import UnsafeDestination
    from msgsafe.message import Guarantee

    memory_broker.set_guarantee("hello", Guarantee.NONE)
    conn = _connection(memory_broker, tmp_path)
    ch = conn.channel()
    ch.confirm_delivery()
    # As pika reports a refused publish in confirm mode, with msgsafe's reason as cause.
    with pytest.raises(real_pika.exceptions.NackError) as caught:
        ch.basic_publish("", "hello", b"one")
    assert isinstance(caught.value.__cause__, UnsafeDestination)
    assert memory_broker.count("hello") == 0
    conn.close()
    relaxed = pika.BlockingConnection(
        pika.ConnectionParameters(host="127.0.0.1", port=1),
        outbox=tmp_path / "relaxed.sqlite3",
        require="any",
        _url=f"memory://{memory_broker.name}",
    )
    channel = relaxed.channel()
    channel.confirm_delivery()
    channel.basic_publish("", "hello", b"one")
    assert memory_broker.count("hello") == 1
    relaxed.close()


# --- the fast path (the caller's own channel) ------------------------------------------------


class _FastChannel:
    """A real pika channel as FastPublisher uses it: ``answer`` says how it publishes."""

    def __init__(self) -> None:
        self.is_open = True
        self.answer: BaseException | None = None
        self.published: list[bytes] = []

    def confirm_delivery(self) -> None:
        pass

    def basic_publish(self, exchange: str, key: str, body: bytes, props: Any, **_: Any) -> None:
        if self.answer is not None:
            raise self.answer
        self.published.append(body)


class _FastConnection:
    """What FastPublisher reads of the wrapper connection: its real connection's thread,
    its real connection, and msgsafe's producer (here only its backlog)."""

    def __init__(self) -> None:
        self._real_thread = None
        self.channel_made = _FastChannel()
        self.backlog = 0
        self.producer = self

    def _real_connection(self) -> Any:
        return self

    def channel(self) -> _FastChannel:
        return self.channel_made

    def pending(self) -> int:
        return self.backlog

    def guarantee(self, destination: str) -> None:
        raise AssertionError("the pika fast path does not check destinations itself")


def test_the_fast_path_rests_after_a_failure_until_msgsafe_confirms_with_nothing_stored() -> None:
    conn = _FastConnection()
    fast = FastPublisher(conn)  # type: ignore[arg-type]
    channel = conn.channel_made
    props = real_pika.BasicProperties()
    assert fast.publish("", "q", b"1", props)
    channel.answer = real_pika.exceptions.UnroutableError([])
    assert not fast.publish("", "q", b"2", props)
    assert not fast.path.resting  # a return: that message only, the broker answered
    channel.answer = real_pika.exceptions.AMQPConnectionError("gone")
    assert not fast.publish("", "q", b"3", props)
    assert fast.path.resting
    channel.answer = None
    assert not fast.publish("", "q", b"4", props)  # resting: msgsafe's producer takes it
    conn.backlog = 2
    fast.path.confirmed_safe()  # msgsafe confirmed, but two messages wait in the outbox
    assert not fast.publish("", "q", b"5", props)
    conn.backlog = 0
    fast.path.confirmed_safe()
    assert fast.publish("", "q", b"6", props)
    assert channel.published == [b"1", b"6"] and fast.path.accepted == 2

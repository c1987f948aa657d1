"""msgsafe.compat.pika: parameters to URL, and basic_publish against the memory broker
(pipelined, stored on refusal, failures raised as pika's exceptions with their messages)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pika as real_pika
import pytest

from msgsafe.compat import CompatWarning, pika
from msgsafe.compat._pika_config import connection_url, publish_error
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError, MessageTooLarge, Rejected, Unroutable
from msgsafe.testing import MemoryBroker


@pytest.fixture
def broker() -> Iterator[MemoryBroker]:
    b = MemoryBroker.install(MemoryBroker(f"pk-{uuid.uuid4().hex[:8]}"))
    yield b
    MemoryBroker.forget(b.name)


def _connection(broker: MemoryBroker, tmp_path: Path) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(host="127.0.0.1", port=1)
    return pika.BlockingConnection(
        params, outbox=tmp_path / "outbox.sqlite3", _url=f"memory://{broker.name}"
    )


# --- parameters ----------------------------------------------------------------------------


def test_the_module_is_pika_with_one_class_replaced() -> None:
    assert pika.BasicProperties is real_pika.BasicProperties
    assert pika.exceptions is real_pika.exceptions
    assert pika.BlockingConnection is not real_pika.BlockingConnection


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


def test_publish_is_confirmed_with_headers_and_message_id(
    broker: MemoryBroker, tmp_path: Path
) -> None:
    conn = _connection(broker, tmp_path)
    ch = conn.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(headers={"n": 1, "s": "x"}, message_id="order-1", delivery_mode=1)
    ch.basic_publish("", "tasks", b"one", properties=props)
    ch.basic_publish("ex", "rk", "two")  # str body, exchange/routing-key destination
    assert ch.wait_for_confirms(5)
    [one] = broker.messages("tasks")
    assert one.message_id == "order-1" and one.body == b"one"
    assert dict(one.headers) == {"n": "1", "s": "x"}
    assert [m.body for m in broker.messages("ex/rk")] == [b"two"]
    conn.close()
    assert conn.is_closed and ch.is_closed


def test_properties_not_carried_warn_once(broker: MemoryBroker, tmp_path: Path) -> None:
    conn = _connection(broker, tmp_path)
    ch = conn.channel()
    props = pika.BasicProperties(content_type="application/json")
    with pytest.warns(CompatWarning, match="content_type"):
        ch.basic_publish("", "q", b"x", properties=props)
    ch.basic_publish("", "q", b"x", properties=props)
    conn.close()


def test_refused_messages_are_stored_without_an_exception_and_forwarded_on_close(
    broker: MemoryBroker, tmp_path: Path
) -> None:
    conn = _connection(broker, tmp_path)
    ch = conn.channel()
    broker.refuse_writes()
    for i in range(20):
        ch.basic_publish("", "q", str(i).encode())
    assert ch.wait_for_confirms(5)
    assert conn.producer.pending() == 20 and broker.ids("q") == []
    broker.accept_writes()
    conn.close()  # the outbox gets its chance to forward
    assert sorted(int(m.body) for m in broker.messages("q")) == list(range(20))


def test_rejected_message_raises_nack_error_from_the_next_call(
    broker: MemoryBroker, tmp_path: Path
) -> None:
    conn = _connection(broker, tmp_path)
    ch = conn.channel()
    broker.reject_next(1)
    ch.basic_publish("", "q", b"bad")
    with pytest.raises(pika.exceptions.NackError) as info:
        ch.wait_for_confirms(5)
    [returned] = info.value.messages
    assert returned.body == b"bad" and returned.method.routing_key == "q"
    assert isinstance(info.value.__cause__, Rejected)
    ch.basic_publish("", "q", b"good")  # the failure was reported once
    conn.close()
    assert [m.body for m in broker.messages("q")] == [b"good"]


def test_failure_raised_by_close(broker: MemoryBroker, tmp_path: Path) -> None:
    conn = _connection(broker, tmp_path)
    ch = conn.channel()
    broker.reject_next(1)
    ch.basic_publish("", "q", b"bad")
    with pytest.raises(pika.exceptions.NackError):
        conn.close()
    assert conn.is_closed
    with pytest.raises(pika.exceptions.ChannelWrongStateError):
        ch.basic_publish("", "q", b"x")


def test_bad_input_raises_type_error(broker: MemoryBroker, tmp_path: Path) -> None:
    conn = _connection(broker, tmp_path)
    ch = conn.channel()
    with pytest.raises(TypeError):
        ch.basic_publish("", "q", 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ch.basic_publish("", "q", b"x", pika.BasicProperties(headers={"t": {"nested": 1}}))
    conn.close()

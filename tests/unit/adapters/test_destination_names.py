"""A destination name no broker of its protocol takes is refused before anything is sent
or stored, and a stored one (an outbox file older than the check) is quarantined with
the reason when forwarded, never left waiting.

- each adapter's ``check_destination``: AMQP 0-9-1 ``shortstr`` (255 bytes of UTF-8, for
  the queue, the exchange and the routing key of ``exchange/key``), Kafka's topic rule
  (249 characters of ``[a-zA-Z0-9._-]``, not "." or ".."), AMQP 1.0 (no NUL; the
  brokers' own address forms pass, however long);
- :func:`msgsafe.adapters.destination_check` asks once per name;
- ``send()`` to a refused name raises :class:`InvalidDestination` with the broker down
  (before: STORED), and nothing is stored;
- a stored row with such a name is quarantined with the reason by the next forward,
  through the producer's forwarder and through a bare forwarder of the transport.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from msgsafe import Producer
from msgsafe.adapters import destination_check, open_transport
from msgsafe.adapters.amqp10.config import check_destination as amqp10_check
from msgsafe.adapters.kafka.config import check_destination as kafka_check
from msgsafe.adapters.memory.config import check_destination as memory_check
from msgsafe.adapters.rabbitmq.config import check_destination as rabbit_check
from msgsafe.cluster._process import free_port
from msgsafe.endpoints import parse_url
from msgsafe.errors import (
    ConfigurationError,
    InvalidDestination,
    InvalidMessage,
    PermanentError,
)
from msgsafe.message import Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox
from tests.support.waiting import wait_until

Check = Callable[[str], None]


def refused(check: Check, name: str) -> str | None:
    """The refusal's text, or None when ``check`` takes ``name``."""
    try:
        check(name)
    except InvalidDestination as exc:
        return str(exc)
    return None


# --- the rules, one protocol at a time --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("q" * 255, True),
        ("q" * 256, False),
        ("é" * 127 + "q", True),  # 255 bytes of UTF-8 in 128 characters
        ("é" * 128, False),  # 256 bytes in 128 characters: bytes count, not characters
        ("€" * 85, True),  # 255 bytes, 3 each
        ("€" * 85 + "q", False),
        ("amq.topic/" + "k" * 255, True),  # exchange/routing-key: each part its own limit
        ("amq.topic/" + "k" * 256, False),
        ("x" * 255 + "/key", True),
        ("x" * 256 + "/key", False),
        ("amq.direct/", True),  # an empty routing key is a routing key
        ("/key", False),  # no exchange before '/'
    ],
)
def test_amqp091_names_are_shortstr(name: str, ok: bool) -> None:
    text = refused(rabbit_check, name)
    assert (text is None) is ok, text
    if not ok and len(name.encode()) > 255:
        assert "at most 255 bytes" in text  # type: ignore[operator]
        assert name not in text  # type: ignore[operator]  # a long name is cut in the text


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("t" * 249, True),
        ("t" * 250, False),
        ("orders.v1_EU-2", True),
        ("orders v1", False),
        ("orders/v1", False),
        ("ordérs", False),  # one character, two bytes: not a legal character at all
        (".", False),
        ("..", False),
        ("...", True),
    ],
)
def test_kafka_topics_follow_kafkas_rule(name: str, ok: bool) -> None:
    text = refused(kafka_check, name)
    assert (text is None) is ok, text


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a\x00b", False),  # proton would attach to "a"
        ("/amq/queue/" + "q" * 300, True),  # the broker decides what its forms allow
        ("/exchange/" + "x" * 300 + "/key", True),
        ("jms.queue.orders", True),
        ("é" * 5000, True),
        ("queue with spaces", True),
    ],
)
def test_amqp10_addresses_refuse_only_what_proton_cannot_send(name: str, ok: bool) -> None:
    text = refused(amqp10_check, name)
    assert (text is None) is ok, text


def test_the_memory_broker_takes_any_name() -> None:
    assert refused(memory_check, "q" * 10_000 + " /\x00") is None


def test_the_refusal_is_an_invalid_message_and_a_configuration_error() -> None:
    """Permanent for the message (send raises, the forwarder quarantines), and still what
    a receiver raised for such a name before."""
    assert issubclass(InvalidDestination, InvalidMessage)
    assert issubclass(InvalidDestination, PermanentError)
    assert issubclass(InvalidDestination, ConfigurationError)


def test_the_registry_asks_the_adapter_once_per_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import msgsafe.adapters.rabbitmq as rabbitmq

    asked: list[str] = []

    def counting(name: str) -> None:
        asked.append(name)
        rabbit_check(name)

    monkeypatch.setattr(rabbitmq, "check_destination", counting)
    check = destination_check("rabbitmq")
    for _ in range(3):
        check("orders")
        with pytest.raises(InvalidDestination) as caught:
            check("q" * 300)
    assert asked == ["orders", "q" * 300]
    assert caught.value.message_id is None and caught.value.__traceback__ is not None


# --- send: refused before anything is stored -------------------------------------------------


@pytest.fixture
def down_rabbit() -> str:
    """An AMQP 0-9-1 URL where nothing listens: every send would be STORED."""
    return f"amqp://127.0.0.1:{free_port()}/?connect_timeout=0.5"


@pytest.mark.parametrize("name", ["q" * 300, "é" * 128, "amq.topic/" + "k" * 256])
def test_send_to_a_name_amqp091_cannot_carry_raises_and_stores_nothing(
    down_rabbit: str, tmp_path: Path, name: str
) -> None:
    path = tmp_path / "outbox.sqlite3"
    with Producer(down_rabbit, outbox=str(path), send_timeout=5) as producer:
        with pytest.raises(InvalidDestination, match="at most 255 bytes") as caught:
            producer.send(name, b"never stored")
        assert caught.value.message_id  # names the message the caller still owns
        with pytest.raises(InvalidDestination):
            producer.send_batch(name, [b"a", b"b"])
        assert producer.pending() == 0
        # A good name still goes where it always went: to the outbox, the broker down.
        receipt = producer.send("orders", b"stored")
        assert receipt.status.name == "STORED"
        assert producer.pending() == 1


# --- a stored bad name: quarantined on the next forward --------------------------------------


@pytest.fixture
def old_file(tmp_path: Path, down_rabbit: str) -> Iterator[tuple[Path, str, str]]:
    """An outbox file for the down broker holding a 300-byte queue name, as a version
    that stored such names left it; yields (path, url, the row's id)."""
    path = tmp_path / "old.sqlite3"
    store = SqliteOutbox(path, target=parse_url(down_rabbit).redacted())
    envelope = Envelope.build("q" * 300, b"stored by an older version")
    store.put([envelope])
    store.close()
    yield path, down_rabbit, envelope.message_id


def test_the_producers_forwarder_quarantines_a_stored_bad_name(
    old_file: tuple[Path, str, str],
) -> None:
    path, url, message_id = old_file
    with Producer(url, outbox=str(path)) as producer:
        store = producer.outbox
        assert store is not None
        wait_until(
            lambda: store.stats().quarantined == 1,
            20.0,
            "the stored bad name is quarantined",
            diagnose=lambda: f"{store.stats()}, {store.list(limit=1)}",
        )
        assert store.stats().depth == 0
        (entry,) = store.quarantined(limit=5)
        assert entry.envelope.message_id == message_id
        assert entry.error.startswith("InvalidDestination: ")
        assert "at most 255 bytes" in entry.error


def test_a_bare_forwarder_quarantines_what_the_transport_refuses_by_name(
    old_file: tuple[Path, str, str],
) -> None:
    """No admit hook (a forwarder of the transport alone): the RabbitMQ transport's own
    refusal of the name is permanent, so the row is quarantined, not released."""
    path, url, message_id = old_file
    store = SqliteOutbox(path)
    transport = open_transport(parse_url(url), {})
    try:
        forwarder = Forwarder(store, transport)
        assert forwarder.drain(10.0) == 0
        (entry,) = store.quarantined(limit=5)
        assert entry.envelope.message_id == message_id
        assert "at most 255 bytes" in entry.error
    finally:
        transport.close(1.0)
        store.close()

"""Declarations a message carries, and what a returned message fails with, without a broker.

The broker's side (RabbitMQ's answers, a queue whose node is down) is in
``tests/integration/rabbitmq/test_queue_node_down.py`` and
``tests/integration/compat/test_celery.py``.
"""

from __future__ import annotations

import base64

import pika
import pytest

from msgsafe.adapters.rabbitmq._side import node_down
from msgsafe.adapters.rabbitmq._wire import envelope_properties
from msgsafe.adapters.rabbitmq.declarations import DECLARE_HEADER, Declaration, decode, encode
from msgsafe.adapters.rabbitmq.transport import _return_error
from msgsafe.errors import InvalidMessage, Refused, Unroutable
from msgsafe.message import AMQP_PROPERTIES_HEADER, Envelope

DOWN = "NOT_FOUND - home node 'rabbit@h2' of durable queue 'q' in vhost '/' is down or inaccessible"


def test_declarations_round_trip_in_order() -> None:
    made = (
        Declaration("exchange", "ex", type="topic"),
        Declaration("queue", "q", arguments={"x-queue-type": "quorum", "x-expires": 60000}),
        Declaration("bind", "q", source="ex", routing_key="a.#"),
    )
    assert decode(encode(made)) == made


def test_a_declaration_argument_json_cannot_carry_is_refused() -> None:
    with pytest.raises(InvalidMessage):
        encode([Declaration("queue", "q", arguments={"x-message-ttl": 1.5})])
    with pytest.raises(InvalidMessage):
        decode('[{"kind": "drop", "name": "q"}]')


def test_the_declarations_header_is_not_published() -> None:
    header = encode([Declaration("queue", "q")])
    plain = Envelope.build("q", b"x", headers={DECLARE_HEADER: header, "a": "b"})
    props = envelope_properties(plain)
    assert props.headers is not None
    assert DECLARE_HEADER not in props.headers and props.headers["a"] == "b"
    raw = base64.b64encode(b"".join(pika.BasicProperties(priority=3).encode())).decode()
    carried = Envelope.build(
        "ex/q", b"x", headers={AMQP_PROPERTIES_HEADER: raw, DECLARE_HEADER: header}
    )
    props = envelope_properties(carried)
    assert props.priority == 3
    assert not props.headers or DECLARE_HEADER not in props.headers


def test_node_down_reads_rabbitmqs_words() -> None:
    assert node_down(404, DOWN) == "rabbit@h2"
    assert node_down(404, "NOT_FOUND - no queue 'q' in vhost '/'") is None
    assert node_down(406, DOWN) is None


@pytest.mark.parametrize(
    ("answers", "expected", "words"),
    [
        ({"q": ("missing", "")}, Unroutable, "no such queue 'q'"),
        ({"q": ("down", DOWN)}, Refused, "home node rabbit@h2 is down"),
        ({"q": ("unknown", "")}, Refused, "could not be asked"),
        ({"q": ("exists", "")}, Refused, "runs again"),
    ],
)
def test_a_returned_message_to_a_queue_fails_by_what_the_broker_said(
    answers: dict[str, tuple[str, str]], expected: type[Exception], words: str
) -> None:
    error = _return_error("q", True, answers, "127.0.0.1:5672", "id-1")  # type: ignore[arg-type]
    assert type(error) is expected and words in str(error)
    assert error.message_id == "id-1"


def test_a_returned_message_to_an_exchange_whose_queues_exist_is_unroutable() -> None:
    error = _return_error("ex/k", False, {"q": ("exists", "")}, "e", "id-2")
    assert isinstance(error, Unroutable) and "no queue bound for 'ex/k'" in str(error)

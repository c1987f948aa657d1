"""msgsafe.compat.celery: the task message is kombu's own (what a worker's py-amqp decodes
is the same), its id is the task id, ``delay``/``apply_async``/``send_task``/canvas go
through msgsafe (the memory broker here), failures are raised as kombu's, and the
broker URL is the app's."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import amqp  # type: ignore[import-untyped]
import pytest
from amqp.serialization import decode_properties_basic  # type: ignore[import-untyped]
from celery import Celery, chain, group  # type: ignore[import-untyped]
from kombu.exceptions import OperationalError
from kombu.transport.pyamqp import Channel as PyamqpChannel
from pika.spec import BasicProperties

from msgsafe.adapters.rabbitmq._wire import carried_properties
from msgsafe.compat import celery as compat_celery
from msgsafe.compat._celery_message import broker_url, kombu_message, task_id_of
from msgsafe.errors import ConfigurationError, InvalidMessage
from msgsafe.message import AMQP_PROPERTIES_HEADER, Envelope
from msgsafe.testing import MemoryBroker
from tests.support.waiting import wait_until

#: A broker address nothing listens on: the declare step is refused at once.
NOWHERE = "amqp://guest:guest@127.0.0.1:1//"


def _app(**conf: Any) -> Celery:
    app = Celery("unit", broker=NOWHERE, set_as_current=False)
    app.conf.update({"task_send_sent_event": False, **conf})

    @app.task(name="unit.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    return app


def _install(app: Celery, broker: MemoryBroker, tmp_path: Path, **options: Any) -> Any:
    return compat_celery.install(
        app, url=f"memory://{broker.name}", outbox=tmp_path / "outbox.sqlite3", **options
    )


def _props(envelope: Envelope) -> BasicProperties:
    props = BasicProperties()
    props.decode(base64.b64decode(envelope.headers[AMQP_PROPERTIES_HEADER]))
    return props


def _worker_view(raw: bytes) -> dict[str, Any]:
    """What a Celery worker's py-amqp decodes from encoded basic properties."""
    decoded, _ = decode_properties_basic(raw, 0)
    return dict(decoded)


# --- the message ---------------------------------------------------------------------------


def _kombu_reference(body: Any, **options: Any) -> tuple[bytes, dict[str, Any]]:
    """What kombu's pyamqp transport puts on the wire for ``Producer.publish``: the body and
    the properties py-amqp would encode, as a worker decodes them."""
    sent: dict[str, Any] = {}

    class Channel:
        def prepare_message(self, *args: Any) -> Any:
            return PyamqpChannel.prepare_message(self, *args)  # type: ignore[arg-type]

        def basic_publish(self, message: Any, **kwargs: Any) -> None:
            sent["message"] = message

    from kombu import Producer

    Producer(Channel(), auto_declare=False).publish(body, **options)
    message: amqp.Message = sent["message"]
    raw = message._serialize_properties()
    body_bytes = message.body.encode("utf-8") if isinstance(message.body, str) else message.body
    return body_bytes, _worker_view(raw)


def test_the_message_is_kombus_own_as_a_worker_decodes_it() -> None:
    headers = {
        "lang": "py",
        "task": "unit.add",
        "id": "1d4c7a0e-aaaa-4bbb-8ccc-123456789abc",
        "timelimit": (30, None),
        "stamps": {"a": ["x", 1]},
        "eta": None,
        "retries": 0,
        "ignore_result": False,
    }
    options = {
        "exchange": "",
        "routing_key": "celery",
        "serializer": "json",
        "delivery_mode": 2,
        "headers": headers,
        "correlation_id": headers["id"],
        "reply_to": "reply-q",
        "priority": 5,
        "expiration": 12.5,
    }
    body = ((1, 2), {}, {"callbacks": None})
    ref_body, ref_props = _kombu_reference(body, **options)
    message = kombu_message(
        body,
        exchange="",
        routing_key="celery",
        headers=headers,
        options={
            k: v for k, v in options.items() if k not in ("exchange", "routing_key", "headers")
        },
    )
    assert message.body == ref_body
    assert (message.exchange, message.routing_key) == ("", "celery")
    ours = _worker_view(b"".join(message.properties.encode()))
    assert ours == ref_props
    assert task_id_of(message) == headers["id"]


def test_a_fractional_float_header_is_refused_and_a_whole_one_kept_as_int() -> None:
    with pytest.raises(InvalidMessage, match="float"):
        kombu_message(b"x", exchange="", routing_key="q", headers={"t": 1.5}, options={})
    message = kombu_message(b"x", exchange="", routing_key="q", headers={"t": 2.0}, options={})
    assert message.headers["t"] == 2 and type(message.headers["t"]) is int


def test_broker_url_lists_every_failover_host() -> None:
    app = Celery("u", broker="amqp://u:p%40@h1:5673/v;amqp://u:p%40@h2/v", set_as_current=False)
    assert broker_url(app.connection_for_write()) == "amqp://u:p%40@h1:5673,h2:5672/v"
    default = Celery("u", broker="pyamqp://", set_as_current=False)
    assert broker_url(default.connection_for_write()) == "amqp://guest:guest@localhost:5672/%2F"


def test_broker_url_refuses_another_transport() -> None:
    app = Celery("u", broker="memory://localhost/", set_as_current=False)
    with pytest.raises(ConfigurationError, match="RabbitMQ"):
        compat_celery.install(app)


# --- publishing through msgsafe --------------------------------------------------------------


def test_delay_is_confirmed_through_msgsafe_with_the_task_id(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    app = _app()
    publisher = _install(app, memory_broker, tmp_path)
    try:
        result = app.tasks["unit.add"].delay(2, 3)
        (envelope,) = memory_broker.messages("celery")
        assert envelope.message_id == result.id
        props = _props(envelope)
        assert props.headers["id"] == result.id and props.headers["task"] == "unit.add"
        assert props.correlation_id == result.id
        # What the RabbitMQ adapter publishes: the id in the native message_id as well.
        assert carried_properties(envelope).message_id == result.id
        assert props.content_type == "application/json"
        assert envelope.body.startswith(b"[[2, 3], {}")
        assert compat_celery.installed(app) == publisher
    finally:
        publisher.uninstall()


def test_send_task_canvas_and_routing_go_through_msgsafe(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    app = _app(task_routes={"unit.routed": {"queue": "other"}})
    publisher = _install(app, memory_broker, tmp_path)
    add = app.tasks["unit.add"]
    try:
        sent = app.send_task("unit.routed", (1,))
        grouped = group(add.s(i, i) for i in range(3)).apply_async()
        chained = chain(add.s(1, 1), add.s(2)).apply_async()
        assert memory_broker.ids("other") == [sent.id]
        ids = memory_broker.ids("celery")
        assert set(ids) == {r.id for r in grouped.results} | {chained.parent.id}
    finally:
        publisher.uninstall()


def test_broker_down_stores_the_task_and_forwards_it_later(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    app = _app()
    publisher = _install(app, memory_broker, tmp_path, connect_timeout=0.2)
    try:
        memory_broker.down()
        result = app.tasks["unit.add"].delay(1, 1)
        assert publisher.producer.pending() == 1
        memory_broker.up()
        assert publisher.producer.drain(10) == 0
        assert memory_broker.ids("celery") == [result.id]
    finally:
        publisher.uninstall()


def test_during_an_outage_tasks_go_straight_to_the_outbox_until_the_forwarder_gets_through(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    app = _app()
    publisher = _install(app, memory_broker, tmp_path, connect_timeout=0.2)
    add = app.tasks["unit.add"]
    try:
        memory_broker.down()
        first = add.delay(0, 0)
        rest = [add.delay(i, i) for i in range(1, 20)]
        producer = publisher.producer
        assert producer.stats().sent == 1  # the others never waited on the broker
        assert producer.pending() == 20
        memory_broker.up()
        wait_until(lambda: producer.pending() == 0, 30, "the outbox forwarded")
        # The publisher reads the forwarder's progress at most every 0.1 s: a drain that
        # quick is seen at the next reading.
        wait_until(lambda: not publisher._in_outage(producer), 5, "the outage seen over")
        after = add.delay(9, 9)
        assert producer.stats().confirmed == 1  # the outage is over: sent again
        ids = memory_broker.ids("celery")
        assert sorted(ids) == sorted([first.id, after.id, *(r.id for r in rest)])
    finally:
        publisher.uninstall()


def test_without_an_outbox_a_refusal_is_kombus_operational_error(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    app = _app()
    publisher = compat_celery.install(app, url=f"memory://{memory_broker.name}", outbox=False)
    try:
        memory_broker.refuse_writes()
        with pytest.raises(OperationalError, match="not published"):
            app.tasks["unit.add"].delay(1, 1)
    finally:
        publisher.uninstall()


def test_settings_give_the_defaults_and_uninstall_restores_celery(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    app = _app()
    original = app.amqp.send_task_message
    app.conf[compat_celery.SETTING] = {
        "url": f"memory://{memory_broker.name}",
        "outbox": tmp_path / "o.sqlite3",
    }
    publisher = compat_celery.install(app)
    assert app.amqp.send_task_message is not original
    app.tasks["unit.add"].delay(1, 2)
    assert memory_broker.count("celery") == 1
    assert "guest" not in repr(publisher)
    publisher.uninstall()
    assert app.amqp.send_task_message is original
    assert compat_celery.installed(app) is None


def test_the_task_sent_event_goes_to_the_real_producer(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    app = _app(task_send_sent_event=True)
    publisher = _install(app, memory_broker, tmp_path)
    events: list[dict[str, Any]] = []

    class Real:
        """A kombu producer's surface as send_task uses it."""

        connection = app.connection_for_write()
        channel = None

        def publish(self, body: Any, **kwargs: Any) -> None:
            events.append({"body": body, **kwargs})

    try:
        result = app.tasks["unit.add"].apply_async((1, 2), producer=Real())
        assert memory_broker.ids("celery") == [result.id]
        assert [e["body"]["type"] for e in events] == ["task-sent"]
    finally:
        publisher.uninstall()


def test_the_declarations_celery_makes_travel_with_the_task() -> None:
    """What kombu's ``maybe_declare`` makes for the task's queue (its exchange, the queue
    with its arguments, the binding), recorded in the envelope's declarations header."""
    from kombu import Exchange, Queue

    from msgsafe.adapters.rabbitmq.declarations import DECLARE_HEADER, Declaration, decode
    from msgsafe.compat._celery_message import declarations_of

    queue = Queue(
        "jobs",
        Exchange("work", type="topic"),
        routing_key="jobs.#",
        queue_arguments={"x-queue-type": "quorum"},
        max_length=10,
    )
    made = declarations_of([queue])
    assert made == (
        Declaration("exchange", "work", type="topic"),
        Declaration("queue", "jobs", arguments={"x-queue-type": "quorum", "x-max-length": 10}),
        Declaration("bind", "jobs", source="work", routing_key="jobs.#"),
    )
    message = kombu_message(
        b"{}", exchange="work", routing_key="jobs.1", headers={"id": "t-1"}, options={}
    )
    envelope = compat_celery.envelope_of(message, made)
    assert decode(envelope.headers[DECLARE_HEADER]) == made
    assert DECLARE_HEADER not in (carried_properties(envelope).headers or {})
    assert declarations_of([Queue("", Exchange("x"))]) == ()  # the broker names it


def test_direct_is_the_former_name_of_fast_path(tmp_path: Path) -> None:
    """``fast_path`` switches the caller's-thread path; ``direct`` still does, warned."""
    on = compat_celery.install(_app(), url="amqp://127.0.0.1:1", outbox=tmp_path / "a.db")
    with pytest.warns(DeprecationWarning, match="fast_path"):
        off = compat_celery.install(
            _app(), url="amqp://127.0.0.1:1", outbox=tmp_path / "b.db", direct=False
        )
    try:
        assert on._fast_enabled and not off._fast_enabled
        assert off.direct_sends == off.fast_sends == 0
    finally:
        on.uninstall()
        off.uninstall()

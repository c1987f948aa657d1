"""``proton.utils.BlockingConnection`` and msgsafe.compat.proton side by side on the
session's ActiveMQ Artemis pair: each scenario runs with each client and the wrapper must
observe what proton observes (see ``differential.py``). Senders are the side's own;
receiving goes through the side's ``create_receiver`` (a real proton receiver in both).

The real client's links carry the ``queue`` capability, as msgsafe's do (Artemis then
routes a new address to an anycast queue; without it, to nobody): both clients send to
the same kind of node. (RabbitMQ 3.10's AMQP 1.0 plugin does not answer a detach in
time for proton's blocking ``close()`` of a link, so this suite runs on Artemis.)"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import proton
import proton.utils
import pytest

from msgsafe.adapters.amqp10._wire import Capability
from msgsafe.cluster.artemis import ArtemisCluster
from msgsafe.compat import proton as compat
from msgsafe.message import Status
from tests.integration.compat.differential import Side, differ, sides

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore::msgsafe.compat.CompatWarning"),
]


def _side(name: str, cluster: ArtemisCluster, tmp_path: Path) -> Side:
    url = f"amqp://{cluster.user}:{cluster.password}@127.0.0.1:{cluster.ports[0]}"
    if name == "real":
        make: Callable[..., Any] = lambda: proton.utils.BlockingConnection(url, timeout=20)  # noqa: E731
        return Side("real", proton.utils, make, cluster)
    outbox = tmp_path / f"outbox-{uuid.uuid4().hex[:6]}.sqlite3"
    return Side(
        "wrapper",
        compat,
        lambda: compat.BlockingConnection(url, timeout=20, outbox=outbox),
        cluster,
    )


side, real = sides(_side, "artemis_pair")


def _address() -> str:
    return f"pdiff-{uuid.uuid4().hex[:8]}"


def _sender(s: Side, conn: Any, address: str | None) -> Any:
    if s.wrapped:
        return conn.create_sender(address)
    return conn.create_sender(address, options=Capability("queue"))


def _received(conn: Any, address: str, count: int) -> list[Any]:
    receiver = conn.create_receiver(address, credit=count, options=Capability("queue"))
    got = []
    for _ in range(count):
        message = receiver.receive(timeout=10)
        receiver.accept()
        got.append(message)
    receiver.close()
    return got


def test_send_with_properties_and_receive(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    def scenario(s: Side) -> Any:
        address = _address()
        seen: list[Any] = []
        conn = s.make()
        sender = _sender(s, conn, address)
        for i in range(3):
            sent = sender.send(
                proton.Message(
                    id=f"id-{i}",
                    body=b"\x00body-%d" % i,
                    properties={"text": "é", "n": str(i)},
                    durable=True,
                )
            )
            seen.append(("sent", sent.remote_state == proton.Delivery.ACCEPTED, sent.settled))
        for message in _received(conn, address, 3):
            seen.append(
                (
                    "received",
                    message.id,
                    bytes(message.body),
                    dict(message.properties or {}),
                    message.durable,
                )
            )
        sender.close()
        conn.close()
        conn.close()  # idempotent in both
        return seen

    def with_id_property(observed: Any) -> Any:
        """msgsafe adds its id as the application property ``msgsafe-id``."""
        return [
            (*o[:3], {**o[3], "msgsafe-id": o[1]}, o[4]) if o[0] == "received" else o
            for o in observed
        ]

    differ(request, side, real, scenario, intended=with_id_property)


def test_an_anonymous_sender_uses_each_message_address(
    request: pytest.FixtureRequest, side: Side, real: Side
) -> None:
    def scenario(s: Side) -> Any:
        address = _address()
        conn = s.make()
        sender = _sender(s, conn, None)
        sender.send(proton.Message(address=address, body=b"routed", durable=True))
        [message] = _received(conn, address, 1)
        conn.close()
        return bytes(message.body)

    differ(request, side, real, scenario)


def test_a_text_body(request: pytest.FixtureRequest, side: Side, real: Side) -> None:
    def scenario(s: Side) -> Any:
        address = _address()
        conn = s.make()
        _sender(s, conn, address).send(proton.Message(body="héllo", durable=True))
        [message] = _received(conn, address, 1)
        conn.close()
        body = message.body
        return (type(body).__name__, bytes(body) if not isinstance(body, str) else body)

    def as_data(observed: Any) -> Any:
        """msgsafe sends one data section: a str body arrives as its UTF-8 bytes."""
        return ("memoryview", observed[1].encode())

    differ(request, side, real, scenario, intended=as_data)


def test_no_broker_at_connect(request: pytest.FixtureRequest, side: Side, real: Side) -> None:
    def scenario(s: Side) -> Any:
        try:
            if s.wrapped:
                compat.BlockingConnection("amqp://127.0.0.1:1", timeout=3, outbox=False)
            else:
                proton.utils.BlockingConnection("amqp://127.0.0.1:1", timeout=3)
        except (proton.ConnectionException, proton.Timeout) as exc:
            return ("raised", isinstance(exc, proton.ConnectionException))
        return ("connected",)

    differ(request, side, real, scenario)


@pytest.mark.parametrize("fast_path", [True, False])
def test_fast_path_false_keeps_every_send_on_msgsafes_path(
    artemis_pair: ArtemisCluster, tmp_path: Path, fast_path: bool
) -> None:
    """Not a comparison: the wrapper's own switch. A confirm through msgsafe's producer
    (the first send's, with the outbox empty) must not turn on a path turned off."""
    url = f"amqp://{artemis_pair.user}:{artemis_pair.password}@127.0.0.1:{artemis_pair.ports[0]}"
    conn = compat.BlockingConnection(url, timeout=20, outbox=tmp_path / "o.db", fast_path=fast_path)
    try:
        sender = conn.create_sender(_address())
        statuses = [sender.send(proton.Message(body=b"%d" % i)).receipt for i in range(3)]
        assert all(r is not None and r.status is Status.CONFIRMED for r in statuses)
        assert conn.fast_sends == (3 if fast_path else 0)
    finally:
        conn.close()

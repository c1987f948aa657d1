"""A link's name is its connection's own (``Engine.link_name``), for senders and
receivers: Broker-J hands over a link whose name is still attached on an earlier
connection ("link stealing"), and once, with that connection dying, the new attach was
never answered (a chaos run's Qpid partition story waited for credit for three minutes).
Stand-in: an engine that records the links asked for, since the broker's handover cannot
be made to hang on demand."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from msgsafe.adapters.amqp10._connection import Engine
from msgsafe.adapters.amqp10.receiver import Subscriptions
from msgsafe.adapters.amqp10.transport import Sends
from msgsafe.message import Envelope


@dataclass
class _Container:
    container_id: str = "msgsafe-sender-1234"
    names: list[str] = field(default_factory=list)

    def create_sender(self, conn: Any, address: str, *, name: str, options: Any) -> object:
        self.names.append(name)
        return object()

    def create_receiver(self, conn: Any, address: str, *, name: str, options: Any) -> Any:
        self.names.append(name)
        return _Link()


class _Link:
    def flow(self, credit: int) -> None:
        pass


@dataclass
class _Engine:
    container: _Container = field(default_factory=_Container)
    conn: object = field(default_factory=object)
    generation: int = 1
    opened: bool = True
    fatal: Any = None
    closing: bool = False
    all_failed: bool = False
    link_options: list[Any] = field(default_factory=list)
    options: Any = field(default_factory=lambda: type("Options", (), {"credit": 10})())

    def link_name(self, address: str) -> str:
        return Engine.link_name(self, address)  # type: ignore[arg-type]

    def open_sender(self, address: str) -> Any:
        return Engine.open_sender(self, address)  # type: ignore[arg-type]

    def open_receiver(self, address: str) -> Any:
        return Engine.open_receiver(self, address)  # type: ignore[arg-type]

    def _watch_attach(self, link: Any) -> None:
        """The attach deadline is not this test's (the test peer's ``--mute-attach``)."""

    def call(self, fn: Any) -> bool:
        fn()
        return True


def test_each_connection_attaches_its_sender_under_a_name_of_its_own() -> None:
    engine = _Engine()
    sends = Sends()
    sends.bind(engine)  # type: ignore[arg-type]
    sends._enqueue(Envelope.build("orders", b"x"), Future(), time.monotonic() + 60)
    sends.opened()
    sends._links.clear()  # the connection was lost: links are attached again
    engine.generation = 2
    sends.opened()
    first, second = engine.container.names
    assert first != second
    assert all(n.startswith("msgsafe-sender-1234-orders") for n in (first, second))


def test_each_connection_attaches_its_receiver_under_a_name_of_its_own() -> None:
    engine = _Engine()
    subs = Subscriptions()
    subs.bind(engine)  # type: ignore[arg-type]
    subs.subscribe("orders")
    subs.lost()
    engine.generation = 2
    subs.opened()
    first, second = engine.container.names
    assert first != second
    assert all(n.startswith("msgsafe-sender-1234-orders") for n in (first, second))

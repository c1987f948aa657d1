"""The AMQP 1.0 receiver's give-backs, on stand-ins for proton's link and deliveries:
``release()`` and what ``close`` gives back unread settle as ``released`` (the broker's
delivery-count stays), ``nack()`` as ``modified`` with delivery-failed (counted), and on
RabbitMQ's plugin (first-acquirer marks redeliveries) both as ``released``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from proton import Delivery as ProtonDelivery
from proton import Message

from msgsafe.adapters.amqp10.receiver import Subscriptions


class _Source:
    address = "orders"


class _Link:
    LOCAL_ACTIVE = 2
    state = LOCAL_ACTIVE
    source = _Source()

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.credit_given = 0

    def recv(self, size: int) -> bytes:
        return self.frames.pop(0)

    def advance(self) -> None:
        pass

    def flow(self, credit: int) -> None:
        self.credit_given += credit


@dataclass
class _Local:
    failed: bool = False


@dataclass
class _ProtonDelivery:
    """What the receiver uses of a proton delivery: how it was settled."""

    link: _Link
    pending: int = 0
    aborted: bool = False
    readable: bool = True
    partial: bool = False
    local: _Local = field(default_factory=_Local)
    state: Any = None
    settled: bool = False

    def update(self, state: Any) -> None:
        self.state = state

    def settle(self) -> None:
        self.settled = True


@dataclass
class _Engine:
    first_acquirer_marks: bool = False
    generation: int = 1
    opened: bool = True
    stopped: bool = False
    closing: bool = False
    target: str = "amqp10://broker"

    def call(self, fn: Any) -> bool:
        fn()
        return True


def _received(subs: Subscriptions, link: _Link, count: int) -> list[_ProtonDelivery]:
    """``count`` messages arrived on ``link``: their proton deliveries."""
    arrived = []
    for n in range(count):
        frame = Message(id=f"id-{n}", body=b"%d" % n).encode()
        link.frames.append(frame)
        dlv = _ProtonDelivery(link, pending=len(frame))
        subs.delivery(dlv)
        arrived.append(dlv)
    return arrived


def _subscriptions(first_acquirer_marks: bool = False) -> Subscriptions:
    subs = Subscriptions()
    subs.bind(_Engine(first_acquirer_marks=first_acquirer_marks))  # type: ignore[arg-type]
    return subs


def _engine(subs: Subscriptions) -> _Engine:
    engine: Any = subs.engine
    return cast(_Engine, engine)


def test_release_settles_released_and_nack_modified_with_delivery_failed() -> None:
    subs, link = _subscriptions(), _Link()
    arrived = _received(subs, link, 3)
    released, nacked, acked = subs.take(3, 0)
    released.release()
    nacked.nack()
    acked.ack()
    assert [(d.state, d.local.failed, d.settled) for d in arrived] == [
        (ProtonDelivery.RELEASED, False, True),
        (ProtonDelivery.MODIFIED, True, True),
        (ProtonDelivery.ACCEPTED, False, True),
    ]
    # The ack tops the window up at once; the two given back, at the next take.
    assert link.credit_given == 1
    assert subs.take(1, 0) == []
    assert link.credit_given == 3


def test_what_a_stopping_consumer_gives_back_brings_nothing_back_in() -> None:
    # run() stopping releases what never started, then closes: credit for the releases
    # would have the broker hand them straight back during the close, unsettled when the
    # connection ends (Broker-J then counts an attempt for each).
    subs, link = _subscriptions(), _Link()
    _received(subs, link, 4)
    for delivery in subs.take(4, 0):
        delivery.release()
    assert link.credit_given == 0
    _engine(subs).closing = True
    subs.closing()
    assert link.credit_given == 0


def test_close_releases_what_was_not_handed_out_uncounted() -> None:
    subs, link = _subscriptions(), _Link()
    arrived = _received(subs, link, 5)
    (taken,) = subs.take(1, 0)
    assert subs.waiting() == 4
    _engine(subs).closing = True  # as Engine.shutdown sets it before calling closing()
    subs.closing()
    assert subs.waiting() == 0
    assert [(d.state, d.local.failed) for d in arrived[1:]] == [
        (ProtonDelivery.RELEASED, False)
    ] * 4
    assert arrived[0].state is None  # handed out: the application settles it
    assert taken.settled is None
    assert link.credit_given == 0  # no more credit once closing: nothing more comes in


@pytest.mark.parametrize("give_back", ["release", "nack"])
def test_rabbitmq_plugin_gets_released_for_both(give_back: str) -> None:
    # RabbitMQ's plugin marks a redelivery by first-acquirer, not by counting.
    subs, link = _subscriptions(first_acquirer_marks=True), _Link()
    (dlv,) = _received(subs, link, 1)
    (delivery,) = subs.take(1, 0)
    getattr(delivery, give_back)()
    assert (dlv.state, dlv.local.failed) == (ProtonDelivery.RELEASED, False)

"""Confirm bookkeeping of ``RabbitTransport.publish_batch`` without a broker.

RabbitMQ rarely acks out of order or mixes ``multiple`` acks across batches and single
envelopes, so these cases are driven by hand: ack/nack frames fed to the transport on
its own I/O thread (it points at a closed port and never connects). Each case checks
that every message is reported exactly once and that the window is given back.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
from pika.spec import Basic

from msgsafe.adapters.rabbitmq import RabbitOptions, RabbitTransport
from msgsafe.adapters.rabbitmq._confirms import BatchJob, BatchPart, SendItem
from msgsafe.adapters.rabbitmq.config import parse_destination
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfirmTimeout, ConnectionLost, MsgsafeError, Refused, Unroutable
from msgsafe.message import Batch, Envelope


class Recorder:
    def __init__(self) -> None:
        self.confirmed_total = 0
        self.calls = 0
        self.failures: dict[int, MsgsafeError] = {}
        self.twice: list[int] = []

    def confirmed(self, count: int) -> None:
        self.confirmed_total += count
        self.calls += 1

    def failed(self, index: int, error: MsgsafeError) -> None:
        if index in self.failures:
            self.twice.append(index)
        self.failures[index] = error


@pytest.fixture
def transport() -> Iterator[RabbitTransport]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = RabbitOptions(connect_timeout=60, confirm_timeout=60)
    t = RabbitTransport(parse_url(f"amqp://127.0.0.1:{port}"), options)
    try:
        yield t
    finally:
        t.close(0)


def _on_io(transport: RabbitTransport, fn: Callable[[], None]) -> None:
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    assert transport._io.call(run)
    assert done.wait(10)
    if errors:
        raise errors[0]


def _ack(tag: int, *, multiple: bool = False, nack: bool = False) -> SimpleNamespace:
    method = Basic.Nack if nack else Basic.Ack
    return SimpleNamespace(method=method(delivery_tag=tag, multiple=multiple))


def _in_flight(
    transport: RabbitTransport, batch: Batch, report: Recorder, deadline: float
) -> BatchPart:
    part = BatchPart(
        BatchJob(batch, parse_destination(batch.destination), report), range(len(batch)), deadline
    )
    with transport._cond:
        transport._outstanding += len(batch)
    transport._ledger.in_flight_part(part, len(batch))
    return part


def test_out_of_order_and_multiple_acks_across_parts_and_an_envelope(
    transport: RabbitTransport,
) -> None:
    first = Batch.build("q", [b"x"] * 10)
    second = Batch.build("q", [b"y"] * 5)
    r1, r2 = Recorder(), Recorder()
    outcome: list[MsgsafeError | None] = []

    def scenario() -> None:
        deadline = time.monotonic() + 60
        _in_flight(transport, first, r1, deadline)  # tags 1-10
        env = Envelope.build("q", b"z")
        with transport._cond:
            transport._outstanding += 1
        transport._ledger.in_flight[transport._ledger.next_tag] = SendItem(
            env, parse_destination("q"), outcome.append, deadline, 0.0
        )  # tag 11
        transport._ledger.next_tag += 1
        _in_flight(transport, second, r2, deadline)  # tags 12-16
        transport._on_confirm(_ack(3))
        transport._on_confirm(_ack(5))
        transport._on_confirm(_ack(3))  # a repeat changes nothing
        transport._on_confirm(_ack(4, multiple=True))  # 1, 2, 4 (3 done): then pos past 5
        transport._ledger.returned.add(first.message_ids[6])
        transport._on_confirm(_ack(14))  # out of order, in the second part
        transport._on_confirm(_ack(13, multiple=True))  # 6-10 (7 returned), 11, 12-13

    _on_io(transport, scenario)
    assert r1.confirmed_total == 9 and list(r1.failures) == [6]
    # No broker to ask whether queue q exists: the returned message is kept (transient).
    assert isinstance(r1.failures[6], Refused) and not isinstance(r1.failures[6], Unroutable)
    assert r1.failures[6].message_id == first.message_ids[6]
    assert outcome == [None]
    assert r2.confirmed_total == 3 and not r2.failures  # 12, 13, 14
    assert r1.calls <= 4

    def rest() -> None:
        transport._on_confirm(_ack(16, nack=True))  # the last one nacked
        transport._on_confirm(_ack(16, multiple=True))  # 15; 16 already settled

    _on_io(transport, rest)
    assert r2.confirmed_total == 4 and isinstance(r2.failures[4], Refused)
    assert not r1.twice and not r2.twice
    assert transport._outstanding == 0
    assert not transport._ledger.spans and not transport._ledger.in_flight


def test_connection_lost_requeues_only_the_unsettled(transport: RabbitTransport) -> None:
    batch = Batch.build("q", [b"x"] * 10)
    report = Recorder()
    requeued: list[list[int]] = []

    def scenario() -> None:
        _in_flight(transport, batch, report, time.monotonic() + 60)
        transport._on_confirm(_ack(2))  # offset 1, out of order
        transport._on_confirm(_ack(1, multiple=True))  # 1: pos 2
        transport._on_confirm(_ack(5))  # offset 4
        transport._ledger.requeue_in_flight()
        requeued.extend(
            list(p.indexes) for p in transport._ledger.pending if isinstance(p, BatchPart)
        )
        transport._shutdown()

    _on_io(transport, scenario)
    assert requeued == [[2, 3, 5, 6, 7, 8, 9]]
    assert report.confirmed_total == 3
    assert sorted(report.failures) == [2, 3, 5, 6, 7, 8, 9]
    assert all(isinstance(e, ConnectionLost) for e in report.failures.values())
    assert not report.twice
    assert transport._outstanding == 0


def test_confirm_timeout_fails_the_unsettled_once(transport: RabbitTransport) -> None:
    batch = Batch.build("q", [b"x"] * 6)
    report = Recorder()

    def scenario() -> None:
        _in_flight(transport, batch, report, time.monotonic() - 1)
        transport._on_confirm(_ack(2, multiple=True))
        transport._tick()
        transport._on_confirm(_ack(6, multiple=True))  # too late: nothing left to settle

    _on_io(transport, scenario)
    assert report.confirmed_total == 2
    assert sorted(report.failures) == [2, 3, 4, 5]
    assert all(isinstance(e, ConfirmTimeout) for e in report.failures.values())
    assert transport._outstanding == 0

"""Per-key order across the start of an outage: messages of a key that went to the
outbox while earlier ones of the same key were still in the transport are stored after
those, whatever order the transport's errors come in.

A stand-in transport: no broker lets a test choose the order in which in-flight
messages fail.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

import msgsafe.producer
from msgsafe import Producer, RetryPolicy, Status
from msgsafe.errors import ConnectError
from msgsafe.message import Envelope
from msgsafe.ports import TransportCapabilities


class HeldTransport:
    """Holds every publish until the test answers it; once ``delivering``, confirms at
    once and records the order the broker would have seen."""

    #: publish alone: every send's future is one the test answers.
    capabilities = TransportCapabilities()

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: list[tuple[Envelope, Future[None]]] = []
        self.delivered: list[Envelope] = []
        self.delivering = False

    def publish(self, envelope: Envelope) -> Future[None]:
        future: Future[None] = Future()
        with self.lock:
            if not self.delivering:
                self.held.append((envelope, future))
                return future
            self.delivered.append(envelope)
        future.set_result(None)
        return future

    def deliver(self, keep: set[int]) -> None:
        """Confirm from now on, and confirm what the forwarder published meanwhile (the
        held publishes not answered yet, except ``keep``: the test answers those)."""
        with self.lock:
            self.delivering = True
            extra = [
                i for i, (_, future) in enumerate(self.held) if not future.done() and i not in keep
            ]
        for index in extra:
            self.answer(index, None)

    def answer(self, index: int, error: BaseException | None) -> None:
        envelope, future = self.held[index]
        if error is None:
            with self.lock:
                self.delivered.append(envelope)
            future.set_result(None)
        else:
            future.set_exception(error)

    def close(self, timeout: float | None = None) -> None:
        pass


@pytest.fixture
def transport(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldTransport]:
    fake = HeldTransport()
    monkeypatch.setattr(msgsafe.producer, "open_transport", lambda url, options: fake)
    yield fake


@pytest.mark.parametrize("confirmed_first", [0, 5])
def test_errors_in_any_order_keep_the_key_in_send_order(
    transport: HeldTransport, tmp_path: Path, confirmed_first: int
) -> None:
    """10 sends of one key wait in the transport; the last one fails first (the refusal
    pause begins), 10 more are sent (to the outbox), then the rest of the first 10 fail
    backwards (after ``confirmed_first`` confirmations): the broker sees the key's 20
    messages in send order, each once."""
    policy = RetryPolicy(initial=0.01, maximum=0.05)
    with Producer("memory://held", outbox=tmp_path / "o.db", retry=policy) as producer:
        first = [producer.send_async("q", b"%d" % i, key="k") for i in range(10)]
        transport.answer(9, ConnectError("refused"))
        later = [producer.send_async("q", b"%d" % i, key="k") for i in range(10, 20)]
        transport.deliver(keep=set(range(9)))
        for index in range(confirmed_first):  # a broker confirms in publish order
            transport.answer(index, None)
        for index in range(8, confirmed_first - 1, -1):
            transport.answer(index, ConnectError("refused"))
        statuses = [f.result(10).status for f in first + later]
        assert statuses.count(Status.CONFIRMED) == confirmed_first
        assert producer.drain(10) == 0
    seen = [int(env.body) for env in transport.delivered]
    print(f"sent=20 confirmed={confirmed_first} delivered={len(seen)} order={seen}")
    assert seen == list(range(20))


def test_only_the_key_with_sends_in_the_transport_waits(
    transport: HeldTransport, tmp_path: Path
) -> None:
    """A failed message whose key has an earlier send still in the transport waits for
    it; a message of another key bound for the outbox is stored at once."""
    with Producer("memory://held", outbox=tmp_path / "o.db") as producer:
        a0 = producer.send_async("q", b"a0", key="a")
        a1 = producer.send_async("q", b"a1", key="a")
        b0 = producer.send_async("q", b"b0", key="b")
        transport.answer(2, ConnectError("refused"))
        assert b0.result(10).status is Status.STORED  # key b now waits in the outbox
        transport.answer(1, ConnectError("refused"))
        b1 = producer.send_async("q", b"b1", key="b")
        assert b1.result(10).status is Status.STORED
        assert not a1.done(), "a1 was stored before a0, which is still in the transport"
        transport.deliver(keep={0})
        transport.answer(0, ConnectError("refused"))
        assert [f.result(10).status for f in (a0, a1)] == [Status.STORED] * 2
        assert producer.drain(10) == 0
    seen = [env.body for env in transport.delivered]
    assert seen.index(b"a0") < seen.index(b"a1")
    assert seen.index(b"b0") < seen.index(b"b1")


def test_a_batch_in_the_refusal_pause_does_not_overtake_a_key_in_the_transport(
    transport: HeldTransport, tmp_path: Path
) -> None:
    """In the refusal pause a batch goes to the outbox whole, unless a key of it still
    has a send in the transport: then its messages wait for that send, and later sends
    of its keys queue behind the batch."""
    with Producer("memory://held", outbox=tmp_path / "o.db") as producer:
        a0 = producer.send_async("q", b"a0", key="a")
        b0 = producer.send_async("q", b"b0", key="b")
        transport.answer(1, ConnectError("refused"))  # the refusal pause begins
        assert b0.result(10).status is Status.STORED
        batch = producer.send_batch_async("q", [b"a1", b"b1", b"c1"], keys=["a", "b", "c"])
        later = producer.send_async("q", b"a2", key="a")
        assert not batch.done(), "a1 was stored before a0, which is still in the transport"
        whole = producer.send_batch_async("q", [b"c2", b"d2"], keys=["c", "d"])
        assert whole.result(10).stored == 2
        transport.answer(0, ConnectError("refused"))
        assert batch.result(10).stored == 3
        assert [f.result(10).status for f in (a0, later)] == [Status.STORED] * 2
        transport.deliver(keep=set())
        assert producer.drain(10) == 0
    seen = [env.body for env in transport.delivered]
    print(f"sent=9 delivered={len(seen)} order={seen}")
    assert sorted(seen) == sorted([b"a0", b"b0", b"a1", b"b1", b"c1", b"a2", b"c2", b"d2"])
    for key in (b"a", b"b", b"c"):
        mine = [body for body in seen if body.startswith(key)]
        assert mine == sorted(mine), f"key {key!r} out of order: {mine}"

"""An id names one message: resending it is a retry (stored once, deduplicated), and
the same id on another message is refused before anything is sent — a dedup consumer
would otherwise drop that other message. And a send that cannot say whether the outbox
stored its message says so, with the id to retry with (not ``SendTimeout``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from msgsafe import Producer, Status
from msgsafe._recent_ids import RecentIds
from msgsafe.errors import MessageIdReused, StoreOutcomeUnknown
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox
from msgsafe.testing import MemoryBroker


def test_an_id_resent_with_the_same_message_is_sent_and_with_another_refused(
    memory_broker: MemoryBroker,
) -> None:
    with Producer(f"memory://{memory_broker.name}", outbox=False) as producer:
        first = producer.send("q", b"the order", key="k")
        again = producer.send("q", b"the order", key="k", message_id=first.message_id)
        assert {first.status, again.status} == {Status.CONFIRMED}
        for changed in (
            {"destination": "q", "body": b"another order", "key": "k"},
            {"destination": "q", "body": b"the order", "key": "other"},
            {"destination": "elsewhere", "body": b"the order", "key": "k"},
        ):
            with pytest.raises(MessageIdReused) as raised:
                producer.send(**changed, message_id=first.message_id)  # type: ignore[arg-type]
            assert raised.value.message_id == first.message_id
        with pytest.raises(MessageIdReused):
            producer.send_async("q", b"another order", key="k", message_id=first.message_id)
        # An async send's own id, reused for another message, is refused too.
        fresh = producer.send_async("q", b"async one").result(5)
        with pytest.raises(MessageIdReused):
            producer.send("q", b"not that one", message_id=fresh.message_id)
    # Nothing of the refused sends reached the broker.
    assert memory_broker.ids("q") == [first.message_id] * 2 + [fresh.message_id]
    assert memory_broker.count("elsewhere") == 0


def test_the_memory_keeps_at_least_its_window_and_at_most_twice_it() -> None:
    recent = RecentIds(size=100)
    recent.remember("old", "q", None, b"a")
    for i in range(99):
        recent.remember(f"id-{i}", "q", None, b"x")
    with pytest.raises(MessageIdReused):  # within the last 100
        recent.remember("old", "q", None, b"b")
    for i in range(99, 300):
        recent.remember(f"id-{i}", "q", None, b"x")
    recent.remember("old", "q", None, b"b")  # beyond twice the window: forgotten
    assert len(recent._new) + len(recent._old) <= 200


class _SlowStore(SqliteOutbox):
    """A store whose puts wait for ``opened``: a commit that does not answer."""

    opened = threading.Event()

    def put(self, envelopes: Sequence[Envelope]) -> None:
        assert self.opened.wait(30)
        super().put(envelopes)


def test_a_send_timing_out_on_its_way_into_the_outbox_may_be_stored(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    store = _SlowStore(tmp_path / "o.db")
    store.opened = threading.Event()
    memory_broker.down()
    with Producer(
        f"memory://{memory_broker.name}", outbox=store, send_timeout=0.5, forward=False
    ) as producer:
        with pytest.raises(StoreOutcomeUnknown) as raised:
            producer.send("q", b"the order")
        error = raised.value
        assert error.message_id is not None and error.destination == "q"
        assert f"retry with message_id={error.message_id}" in str(error)
        assert "SqliteOutbox" in str(error) and "memory://" not in str(error)
        store.opened.set()
        assert producer.flush(10)
        retried = producer.send("q", b"the order", message_id=error.message_id)
        assert retried.status is Status.STORED
        assert producer.pending() == 1  # the first put and its retry: one row
        memory_broker.up()
        assert producer.drain(10) == 0
    assert memory_broker.ids("q") == [error.message_id]

"""Testing your own service against broker failures, with no broker running.

Run:  python3 examples/testing_your_code.py        (runs the tests below with pytest)
      pytest examples/testing_your_code.py

``msgsafe.testing.MemoryBroker`` is what ``memory://NAME`` connects to. It injects the
failures real brokers produce — refusals, outages, rejections, lost confirms — so you
can check that *your* code does the right thing with each outcome. Copy the fixture and
the tests, and replace ``OrderService`` with your code.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import msgsafe
from msgsafe.errors import PermanentError
from msgsafe.testing import MemoryBroker

# --- the code under test (yours) ----------------------------------------------------------


@dataclass
class OrderService:
    """Publishes an ``order-placed`` event per order; remembers what the broker refused."""

    producer: msgsafe.Producer
    failed: list[str] = field(default_factory=list)

    def place(self, order_id: str) -> msgsafe.Status | None:
        try:
            receipt = self.producer.send("orders", order_id.encode(), key=order_id)
        except PermanentError:
            # Refused for good (rejected, too large, unroutable): retrying will not
            # help, so the order is flagged for a human instead.
            self.failed.append(order_id)
            return None
        # CONFIRMED or STORED: both mean "safe", the service need not care which.
        return receipt.status


# --- the tests ----------------------------------------------------------------------------


@pytest.fixture
def broker() -> Iterator[MemoryBroker]:
    """A fresh in-process broker per test, under a unique name."""
    broker = MemoryBroker.install(MemoryBroker(f"test-{uuid.uuid4().hex[:8]}"))
    yield broker
    MemoryBroker.forget(broker.name)


@pytest.fixture
def service(broker: MemoryBroker, tmp_path: Path) -> Iterator[OrderService]:
    # A temporary outbox file: tests never touch the user's real outbox directory.
    with msgsafe.Producer(f"memory://{broker.name}", outbox=tmp_path / "outbox.db") as producer:
        yield OrderService(producer)


def test_orders_are_published(service: OrderService, broker: MemoryBroker) -> None:
    assert service.place("o-1") is msgsafe.Status.CONFIRMED
    assert [m.body for m in broker.messages("orders")] == [b"o-1"]


def test_refused_orders_wait_in_the_outbox(service: OrderService, broker: MemoryBroker) -> None:
    broker.refuse_writes()  # or broker.down(): the broker cannot take messages
    assert service.place("o-2") is msgsafe.Status.STORED
    assert service.producer.pending() == 1
    assert broker.count("orders") == 0

    broker.accept_writes()
    assert service.producer.drain(timeout=5) == 0  # forwarded, none left
    assert [m.body for m in broker.messages("orders")] == [b"o-2"]


def test_rejected_orders_are_flagged(service: OrderService, broker: MemoryBroker) -> None:
    broker.reject_next(1)  # the broker refuses this one message for good
    assert service.place("o-3") is None
    assert service.failed == ["o-3"]
    assert service.place("o-4") is msgsafe.Status.CONFIRMED


def test_a_lost_confirm_duplicates_but_never_loses(
    service: OrderService, broker: MemoryBroker
) -> None:
    # The broker stores the message but the confirm never arrives: msgsafe cannot know,
    # so it keeps the message (outbox) and sends it again with the SAME id.
    broker.drop_after_confirm(1)
    assert service.place("o-5") is msgsafe.Status.STORED
    assert service.producer.drain(timeout=5) == 0
    ids = broker.ids("orders")
    assert len(ids) == 2 and len(set(ids)) == 1  # a duplicate, never a loss

    # A consumer with dedup=True sees it once: handle duplicates there, not here.
    with msgsafe.Consumer(f"memory://{broker.name}", group="billing", dedup=True) as consumer:
        consumer.subscribe("orders")
        seen = []
        for delivery in consumer.poll(1, max_messages=10):
            seen.append(delivery.body)
            delivery.ack()
    assert seen == [b"o-5"]


if __name__ == "__main__":
    # -p no:cacheprovider: leave no .pytest_cache next to the example.
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))

"""Delivery.attempt: the broker's count where it keeps one, the consumer's elsewhere."""

from __future__ import annotations

import pytest

from msgsafe.adapters.rabbitmq.receiver import DELIVERY_COUNT_HEADER, quorum_attempt
from msgsafe.dedup import AttemptMemory
from msgsafe.message import Delivery
from msgsafe.ports import AttemptCounter


def test_attempt_memory_counts_deliveries_and_retries_and_forgets() -> None:
    memory = AttemptMemory(capacity=2)
    assert isinstance(memory, AttemptCounter)
    assert memory.delivered("a", redelivered=False) == 1
    assert memory.delivered("a", redelivered=True) == 2
    memory.retried("a", 5)
    assert memory.delivered("a", redelivered=True) == 6
    memory.forget("a")
    assert memory.delivered("a", redelivered=False) == 1
    # Unknown here but marked redelivered by the broker: an earlier delivery happened.
    assert memory.delivered("b", redelivered=True) == 2
    memory.delivered("c", redelivered=False)  # bounded: "a", the oldest, is forgotten
    assert len(memory) == 2 and memory.delivered("a", redelivered=False) == 1


@pytest.mark.parametrize(
    ("headers", "attempt"),
    [
        (None, None),  # a classic queue, or a quorum queue's first delivery
        ({}, None),
        ({DELIVERY_COUNT_HEADER: 0}, 1),
        ({DELIVERY_COUNT_HEADER: 2}, 3),
        ({DELIVERY_COUNT_HEADER: "2"}, None),  # not the broker's type: not trusted
        ({DELIVERY_COUNT_HEADER: True}, None),
    ],
)
def test_quorum_queue_delivery_count_is_the_attempt(
    headers: dict[str, object] | None, attempt: int | None
) -> None:
    assert quorum_attempt(headers) == attempt


def test_a_delivery_without_a_broker_count_starts_at_one_or_two() -> None:
    def settle(outcome: object) -> None:
        pass

    first = Delivery(body=b"", destination="q", message_id="m", settle=settle)
    again = Delivery(body=b"", destination="q", message_id="m", settle=settle, redelivered=True)
    counted = Delivery(body=b"", destination="q", message_id="m", settle=settle, attempt=4)
    assert (first.attempt, first.attempt_from_broker) == (1, False)
    assert (again.attempt, again.attempt_from_broker) == (2, False)
    assert (counted.attempt, counted.attempt_from_broker) == (4, True)
    assert "attempt=4" in repr(counted)


def test_attempt_memory_counts_a_batch_of_first_deliveries_at_once() -> None:
    memory = AttemptMemory(capacity=3)
    assert memory.delivered_first(["a", "b"])
    assert memory.delivered("a", redelivered=True) == 2  # counted 1 by the batch
    # A known id, or one twice in the batch: nothing counted, one by one instead.
    assert not memory.delivered_first(["c", "a"])
    assert not memory.delivered_first(["c", "c"])
    assert memory.delivered("c", redelivered=False) == 1
    assert memory.delivered_first(["d", "e"])  # bounded: the oldest go
    assert len(memory) == 3 and memory.delivered("b", redelivered=False) == 1

"""A run of Kafka deliveries acknowledged at once (``Consumer.run``'s workers do, one
receiver lock a run): the same bookkeeping as one ``ack()`` each — only settled prefixes
committed, each delivery settled once, its observer told once — on the receiver's
stand-in for librdkafka (no broker)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from msgsafe.adapters.kafka import open_receiver
from msgsafe.adapters.kafka import receiver as kafka_receiver
from msgsafe.endpoints import parse_url
from msgsafe.errors import ClosedError
from msgsafe.message import Delivery, Outcome
from tests.unit.adapters.kafka.test_receiver_commits import _committed, _Record, _StandIn


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[_StandIn]:
    made: list[_StandIn] = []

    def make(settings: dict[str, Any]) -> _StandIn:
        made.append(_StandIn(settings))
        return made[-1]

    monkeypatch.setattr(kafka_receiver, "Consumer", make)
    monkeypatch.setattr(kafka_receiver, "_COMMIT_EVERY_S", 0.0)
    return made


def test_runs_acked_at_once_commit_only_settled_prefixes(stand_in: list[_StandIn]) -> None:
    receiver = open_receiver(parse_url("kafka://127.0.0.1:9"), {}, group="g")
    receiver.subscribe("t")
    consumer = stand_in[0]
    consumer.queued = [_Record("t", p, o) for p in range(3) for o in range(100)]
    deliveries: list[Delivery] = []
    while consumer.queued:
        deliveries.extend(receiver.receive(max_messages=64, timeout=0))
    assert len(deliveries) == 300
    told: list[tuple[str | None, Outcome]] = []
    for delivery in deliveries:
        delivery.observe(lambda d, outcome: told.append((d.message_id, outcome)))
    rng = random.Random(53)
    unsettled = deliveries[:]
    rng.shuffle(unsettled)
    settled: set[str] = set()
    while unsettled:
        run, unsettled = unsettled[:16], unsettled[16:]
        assert type(run[0])._ack_run(run) == []
        settled.update(str(d.message_id) for d in run)
        receiver.receive(max_messages=1, timeout=0)  # commits what may be committed
        for partition, offset in _committed(consumer).items():
            assert all(f"id-{partition}-{o}" in settled for o in range(offset))
    assert all(d.settled is Outcome.ACCEPT for d in deliveries)
    assert sorted(told) == sorted((d.message_id, Outcome.ACCEPT) for d in deliveries)
    receiver.close()
    assert _committed(consumer) == {0: 100, 1: 100, 2: 100}


def test_a_settled_delivery_in_a_run_is_reported_and_the_rest_acked(
    stand_in: list[_StandIn],
) -> None:
    receiver = open_receiver(parse_url("kafka://127.0.0.1:9"), {}, group="g")
    receiver.subscribe("t")
    consumer = stand_in[0]
    consumer.queued = [_Record("t", 0, o) for o in range(5)]
    batch = receiver.receive(max_messages=5, timeout=0)
    told: list[str | None] = []
    for delivery in batch:
        delivery.observe(lambda d, outcome: told.append(d.message_id))
    batch[2].ack()
    failed = type(batch[0])._ack_run(batch)
    assert [(d, type(exc)) for d, exc in failed] == [(batch[2], ClosedError)]
    assert [d.settled for d in batch] == [Outcome.ACCEPT] * 5
    # Each observer told once: the one acked alone before, the others by the run.
    assert sorted(map(str, told)) == sorted(str(d.message_id) for d in batch)
    receiver.receive(max_messages=1, timeout=0)
    assert _committed(consumer) == {0: 5}
    receiver.close()

"""The Kafka receiver commits only settled prefixes, whatever order deliveries are
settled in, and asynchronously from ``receive``: librdkafka's ``Consumer`` is replaced by
a stand-in that hands out records and keeps every commit (no broker: what is checked is
the receiver's bookkeeping, which no broker could show as directly)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from msgsafe.adapters.kafka import open_receiver
from msgsafe.adapters.kafka import receiver as kafka_receiver
from msgsafe.endpoints import parse_url
from msgsafe.errors import ClosedError
from msgsafe.message import Delivery, Outcome


class _Record:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._where = (topic, partition, offset)

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]

    def headers(self) -> list[tuple[str, bytes]]:
        return [("msgsafe-id", f"id-{self._where[1]}-{self._where[2]}".encode())]

    def value(self) -> bytes:
        return b"x"

    def key(self) -> None:
        return None


class _StandIn:
    """What the receiver calls of ``confluent_kafka.Consumer``."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.queued: list[_Record] = []
        #: (asynchronous, [(partition, offset)]) per commit call.
        self.commits: list[tuple[bool, list[tuple[int, int]]]] = []
        self.fail_next_async = False

    def subscribe(self, topics: list[str], **_callbacks: Any) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[_Record]:
        out, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return out

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        self.commits.append((asynchronous, [(tp.partition, tp.offset) for tp in offsets]))
        if asynchronous and self.fail_next_async:
            self.fail_next_async = False
            failed = [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in offsets]
            self.settings["on_commit"](Exception("coordinator moved"), failed)
        return None if asynchronous else offsets

    def close(self) -> None:
        pass


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[_StandIn]:
    made: list[_StandIn] = []

    def make(settings: dict[str, Any]) -> _StandIn:
        made.append(_StandIn(settings))
        return made[-1]

    monkeypatch.setattr(kafka_receiver, "Consumer", make)
    # Every receive() may commit: the interval is what the next test varies.
    monkeypatch.setattr(kafka_receiver, "_COMMIT_EVERY_S", 0.0)
    return made


def _committed(consumer: _StandIn) -> dict[int, int]:
    """The last offset committed per partition."""
    last: dict[int, int] = {}
    for _async, offsets in consumer.commits:
        for partition, offset in offsets:
            assert offset >= last.get(partition, 0), "a commit went backwards"
            last[partition] = offset
    return last


def test_only_settled_prefixes_are_committed_in_any_settle_order(
    stand_in: list[_StandIn],
) -> None:
    receiver = open_receiver(parse_url("kafka://127.0.0.1:9"), {}, group="g")
    receiver.subscribe("t")
    consumer = stand_in[0]
    # Three partitions, their records interleaved in runs, 0..199 each.
    consumer.queued = [
        _Record("t", p, o)
        for start in range(0, 200, 20)
        for p in range(3)
        for o in range(start, start + 20)
    ]
    deliveries: list[tuple[int, int, Delivery]] = []
    while consumer.queued:
        for d in receiver.receive(max_messages=50, timeout=0):
            _t, p, o = d.message_id.split("-") if d.message_id else ("", "0", "0")
            deliveries.append((int(p), int(o), d))
    assert len(deliveries) == 600
    rng = random.Random(53)
    unsettled = deliveries[:]
    rng.shuffle(unsettled)
    settled: set[tuple[int, int]] = set()
    while unsettled:
        for partition, offset, delivery in unsettled[:37]:
            delivery.ack()
            settled.add((partition, offset))
        unsettled = unsettled[37:]
        receiver.receive(max_messages=1, timeout=0)  # commits what may be committed
        for partition, offset in _committed(consumer).items():
            # At-least-once: everything below a committed offset was settled.
            assert all((partition, o) in settled for o in range(offset))
    receiver.close()
    assert _committed(consumer) == {0: 200, 1: 200, 2: 200}


def test_an_unsettled_delivery_holds_its_partition_back(stand_in: list[_StandIn]) -> None:
    receiver = open_receiver(parse_url("kafka://127.0.0.1:9"), {}, group="g")
    receiver.subscribe("t")
    consumer = stand_in[0]
    consumer.queued = [_Record("t", 0, o) for o in range(10)]
    batch = receiver.receive(max_messages=10, timeout=0)
    for delivery in batch[:3] + batch[4:]:
        delivery.ack()
    receiver.receive(max_messages=1, timeout=0)
    assert _committed(consumer) == {0: 3}
    batch[3].ack()
    receiver.close()
    assert _committed(consumer) == {0: 10}
    # The commits from receive() were asynchronous; the one at close() waited.
    assert [a for a, _ in consumer.commits] == [True, False]


def test_a_failed_asynchronous_commit_is_sent_again(stand_in: list[_StandIn]) -> None:
    receiver = open_receiver(parse_url("kafka://127.0.0.1:9"), {}, group="g")
    receiver.subscribe("t")
    consumer = stand_in[0]
    consumer.queued = [_Record("t", 0, o) for o in range(5)]
    for delivery in receiver.receive(max_messages=5, timeout=0):
        delivery.ack()
    consumer.fail_next_async = True
    receiver.receive(max_messages=1, timeout=0)  # sent, failed
    receiver.receive(max_messages=1, timeout=0)  # sent again
    receiver.receive(max_messages=1, timeout=0)  # nothing new: nothing sent
    assert consumer.commits == [(True, [(0, 5)]), (True, [(0, 5)])]
    receiver.close()


def test_commits_from_receive_wait_for_their_interval(
    stand_in: list[_StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_receiver, "_COMMIT_EVERY_S", 3600.0)
    receiver = open_receiver(parse_url("kafka://127.0.0.1:9"), {}, group="g")
    receiver.subscribe("t")
    consumer = stand_in[0]
    consumer.queued = [_Record("t", 0, o) for o in range(5)]
    for delivery in receiver.receive(max_messages=5, timeout=0):
        delivery.ack()
    receiver.receive(max_messages=1, timeout=0)
    assert consumer.commits == []  # the first receive() was the interval's commit
    receiver.close()
    assert consumer.commits == [(False, [(0, 5)])]


class _Headed(_Record):
    def __init__(self, offset: int, headers: list[tuple[str, bytes]] | None) -> None:
        super().__init__("t", 0, offset)
        self._headers = headers

    def headers(self) -> list[tuple[str, bytes]] | None:  # type: ignore[override]
        return self._headers


def test_a_delivery_settles_once_either_way_and_its_headers_are_read(
    stand_in: list[_StandIn],
) -> None:
    receiver = open_receiver(parse_url("kafka://127.0.0.1:9"), {}, group="g")
    receiver.subscribe("t")
    consumer = stand_in[0]
    consumer.queued = [
        _Headed(0, [("msgsafe-id", b"a")]),
        _Headed(1, [("msgsafe-id", b"b"), ("trace", b"t1"), ("msgsafe-id", b"other")]),
        _Headed(2, None),
        _Headed(3, [("msgsafe-id", b"d")]),
    ]
    plain, headed, bare, wrapped = receiver.receive(max_messages=4, timeout=0)
    assert (plain.message_id, dict(plain.headers)) == ("a", {})
    assert (headed.message_id, dict(headed.headers)) == ("b", {"trace": "t1"})
    assert (bare.message_id, dict(bare.headers)) == (None, {})
    with pytest.raises(TypeError):
        headed.headers["x"] = "y"  # type: ignore[index]
    seen: list[Outcome] = []

    def wrap(inner: Callable[[Outcome], None]) -> Callable[[Outcome], None]:
        def settle(outcome: Outcome) -> None:
            inner(outcome)
            seen.append(outcome)

        return settle

    wrapped._wrap_settle(wrap)  # as the telemetry does: the general way
    wrapped.ack()
    bare.nack(requeue=False)  # Kafka skips a reject: it counts as settled
    plain.ack()
    for delivery in (plain, wrapped):
        with pytest.raises(ClosedError):
            delivery.ack()
    assert seen == [Outcome.ACCEPT]
    receiver.receive(max_messages=1, timeout=0)
    assert _committed(consumer) == {0: 1}  # offset 1 holds the partition back
    headed.ack()
    receiver.close()
    assert _committed(consumer) == {0: 4}

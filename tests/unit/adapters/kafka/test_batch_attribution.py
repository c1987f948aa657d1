"""How the Kafka batch path maps failed delivery reports to messages without a broker.

librdkafka's report carries the message's key and value but not its headers, so a
failure is matched by content within its chunk (one ``ReportRun`` of the Kafka fast path):
exactly where the content is unique, and where identical messages both failed and
succeeded, all of them go to the outbox as possibly delivered (a duplicate with a known
id, never a loss).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

from msgsafe.adapters.kafka._connection import BatchReports
from msgsafe.adapters.kafka._errors import translate
from msgsafe.errors import ConfirmTimeout, MsgsafeError, PermanentError
from msgsafe.message import Batch


class _Msg:
    """What a delivery report's message offers: key and value, no headers."""

    def __init__(self, key: bytes | None, value: bytes) -> None:
        self._key, self._value = key, value

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value


class _Transport:
    _target = "kafka://test"

    def delivery_error(self, err: KafkaError, message_id: str | None = None) -> MsgsafeError:
        return translate(err, endpoint=self._target, message_id=message_id)


class _Tally:
    """A BatchReport that insists on one report per message."""

    def __init__(self) -> None:
        self.confirmed_count = 0
        self.failures: dict[int, MsgsafeError] = {}

    def confirmed(self, count: int) -> None:
        self.confirmed_count += count

    def failed(self, index: int, error: MsgsafeError) -> None:
        assert index not in self.failures, f"index {index} reported twice"
        self.failures[index] = error


def _run(batch: Batch, failing: set[int]) -> _Tally:
    """Deliver ``batch`` through one chunk, failing the messages at ``failing``."""
    tally = _Tally()
    reports = BatchReports(_Transport(), batch, tally)  # type: ignore[arg-type]
    chunk = reports.chunk(0, len(batch))
    err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    for index in range(len(batch)):
        key = None if batch.keys is None else batch.keys[index]
        msg: Any = _Msg(key, batch.bodies[index])
        chunk(err if index in failing else None, msg)
    return tally


def test_unique_content_names_the_failed_message_exactly() -> None:
    batch = Batch.build("t", [b"a", b"b", b"c", b"d"])
    tally = _run(batch, {1, 3})
    assert set(tally.failures) == {1, 3}
    assert all(isinstance(e, PermanentError) for e in tally.failures.values())
    assert tally.confirmed_count == 2


def test_identical_messages_that_all_failed_each_fail() -> None:
    batch = Batch.build("t", [b"x", b"x", b"y"])
    tally = _run(batch, {0, 1})
    assert set(tally.failures) == {0, 1}
    assert tally.confirmed_count == 1


def test_identical_messages_partly_failed_all_go_out_as_possibly_delivered() -> None:
    batch = Batch.build("t", [b"x", b"x", b"x", b"y"])
    tally = _run(batch, {1})
    assert set(tally.failures) == {0, 1, 2}
    assert all(isinstance(e, ConfirmTimeout) and e.maybe_delivered for e in tally.failures.values())
    assert tally.confirmed_count == 1


def test_keys_tell_identical_bodies_apart() -> None:
    batch = Batch.build("t", [b"x", b"x"], keys=["k1", "k2"])
    tally = _run(batch, {1})
    assert set(tally.failures) == {1}
    assert tally.confirmed_count == 1


def test_every_message_is_reported_once_in_total() -> None:
    batch = Batch.build("t", [b"%d" % (i % 7) for i in range(100)])
    tally = _run(batch, {3, 10, 50})
    assert tally.confirmed_count + len(tally.failures) == 100

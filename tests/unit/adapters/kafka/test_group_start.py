"""Where a checking consumer's group starts (``msgsafe demo``/``verify`` read back their
run): a coordinator that is still loading after a broker restart is asked again until
the deadline, and any other commit error is reported at once.

A stand-in consumer: no broker answers COORDINATOR_LOAD_IN_PROGRESS on demand.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from msgsafe.adapters.kafka.positions import _commit_at_zero


class Committer:
    """Fails its first ``failures`` commits with ``code``, then commits."""

    def __init__(self, failures: int, code: int) -> None:
        self.failures = failures
        self.code = code
        self.calls = 0

    def commit(self, *, offsets: list[object], asynchronous: bool) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code))


def test_a_loading_coordinator_is_asked_again() -> None:
    consumer = Committer(3, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    _commit_at_zero(consumer, "t", [0, 1], time.monotonic() + 10)
    assert consumer.calls == 4


def test_a_loading_coordinator_past_the_deadline_raises() -> None:
    consumer = Committer(1_000_000, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    with pytest.raises(KafkaException):
        _commit_at_zero(consumer, "t", [0], time.monotonic() + 0.5)
    assert consumer.calls > 1


def test_other_commit_errors_are_not_retried() -> None:
    consumer = Committer(1, KafkaError.GROUP_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        _commit_at_zero(consumer, "t", [0], time.monotonic() + 10)
    assert consumer.calls == 1

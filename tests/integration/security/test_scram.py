"""SASL/SCRAM on the real Kafka cluster (a SCRAM-SHA-256/512 user created when the
storage was formatted, a SASL_PLAINTEXT listener per node): the right login carries
every message; a wrong password or an unknown user is an AuthenticationError within 2 s,
raised to the caller, nothing stored, never retried by the producer; the outbox's
forwarder facing the wrong login reports once, keeps every message waiting (none
quarantined) and backs off; with the right login every accepted message arrives."""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path

import pytest

import msgsafe
from msgsafe.adapters import open_transport
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.endpoints import parse_url
from msgsafe.errors import AuthenticationError
from msgsafe.message import Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox
from msgsafe.retry import RetryPolicy
from tests.integration.security._users import SCRAM_USER
from tests.support.tls_checks import WITHIN_S, round_trip

pytestmark = pytest.mark.integration


def _topic(cluster: KafkaCluster) -> str:
    name = f"scram-{secrets.token_hex(3)}"
    cluster.create_topic(name, partitions=3)
    return name


def test_the_right_login_carries_every_message(kafka_secure: KafkaCluster) -> None:
    url = kafka_secure.sasl_url(SCRAM_USER.name, SCRAM_USER.password)
    assert round_trip(url, _topic(kafka_secure)) == (50, 50)


@pytest.mark.parametrize(
    ("user", "password"),
    [(SCRAM_USER.name, "wrong-password"), ("nobody", SCRAM_USER.password)],
    ids=["wrong password", "unknown user"],
)
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_wrong_login_fails_fast_and_stores_nothing(
    kafka_secure: KafkaCluster, tmp_path: Path, user: str, password: str, mechanism: str
) -> None:
    url = kafka_secure.sasl_url(user, password, mechanism)
    producer = msgsafe.Producer(url, outbox=tmp_path / "outbox.db")
    try:
        start = time.monotonic()
        with pytest.raises(AuthenticationError) as caught:
            producer.send("scram-faults", b"x")
        took = time.monotonic() - start
        assert producer.pending() == 0, "stored as if the broker were down"
        with pytest.raises(AuthenticationError):
            producer.send("scram-faults", b"y")
    finally:
        producer.close(timeout=1)
    assert took < WITHIN_S, took
    assert password not in str(caught.value) and password not in repr(caught.value)


def test_the_forwarder_waits_on_a_wrong_login_and_loses_nothing(
    kafka_secure: KafkaCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = _topic(kafka_secure)
    good = kafka_secure.sasl_url(SCRAM_USER.name, SCRAM_USER.password)
    stored = [Envelope.build(topic, f"s{i}".encode(), key=f"k{i % 4}") for i in range(100)]
    store = SqliteOutbox(tmp_path / "outbox.db")
    store.put(stored)
    policy = RetryPolicy(initial=0.05, maximum=1.0)
    caplog.set_level(logging.ERROR, logger="msgsafe.outbox")
    wrong = open_transport(parse_url(kafka_secure.sasl_url(SCRAM_USER.name, "wrong")), {})
    try:
        forwarder = Forwarder(store, wrong, policy=policy)
        for _ in range(5):
            forwarder.step()
        stats = forwarder.stats()
        waits = forwarder.next_attempt_in()
    finally:
        wrong.close(1)
    assert stats.depth == 100 and stats.quarantined == 0 and stats.delivered == 0, stats
    assert stats.last_error is not None and "AuthenticationError" in stats.last_error
    assert waits > 0, "the forwarder must back off, not hammer the broker"
    errors = [r for r in caplog.records if "refused the connection" in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in caplog.records]
    assert not any("wrong" in r.getMessage() for r in caplog.records)

    right = open_transport(parse_url(good), {})
    try:
        assert Forwarder(store, right, policy=policy).drain(60) == 0
    finally:
        right.close(5)
        store.close()
    sent = {e.message_id for e in stored}
    received: set[str] = set()
    deadline = time.monotonic() + 30
    with msgsafe.Consumer(good) as consumer:
        consumer.subscribe(topic)
        while not sent <= received and time.monotonic() < deadline:
            for delivery in consumer.poll(max_messages=200, timeout=1.0):
                received.add(delivery.message_id)
                delivery.ack()
    assert sent - received == set(), f"lost {len(sent - received)} of {len(sent)}"
    assert received <= sent

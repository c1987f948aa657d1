"""A queue name RabbitMQ cannot take (300 bytes: AMQP 0-9-1 names are ``shortstr``, at
most 255 bytes), on the real cluster, as a user met it: ``send()`` returned STORED and
``msgsafe outbox drain`` left it waiting for ever.

Now ``send()`` raises :class:`InvalidDestination` with the cluster up (nothing stored:
the caller still owns the message), and an outbox file that already holds such a row
(written by an older version) is drained with that row quarantined with the reason,
the good rows delivered and counted, and exit code 8 (nothing waits, the quarantine
holds one)."""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter
from pathlib import Path

import pytest

from msgsafe import Consumer, Producer
from msgsafe.endpoints import parse_url
from msgsafe.errors import InvalidDestination
from msgsafe.message import Envelope, Status
from msgsafe.outbox import SqliteOutbox
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.commands import msgsafe

pytestmark = pytest.mark.integration

QUARANTINED = 8


def test_send_to_a_300_byte_queue_name_raises_and_stores_nothing(
    rabbit_urls: RabbitUrls, tmp_path: Path
) -> None:
    good = f"names-{secrets.token_hex(4)}"
    bad = "q" * 300
    path = tmp_path / "outbox.sqlite3"
    with Producer(rabbit_urls.cluster, outbox=str(path), declare="quorum") as producer:
        with pytest.raises(InvalidDestination, match="at most 255 bytes") as caught:
            producer.send(bad, b"never stored")
        assert caught.value.message_id
        assert producer.pending() == 0
        assert producer.send(good, b"kept").status is Status.CONFIRMED
        assert producer.pending() == 0
    store = SqliteOutbox(path)
    try:
        assert store.stats().depth == 0 and store.stats().quarantined == 0
    finally:
        store.close()


def test_drain_quarantines_a_stored_300_byte_name_and_delivers_the_rest(
    rabbit_urls: RabbitUrls, tmp_path: Path
) -> None:
    good = f"names-{secrets.token_hex(4)}"
    path = tmp_path / "old.sqlite3"
    store = SqliteOutbox(path, target=parse_url(rabbit_urls.cluster).redacted())
    kept = [Envelope.build(good, f"m{i}".encode()) for i in range(5)]
    poison = Envelope.build("q" * 300, b"stored by an older version")
    store.put([kept[0], kept[1], poison, *kept[2:]])
    store.close()

    drained = msgsafe("outbox", "drain", str(path), "-o", "declare=quorum", "--timeout", "60")
    assert drained.code == QUARANTINED, (drained.stdout, drained.stderr[-3000:])
    assert drained.stdout.split("(")[0].strip() == "5 delivered, 0 remaining, 1 quarantined"
    said = " ".join(drained.stderr.split())
    assert f"msgsafe outbox quarantine {path}" in said and "replay" in said

    (entry,) = json.loads(msgsafe("outbox", "quarantine", str(path), "--json").stdout)
    assert entry["message_id"] == poison.message_id
    assert entry["error"].startswith("InvalidDestination: ")
    assert "at most 255 bytes" in entry["error"]

    # Count, don't hope: every good id reached the queue, once.
    wanted = {e.message_id for e in kept}
    received: Counter[str] = Counter()
    with Consumer(rabbit_urls.cluster) as consumer:
        consumer.subscribe(good)
        deadline = time.monotonic() + 60
        while not wanted <= set(received) and time.monotonic() < deadline:
            for delivery in consumer.poll(2, max_messages=100):
                received[str(delivery.message_id)] += 1
                delivery.ack()
    assert not wanted - set(received), f"lost: {wanted - set(received)}"
    assert set(received) == wanted  # and the refused one never reached any queue

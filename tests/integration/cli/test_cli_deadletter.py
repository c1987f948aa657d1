"""``msgsafe deadletter`` against the session's RabbitMQ cluster, Apache Kafka cluster
and ActiveMQ Artemis pair (AMQP 1.0), as a subprocess: 250 poison messages dead-lettered
by Consumer.run are listed (with their attempts), replayed to their origin, and handled
there by a fixed handler; counted per id. 250 is above a receiver's default window (100
deliveries on AMQP 1.0): every dead letter read is held until the command ends."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from msgsafe import Consumer, Delivery, Producer, RetryPolicy
from msgsafe.cluster.artemis import ArtemisCluster
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.commands import msgsafe
from tests.support.kafka_lab import LabKafka
from tests.support.rabbit_queues import declare_quorum
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

COUNT, ATTEMPTS = 250, 3


@dataclass(frozen=True, slots=True)
class Place:
    """Where a broker's dead letters go: the cluster ``url``, the ``origin`` consumed and
    the dead-letter ``dlq``; on Kafka the origin's consumer ``group`` (both runs)."""

    broker: str
    url: str
    origin: str
    dlq: str
    group: str | None = None


def _place(broker: str, request: pytest.FixtureRequest) -> Place:
    suffix = uuid.uuid4().hex[:8]
    if broker == "rabbitmq":
        urls: RabbitUrls = request.getfixturevalue("rabbit_urls")
        origin = declare_quorum(urls.amqp[0], f"dl-origin-{suffix}")
        return Place(broker, urls.cluster, origin, declare_quorum(urls.amqp[0], f"dl-dlq-{suffix}"))
    if broker == "kafka":
        kafka: LabKafka = request.getfixturevalue("kafka_cluster")
        origin, dlq = f"dl-origin-{suffix}", f"dl-dlq-{suffix}"
        for topic in (origin, dlq):
            kafka.create_topic(topic, partitions=3)
        return Place(broker, kafka.url, origin, dlq, group=f"dl-app-{suffix}")
    pair: ArtemisCluster = request.getfixturevalue("artemis_pair")
    return Place(broker, pair.url, f"dl.origin.{suffix}", f"dl.dlq.{suffix}")


def _run_until(
    consumer: Consumer,
    handler: Callable[[Delivery], object],
    done: Callable[[], object],
    **options: Any,
) -> None:
    """``consumer.run(handler)`` here, stopped once ``done()`` (within 120 s)."""
    failures: list[AssertionError] = []

    def stop_when_done() -> None:
        try:
            wait_until(done, 120, "the run's work", diagnose=lambda: repr(consumer.stats()))
        except AssertionError as exc:
            failures.append(exc)
        finally:
            consumer.stop()

    stopper = threading.Thread(target=stop_when_done, daemon=True)
    stopper.start()
    consumer.run(handler, handle_signals=False, **options)
    stopper.join()
    assert not failures, failures[0]


def _json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("broker", ["rabbitmq", "kafka", "amqp10"])
def test_dead_letters_listed_replayed_and_then_handled(
    broker: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    place = _place(broker, request)
    with Producer(place.url, outbox=False) as producer:
        ids = [producer.send(place.origin, f"order {n}".encode()).message_id for n in range(COUNT)]

    def poison(delivery: Delivery) -> None:
        raise ValueError("cannot parse")

    first = Consumer(place.url, group=place.group).subscribe(place.origin)
    with Producer(place.url, outbox=tmp_path / "dead.db") as dead_letters:
        _run_until(
            first,
            poison,
            lambda: first.stats().dead_lettered == COUNT,
            retry=RetryPolicy(initial=0.0, max_attempts=ATTEMPTS),
            dead_letter=place.dlq,
            dead_letter_producer=dead_letters,
        )

    # The URL through the environment: no password in argv.
    env = {
        "MSGSAFE_DL_URL": place.url,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    url = ["--url", "env:MSGSAFE_DL_URL"]
    listed = msgsafe("deadletter", "list", place.dlq, *url, "--limit", "1000", "--json", env=env)
    assert listed.code == 0, listed.stderr[-3000:]
    *rows, summary = _json_lines(listed.stdout)
    print(f"[{broker}] listed {summary}")
    assert summary == {"read": COUNT, "complete": True}
    assert sorted(str(r["message_id"]) for r in rows) == sorted(ids)
    assert {(r["source"], r["attempts"], r["error_type"]) for r in rows} == {
        (place.origin, str(ATTEMPTS), "ValueError")
    }
    missing = msgsafe("deadletter", "list", f"no-such-{uuid.uuid4().hex[:8]}", *url, env=env)
    if broker == "amqp10":
        # NOTE: Artemis creates the queue a receiver attaches to (auto-create-queues):
        # there is no missing address to report, only an empty one.
        assert missing.code == 0 and "0 dead letter(s) read; that is all" in missing.stdout
    else:
        assert missing.code == 3 and "does not exist" in missing.stderr, missing.stderr[-3000:]

    replayed = msgsafe("deadletter", "replay", place.dlq, *url, "--all", "--json", env=env)
    assert replayed.code == 0, replayed.stderr[-3000:]
    *records, totals = _json_lines(replayed.stdout)
    assert (totals["confirmed"], totals["failed"]) == (COUNT, 0)
    assert sorted(str(r["message_id"]) for r in records) == sorted(ids)
    audit = tmp_path / "state" / "msgsafe" / "deadletter-audit.jsonl"
    assert len(audit.read_text().splitlines()) == COUNT

    handled: Counter[str] = Counter()
    lock = threading.Lock()

    def fixed(delivery: Delivery) -> None:
        with lock:
            handled[str(delivery.message_id)] += 1

    # On Kafka the origin's group goes on where the first run committed: the replays.
    second = Consumer(place.url, group=place.group).subscribe(place.origin)
    _run_until(second, fixed, lambda: len(handled) == COUNT)
    lost = set(ids) - set(handled)
    print(f"[{broker}] replayed {totals}, handled {len(handled)}, lost {len(lost)}")
    assert lost == set() and set(handled) == set(ids)  # the original ids, none lost
    after = msgsafe("deadletter", "list", place.dlq, *url, "--limit", "1000", "--json", env=env)
    # Kafka removes nothing (the audit log says what was replayed); the others did.
    left = COUNT if broker == "kafka" else 0
    assert _json_lines(after.stdout)[-1] == {"read": left, "complete": True}

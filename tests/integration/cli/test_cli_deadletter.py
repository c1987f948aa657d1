"""``msgsafe deadletter`` against the session's RabbitMQ cluster, as a subprocess: 20
poison messages dead-lettered by Consumer.run are listed (with their attempts), replayed
to their origin, and handled there by a fixed handler; counted per id."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from msgsafe import Consumer, Delivery, Producer, RetryPolicy
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.commands import msgsafe
from tests.support.rabbit_queues import declare_quorum
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

COUNT, ATTEMPTS = 20, 3


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


def test_dead_letters_listed_replayed_and_then_handled(
    rabbit_urls: RabbitUrls, tmp_path: Path
) -> None:
    origin = declare_quorum(rabbit_urls.amqp[0], f"dl-origin-{uuid.uuid4().hex[:8]}")
    dlq = declare_quorum(rabbit_urls.amqp[0], f"dl-dlq-{uuid.uuid4().hex[:8]}")
    with Producer(rabbit_urls.cluster, outbox=False) as producer:
        ids = [producer.send(origin, f"order {n}".encode()).message_id for n in range(COUNT)]

    def poison(delivery: Delivery) -> None:
        raise ValueError("cannot parse")

    first = Consumer(rabbit_urls.cluster).subscribe(origin)
    with Producer(rabbit_urls.cluster, outbox=tmp_path / "dead.db") as dead_letters:
        _run_until(
            first,
            poison,
            lambda: first.stats().dead_lettered == COUNT,
            retry=RetryPolicy(initial=0.0, max_attempts=ATTEMPTS),
            dead_letter=dlq,
            dead_letter_producer=dead_letters,
        )

    # The URL through the environment: no password in argv.
    env = {
        "MSGSAFE_DL_URL": rabbit_urls.cluster,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    url = ["--url", "env:MSGSAFE_DL_URL"]
    listed = msgsafe("deadletter", "list", dlq, *url, "--json", env=env)
    assert listed.code == 0, listed.stderr[-3000:]
    *rows, summary = _json_lines(listed.stdout)
    assert summary == {"read": COUNT, "complete": True}
    assert sorted(str(r["message_id"]) for r in rows) == sorted(ids)
    assert {(r["source"], r["attempts"], r["error_type"]) for r in rows} == {
        (origin, str(ATTEMPTS), "ValueError")
    }
    missing = msgsafe("deadletter", "list", f"no-such-{uuid.uuid4().hex[:8]}", *url, env=env)
    assert missing.code == 3 and "does not exist" in missing.stderr

    replayed = msgsafe("deadletter", "replay", dlq, *url, "--all", "--json", env=env)
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

    second = Consumer(rabbit_urls.cluster).subscribe(origin)
    _run_until(second, fixed, lambda: len(handled) == COUNT)
    lost = set(ids) - set(handled)
    assert lost == set() and set(handled) == set(ids)  # the original ids, none lost
    empty = msgsafe("deadletter", "list", dlq, *url, "--json", env=env)
    assert _json_lines(empty.stdout) == [{"read": 0, "complete": True}]

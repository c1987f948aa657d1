"""Every example that runs on ``memory://`` runs here as a subprocess, as a user would
start it: exit 0, the lines it promises, and nothing written outside its temp dirs.

The examples that need PostgreSQL, Kafka or Spark run in tests/integration/examples/.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.commands import EXAMPLES, Run, run_example

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture
def run(tmp_path: Path) -> Callable[..., Run]:
    home = tmp_path / "home"
    home.mkdir()

    def start(name: str, *args: str) -> Run:
        result = run_example(name, *args, home=home, timeout=60)
        # NOTE: the examples use temporary outboxes; none may create the default one.
        assert list(home.iterdir()) == [], f"{name} wrote into HOME: {list(home.rglob('*'))}"
        return result

    return start


def test_every_example_is_tested() -> None:
    tested = {
        "quickstart.py",
        "outbox_outage.py",
        "async_producer.py",
        "send_batch.py",
        "kafka_keys.py",
        "testing_your_code.py",
        "observability.py",
        # tests/integration/examples/:
        "transactional_outbox.py",
        "spark_sink.py",
    }
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_quickstart(run: Callable[..., Run]) -> None:
    result = run("quickstart.py")
    assert result.code == 0, result.stderr
    lines = result.lines()
    sent = [m.group(1) for m in (re.fullmatch(rf"sent ({UUID}) CONFIRMED", x) for x in lines) if m]
    received = [
        m.group(1) for m in (re.fullmatch(rf"received ({UUID}) order \d", x) for x in lines) if m
    ]
    assert len(sent) == 3
    assert received == sent  # one key: in order, each once
    assert f"resent {sent[0]} CONFIRMED" in lines
    assert lines[-1] == "sent 3 · received 3 · duplicates dropped 1"


def test_outbox_outage(run: Callable[..., Run]) -> None:
    result = run("outbox_outage.py")
    assert result.code == 0, result.stderr
    assert result.lines() == [
        "pending during the outage: 10",
        "pending after drain: 0",
        "receipts: CONFIRMED 1, STORED 10",
        "on the broker: 11 · lost 0",
    ]


def test_send_batch(run: Callable[..., Run]) -> None:
    result = run("send_batch.py")
    assert result.code == 0, result.stderr
    lines = result.lines()
    assert lines[:2] == ["batch of 10000: confirmed 10000, stored 0", "failed 2, safe 2"]
    assert len(lines) == 4
    assert all(re.fullmatch(rf"  {UUID}: Rejected", line) for line in lines[2:])


def test_async_producer(run: Callable[..., Run]) -> None:
    result = run("async_producer.py")
    assert result.code == 0, result.stderr
    lines = result.lines()
    assert re.fullmatch(r"sent 500 in \d+\.\d\ds", lines[0])
    assert lines[1:] == ["receipts: CONFIRMED 500", "failed 0"]


def test_observability(run: Callable[..., Run]) -> None:
    result = run("observability.py")
    assert result.code == 0, result.stderr
    assert result.lines() == [
        "producer: sent 25, confirmed 20, stored 5, drained 5, in flight 0",
        "consumer: received 25, acked 25",
        "spans: PRODUCER 25, CONSUMER 25, detours 5",
        "lost 0",
    ]


def test_kafka_keys_on_memory(run: Callable[..., Run]) -> None:
    # The order logic is the same on any URL; tests/integration runs it on Kafka.
    result = run("kafka_keys.py", "memory://examples-keys")
    assert result.code == 0, result.stderr
    lines = result.lines()
    assert lines[0] == "sent 200: CONFIRMED 200"
    for n in range(1, 5):
        assert f"customer-{n}: received 50 of 50, in order: True" in lines


def test_kafka_keys_without_url_shows_how_to_get_a_broker(run: Callable[..., Run]) -> None:
    result = run("kafka_keys.py")
    assert result.code == 2
    assert "python3 -m msgsafe.cluster.tansu 1" in result.stderr


def test_testing_your_code(run: Callable[..., Run]) -> None:
    result = run("testing_your_code.py")
    assert result.code == 0, result.stdout + result.stderr
    assert re.search(r"^4 passed in ", result.stdout, re.MULTILINE)

"""``msgsafe deadletter list|show|replay|purge`` on the memory broker.

``Consumer.run`` with a handler that always fails fills a dead-letter queue; the
commands then run in this process (CliRunner), so the memory broker is shared with the
test, which counts what is where afterwards.
"""

from __future__ import annotations

import getpass
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msgsafe import Consumer, Delivery, Producer, RetryPolicy
from msgsafe.adapters._config import build_config
from msgsafe.adapters.amqp10.config import load_options as amqp10_options
from msgsafe.adapters.rabbitmq.config import RabbitOptions
from msgsafe.cli import app
from msgsafe.cli._output import with_options
from msgsafe.cli.deadletter import REPLAYED_BY, REPLAYED_FROM, reading_options
from msgsafe.consuming.dead_letter import DEAD_LETTER_HEADERS, DLQ_MESSAGE_ID
from msgsafe.endpoints import parse_url
from msgsafe.testing import MemoryBroker
from tests.support.kafka_mock import MockKafkaCluster
from tests.support.waiting import wait_until

USAGE, ERROR, LOSS = 2, 3, 1
ORIGIN, DLQ = "orders", "orders.dlq"
_names = iter(range(1_000_000))


@dataclass
class Dead:
    broker: MemoryBroker
    url: str
    ids: list[str]


@pytest.fixture
def dead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Dead]:
    """Five messages sent to ORIGIN, each dead-lettered to DLQ after 3 attempts."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    name = f"cli-deadletter-{next(_names)}"
    broker = MemoryBroker.named(name)
    url = f"memory://{name}"
    with Producer(url, outbox=False) as producer:
        ids = [
            producer.send(ORIGIN, f"order {n}".encode(), key=f"k{n}").message_id for n in range(5)
        ]

    def poison(delivery: Delivery) -> None:
        raise ValueError(f"cannot parse {delivery.body!r}")

    consumer = Consumer(url).subscribe(ORIGIN)
    with Producer(url, outbox=False) as dead_letters:
        stopper = threading.Thread(
            target=lambda: (
                wait_until(lambda: broker.count(DLQ) == 5, 20, "5 dead letters"),
                consumer.stop(),
            ),
            daemon=True,
        )
        stopper.start()
        consumer.run(
            poison,
            retry=RetryPolicy(initial=0.0, max_attempts=3),
            dead_letter=DLQ,
            dead_letter_producer=dead_letters,
            handle_signals=False,
        )
        stopper.join()
    yield Dead(broker, url, ids)
    MemoryBroker.forget(name)


def cli(*args: str) -> tuple[int, list[dict[str, object]], str]:
    # All were read once nothing arrived for 0.3 s: the memory broker hands out at once.
    result = CliRunner().invoke(app, [*args, "--wait", "0.3"])
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, lines, result.output


def waiting(d: Dead, destination: str) -> list[Delivery]:
    """What a new consumer finds at ``destination`` now (and gives back)."""
    found: list[Delivery] = []
    with Consumer(d.url) as again:
        again.subscribe(destination)
        while batch := again.poll(0.1, max_messages=100):
            found.extend(batch)
    return found


def dead_ids(d: Dead) -> list[str]:
    return sorted(x.headers[DLQ_MESSAGE_ID] for x in waiting(d, DLQ))


def test_list_shows_every_dead_letter_and_removes_none(dead: Dead) -> None:
    code, lines, output = cli("deadletter", "list", DLQ, "--url", dead.url, "--json")
    assert code == 0, output
    *rows, summary = lines
    assert summary == {"read": 5, "complete": True}
    assert sorted(str(r["message_id"]) for r in rows) == sorted(dead.ids)
    assert {(r["source"], r["attempts"], r["error_type"]) for r in rows} == {
        (ORIGIN, "3", "ValueError")
    }
    assert all(str(r["error"]).startswith("cannot parse") for r in rows)
    assert dead_ids(dead) == sorted(dead.ids)  # nothing removed
    code, lines, _ = cli("deadletter", "list", DLQ, "--url", dead.url, "--limit", "2", "--json")
    assert code == 0 and lines[-1] == {"read": 2, "complete": False}
    code, _, output = cli("deadletter", "list", DLQ, "--url", dead.url)
    assert code == 0 and "5 dead letter(s) read; that is all" in output


def test_show_prints_one_dead_letter_in_full(dead: Dead) -> None:
    code, [shown], output = cli("deadletter", "show", DLQ, dead.ids[2], "--url", dead.url, "--json")
    assert code == 0, output
    assert shown["message_id"] == dead.ids[2] and shown["body"] == "order 2"
    assert shown["key"] == "k2" and shown["truncated"] is False
    headers = shown["headers"]
    assert isinstance(headers, dict) and set(DEAD_LETTER_HEADERS) <= set(headers)
    code, _, output = cli("deadletter", "show", DLQ, "no-such-id", "--url", dead.url)
    assert code == USAGE and "no dead letter with id no-such-id" in output
    assert len(dead_ids(dead)) == 5


def test_replay_keeps_the_id_removes_the_dead_letter_and_records_it(
    dead: Dead, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    chosen = dead.ids[:3]
    args = ["deadletter", "replay", DLQ, "--url", dead.url, "--audit", str(audit), "--json"]
    code, lines, output = cli(*args, *(x for i in chosen for x in ("--id", i)))
    assert code == 0, output
    *records, summary = lines
    assert summary["confirmed"] == 3 and summary["failed"] == 0
    assert sorted(str(r["message_id"]) for r in records) == sorted(chosen)
    # Back at the origin with the original ids; the dead-letter headers gone.
    back = {m.message_id: m for m in dead.broker.messages(ORIGIN)[5:]}
    assert sorted(back) == sorted(chosen)
    for message in back.values():
        headers = dict(message.headers or {})
        assert not set(DEAD_LETTER_HEADERS) & set(headers)
        assert headers[REPLAYED_BY] == getpass.getuser() and headers[REPLAYED_FROM] == DLQ
    # Only the replayed dead letters were removed; each replay is in the audit log.
    assert dead_ids(dead) == sorted(dead.ids[3:])
    logged = [json.loads(line) for line in audit.read_text().splitlines()]
    assert sorted(r["message_id"] for r in logged) == sorted(chosen)
    assert {(r["by"], r["from"], r["to"], r["status"]) for r in logged} == {
        (getpass.getuser(), DLQ, ORIGIN, "confirmed")
    }


def test_a_refused_replay_leaves_its_dead_letter_in_place(dead: Dead, tmp_path: Path) -> None:
    dead.broker.reject_next(2)
    code, _, output = cli(
        "deadletter", "replay", DLQ, "--url", dead.url, "--all", "--audit", str(tmp_path / "a")
    )
    assert code == LOSS, output
    assert "3 confirmed, 0 stored, 2 failed" in output
    replayed = sorted(m.message_id for m in dead.broker.messages(ORIGIN)[5:])
    left = dead_ids(dead)
    assert len(replayed) == 3 and len(left) == 2
    assert sorted(replayed + left) == sorted(dead.ids)  # none lost, none both


def test_replay_to_another_destination_and_unknown_ids(dead: Dead, tmp_path: Path) -> None:
    audit = ["--audit", str(tmp_path / "a")]
    code, _, output = cli(
        "deadletter", "replay", DLQ, "--url", dead.url, "--id", "nope", "--id", dead.ids[0], *audit
    )
    assert code == USAGE and "nope" in output
    assert len(dead_ids(dead)) == 5 and len(dead.broker.messages(ORIGIN)) == 5
    code, _, output = cli(
        "deadletter", "replay", DLQ, "--url", dead.url, "--id", dead.ids[0], "--to", "elsewhere"
    )
    assert code == 0, output
    assert dead.broker.ids("elsewhere") == [dead.ids[0]]
    assert (tmp_path / "state" / "msgsafe" / "deadletter-audit.jsonl").is_file()


def test_purge_deletes_chosen_dead_letters_only_with_yes(dead: Dead) -> None:
    code, _, output = cli("deadletter", "purge", DLQ, "--url", dead.url, "--id", dead.ids[1])
    assert code == USAGE and "--yes" in output
    assert len(dead_ids(dead)) == 5
    code, [result], output = cli(
        "deadletter", "purge", DLQ, "--url", dead.url, "--id", dead.ids[1], "--yes", "--json"
    )
    assert code == 0 and result == {"purged": 1, "message_ids": [dead.ids[1]]}, output
    assert dead_ids(dead) == sorted(set(dead.ids) - {dead.ids[1]})
    code, _, _ = cli("deadletter", "purge", DLQ, "--url", dead.url, "--all", "--yes")
    assert code == 0 and dead_ids(dead) == []


def test_purge_refuses_on_kafka_naming_retention() -> None:
    code, _, output = cli(
        "deadletter", "purge", "t.dlq", "--url", "kafka://127.0.0.1:1", "--all", "--yes"
    )
    assert code == USAGE and "retention" in output


def test_an_unreachable_broker_exits_3(dead: Dead) -> None:
    dead.broker.down()
    try:
        code, [error], _ = cli("deadletter", "list", DLQ, "--url", dead.url, "--json")
    finally:
        dead.broker.up()
    assert code == ERROR and "ConnectError" in str(error["error"])
    assert len(dead_ids(dead)) == 5


def test_a_kafka_topic_that_does_not_exist_exits_3_at_once(kafka_mock: MockKafkaCluster) -> None:
    """Not 15 s of waiting for a group's partitions, then "0 dead letters; that is all"."""
    url = f"kafka://{kafka_mock.bootstrap}"
    code, [error], _ = cli("deadletter", "list", "no-such.dlq", "--url", url, "--json")
    assert code == ERROR and "no-such.dlq does not exist" in str(error["error"])


@pytest.mark.parametrize("limit", [1, 250, 10_000])
def test_a_read_asks_the_broker_for_every_dead_letter_it_may_hold(limit: int) -> None:
    """Every dead letter read stays unsettled until the command ends: the AMQP 1.0
    credit and the RabbitMQ prefetch must cover ``--limit``, or a read stops short."""
    amqp10 = parse_url(with_options("amqp10://h:5672", reading_options("amqp10", limit)))
    assert amqp10_options(amqp10, {}).credit == limit
    rabbit = parse_url(with_options("amqp://h:5672", reading_options("rabbitmq", limit)))
    assert build_config(RabbitOptions, rabbit, {}).prefetch == min(limit, 65535)

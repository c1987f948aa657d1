"""``msgsafe outbox drain`` exits 0 only when the outbox is empty: 1 while messages wait
(saying how many and why), 8 when nothing waits but the quarantine holds messages
(pointing at ``msgsafe outbox quarantine`` and ``replay``). A stored name the protocol
refuses is quarantined by the drain, never left waiting.

The memory broker is shared with the test, so these commands run in-process; the
quarantine cases run as subprocesses against a port where nothing listens (the name is
refused before any connection)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msgsafe.cli import app
from msgsafe.cluster._process import free_port
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox
from msgsafe.testing import MemoryBroker
from tests.support.commands import msgsafe as run

OK, WAITING, QUARANTINED = 0, 1, 8


def _file(path: Path, target: str, destinations: list[str]) -> list[str]:
    """An outbox file for ``target`` holding one message per destination, written as a
    producer would have stored them; their ids."""
    store = SqliteOutbox(path, target=target)
    envelopes = [Envelope.build(d, f"m{i}".encode()) for i, d in enumerate(destinations)]
    store.put(envelopes)
    store.close()
    return [e.message_id for e in envelopes]


def test_drain_exits_0_when_everything_was_delivered(tmp_path: Path) -> None:
    broker = MemoryBroker.named("drain-ok")
    try:
        path = tmp_path / "ok.sqlite3"
        _file(path, "memory://drain-ok", ["q", "q", "q"])
        done = CliRunner().invoke(app, ["outbox", "drain", str(path)])
        assert done.exit_code == OK, done.output
        assert done.stdout.strip() == "3 delivered, 0 remaining, 0 quarantined"
        assert broker.count("q") == 3
    finally:
        MemoryBroker.forget("drain-ok")


def test_drain_exits_1_while_messages_wait_and_says_how_many_and_why(tmp_path: Path) -> None:
    broker = MemoryBroker.named("drain-waits")
    broker.refuse_writes()
    try:
        path = tmp_path / "waits.sqlite3"
        _file(path, "memory://drain-waits", ["q", "q"])
        runner = CliRunner()
        done = runner.invoke(app, ["outbox", "drain", str(path), "--timeout", "1"])
        assert done.exit_code == WAITING, done.output
        said = " ".join(done.stderr.split())
        assert "2 message(s) still wait" in said, said
        assert "Refused" in said  # why: the broker's refusal
        assert f"msgsafe outbox drain {path}" in said
        report = runner.invoke(app, ["outbox", "drain", str(path), "--timeout", "1", "--json"])
        assert report.exit_code == WAITING
        data = json.loads(report.stdout)
        assert data["remaining"] == 2 and data["exit_code"] == WAITING
        assert "Refused" in data["last_error"]
    finally:
        MemoryBroker.forget("drain-waits")


@pytest.mark.parametrize(
    ("scheme", "name", "reason"),
    [
        ("amqp", "q" * 300, "at most 255 bytes"),  # what the user met
        ("amqp", "é" * 128, "at most 255 bytes"),  # 256 bytes in 128 characters
        ("kafka", "orders v1", "Kafka topic names hold only"),
    ],
)
def test_drain_quarantines_a_stored_name_the_protocol_refuses_and_exits_8(
    tmp_path: Path, scheme: str, name: str, reason: str
) -> None:
    path = tmp_path / "old.sqlite3"
    (message_id,) = _file(path, f"{scheme}://127.0.0.1:{free_port()}", [name])
    done = run("outbox", "drain", str(path), "--timeout", "10")
    assert done.code == QUARANTINED, (done.stdout, done.stderr)
    assert done.stdout.split("(")[0].strip() == "0 delivered, 0 remaining, 1 quarantined"
    said = " ".join(done.stderr.split())
    assert "1 moved there by this drain" in said, said
    assert f"msgsafe outbox quarantine {path}" in said
    assert f"msgsafe outbox replay {path} --all" in said
    (entry,) = json.loads(run("outbox", "quarantine", str(path), "--json").stdout)
    assert entry["message_id"] == message_id
    assert entry["error"].startswith("InvalidDestination: ") and reason in entry["error"]
    again = run("outbox", "drain", str(path), "--json")
    assert again.code == QUARANTINED
    assert json.loads(again.stdout) | {"last_error": None} == {
        "before": 0,
        "delivered": 0,
        "remaining": 0,
        "quarantined": 1,
        "newly_quarantined": 0,
        "last_error": None,
        "exit_code": QUARANTINED,
    }


def test_forward_quarantines_a_stored_name_the_protocol_refuses_too(tmp_path: Path) -> None:
    # An AMQP 1.0 address with a NUL: its transport would not refuse it (proton cuts the
    # address there), only the destination check does.
    path = tmp_path / "old.sqlite3"
    (message_id,) = _file(path, f"amqp10://127.0.0.1:{free_port()}", ["q\x00x"])
    done = run(
        "outbox", "forward", str(path), "--until-empty", "--interval", "0.2", "--json", timeout=30
    )
    assert done.code == 0, (done.stdout, done.stderr)
    (entry,) = json.loads(run("outbox", "quarantine", str(path), "--json").stdout)
    assert entry["message_id"] == message_id
    assert entry["error"].startswith("InvalidDestination: "), entry

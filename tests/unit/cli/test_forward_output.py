"""What ``msgsafe outbox forward`` prints and how URLs reach the CLI without ``ps``.

- ``--json`` events are JSON lines (one object per line), and every single-document
  ``--json`` output is one line of valid JSON too;
- ``last_error`` is an error since the last delivery, with the time it was first seen:
  an error the run got past is not repeated in the final event;
- ``env:NAME`` and ``@FILE`` name where a URL is (store and broker);
- every ``outbox`` subcommand's help says it takes a file or a ``postgresql://`` URL.

The commands run in this process (CliRunner): the memory broker is shared with the test.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from msgsafe.cli import app
from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope
from msgsafe.outbox import ForwarderStats, open_store
from msgsafe.testing import MemoryBroker
from tests.support.waiting import wait_until

USAGE = 2


@pytest.fixture
def broker(memory_broker: MemoryBroker) -> MemoryBroker:
    return memory_broker


def _stored(path: Path, broker: MemoryBroker, count: int) -> list[str]:
    store = open_store(str(path), parse_url(f"memory://{broker.name}"))
    assert store is not None
    envelopes = [Envelope.build("q", f"m{i}".encode()) for i in range(count)]
    store.put(envelopes)
    store.close()
    return [e.message_id for e in envelopes]


def _events(stdout: str) -> list[dict[str, Any]]:
    lines = stdout.splitlines()
    assert lines, "no output"
    events = [json.loads(line) for line in lines]  # every line a whole JSON object
    assert all(isinstance(e, dict) for e in events)
    return events


def test_forward_json_is_json_lines_and_forgets_an_error_it_got_past(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    path = tmp_path / "outbox.db"
    ids = _stored(path, broker, 5)
    broker.down()

    def back_up() -> None:
        # Up after the forwarder was refused three times: backoffs of 0.2 s and more
        # between them, while the status loop samples every 0.05 s.
        wait_until(lambda: broker.publish_attempts >= 3, 30.0, "three refused attempts")
        broker.up()

    helper = threading.Thread(target=back_up, daemon=True)
    helper.start()
    result = CliRunner().invoke(
        app,
        ["outbox", "forward", str(path), "--until-empty", "--interval", "0.05", "--json"],
    )
    helper.join(30.0)
    assert result.exit_code == 0, result.output
    events = _events(result.stdout)
    refused = [e for e in events if e["event"] == "status" and e["refusing"]]
    assert refused, events
    assert "down" in refused[0]["last_error"] and refused[0]["last_error_at"], refused[0]
    done = events[-1]
    assert done["event"] == "done"
    assert sorted(broker.ids("q")) == sorted(ids)
    assert done["delivered"] == 5 and done["waiting"] == 0
    assert done["last_error"] is None, done
    assert done["last_error_at"] is None


def _stats(delivered: int, error: str | None, refusing: bool = False) -> ForwarderStats:
    return ForwarderStats(
        depth=1,
        bytes=1,
        oldest_age_s=1.0,
        quarantined=0,
        delivered=delivered,
        retried=0,
        refusing=refusing,
        last_error=error,
    )


def test_last_error_is_reported_with_its_time_until_a_delivery_follows_it() -> None:
    from msgsafe.cli.outbox_forward import _RecentError

    recent = _RecentError()
    assert recent.sample(_stats(0, None)) == (None, None)
    error, at = recent.sample(_stats(3, "ConnectError: down"))
    assert error == "ConnectError: down" and at is not None and at.endswith("+00:00")
    assert recent.sample(_stats(3, "ConnectError: down")) == (error, at)
    # A refusing broker's error stays current whatever went through before it.
    assert recent.sample(_stats(4, "ConnectError: down", refusing=True)) == (error, at)
    assert recent.sample(_stats(5, "ConnectError: down")) == (None, None)
    new_error, new_at = recent.sample(_stats(5, "Rejected: x"))
    assert new_error == "Rejected: x" and new_at is not None


def test_single_document_json_outputs_are_one_line_of_valid_json(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    path = tmp_path / "outbox.db"
    _stored(path, broker, 2)
    runner = CliRunner()
    for args in (["status"], ["list"], ["quarantine"]):
        result = runner.invoke(app, ["outbox", *args, str(path), "--json"])
        assert result.exit_code == 0, result.output
        assert len(result.stdout.splitlines()) == 1, result.stdout
        json.loads(result.stdout)
    doctor = runner.invoke(app, ["doctor", f"memory://{broker.name}", "--json"])
    assert len(doctor.stdout.splitlines()) == 1, doctor.stdout
    assert json.loads(doctor.stdout)["broker"].startswith("memory://")


def test_urls_come_from_a_variable_or_a_file(
    tmp_path: Path, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "outbox.db"
    ids = _stored(path, broker, 3)
    monkeypatch.setenv("MSGSAFE_TEST_OUTBOX", str(path))
    secret_file = tmp_path / "broker-url"
    secret_file.write_text(f"memory://{broker.name}\n")
    result = CliRunner().invoke(
        app,
        [
            "outbox",
            "forward",
            "env:MSGSAFE_TEST_OUTBOX",
            "--url",
            f"@{secret_file}",
            "--until-empty",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert sorted(broker.ids("q")) == sorted(ids)
    assert _events(result.stdout)[-1]["store"] == str(path)


def test_a_missing_variable_or_file_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    runner = CliRunner()
    unset = runner.invoke(app, ["outbox", "status", "env:MSGSAFE_TEST_NOT_SET"])
    assert unset.exit_code == USAGE
    assert "MSGSAFE_TEST_NOT_SET" in unset.output
    missing = runner.invoke(app, ["doctor", f"@{tmp_path / 'nothing'}"])
    assert missing.exit_code == USAGE
    # The error box wraps a long path anywhere: read it unwrapped.
    unwrapped = "".join(line.strip("│ ") for line in missing.output.splitlines())
    assert f"{tmp_path / 'nothing'}" in unwrapped, missing.output


@pytest.mark.parametrize(
    "command", ["status", "list", "quarantine", "replay", "purge", "drain", "watch", "forward"]
)
def test_outbox_help_says_the_store_is_a_file_or_a_postgresql_url(command: str) -> None:
    result = CliRunner().invoke(app, ["outbox", command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.replace("│", " ").split())
    assert "postgresql:// URL" in said, said
    assert "The outbox file" not in said
    assert "env:NAME" in said

"""``msgsafe outbox watch``: the live view forwards the file while it shows depth,
drain rate, oldest row and per-destination counts, and stops once it is empty."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from msgsafe.cli import app
from msgsafe.cli._output import ExitCode
from msgsafe.cli.outbox_watch import Sample, render
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox
from msgsafe.testing import MemoryBroker


def test_watch_forwards_until_empty_and_shows_the_figures(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    path = tmp_path / "o.db"
    store = SqliteOutbox(path, target=f"memory://{memory_broker.name}")
    ids = {"orders": 30, "audit": 12}
    sent: set[str] = set()
    for destination, count in ids.items():
        envelopes = [Envelope.build(destination, b"x" * 10) for _ in range(count)]
        store.put(envelopes)
        sent.update(e.message_id for e in envelopes)
    assert store.destinations() == [("orders", 30), ("audit", 12)]
    store.close()

    result = CliRunner().invoke(
        app, ["outbox", "watch", str(path), "--until-empty", "--interval", "0.05", "--for", "30"]
    )
    assert result.exit_code == 0, result.output
    assert "waiting" in result.output and "drain rate" in result.output
    assert set(memory_broker.ids("orders")) | set(memory_broker.ids("audit")) == sent
    again = SqliteOutbox(path)
    try:
        assert again.pending() == 0
    finally:
        again.close()


def test_the_view_of_a_sample() -> None:
    sample = Sample(
        path="/data/o.db",
        target="amqp://h1:5672",
        waiting=1200,
        bytes=120_000,
        oldest_age_s=95.0,
        quarantined=2,
        delivered=800,
        rate=400.0,
        refusing=False,
        last_error=None,
        per_destination=(("orders", 1000), ("audit", 200)),
    )
    console = Console(record=True, width=80)
    console.print(render(sample))
    text = console.export_text()
    for expected in ("1,200", "95.0 s", "400 msg/s", "3.0 s", "forwarding", "orders", "audit"):
        assert expected in text, expected


def test_a_file_another_process_holds_says_where_its_figures_are(tmp_path: Path) -> None:
    path = tmp_path / "held.db"
    held = f"""
import sys, time
from msgsafe.outbox import SqliteOutbox
from msgsafe.message import Envelope
store = SqliteOutbox({str(path)!r}, target="memory://elsewhere")
store.put([Envelope.build("orders", b"x")])
print("held", flush=True)
sys.stdin.read()
store.close()
"""
    owner = subprocess.Popen(
        [sys.executable, "-c", held], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline() == "held\n"
        result = CliRunner().invoke(app, ["outbox", "watch", str(path), "--for", "0.1"])
        assert result.exit_code == ExitCode.ERROR, result.output
        assert "in use by another process" in result.output
        assert "Producer.stats()" in result.output
    finally:
        owner.communicate("", timeout=30)
    # Once the owner stopped, the same command shows the file.
    result = CliRunner().invoke(
        app, ["outbox", "watch", str(path), "--no-forward", "--interval", "0.05", "--for", "0.1"]
    )
    assert result.exit_code == 0, result.output
    assert "waiting" in result.output

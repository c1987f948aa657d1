"""The CLI tells the truth about the outbox, and can operate it.

- ``msgsafe send`` exits 7 when something was only STORED, printing the outbox path and
  the command that forwards it (and that command works);
- ``msgsafe outbox status`` with no path lists every default outbox;
- ``purge --waiting/--quarantined/--all`` with ``--yes`` for scripts, refusing without it
  when stdin is not a terminal; unknown ids are errors for ``purge`` and ``replay``;
- ``drain PATH`` forwards to the broker the rows name, no ``--url`` needed;
- a damaged file's ``OutboxCorrupt`` names ``msgsafe outbox salvage``, which copies every
  intact message to a new file and reports the count.

Commands run as subprocesses unless the memory broker must be shared with the test.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msgsafe.cli import app
from msgsafe.endpoints import parse_url
from msgsafe.errors import OutboxCorrupt
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox, open_store
from msgsafe.testing import MemoryBroker
from tests.support.commands import msgsafe as run

ROOT = Path(__file__).resolve().parents[3]
USAGE, ERROR, STORED, QUARANTINED = 2, 3, 7, 8


# --- finding 6: send says when something was only stored ------------------------------------


def test_send_exits_7_when_only_stored_and_its_forwarding_command_works(data_home: Path) -> None:
    broker = MemoryBroker.named("cli-stored")
    broker.refuse_writes()
    runner = CliRunner()
    try:
        sent = runner.invoke(app, ["send", "memory://cli-stored", "q"], input="a\nb\nc\n")
        assert sent.exit_code == STORED, sent.output
        assert [line.split()[0] for line in sent.stdout.splitlines()] == ["stored"] * 3
        said = " ".join(sent.stderr.split())
        match = re.search(r"Forward them with: (msgsafe outbox drain \S+)", said)
        assert match, sent.stderr
        path = Path(match.group(1).split()[-1])
        assert str(path) in said and path.is_file()
        assert str(data_home) in str(path)

        broker.accept_writes()
        drained = runner.invoke(app, match.group(1).split()[1:])
        assert drained.exit_code == 0, drained.output
        assert broker.count("q") == 3

        confirmed = runner.invoke(app, ["send", "memory://cli-stored", "q"], input="d\n")
        assert confirmed.exit_code == 0, confirmed.output
        assert "drain" not in confirmed.stderr
    finally:
        MemoryBroker.forget("cli-stored")


def test_send_to_a_refusing_port_exits_7_and_prints_the_path(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"amqp://guest:secret@127.0.0.1:{port}/%2F"
    proc = run(
        "send",
        url,
        "q",
        "-o",
        "connect_timeout=0.5",
        stdin="one\n",
        env={"XDG_DATA_HOME": str(tmp_path / "data")},
    )
    assert proc.code == STORED, proc.stderr
    said = " ".join(proc.stderr.split())
    assert "msgsafe outbox drain" in said and str(tmp_path / "data") in said
    assert "--url URL" in said and "secret" not in said


def test_exit_code_7_is_in_the_help() -> None:
    help_text = " ".join(run("--help").stdout.split())
    assert "7 some messages were only stored" in help_text


# --- finding 1's listing: status with no path -------------------------------------------------


def test_status_without_a_path_lists_every_default_outbox(data_home: Path) -> None:
    for url, count in (("amqp://user:secret@h1:5672/%2F?heartbeat=3", 3), ("kafka://b1", 2)):
        store = open_store(True, parse_url(url))
        assert store is not None
        store.put([Envelope.build("q", b"x") for _ in range(count)])
        store.close()
    env = {"XDG_DATA_HOME": str(data_home)}
    listed = run("outbox", "status", "--json", env=env)
    assert listed.code == 0, listed.stderr
    rows = {row["destination"]: row for row in json.loads(listed.stdout)}
    assert rows["amqp://h1:5672/%2F"]["waiting"] == 3
    assert rows["kafka://b1:9092"]["waiting"] == 2
    assert all(row["state"] == "ok" for row in rows.values())
    human = run("outbox", "status", env=env)
    assert human.code == 0
    assert "amqp://h1:5672/%2F" in human.stdout and "kafka://b1:9092" in human.stdout
    assert "secret" not in listed.stdout + human.stdout


# --- finding 7: purge, replay, drain ---------------------------------------------------------


Mixed = tuple[Path, list[str], list[str]]


@pytest.fixture
def mixed(tmp_path: Path) -> Iterator[Mixed]:
    """An outbox for memory://ops with 4 waiting and 2 quarantined messages."""
    path = tmp_path / "ops.sqlite3"
    store = SqliteOutbox(path, target="memory://ops?confirm_timeout=6")
    envelopes = [Envelope.build("q", f"m{i}".encode()) for i in range(6)]
    store.put(envelopes)
    for env in store.claim(limit=2, lease_s=30):
        store.failed(env.message_id, error="Rejected: poison", retry_at=None)
    store.close()
    ids = [e.message_id for e in envelopes]
    yield path, ids[2:], ids[:2]


def counts(path: Path) -> tuple[int, int]:
    status = json.loads(run("outbox", "status", str(path), "--json").stdout)
    return status["waiting"], status["quarantined"]


def test_purge_without_yes_refuses_when_stdin_is_not_a_terminal(mixed: Mixed) -> None:
    path, _, _ = mixed
    refused = run("outbox", "purge", str(path), "--all")
    assert refused.code == USAGE
    assert "stdin is not a terminal" in refused.stderr and "--yes" in refused.stderr
    assert counts(path) == (4, 2)


@pytest.mark.parametrize(
    ("flags", "purged", "left"),
    [
        (("--waiting",), 4, (0, 2)),
        (("--quarantined",), 2, (4, 0)),
        (("--all",), 6, (0, 0)),
        (("--waiting", "--quarantined"), 6, (0, 0)),
    ],
)
def test_purge_scopes(
    mixed: Mixed, flags: tuple[str, ...], purged: int, left: tuple[int, int]
) -> None:
    path, _, _ = mixed
    proc = run("outbox", "purge", str(path), *flags, "--yes", "--json")
    assert proc.code == 0, proc.stderr
    assert json.loads(proc.stdout) == {"purged": purged}
    assert counts(path) == left


def test_purge_ids_anywhere_and_unknown_ids_change_nothing(mixed: Mixed) -> None:
    path, waiting, quarantined = mixed
    unknown = run("outbox", "purge", str(path), waiting[0], "no-such-id", "--yes")
    assert unknown.code == USAGE
    assert "no-such-id" in unknown.stderr and "nothing was changed" in unknown.stderr
    assert counts(path) == (4, 2)
    both = run("outbox", "purge", str(path), waiting[0], quarantined[0], "--yes", "--json")
    assert json.loads(both.stdout) == {"purged": 2}
    assert counts(path) == (3, 1)
    assert run("outbox", "purge", str(path), waiting[1], "--all").code == USAGE


def test_replay_of_an_unknown_or_waiting_id_is_an_error(mixed: Mixed) -> None:
    path, waiting, quarantined = mixed
    unknown = run("outbox", "replay", str(path), "0190aaaa-0000-7000-8000-000000000000")
    assert unknown.code == USAGE, unknown.stdout
    assert "0190aaaa-0000-7000-8000-000000000000" in unknown.stderr
    not_quarantined = run("outbox", "replay", str(path), waiting[0], quarantined[0])
    assert not_quarantined.code == USAGE
    assert "is waiting" in not_quarantined.stderr
    assert counts(path) == (4, 2)
    good = run("outbox", "replay", str(path), quarantined[0], "--json")
    assert good.code == 0 and json.loads(good.stdout) == {"replayed": 1}


@pytest.mark.parametrize("columns", ["80", "40"])
def test_list_and_quarantine_print_whole_ids_into_a_pipe(tmp_path: Path, columns: str) -> None:
    """Output that is not a terminal (80 columns, or a narrow COLUMNS) still shows every
    id whole on one line, so it can be copied into purge or replay; the long destination,
    key and error fold instead."""
    path = tmp_path / "wide.sqlite3"
    store = SqliteOutbox(path, target="memory://wide")
    envelopes = [
        Envelope.build("orders-" + "x" * 40, f"m{i}".encode(), key=f"customer-{i}-" + "k" * 30)
        for i in range(4)
    ]
    store.put(envelopes)
    for env in store.claim(limit=2, lease_s=30):
        error = "Unroutable: no queue bound for 'orders' in vhost '/' " * 3
        store.failed(env.message_id, error=error, retry_at=None)
    store.close()
    ids = [e.message_id for e in envelopes]
    id_pattern = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    printed: dict[str, list[str]] = {}
    for command in ("list", "quarantine"):
        proc = run("outbox", command, str(path), env={"COLUMNS": columns})
        assert proc.code == 0, proc.stderr
        printed[command] = id_pattern.findall(proc.stdout)
    assert printed == {"list": ids[2:], "quarantine": ids[:2]}
    copied = run("outbox", "purge", str(path), printed["list"][0], "--yes", "--json")
    assert json.loads(copied.stdout) == {"purged": 1}


def test_drain_takes_the_destination_from_the_rows(mixed: Mixed) -> None:
    path, _, _ = mixed
    drained = run("outbox", "drain", str(path), "--json")  # no --url
    # Everything waiting was delivered; the two quarantined before still are not.
    assert drained.code == QUARANTINED, drained.stderr
    report = json.loads(drained.stdout)
    assert report["before"] == 4 and report["delivered"] == 4 and report["remaining"] == 0
    assert report["quarantined"] == 2 and report["newly_quarantined"] == 0
    assert "note:" not in drained.stderr  # the same destination: nothing to point out
    assert counts(path) == (0, 2)
    again = run("outbox", "drain", str(path), "--json")
    assert again.code == QUARANTINED and json.loads(again.stdout)["before"] == 0


# --- finding 7: a damaged file, and its salvage -----------------------------------------------


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(path: Path, count: int) -> dict[str, tuple[bytes, str]]:
    """An outbox with ``count`` messages over a few hundred pages, some quarantined;
    returns id -> (body, table)."""
    store = SqliteOutbox(path, target="memory://salvage")
    envelopes = [
        Envelope.build("q", os.urandom(8) * (30 + i % 20), key=f"k{i % 9}", headers={"n": str(i)})
        for i in range(count)
    ]
    for start in range(0, count, 250):
        store.put(envelopes[start : start + 250])
    poison = store.claim(limit=40, lease_s=30)
    for env in poison:
        store.failed(env.message_id, error="Rejected: poison", retry_at=None)
    store.close()
    bad = {env.message_id for env in poison}
    return {
        e.message_id: (e.body, "quarantine" if e.message_id in bad else "outbox") for e in envelopes
    }


def damage(path: Path) -> int:
    """Scribble over the outbox table's root (an interior page: SQLite then reads none of
    its rows) and three leaves in its middle; returns how many rows those leaves held."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'outbox'").fetchone()[
            0
        ]
        leaves = conn.execute(
            "SELECT pageno, ncell FROM dbstat WHERE name = 'outbox' AND pagetype = 'leaf'"
            " ORDER BY pageno"
        ).fetchall()
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    assert len(leaves) > 20, "the table must span many pages"
    middle = leaves[len(leaves) // 2 : len(leaves) // 2 + 3]
    data = bytearray(path.read_bytes())
    for number in [root, *(n for n, _ in middle)]:
        for offset in range((number - 1) * page, number * page, 7):
            data[offset] = 0xA5
    path.write_bytes(bytes(data))
    return sum(cells for _, cells in middle)


def test_a_damaged_file_names_salvage_which_keeps_every_intact_message(tmp_path: Path) -> None:
    path = tmp_path / "damaged.sqlite3"
    originals = build(path, 3000)
    lost_with_pages = damage(path)
    before = digest(path)
    with pytest.raises(OutboxCorrupt, match="msgsafe outbox salvage"):
        SqliteOutbox(path)
    opened = run("outbox", "status", str(path))
    assert opened.code == ERROR and "msgsafe outbox salvage" in opened.stderr

    new = tmp_path / "rescued.sqlite3"
    proc = run("outbox", "salvage", str(path), "--to", str(new), "--json")
    assert proc.code == 0, proc.stderr
    report = json.loads(proc.stdout)
    print({k: v for k, v in report.items() if k not in ("source", "target")})
    assert digest(path) == before, "the damaged file is only read"

    store = SqliteOutbox(new)  # a sound file (its integrity check passes)
    try:
        waiting = store.list(limit=10_000)
        quarantined = store.quarantined(limit=10_000)
    finally:
        store.close()
    got = {e.envelope.message_id: (e.envelope.body, "outbox") for e in waiting}
    got |= {e.envelope.message_id: (e.envelope.body, "quarantine") for e in quarantined}
    assert report["waiting"] == len(waiting) and report["quarantined"] == len(quarantined)
    assert all(originals.get(i) == v for i, v in got.items()), "only intact, identical messages"
    assert len(got) >= len(originals) - lost_with_pages, (len(got), lost_with_pages)
    assert len(quarantined) == 40
    assert report["damaged_pages"] >= 1
    # The waiting ones keep their queue order (ids are time-ordered UUIDv7s).
    order = [e.envelope.message_id for e in waiting]
    assert order == sorted(order)

    human = run("outbox", "salvage", str(path), "--to", str(tmp_path / "again.sqlite3"))
    said = " ".join(human.stdout.split())
    assert f"copied {len(waiting)} waiting and 40 quarantined" in said
    assert "msgsafe outbox drain" in said
    assert run("outbox", "salvage", str(path), "--to", str(new)).code == ERROR  # exists


_DIES_WITH_A_WAL = textwrap.dedent(
    """
    import os, sys
    from msgsafe.message import Envelope
    from msgsafe.outbox import SqliteOutbox
    store = SqliteOutbox(sys.argv[1], target="memory://wal")
    store.put([Envelope.build("q", b"only-in-the-wal") for _ in range(25)])
    os._exit(0)
    """
)


def test_salvage_applies_the_write_ahead_log_of_a_dead_process(tmp_path: Path) -> None:
    path = tmp_path / "crashed.sqlite3"
    subprocess.run([sys.executable, "-c", _DIES_WITH_A_WAL, str(path)], cwd=ROOT, check=True)
    assert Path(f"{path}-wal").stat().st_size > 0
    proc = run("outbox", "salvage", str(path), "--json")
    assert proc.code == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["wal"] == "applied" and report["waiting"] == 25
    assert report["target"] == str(tmp_path / "crashed.salvaged.sqlite3")

"""``msgsafe outbox status|list|quarantine|replay|purge|watch`` on a PostgreSQL outbox
(the real primary + synchronous standby pair), as on an outbox file: the URL in place of
the path, its password never shown."""

from __future__ import annotations

import uuid

import pytest
from typer.testing import CliRunner

from msgsafe.cli import app
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.message import Envelope
from msgsafe.outbox import PostgresOutbox
from msgsafe.testing import MemoryBroker
from tests.support.commands import Run, msgsafe

pytestmark = pytest.mark.integration


def _no_secret(pair: PostgresCluster, *texts: str) -> None:
    # The pair's password is "msgsafe", as its user and database: look for it as one.
    for text in texts:
        assert f":{pair.password}@" not in text and "password" not in text.lower(), text


def _ok(run: Run, pair: PostgresCluster) -> Run:
    assert run.code == 0, run.stderr[-2000:]
    _no_secret(pair, run.stdout, run.stderr)
    return run


def test_status_list_quarantine_replay_purge_on_the_shared_table(
    pg_pair: PostgresCluster,
) -> None:
    table = f"cli_{uuid.uuid4().hex[:10]}"
    url = f"{pg_pair.url}&table={table}"
    store = PostgresOutbox.from_url(url, target="amqp://rabbit1:5672/")
    try:
        sent = [Envelope.build("orders", b"m%d" % i, key=f"k{i % 2}") for i in range(6)]
        store.put(sent)
        poison = store.claim(limit=1, lease_s=30)[0]
        store.failed(poison.message_id, error="PermanentError: too large", retry_at=None)
    finally:
        store.close()
    waiting_ids = [e.message_id for e in sent if e.message_id != poison.message_id]

    status = _ok(msgsafe("outbox", "status", url, "--json"), pg_pair).json()
    assert (status["waiting"], status["quarantined"]) == (5, 1)
    assert status["target"] == "amqp://rabbit1:5672"
    assert status["path"].startswith("postgresql://msgsafe@127.0.0.1:"), status["path"]
    assert status["path"].endswith(f"?table={table}")
    shown = _ok(msgsafe("outbox", "status", url), pg_pair).stdout
    assert "waiting" in shown and "quarantined" in shown  # the title folds at 80 columns

    listed = _ok(msgsafe("outbox", "list", url, "--json"), pg_pair).json()
    assert [row["message_id"] for row in listed] == waiting_ids
    assert {row["destination"] for row in listed} == {"orders"}
    _ok(msgsafe("outbox", "list", url), pg_pair)

    held = _ok(msgsafe("outbox", "quarantine", url, "--json"), pg_pair).json()
    assert [(row["message_id"], row["error"]) for row in held] == [
        (poison.message_id, "PermanentError: too large")
    ]

    wrong = msgsafe("outbox", "replay", url, waiting_ids[0], "--json")
    assert wrong.code == 2, wrong.stdout + wrong.stderr  # waiting, not quarantined
    _no_secret(pg_pair, wrong.stdout, wrong.stderr)
    moved = _ok(msgsafe("outbox", "replay", url, poison.message_id, "--json"), pg_pair).json()
    assert moved == {"replayed": 1}
    listed = _ok(msgsafe("outbox", "list", url, "--json"), pg_pair).json()
    assert [row["message_id"] for row in listed] == [*waiting_ids, poison.message_id]

    refused = msgsafe("outbox", "purge", url, "--waiting")  # stdin is not a terminal
    assert refused.code == 2
    _no_secret(pg_pair, refused.stdout, refused.stderr)
    purged = _ok(
        msgsafe("outbox", "purge", url, waiting_ids[0], waiting_ids[1], "--yes", "--json"),
        pg_pair,
    ).json()
    assert purged == {"purged": 2}
    status = _ok(msgsafe("outbox", "status", url, "--json"), pg_pair).json()
    assert (status["waiting"], status["quarantined"]) == (4, 0)


def test_watch_forwards_the_shared_table_until_empty(
    pg_pair: PostgresCluster, memory_broker: MemoryBroker
) -> None:
    """In-process (the memory broker lives in this process): the URL reaches the command
    as a Path argument, whose collapsed ``//`` is repaired."""
    table = f"cli_{uuid.uuid4().hex[:10]}"
    url = f"{pg_pair.url}&table={table}"
    store = PostgresOutbox.from_url(url, target=f"memory://{memory_broker.name}")
    try:
        sent = [Envelope.build("orders", b"x", key=f"k{i % 4}") for i in range(40)]
        sent += [Envelope.build("audit", b"y") for _ in range(10)]
        store.put(sent)
        assert store.destinations() == [("orders", 40), ("audit", 10)]
    finally:
        store.close()
    result = CliRunner().invoke(
        app, ["outbox", "watch", url, "--until-empty", "--interval", "0.1", "--for", "120"]
    )
    assert result.exit_code == 0, result.output
    assert "waiting" in result.output and "drain rate" in result.output
    _no_secret(pg_pair, result.output)
    got = memory_broker.ids("orders") + memory_broker.ids("audit")
    assert sorted(got) == sorted(e.message_id for e in sent)

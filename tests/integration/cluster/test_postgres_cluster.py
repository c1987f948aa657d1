"""``msgsafe cluster up postgres``: a real primary and synchronous streaming standby from
the machine's PostgreSQL, driven through the command as a user would (up, status, kill,
promote, restart, down), with every committed row counted across the fail-over.

A missing PostgreSQL fails with the command that installs it.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from msgsafe.cluster import load
from msgsafe.cluster._process import pid_alive
from msgsafe.cluster.postgres import INSTALL_HINT, PostgresCluster
from tests.support.commands import msgsafe
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "pg"
    yield folder
    if (folder / "cluster.json").exists():
        found = load(folder)
        found.stop()
        found.delete_data()


def _roles(described: dict[str, Any]) -> dict[str, str | None]:
    return {node["name"]: node["role"] for node in described["nodes"]}


def _count(url: str) -> int:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute("SELECT count(*) FROM counted").fetchone()
    return int(row[0]) if row else -1


def test_up_kill_promote_restart_down_through_the_command(cluster_dir: Path) -> None:
    up = msgsafe("cluster", "up", "postgres", "--nodes", "2", "--dir", str(cluster_dir), "--json")
    assert up.code == 0, f"{up.stderr}\n{INSTALL_HINT}"
    described = up.json()
    assert described["kind"] == "postgres"
    assert _roles(described) == {"pg0": "primary", "pg1": "standby"}
    url = described["url"]
    ports = [node["port"] for node in described["nodes"]]
    assert all(f"127.0.0.1:{port}" in url for port in ports), "the url names both hosts"
    assert "target_session_attrs=read-write" in url
    pids = {node["name"]: node["pid"] for node in described["nodes"]}
    assert all(pid_alive(pid) for pid in pids.values())

    # Every commit the primary acknowledged must be on the standby: synchronous commit.
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE counted (n int PRIMARY KEY)")
        conn.commit()
        for n in range(200):
            conn.execute("INSERT INTO counted VALUES (%s)", (n,))
            conn.commit()
        sync = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall()
    assert sync in ([("quorum",)], [("sync",)]), sync

    refused = msgsafe("cluster", "promote", "pg1", "--dir", str(cluster_dir))
    assert refused.code == 3 and "split brain" in refused.stderr

    killed = msgsafe("cluster", "kill", "pg0", "--dir", str(cluster_dir))
    assert killed.code == 0 and "pg0: not running" in killed.stdout
    assert not pid_alive(pids["pg0"])
    promoted = msgsafe("cluster", "promote", "pg1", "--dir", str(cluster_dir))
    assert promoted.code == 0 and "role primary" in promoted.stdout
    assert _count(url) == 200, "every acknowledged commit survived the primary's SIGKILL"
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO counted VALUES (200)")
        conn.commit()

    restarted = msgsafe("cluster", "restart", "pg0", "--dir", str(cluster_dir))
    assert restarted.code == 0 and "role standby" in restarted.stdout
    status = msgsafe("cluster", "status", "--dir", str(cluster_dir), "--json")
    assert _roles(status.json()) == {"pg0": "standby", "pg1": "primary"}
    # The rebuilt standby is synchronous again: a commit waits for it.
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO counted VALUES (201)")
        conn.commit()
        sync = conn.execute("SELECT application_name, sync_state FROM pg_stat_replication")
        assert sync.fetchall() in ([("pg0", "quorum")], [("pg0", "sync")])
    with psycopg.connect(load(cluster_dir).node_url(0)) as standby:
        row = standby.execute("SELECT count(*) FROM counted").fetchone()
        assert row is not None and row[0] == 202

    down = msgsafe("cluster", "down", "--dir", str(cluster_dir))
    assert down.code == 0 and "none left running" in down.stdout
    after = msgsafe("cluster", "status", "--dir", str(cluster_dir), "--json")
    assert [n["running"] for n in after.json()["nodes"]] == [False, False]

    # Started again from its data: pg1 is the primary it was.
    again = msgsafe("cluster", "up", "postgres", "--dir", str(cluster_dir), "--json")
    assert again.code == 0, again.stderr
    assert _roles(again.json()) == {"pg0": "standby", "pg1": "primary"}
    assert _count(url) == 202


def test_a_new_cluster_in_a_deleted_dirs_path_starts_empty(cluster_dir: Path) -> None:
    """A dir deleted with its cluster stopped (a test's temp dir, a user's ``rm -r``), then
    ``up`` again at the same path: a new, empty cluster whose standby streams, although
    the old data (kept under the spare root when the server's user cannot reach the dir)
    names other ports."""
    first = msgsafe(
        "cluster", "up", "postgres", "--nodes", "2", "--dir", str(cluster_dir), "--json"
    )
    assert first.code == 0, f"{first.stderr}\n{INSTALL_HINT}"
    old = load(cluster_dir)
    assert isinstance(old, PostgresCluster)
    with psycopg.connect(first.json()["url"], autocommit=True) as conn:
        conn.execute("CREATE TABLE left_behind (n int)")
    assert msgsafe("cluster", "down", "--dir", str(cluster_dir)).code == 0
    shutil.rmtree(cluster_dir)

    again = msgsafe(
        "cluster", "up", "postgres", "--nodes", "2", "--dir", str(cluster_dir), "--json"
    )
    assert again.code == 0, again.stderr
    assert _roles(again.json()) == {"pg0": "primary", "pg1": "standby"}
    with psycopg.connect(again.json()["url"]) as conn:
        row = conn.execute("SELECT to_regclass('left_behind') IS NULL").fetchone()
    assert row == (True,), "the new cluster started on the deleted one's data"


def test_a_standby_follows_its_primary_to_new_ports(cluster_dir: Path) -> None:
    """Started again on other ports than its copy was made from (a state file edited, a
    library user's ``base_port`` changed), the standby streams from where the primary
    listens now."""
    first = PostgresCluster(nodes=2, dir=cluster_dir, detached=True)
    first.start()
    moved_from = list(first.ports)
    first.stop()
    again = PostgresCluster(nodes=2, dir=cluster_dir, detached=True)
    assert again.ports != moved_from
    try:
        again.start()  # returns once the standby streams synchronously
        with psycopg.connect(again.url, autocommit=True) as conn:
            # A synchronous commit: it returns only once the standby has it.
            conn.execute("CREATE TABLE moved (n int)")
    finally:
        again.stop()


def test_the_session_pair_heals(pg_pair: PostgresCluster) -> None:
    """The fixture's heal undoes a fail-over: pg0 primary, pg1 its standby again."""
    pg_pair.kill(0)
    pg_pair.promote(1)
    assert [n.role for n in pg_pair.nodes()] == [None, "primary"]
    with psycopg.connect(pg_pair.url) as conn:
        assert conn.info.port == pg_pair.ports[1]


def test_pause_and_a_killed_standby_blocks_nothing_it_should_not(
    pg_pair: PostgresCluster,
) -> None:
    """A paused node shows as paused; kill of the standby then restart streams again."""
    pg_pair.pause(1)
    assert pg_pair.nodes()[1].role == "paused"
    pg_pair.resume(1)
    pg_pair.kill(1)
    assert pg_pair.nodes()[1].running is False
    pg_pair.restart(1)
    assert [n.role for n in pg_pair.nodes()] == ["primary", "standby"]


def test_a_single_node_commits_without_a_standby() -> None:
    """One node has no standby to wait for: its COMMIT returns (it once named itself its
    own synchronous standby, and every commit waited for ever)."""
    single = PostgresCluster(nodes=1)
    single.start()
    try:
        assert [n.role for n in single.nodes()] == ["primary"]
        conn = psycopg.connect(single.url, connect_timeout=5, autocommit=True)
        committed = threading.Event()

        def commit() -> None:
            conn.execute("CREATE TABLE counted (n int PRIMARY KEY)")
            conn.execute("INSERT INTO counted VALUES (1)")
            committed.set()

        worker = threading.Thread(target=commit, daemon=True)
        worker.start()
        try:
            wait_until(committed.is_set, 20.0, "an autocommit INSERT on the single node returns")
        finally:
            if not committed.is_set():
                conn.cancel()  # the waiting COMMIT, so the connection can close
            worker.join(10.0)
            conn.close()
        assert _count(single.url) == 1
    finally:
        single.stop()

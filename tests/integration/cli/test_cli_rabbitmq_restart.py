"""``msgsafe cluster restart`` on a real three-node RabbitMQ cluster, as a user runs it.

- after every node was killed, ``restart 0`` starts the others with it (a node that was
  not the last to stop waits at boot for its peers' tables: alone it once waited 96 s,
  saying nothing) and says so on stderr;
- ``restart`` of a running node is refused, naming ``--force``; with ``--force`` the
  node is replaced (a new VM), and said so.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe.cluster._process import pid_alive
from msgsafe.cluster.rabbitmq import INSTALL_HINT
from tests.support.commands import msgsafe

pytestmark = pytest.mark.integration


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "rabbit"
    # A state dir of its own: `up` records the clusters it starts there.
    state = {"XDG_STATE_HOME": str(tmp_path / "state")}
    up = msgsafe(
        "cluster",
        "up",
        "rabbitmq",
        "--nodes",
        "3",
        "--dir",
        str(folder),
        "--json",
        timeout=240,
        env=state,
    )
    if up.code != 0:
        pytest.fail(f"msgsafe cluster up rabbitmq failed ({INSTALL_HINT}): {up.stderr}")
    try:
        yield folder
    finally:
        msgsafe("cluster", "down", "--dir", str(folder), timeout=120)


def _pids(folder: Path) -> list[int | None]:
    status = msgsafe("cluster", "status", "--dir", str(folder), "--json")
    assert status.code == 0, status.stderr
    return [node["pid"] for node in status.json()["nodes"]]


def test_restart_refuses_a_running_node_unless_forced(three_nodes: Path) -> None:
    before = _pids(three_nodes)
    refused = msgsafe("cluster", "restart", "2", "--dir", str(three_nodes))
    assert refused.code == 3, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert "is running" in said and "--force" in said, said
    assert _pids(three_nodes) == before, "the running node was left alone"
    assert pid_alive(before[2])

    forced = msgsafe("cluster", "restart", "2", "--dir", str(three_nodes), "--force", timeout=240)
    assert forced.code == 0, forced.stderr
    after = _pids(three_nodes)
    assert after[2] is not None and after[2] != before[2], "a new VM serves node 2"
    assert not pid_alive(before[2])
    assert after[:2] == before[:2]
    assert "running (pid" in forced.stdout


def test_restart_after_every_node_was_killed_starts_them_together(three_nodes: Path) -> None:
    for node in ("0", "1", "2"):
        killed = msgsafe("cluster", "kill", node, "--dir", str(three_nodes))
        assert killed.code == 0, killed.stderr
    assert _pids(three_nodes) == [None, None, None]

    restarted = msgsafe("cluster", "restart", "0", "--dir", str(three_nodes), timeout=240)
    assert restarted.code == 0, restarted.stderr
    assert "the other nodes are down too" in restarted.stderr, restarted.stderr
    lines = restarted.stdout.splitlines()
    assert len(lines) == 3 and all("running (pid" in line for line in lines), lines
    assert lines[1].startswith("also ") and lines[2].startswith("also ")
    assert all(pid is not None and pid_alive(pid) for pid in _pids(three_nodes))
    # The cluster serves as one: a node's cluster status lists all three running.
    status = msgsafe("cluster", "status", "--dir", str(three_nodes), "--json")
    assert [n["running"] for n in status.json()["nodes"]] == [True, True, True]

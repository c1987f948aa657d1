"""A node SIGSTOPped by another process shows as ``paused`` in ``nodes()``, both in the
process that drives the cluster and in one that found it again from ``cluster.json``
(what ``msgsafe cluster status`` does). RabbitMQ and tansu: the launchers whose nodes
are not JVMs (the JVM launchers are covered by their own test files).

Why tansu: its launcher is the one under test here (``msgsafe cluster up tansu``), not a
stand-in for another broker; no real broker can check that launcher's ``nodes()``.

A missing broker fails the test with the launcher's message on how to install it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe.cluster import load
from msgsafe.cluster._process import pid_paused, wait_for
from msgsafe.cluster.base import LocalCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.cluster.tansu import TansuCluster


@pytest.fixture(params=["rabbitmq", "tansu"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalCluster]:
    made: LocalCluster
    if request.param == "rabbitmq":
        made = RabbitCluster(nodes=1, dir=tmp_path / "c", detached=True)
    else:
        made = TansuCluster(1, tmp_path / "c", detached=True)
    try:
        made.start()
        yield made
    finally:
        made.stop()


def test_a_node_stopped_elsewhere_shows_as_paused(cluster: LocalCluster) -> None:
    (node,) = cluster.nodes()
    assert node.running and node.pid is not None and node.role != "paused"
    # Stopped by another process: only the kernel's view of the pid can tell.
    subprocess.run(["kill", "-STOP", str(node.pid)], check=True)
    try:
        wait_for(lambda: pid_paused(node.pid), 10.0, "the node to be stopped")
        assert cluster.nodes()[0].role == "paused"
        again = load(cluster.dir)
        assert again.nodes()[0].role == "paused", "a cluster found again sees the pause"
    finally:
        subprocess.run(["kill", "-CONT", str(node.pid)], check=True)
    wait_for(lambda: cluster.nodes()[0].role != "paused", 10.0, "the node to run again")
    cluster.pause(0)
    assert cluster.nodes()[0].role == "paused", "pause() returns once the node is stopped"
    cluster.resume(0)
    assert cluster.nodes()[0].running

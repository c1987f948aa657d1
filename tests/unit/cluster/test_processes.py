"""The process helpers every launcher shares, on plain child processes (no broker):
the paused state read from /proc, stop and kill of pids, and the cluster.json round trip
of the JVM launchers."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe import cluster as clusters
from msgsafe.cluster._process import (
    Pid,
    _uniform,
    adopt_births,
    free_ports,
    kill_pid,
    pid_alive,
    pid_paused,
    signal_pid,
    spawn,
    stop_pids,
    wait_for,
)
from msgsafe.cluster.base import ClusterError
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.qpid import QpidCluster

_IDLE = [sys.executable, "-c", "import time\nwhile True: time.sleep(60)"]


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(_IDLE)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_paused_is_read_from_proc_whoever_stopped_the_process(
    child: subprocess.Popen[bytes],
) -> None:
    assert not pid_paused(child.pid)
    # Stopped by a process other than the one asking: only /proc can tell.
    subprocess.run(["kill", "-STOP", str(child.pid)], check=True)
    wait_for(lambda: pid_paused(child.pid), 10.0, "the child to be stopped")
    signal_pid(child.pid, signal.SIGCONT)
    wait_for(lambda: not pid_paused(child.pid), 10.0, "the child to run again")
    assert pid_paused(None) is False


def test_stop_pids_ends_a_stopped_process_and_passes_over_gone_ones(
    child: subprocess.Popen[bytes],
) -> None:
    signal_pid(child.pid, signal.SIGSTOP)
    wait_for(lambda: pid_paused(child.pid), 10.0, "the child to be stopped")
    stop_pids([("child", child.pid), ("nothing", None)], grace=10.0)
    assert not pid_alive(child.pid)
    kill_pid(child.pid, "child")  # already gone: nothing to do, no error


def test_kill_pid_ends_an_idle_process(child: subprocess.Popen[bytes]) -> None:
    kill_pid(child.pid, "child")
    assert not pid_alive(child.pid)


def test_kafka_state_round_trip(tmp_path: Path) -> None:
    cluster = KafkaCluster(3, tmp_path, base_port=41000, overrides={"a": "b"})
    cluster.pids = [None, 123456789, None]
    again = KafkaCluster.from_state(tmp_path, cluster.state())
    assert again.state() == cluster.state()
    assert again.detached
    assert [n.running for n in again.nodes()] == [False, False, False]


def test_qpid_state_round_trip(tmp_path: Path) -> None:
    cluster = QpidCluster(3, tmp_path, base_port=42000, group="g", context={"x": "y"})
    again = QpidCluster.from_state(tmp_path, cluster.state())
    assert again.state() == cluster.state()
    assert again.http_ports == [42003, 42004, 42005]
    assert [n.name for n in again.nodes()] == ["qpid-0", "qpid-1", "qpid-2"]


def test_a_state_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    state = KafkaCluster(3, tmp_path, base_port=43000).state()
    state["controller_ports"] = state["controller_ports"][:2]
    with pytest.raises(ClusterError, match="does not describe a kafka cluster"):
        KafkaCluster.from_state(tmp_path, state)
    with pytest.raises(ClusterError, match="no kafka node 3"):
        KafkaCluster(3, tmp_path, base_port=43000).kill(3)


def test_a_pid_another_process_inherited_is_left_alone(
    child: subprocess.Popen[bytes],
) -> None:
    """A cluster's saved pid whose node died long ago now names ``child`` (the kernel
    hands pids out again): it counts as gone and no signal reaches ``child``."""
    stale = Pid(child.pid, "1")  # the node it named started at tick 1
    assert not pid_alive(stale)
    assert not pid_paused(stale)
    assert signal_pid(stale, signal.SIGKILL) is False
    stop_pids([("node", stale)], grace=1.0)
    kill_pid(stale, "node")
    assert pid_alive(child.pid), "the process that has the pid now is alive"
    assert child.poll() is None, "a process that merely inherited the pid was signalled"


def test_cluster_json_keeps_each_pid_start_time(tmp_path: Path) -> None:
    """``cluster down`` in another process, days later, knows each node by pid and start
    time: a node that still runs is found; its pid on another process would not be."""
    cluster = KafkaCluster(3, tmp_path, base_port=44000, detached=True)
    pid = spawn(_IDLE, log=tmp_path / "node.log", detached=True)
    try:
        cluster.pids = [pid, None, None]
        cluster.save_state()
        saved = json.loads((tmp_path / "cluster.json").read_text())
        assert saved["births"] == {str(pid): pid.born}
        again = clusters.load(tmp_path)
        assert again.state() == cluster.state()
        found = again.pids[0]
        assert found == pid and not isinstance(found, Pid)  # a plain int from the file
        assert pid_alive(found)
        adopt_births({str(pid): "1"})  # as if the node had died and its pid moved on
        assert not pid_alive(found)
        assert signal_pid(found, signal.SIGKILL) is False
        adopt_births(saved["births"])
        assert pid_alive(found)
    finally:
        kill_pid(pid, "node")


def test_node_ports_are_never_ones_an_outgoing_connection_can_take() -> None:
    """A node's port must stay free while the node is down, so that it starts again on
    it: the ports are drawn outside the kernel's ephemeral range, the local ports of
    outgoing connections (a suite run once found a restarted RabbitMQ node's port held
    by one, EADDRINUSE), and a port held meanwhile is never drawn."""
    low, high = (
        int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    )
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        outgoing = socket.create_connection(server.getsockname())
        with outgoing:
            taken = outgoing.getsockname()[1]
            assert low <= taken <= high, "the kernel gave a local port outside its range"
            ports = free_ports(200)
    assert len(set(ports)) == 200
    assert not [p for p in ports if low <= p <= high], "a port from the ephemeral range"
    assert taken not in ports


def test_ports_are_drawn_evenly_across_both_sides_of_the_ephemeral_range() -> None:
    """A span ten times larger is drawn ten times as often (drawing the two spans alike
    crowded every process's draws into the small one above the ephemeral range)."""
    draw = random.Random(7)
    spans = [(1000, 1999), (5000, 5099)]
    counts = Counter(
        "low" if port < 5000 else "high" for port in (_uniform(draw, spans) for _ in range(22_000))
    )
    assert 9 < counts["low"] / counts["high"] < 11, counts
    assert {_uniform(draw, [(7, 7)]) for _ in range(10)} == {7}

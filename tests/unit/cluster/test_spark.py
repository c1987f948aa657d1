"""msgsafe.cluster.spark without starting a JVM: the kind is registered, ports are laid
out as documented, cluster.json round-trips, and nodes that do not run are refused.
tests/integration/cluster/test_spark_cluster.py starts a real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from msgsafe.cluster import KINDS, launcher, load
from msgsafe.cluster.base import ClusterError
from msgsafe.cluster.spark import SparkCluster, spark_home


def test_spark_is_a_cluster_kind() -> None:
    assert KINDS["spark"] == "msgsafe.cluster.spark:SparkCluster"
    assert launcher("spark") is SparkCluster


def test_spark_home_is_the_installed_pyspark() -> None:
    home = spark_home()
    assert (home / "bin" / "spark-class").is_file()
    assert (home / "jars").is_dir()


def test_ports_from_a_base_port(tmp_path: Path) -> None:
    cluster = SparkCluster(nodes=2, dir=tmp_path, base_port=41000)
    assert (cluster.master_port, cluster.master_ui_port) == (41000, 41001)
    assert cluster.worker_ports == [41002, 41004]
    assert cluster.worker_ui_ports == [41003, 41005]
    assert cluster.url == "spark://127.0.0.1:41000"
    assert cluster.node_url(1) == cluster.url
    assert cluster.ui_url == "http://127.0.0.1:41001"


def test_nodes_before_start_are_workers_then_the_master(tmp_path: Path) -> None:
    cluster = SparkCluster(nodes=2, dir=tmp_path)
    nodes = cluster.nodes()
    assert [(n.name, n.role, n.running) for n in nodes] == [
        ("worker-0", "worker", False),
        ("worker-1", "worker", False),
        ("master", "master", False),
    ]
    assert cluster.executors() == []
    assert cluster.describe()["ui"] == cluster.ui_url


def test_state_round_trips_through_cluster_json(tmp_path: Path) -> None:
    cluster = SparkCluster(nodes=3, dir=tmp_path, detached=True, cores=2, memory="2g")
    cluster.master_pid = 2**22 + 7  # no such process: shown as not running
    cluster.save_state()
    again = load(tmp_path)
    assert isinstance(again, SparkCluster)
    assert again.state() == cluster.state()
    assert (again.cores, again.memory, again.count) == (2, "2g", 3)
    assert not any(n.running for n in again.nodes())


def test_a_damaged_state_is_a_cluster_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="does not describe a spark cluster"):
        SparkCluster.from_state(tmp_path, {"nodes": 2})


def test_bad_sizes_and_nodes_that_do_not_run_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="at least one worker"):
        SparkCluster(nodes=0, dir=tmp_path)
    with pytest.raises(ClusterError, match="at least one core"):
        SparkCluster(nodes=1, dir=tmp_path, cores=0)
    cluster = SparkCluster(nodes=1, dir=tmp_path)
    with pytest.raises(ClusterError, match="not running"):
        cluster.kill(0)
    with pytest.raises(ClusterError, match="no Spark node 5"):
        cluster.kill(5)
    with pytest.raises(ClusterError, match="is no executor"):
        cluster.kill_executor(1)

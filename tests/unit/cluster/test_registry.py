"""msgsafe.cluster.registry without starting a JVM: the kind is registered, the command
line binds loopback only with a small heap, the URL is Confluent's API path, one node
only, cluster.json round-trips, and a missing build is a ClusterError.
tests/integration/cluster/test_registry_cluster.py starts a real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from msgsafe.cluster import KINDS, launcher, load
from msgsafe.cluster.base import ClusterError
from msgsafe.cluster.registry import API_PATH, VERSION, RegistryCluster, registry_argv


def test_registry_is_a_cluster_kind() -> None:
    assert KINDS["registry"] == "msgsafe.cluster.registry:RegistryCluster"
    assert launcher("registry") is RegistryCluster


def test_the_command_line_binds_loopback_with_a_small_heap(tmp_path: Path) -> None:
    argv = registry_argv(
        "/usr/bin/java", tmp_path / "runner.jar", port=41234, heap_mb=256, marker=tmp_path
    )
    assert argv[0] == "/usr/bin/java"
    assert "-Xmx256m" in argv
    assert "-Dquarkus.http.host=127.0.0.1" in argv
    assert "-Dquarkus.http.port=41234" in argv
    assert f"-Dmsgsafe.node.dir={tmp_path}" in argv
    assert argv[-2:] == ["-jar", str(tmp_path / "runner.jar")]
    # Every option comes before -jar: after it they would be the application's arguments.
    assert all(arg.startswith("-") for arg in argv[1:-2])


def test_the_url_is_confluents_api_on_the_port(tmp_path: Path) -> None:
    cluster = RegistryCluster(dir=tmp_path, base_port=41500)
    assert API_PATH == "/apis/ccompat/v6"
    assert cluster.url == "http://127.0.0.1:41500/apis/ccompat/v6"
    assert cluster.node_url(0) == cluster.url
    with pytest.raises(ClusterError):
        cluster.node_url(1)
    described = cluster.describe()
    assert described["storage"] == "memory"
    assert [(n["name"], n["port"], n["running"]) for n in described["nodes"]] == [
        ("registry-0", 41500, False)
    ]


def test_more_than_one_node_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="one node"):
        RegistryCluster(nodes=3, dir=tmp_path)


def test_state_round_trips_through_cluster_json(tmp_path: Path) -> None:
    cluster = RegistryCluster(dir=tmp_path, base_port=41600, detached=True, heap_mb=300)
    cluster.pids = [2**22 + 7]  # no such process: shown as not running
    cluster.save_state()
    again = load(tmp_path)
    assert isinstance(again, RegistryCluster)
    assert again.state() == cluster.state()
    assert (again.heap_mb, again.url) == (300, cluster.url)
    assert not any(n.running for n in again.nodes())
    with pytest.raises(ClusterError, match="not running"):
        again.kill(0)


def test_a_missing_build_is_a_cluster_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cache that claims to be complete but holds no runner jar.
    monkeypatch.setenv("MSGSAFE_CACHE", str(tmp_path / "cache"))
    home = tmp_path / "cache" / f"registry-{VERSION}"
    home.mkdir(parents=True)
    (home / ".complete").write_text("ok\n")
    cluster = RegistryCluster(dir=tmp_path / "c")
    with pytest.raises(ClusterError, match=r"runner\.jar.*msgsafe cluster fetch registry"):
        cluster.start(timeout=5)
    assert not any(n.running for n in cluster.nodes())

"""``msgsafe doctor`` reading a RabbitMQ node through its management HTTP API.

The session cluster runs without the management plugin (doctor then says what it cannot
see); this test starts one node as a user does, ``msgsafe cluster up rabbitmq``, which
runs the plugin on a free loopback port and prints the doctor command that uses it.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pika
import pytest

from msgsafe.cluster import load
from msgsafe.cluster.rabbitmq import INSTALL_HINT, RabbitCluster
from tests.support.commands import msgsafe

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def state_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of the module's commands: a state dir of their own, where
    ``cluster up`` records its clusters (and doctor finds them)."""
    return {"XDG_STATE_HOME": str(tmp_path_factory.mktemp("state"))}


@pytest.fixture(scope="module")
def managed_node(
    tmp_path_factory: pytest.TempPathFactory, state_home: dict[str, str]
) -> Iterator[tuple[RabbitCluster, str]]:
    """One node started as a user starts it, ``msgsafe cluster up rabbitmq``: the
    management API runs on a loopback port it names (stderr, and --json)."""
    dir = tmp_path_factory.mktemp("rabbit-managed")
    up = msgsafe("cluster", "up", "rabbitmq", "--nodes", "1", "--dir", str(dir), env=state_home)
    if up.code != 0:
        pytest.fail(f"msgsafe cluster up rabbitmq failed ({INSTALL_HINT}): {up.stderr}")
    try:
        cluster = load(dir)
        assert isinstance(cluster, RabbitCluster)
        api = cluster.management_url(0)
        said = " ".join(up.stderr.split())
        assert f"doctor: msgsafe doctor {cluster.url} (it finds the management API {api}" in said
        _wait_for_api(api, timeout=60)
        yield cluster, api
    finally:
        msgsafe("cluster", "down", "--dir", str(dir))


def _wait_for_api(api: str, timeout: float) -> None:
    token = base64.b64encode(b"guest:guest").decode()
    request = urllib.request.Request(
        f"{api}/api/overview", headers={"Authorization": f"Basic {token}"}
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                json.loads(response.read())
                return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # polling the API against the deadline


def test_doctor_reads_nodes_and_queue_types_from_the_management_api(
    managed_node: tuple[RabbitCluster, str],
) -> None:
    cluster, api = managed_node
    channel = pika.BlockingConnection(pika.URLParameters(cluster.node_url(0))).channel()
    channel.queue_declare("mgmt-classic", durable=True)
    channel.queue_declare("mgmt-quorum", durable=True, arguments={"x-queue-type": "quorum"})
    channel.connection.close()

    result = msgsafe("doctor", cluster.node_url(0), "--management", api, "--json")
    report = result.json()
    by_key = {(f["subject"], f["setting"]): f for f in report["findings"]}
    print(by_key)
    assert by_key[("cluster", "nodes")]["severity"] == "warning"  # one node
    assert by_key[("cluster", "nodes")]["value"] == "1"
    assert by_key[("cluster", "cluster_partition_handling")]["severity"] == "unknown"
    assert by_key[("queue mgmt-classic", "queue type")]["severity"] == "critical"
    assert by_key[("queue mgmt-classic", "queue type")]["value"] == "classic"
    assert by_key[("queue mgmt-quorum", "queue type")]["severity"] == "ok"
    assert result.code == 6

    # A management URL that does not answer is reported as such, never guessed around.
    other = msgsafe("doctor", cluster.node_url(0), "mgmt-quorum", "--management", api + "/x")
    assert "did not answer" in other.stdout or "HTTP" in other.stdout


def test_doctor_finds_the_management_api_of_a_cluster_up_cluster_from_its_url(
    managed_node: tuple[RabbitCluster, str], state_home: dict[str, str]
) -> None:
    """No --management: the URL ``cluster up`` printed is enough (it recorded the
    cluster), and --cluster DIR names the cluster explicitly."""
    cluster, api = managed_node
    for extra, env in (([], state_home), (["--cluster", str(cluster.dir)], None)):
        result = msgsafe("doctor", cluster.url, *extra, "--json", env=env)
        report = result.json()
        by_key = {(f["subject"], f["setting"]): f for f in report["findings"]}
        # What only the management API tells: the cluster's nodes.
        assert by_key[("cluster", "nodes")]["value"] == "1", report
        assert "did not answer" not in result.stdout

    told = msgsafe("doctor", cluster.url, env=state_home)
    assert f"management API: {api}" in " ".join(told.stderr.split())

"""``msgsafe doctor`` reading a RabbitMQ node through its management HTTP API.

The session cluster runs without the management plugin (doctor then says what it cannot
see); this test starts one node of its own and enables the plugin on a free port.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pika
import pytest

from msgsafe.cluster._process import free_port
from msgsafe.cluster.rabbitmq import INSTALL_HINT, RabbitCluster
from tests.support.commands import msgsafe

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def managed_node() -> Iterator[tuple[RabbitCluster, str]]:
    """A single RabbitMQ node with the management API on a free loopback port."""
    cluster = RabbitCluster(size=1)
    try:
        cluster.start()
    except RuntimeError as exc:
        pytest.fail(f"cannot start RabbitMQ ({INSTALL_HINT} if missing): {exc}")
    try:
        port = free_port()
        cluster.ctl(
            0,
            "eval",
            f"application:set_env(rabbitmq_management, tcp_config, [{{port, {port}}}, "
            f'{{ip, "127.0.0.1"}}]).',
        )
        node = cluster.members[0]
        # NOTE: rabbitmq-plugins must see the node's own environment (enabled-plugins
        # file, cookie in HOME); the harness builds it.
        enabled = subprocess.run(
            [
                "/usr/lib/rabbitmq/bin/rabbitmq-plugins",
                "-n",
                node.name,
                "enable",
                "rabbitmq_management",
            ],
            env=cluster.env(0),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert enabled.returncode == 0, enabled.stderr
        api = f"http://127.0.0.1:{port}"
        _wait_for_api(api, timeout=60)
        yield cluster, api
    finally:
        cluster.stop()


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
            time.sleep(0.2)


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

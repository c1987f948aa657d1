"""The ``msgsafe`` command against the suite's 3-node RabbitMQ cluster, as a subprocess."""

from __future__ import annotations

import secrets
from pathlib import Path

import pika
import pytest

from msgsafe.cluster.rabbitmq import RabbitCluster
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.commands import msgsafe

pytestmark = pytest.mark.integration


def _channel(cluster: RabbitCluster) -> pika.adapters.blocking_connection.BlockingChannel:
    params = pika.URLParameters(cluster.node_url(0))
    return pika.BlockingConnection(params).channel()


def test_verify_catches_messages_deleted_behind_its_back(
    rabbit_cluster: RabbitCluster, rabbit_urls: RabbitUrls, tmp_path: Path
) -> None:
    queue = f"verify-{secrets.token_hex(4)}"
    run = secrets.token_hex(4)
    common = ["--run", run, "--count", "200", "--keys", "4", "-o", "declare=quorum", "--json"]
    outbox = ["--outbox", str(tmp_path / "outbox.sqlite3")]
    produced = msgsafe("verify", rabbit_urls.cluster, queue, "--phase", "produce", *outbox, *common)
    assert produced.code == 0, produced.stderr[-3000:]
    assert produced.json()["confirmed"] + produced.json()["stored"] == 200

    # Someone else takes 10 messages off the queue and acknowledges them.
    channel = _channel(rabbit_cluster)
    taken = 0
    while taken < 10:
        method, _props, _body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            continue
        channel.basic_ack(method.delivery_tag)
        taken += 1
    channel.connection.close()

    checked = msgsafe(
        "verify", rabbit_urls.cluster, queue, "--phase", "consume", "--timeout", "5", *common
    )
    report = checked.json()
    print({k: v for k, v in report.items() if k != "streams"})
    assert checked.code == 1
    assert report["lost"] == 10
    assert report["received"] == 190
    assert sum(s["lost"] for s in report["streams"]) == 10

    human = msgsafe(
        "verify",
        rabbit_urls.cluster,
        queue,
        "--phase",
        "consume",
        "--timeout",
        "3",
        "--join-timeout",
        "3",
        "--run",
        run,
        "--count",
        "200",
        "--keys",
        "4",
        "--group",
        "again",
    )
    # The queue was drained by the previous check: now all 200 are missing.
    assert human.code == 1
    assert "lost = 200" in human.stdout


def test_doctor_flags_a_classic_queue_and_passes_a_quorum_queue(
    rabbit_cluster: RabbitCluster, rabbit_urls: RabbitUrls
) -> None:
    classic, quorum = f"classic-{secrets.token_hex(3)}", f"quorum-{secrets.token_hex(3)}"
    channel = _channel(rabbit_cluster)
    channel.queue_declare(classic, durable=True)
    channel.queue_declare(quorum, durable=True, arguments={"x-queue-type": "quorum"})
    channel.connection.close()

    result = msgsafe("doctor", rabbit_urls.cluster, classic, quorum, "missing-q", "--json")
    report = result.json()
    by_subject = {(f["subject"], f["setting"]): f for f in report["findings"]}
    print(by_subject)
    assert result.code == 6
    assert by_subject[(f"queue {classic}", "queue type")]["severity"] == "critical"
    assert by_subject[(f"queue {quorum}", "queue type")]["severity"] == "ok"
    assert by_subject[("queue missing-q", "exists")]["value"] == "no"
    # Without the management plugin the cluster-wide settings are unknown, not guessed.
    cluster = by_subject[("cluster", "nodes, partitions, cluster_partition_handling")]
    assert cluster["severity"] == "unknown"

    # The probe changed nothing: the classic queue is still classic and still there.
    again = msgsafe("doctor", rabbit_urls.cluster, classic, "--json")
    assert again.code == 6
    only_quorum = msgsafe("doctor", rabbit_urls.cluster, quorum)
    assert only_quorum.code == 4  # quorum ok; cluster settings unknown
    assert "not guessed" in only_quorum.stdout


def test_demo_against_a_cluster_url(rabbit_urls: RabbitUrls) -> None:
    result = msgsafe("demo", "--url", rabbit_urls.cluster, "--count", "300", "--json")
    assert result.code == 0, result.stderr[-3000:]
    report = result.json()
    print({k: v for k, v in report.items() if k != "timeline"})
    assert report["lost"] == 0 and report["consumed"] == 300


def test_send_consume_and_credentials_never_printed(
    rabbit_urls: RabbitUrls, tmp_path: Path
) -> None:
    queue = f"shell-{secrets.token_hex(3)}"
    url = rabbit_urls.cluster
    outbox = str(tmp_path / "outbox.sqlite3")
    sent = msgsafe(
        "send",
        url,
        queue,
        "-o",
        "declare=quorum",
        "--outbox",
        outbox,
        "--json",
        stdin="a\nb\nc\n",
    )
    assert sent.code == 0, sent.stderr
    assert len([line for line in sent.stdout.splitlines() if '"confirmed"' in line]) == 3
    got = msgsafe("consume", url, queue, "--count", "3", "--timeout", "20")
    assert got.code == 0 and got.stdout.splitlines() == ["a", "b", "c"]
    bad = msgsafe(
        "send",
        url.replace("guest:guest", "guest:s3cret-pw"),
        queue,
        "--outbox",
        outbox,
        stdin="x\n",
    )
    assert bad.code != 0
    assert "s3cret-pw" not in bad.stdout + bad.stderr


@pytest.mark.parametrize("protocol", ["amqp", "amqp10"])
def test_verify_with_a_wrong_password_says_the_login_failed(
    rabbit_cluster: RabbitCluster, protocol: str
) -> None:
    """A refused login ends verify at once (exit 3) naming the refusal; it never prints a
    table with ``lost = 0`` about messages that were never accepted."""
    port = rabbit_cluster.port(0)
    secret = f"wrong-{secrets.token_hex(6)}"
    url = (
        f"amqp://guest:{secret}@127.0.0.1:{port}/"
        if protocol == "amqp"
        # NOTE: RabbitMQ's AMQP 1.0 plugin answers a refused login only after 3 s, past
        # the 2 s connect_timeout: a peer that answered gets the time to refuse.
        else f"amqp10://guest:{secret}@127.0.0.1:{port}"
    )
    run = msgsafe("verify", url, f"verify-auth-{secrets.token_hex(3)}", "--count", "20")
    text = run.stdout + run.stderr
    assert run.code == 3, text
    assert "AuthenticationError" in text and "refused" in text, text
    assert "lost = 0" not in text and "lost" not in run.stdout, text
    assert secret not in text, text
    assert "Traceback" not in text, text
    assert run.seconds < 30, run.seconds

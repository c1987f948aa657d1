"""The ``msgsafe`` command against the session's Apache Kafka cluster, as a subprocess
(``msgsafe demo`` with no URL runs its own zero-Java tansu broker, as a user's first run
does; ``msgsafe demo --cluster kafka`` its own 3-node Apache Kafka).

Why tansu in one test: it is what ``msgsafe demo`` itself starts without a URL, so no
real broker can show that first run; every other test here uses Apache Kafka."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox
from tests.support.commands import msgsafe

pytestmark = pytest.mark.integration


def test_demo_the_readme_command_prints_lost_0_within_a_minute() -> None:
    result = msgsafe("demo", timeout=120)
    print(result.stdout)
    assert result.code == 0, result.stderr[-3000:]
    assert "lost = 0" in result.stdout
    for row in ("sent", "confirmed", "stored then delivered", "consumed", "lost", "duplicates"):
        assert row in result.stdout
    assert "killing the broker" in result.stderr
    assert result.seconds < 60


def test_demo_on_its_own_apache_kafka_kills_a_leader_and_loses_nothing() -> None:
    """``--cluster kafka``: the demo starts three Apache Kafka nodes through
    msgsafe.cluster, SIGKILLs the leader of partition 0 mid-run, restarts it, counts
    every message back and stops the cluster (no node left listening)."""
    result = msgsafe("demo", "--cluster", "kafka", "--count", "1000", "--json", timeout=240)
    assert result.code == 0, result.stderr[-3000:]
    report = result.json()
    print({k: v for k, v in report.items() if k != "timeline"}, f"{result.seconds:.1f} s")
    assert "Apache Kafka node" in report["fault"] and "leader of partition 0" in report["fault"]
    assert report["sent"] == 1000
    assert report["confirmed"] + report["stored"] == 1000
    assert report["confirmed"] > 0 and report["stored"] > 0, "the kill did not hit the run"
    assert report["stored_then_delivered"] == report["stored"]
    assert report["consumed"] == 1000 and report["lost"] == 0 and report["unexpected"] == 0
    # Every extra copy is of a message sent again from the outbox (its id known).
    assert report["duplicated_confirmed"] == 0
    assert report["duplicated_stored"] <= report["stored"]
    assert "cluster up in" in result.stderr
    # The cluster was stopped: no node still listens on its port.
    for hostport in report["broker"].split("://", 1)[1].split(","):
        host, port = hostport.rsplit(":", 1)
        with socket.socket() as sock:
            assert sock.connect_ex((host, int(port))) != 0, f"{hostport} outlived the demo"


def test_demo_json_report_counts_every_message(kafka_url: str) -> None:
    result = msgsafe("demo", "--url", kafka_url, "--count", "300", "--json")
    assert result.code == 0, result.stderr[-3000:]
    report = result.json()
    print({k: v for k, v in report.items() if k != "timeline"})
    assert report["sent"] == 300
    assert report["confirmed"] + report["stored"] == 300
    assert report["consumed"] == 300
    assert report["lost"] == 0
    assert report["unexpected"] == 0


def test_verify_counts_every_message_back(kafka_url: str, kafka_topic: str, tmp_path: Path) -> None:
    result = msgsafe(
        "verify",
        kafka_url,
        kafka_topic,
        "--count",
        "400",
        "--keys",
        "4",
        "--outbox",
        str(tmp_path / "outbox.sqlite3"),
        "--json",
    )
    assert result.code == 0, result.stderr[-3000:]
    report = result.json()
    print({k: v for k, v in report.items() if k != "streams"})
    assert report["lost"] == 0
    assert report["received"] == 400
    assert report["confirmed"] + report["stored"] == 400
    assert report["out_of_order"] == 0
    assert [s["expected"] for s in report["streams"]] == [100, 100, 100, 100]


def _by_setting(report: dict[str, Any], topic: str) -> dict[str, dict[str, str]]:
    return {f["setting"]: f for f in report["findings"] if f["subject"] == f"topic {topic}"}


def test_doctor_flags_unsafe_topics_on_the_real_cluster(kafka_cluster: KafkaCluster) -> None:
    """Topics created unsafe on Apache Kafka itself, each flagged by what it lacks; a
    topic with the cluster's safe settings is not."""
    tag = uuid.uuid4().hex[:8]
    topics = {
        "rf1": (1, {}),
        "rf2": (2, {}),
        "minisr1": (3, {"min.insync.replicas": "1"}),
        "unclean": (3, {"unclean.leader.election.enable": "true"}),
        "safe": (3, {}),
    }
    names = {kind: f"doctor-{kind}-{tag}" for kind in topics}
    for kind, (replication, config) in topics.items():
        kafka_cluster.create_topic(names[kind], 1, replication, config)
    result = msgsafe("doctor", kafka_cluster.url, *names.values(), "--json")
    report = result.json()
    assert result.code == 6, report
    rf1 = _by_setting(report, names["rf1"])
    assert rf1["replication factor"]["severity"] == "critical"
    assert rf1["replication factor"]["value"] == "1"
    rf2 = _by_setting(report, names["rf2"])
    assert rf2["replication factor"]["severity"] == "warning"
    assert rf2["replication factor"]["value"] == "2"
    minisr1 = _by_setting(report, names["minisr1"])
    assert minisr1["replication factor"]["severity"] == "ok"
    assert minisr1["min.insync.replicas"]["severity"] == "critical"
    assert minisr1["min.insync.replicas"]["value"] == "1"
    unclean = _by_setting(report, names["unclean"])
    assert unclean["unclean.leader.election.enable"]["severity"] == "critical"
    assert unclean["unclean.leader.election.enable"]["value"] == "true"
    safe = _by_setting(report, names["safe"])
    assert {f["severity"] for f in safe.values()} == {"ok"}, safe
    assert safe["min.insync.replicas"]["value"] == "2"
    assert safe["unclean.leader.election.enable"]["value"] == "false"
    # The cluster itself: three brokers, safe defaults.
    cluster = [f for f in report["findings"] if not f["subject"].startswith("topic ")]
    assert not [f for f in cluster if f["severity"] in ("critical", "warning")], cluster
    human = msgsafe("doctor", kafka_cluster.url, names["unclean"], names["safe"])
    assert human.code == 6
    assert "unclean.leader.election.enable" in human.stdout and "fix:" in human.stdout
    clean = msgsafe("doctor", kafka_cluster.url, names["safe"], "--json")
    assert clean.code == 0, clean.json()


def test_doctor_unreachable_broker_exits_3() -> None:
    result = msgsafe("doctor", "kafka://127.0.0.1:1", "--json", timeout=60)
    assert result.code == 3
    assert "error" in result.json()


def test_send_then_consume_round_trip(kafka_url: str, kafka_topic: str) -> None:
    lines = [f"line {i} ünïcode" for i in range(25)]
    sent = msgsafe(
        "send",
        kafka_url,
        kafka_topic,
        "--no-outbox",
        stdin="\n".join(lines) + "\n",
    )
    assert sent.code == 0, sent.stderr
    receipts = sent.stdout.splitlines()
    assert len(receipts) == 25 and all(r.startswith("confirmed") for r in receipts)
    got = msgsafe("consume", kafka_url, kafka_topic, "--count", "25", "--timeout", "30")
    assert got.code == 0, got.stderr
    assert sorted(got.stdout.splitlines()) == sorted(lines)


def test_outbox_drain_forwards_a_stored_file(
    kafka_url: str, kafka_topic: str, tmp_path: Path
) -> None:
    path = tmp_path / "outbox.sqlite3"
    store = SqliteOutbox(path, target=kafka_url)
    envelopes = [Envelope.build(kafka_topic, f"m{i}".encode(), key="k") for i in range(30)]
    store.put(envelopes)
    store.close()
    status = msgsafe("outbox", "status", str(path), "--json")
    assert status.code == 0 and status.json()["waiting"] == 30
    drained = msgsafe("outbox", "drain", str(path), "--url", kafka_url, "--json")
    assert drained.code == 0, drained.stderr
    assert drained.json()["delivered"] == 30 and drained.json()["remaining"] == 0
    got = msgsafe("consume", kafka_url, kafka_topic, "--count", "30", "--json")
    ids = [line for line in got.stdout.splitlines() if line]
    received = [json.loads(line)["message_id"] for line in ids]
    assert sorted(received) == sorted(e.message_id for e in envelopes)
    assert [json.loads(line)["body"] for line in ids] == [f"m{i}" for i in range(30)]


def test_verify_while_its_broker_is_paused_and_resumed(
    kafka: KafkaCluster, kafka_topic: str, tmp_path: Path
) -> None:
    """What a user does with verify: inject a fault while it runs.

    The leader of partition 0 is paused (SIGSTOP for 5 s, longer than the broker session
    timeout, so the controller moves its partitions), then resumed (SIGCONT).
    """
    command = [
        sys.executable,
        "-m",
        "msgsafe",
        "verify",
        kafka.url,
        kafka_topic,
        "--count",
        "1500",
        "--keys",
        "8",
        "--outbox",
        str(tmp_path / "outbox.sqlite3"),
        "--timeout",
        "10",
        "--json",
    ]
    # The node is paused before verify starts, so the fault overlaps its producer (1500
    # sends take well under a second) as well as its consumer's start.
    node = kafka.leader_of(kafka_topic, 0)
    kafka.pause(node)
    try:
        # INFO: what the consumer saw is in the failure message's stderr tail (a file,
        # not a pipe: a full pipe would stop the command while the test waits).
        env = {**os.environ, "MSGSAFE_LOG_LEVEL": "INFO"}
        log_file = (tmp_path / "verify.stderr").open("w")
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log_file, text=True, env=env
        )
        try:
            paused_at = time.monotonic()
            while proc.poll() is None and time.monotonic() - paused_at < 5.0:
                time.sleep(0.1)  # the length of the fault, not a synchronisation
            kafka.resume(node)
            stdout, _ = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log_file.close()
    finally:
        kafka.resume(node)
    stderr = (tmp_path / "verify.stderr").read_text()
    report = json.loads(stdout)
    print({k: v for k, v in report.items() if k != "streams"})
    lost = {s["key"]: s["lost_seqs"] for s in report["streams"] if s["lost"]}
    assert proc.returncode == 0, (lost, stderr[-3000:])
    assert report["lost"] == 0 and report["received"] == 1500
    assert report["confirmed"] + report["stored"] == 1500


def test_verify_finds_its_run_among_earlier_ones_and_a_consume_phase_can_repeat(
    kafka_url: str, kafka_topic: str, tmp_path: Path
) -> None:
    """A run's group reads the topic from its beginning and counts the earlier runs'
    records as foreign; a consume-only phase of an earlier run can be repeated."""
    url = kafka_url
    common = ["--outbox", str(tmp_path / "outbox.sqlite3"), "--timeout", "5", "--json"]
    first = msgsafe("verify", url, kafka_topic, "--count", "200", *common)
    assert first.code == 0, first.stdout[-3000:]
    second = msgsafe("verify", url, kafka_topic, "--count", "100", *common)
    assert second.code == 0, second.stdout[-3000:]
    assert second.json()["received"] == 100
    assert second.json()["foreign"] == 200 and second.json()["lost"] == 0
    run = first.json()["run"]
    for _ in range(2):
        again = msgsafe(
            "verify",
            url,
            kafka_topic,
            "--phase",
            "consume",
            "--run",
            run,
            "--count",
            "200",
            *common,
        )
        assert again.code == 0, again.stderr[-3000:]
        assert again.json()["received"] == 200 and again.json()["lost"] == 0
        assert again.json()["foreign"] == 100

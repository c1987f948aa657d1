"""A real 3-node Apache Kafka KRaft cluster, started and driven through the
``msgsafe cluster`` command as a user would: up --json, status, kill, restart, pause,
resume, down (no process left). Through it, msgsafe's Producer and Consumer with a
``kafka://`` URL: a round trip, and the leader of a partition SIGKILLed while 5,000
``acks=all`` sends flow, with every id counted (sent, receipted, received): lost == 0.

One cluster for the module (``kafka_cli``): the tests run in file order and the last one
stops it with ``down``; the fixture's teardown stops whatever is left.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import msgsafe
from msgsafe.cluster import load
from msgsafe.cluster._process import pid_alive
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.message import Status, new_message_id
from tests.support.commands import Run, run_python

pytestmark = pytest.mark.integration

_HINT = (
    "the Kafka cluster needs Java 17+ and Maven (apt-get install -y openjdk-17-jre-headless "
    "maven) and confluent-kafka (pip install 'msgsafe[kafka]'); the jars come from Maven "
    "Central on first use (python -m msgsafe.cluster.cli fetch kafka)"
)
FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}


def cli(*args: str, timeout: float = 300.0) -> Run:
    """``python -m msgsafe.cluster.cli ARGS`` in a subprocess (never raises on the code)."""
    return run_python(
        "-m",
        "msgsafe.cluster.cli",
        *args,
        label=f"msgsafe cluster {' '.join(args)}",
        timeout=timeout,
    )


@dataclass
class CliCluster:
    dir: Path
    up: dict[str, Any]
    up_seconds: float

    def status(self) -> dict[str, Any]:
        run = cli("status", "--dir", str(self.dir), "--json")
        assert run.code == 0, run.stderr
        result: dict[str, Any] = run.json()
        return result

    def cluster(self) -> KafkaCluster:
        """The cluster as cluster.json describes it now (pids change on restart)."""
        cluster = load(self.dir)
        assert isinstance(cluster, KafkaCluster)
        return cluster


@pytest.fixture(scope="module")
def kafka_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliCluster]:
    """Three detached nodes started by ``msgsafe cluster up kafka``; stopped after."""
    dir = tmp_path_factory.mktemp("kafka-cluster")
    run = cli("up", "kafka", "--nodes", "3", "--dir", str(dir), "--json", timeout=600)
    if run.code != 0:
        pytest.fail(f"msgsafe cluster up kafka failed ({_HINT}):\n{run.stderr[-3000:]}")
    started = CliCluster(dir, run.json(), run.seconds)
    try:
        yield started
    finally:
        pids = [p for p in started.cluster().pids if p is not None]
        if any(pid_alive(p) for p in pids):
            cli("down", "--dir", str(dir))
        for pid in pids:  # a down that failed must not leave JVMs on a shared machine
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_up_json_describes_three_running_nodes(kafka_cli: CliCluster) -> None:
    described = kafka_cli.up
    print(f"\n[kafka up] 3 nodes serving in {kafka_cli.up_seconds:.1f} s: {described['url']}")
    assert described["kind"] == "kafka"
    assert described["dir"] == str(kafka_cli.dir)
    nodes = described["nodes"]
    assert [n["name"] for n in nodes] == ["kafka-0", "kafka-1", "kafka-2"]
    assert all(n["running"] and n["pid"] and n["host"] == "127.0.0.1" for n in nodes)
    assert described["url"] == "kafka://" + ",".join(f"127.0.0.1:{n['port']}" for n in nodes)
    roles = collections.Counter(n["role"] for n in nodes)
    assert roles == {"controller-leader": 1, "controller-follower": 2}, roles
    for node in nodes:
        rss_kib = int(Path(f"/proc/{node['pid']}/status").read_text().split("VmRSS:")[1].split()[0])
        print(f"[kafka up] {node['name']} pid {node['pid']} RSS {rss_kib // 1024} MiB")
    assert kafka_cli.status() == described


def test_round_trip_through_msgsafe(kafka_cli: CliCluster, tmp_path: Path) -> None:
    cluster = kafka_cli.cluster()
    topic = f"rt-{new_message_id()}"
    cluster.create_topic(topic, partitions=3)
    sent: dict[str, tuple[str, int]] = {}
    with msgsafe.Producer(cluster.url, outbox=tmp_path / "outbox.db") as producer:
        for i in range(500):
            key = f"k{i % 8}"
            receipt = producer.send(topic, b"%d" % i, key=key)
            assert receipt.status is Status.CONFIRMED
            sent[receipt.message_id] = (key, i)
    arrivals = _consume(cluster.url, topic, set(sent), group=f"rt-{topic}")
    assert collections.Counter(arrivals) == collections.Counter(set(sent))
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for message_id in arrivals:
        key, seq = sent[message_id]
        by_key[key].append(seq)
    assert all(seqs == sorted(seqs) for seqs in by_key.values()), "per-key order broken"


def test_leader_sigkilled_during_5k_acks_all_sends_loses_nothing(
    kafka_cli: CliCluster, tmp_path: Path
) -> None:
    n, window, kill_at, rate = 5_000, 1_000, 1_500, 600.0
    cluster = kafka_cli.cluster()
    topic = f"kill-{new_message_id()}"
    cluster.create_topic(topic, partitions=3, config={"min.insync.replicas": "2"})
    cluster.wait_in_sync(topic)
    victim = cluster.leader_of(topic, 0)
    sent: list[str] = []
    futures: list[Future[msgsafe.Receipt]] = []
    pace = threading.Event()  # never set: its wait() paces the traffic
    killed_at = 0.0
    started = time.monotonic()
    with msgsafe.Producer(
        cluster.url, outbox=tmp_path / "outbox.db", send_timeout=60, confirm_timeout=10
    ) as producer:
        for i in range(n):
            if i == kill_at:
                cluster.kill(victim)
                killed_at = time.monotonic()
            if i >= window:
                futures[i - window].exception(60)  # a bounded window keeps sends flowing
            pace.wait(max(0.0, started + i / rate - time.monotonic()))
            message_id = msgsafe.new_message_id()
            sent.append(message_id)
            futures.append(
                producer.send_async(topic, b"%07d" % i, key=f"k{i % 64}", message_id=message_id)
            )
        assert producer.flush(120)
        statuses: collections.Counter[str] = collections.Counter()
        failures: collections.Counter[str] = collections.Counter()
        receipted: set[str] = set()
        for future in futures:
            error = future.exception()
            if error is not None:
                failures[type(error).__name__] += 1
                continue
            receipt = future.result()
            receipted.add(receipt.message_id)
            statuses[receipt.status.value] += 1
        assert producer.drain(120) == 0, "outbox did not drain"
    send_s = time.monotonic() - started
    moved_to = cluster.leader_of(topic, 0)
    restart_started = time.monotonic()
    cluster.restart(victim)
    cluster.wait_in_sync(topic)
    back_s = time.monotonic() - restart_started
    arrivals = _consume(cluster.url, topic, receipted, group=f"check-{topic}")
    received = collections.Counter(arrivals)
    lost = receipted - set(received)
    unknown = set(received) - set(sent)
    duplicates = sum(c - 1 for c in received.values() if c > 1)
    print(
        f"\n[kafka leader kill] sent={len(sent)} receipted={len(receipted)} "
        f"({', '.join(f'{k}={v}' for k, v in sorted(statuses.items()))}) "
        f"received={len(arrivals)} unique={len(received)} lost={len(lost)} "
        f"duplicates={duplicates} unknown={len(unknown)} failures={dict(failures)} | "
        f"node {victim} killed {killed_at - started:.1f}s in, partition 0 now led by "
        f"{moved_to}, send+confirm {send_s:.1f}s, restart+in-sync {back_s:.1f}s"
    )
    assert moved_to != victim
    assert not failures
    assert len(receipted) == n
    assert not lost, f"{len(lost)} receipted messages never arrived"
    assert not unknown


def test_cli_kill_restart_pause_resume(kafka_cli: CliCluster) -> None:
    dir = str(kafka_cli.dir)
    before = kafka_cli.status()["nodes"][1]
    run = cli("kill", "1", "--dir", dir)
    assert run.code == 0, run.stderr
    assert not pid_alive(before["pid"])
    after = kafka_cli.status()["nodes"][1]
    assert (after["running"], after["pid"], after["role"]) == (False, None, None)

    run = cli("restart", "kafka-1", "--dir", dir)
    assert run.code == 0, run.stderr
    again = kafka_cli.status()["nodes"][1]
    assert again["running"] and again["pid"] not in (None, before["pid"])
    assert again["port"] == before["port"]
    print(f"\n[kafka cli] restart of kafka-1 took {run.seconds:.1f} s")

    assert cli("pause", "2", "--dir", dir).code == 0
    assert kafka_cli.status()["nodes"][2]["role"] == "paused"
    assert cli("resume", "2", "--dir", dir).code == 0
    assert kafka_cli.status()["nodes"][2]["role"] in ("controller-leader", "controller-follower")


def test_restart_brings_back_a_cluster_whose_every_node_was_killed(
    kafka_cli: CliCluster, tmp_path: Path
) -> None:
    """A KRaft controller alone never serves: restarting one node of a cluster whose
    every node was killed starts the quorum with it (and says which), then the cluster
    takes writes again; restarting the last one makes it whole."""
    dir = str(kafka_cli.dir)
    for node in range(3):
        assert cli("kill", str(node), "--dir", dir).code == 0
    assert not any(n["running"] for n in kafka_cli.status()["nodes"])
    run = cli("restart", "0", "--dir", dir, timeout=240)
    assert run.code == 0, run.stderr
    assert "also kafka-1: running" in run.stdout, run.stdout
    running = [n["running"] for n in kafka_cli.status()["nodes"]]
    assert running == [True, True, False], running
    cluster = kafka_cli.cluster()
    topic = f"after-{new_message_id()}"
    cluster.create_topic(topic, partitions=1, replication=2)
    with msgsafe.Producer(cluster.url, outbox=tmp_path / "outbox.db") as producer:
        assert producer.send(topic, b"x").status is Status.CONFIRMED
    assert cli("restart", "2", "--dir", dir, timeout=240).code == 0
    assert all(n["running"] for n in kafka_cli.status()["nodes"])


def test_cli_errors_are_one_red_line_and_exit_3(kafka_cli: CliCluster) -> None:
    run = cli("kill", "7", "--dir", str(kafka_cli.dir))
    assert run.code == 3
    assert run.stderr.strip().startswith("error: no node '7'")
    assert "Traceback" not in run.stderr
    missing = cli("status", "--dir", str(kafka_cli.dir / "nothing"))
    assert missing.code == 3 and "cluster.json is missing" in missing.stderr
    again = cli("up", "kafka", "--dir", str(kafka_cli.dir))
    assert again.code == 3 and "already runs" in again.stderr


def test_cli_down_leaves_no_process(kafka_cli: CliCluster) -> None:
    pids = [n["pid"] for n in kafka_cli.status()["nodes"]]
    assert all(pids)
    run = cli("down", "--dir", str(kafka_cli.dir))
    assert run.code == 0, run.stderr
    print(f"\n[kafka cli] down took {run.seconds:.1f} s")
    assert not [pid for pid in pids if pid_alive(pid)]
    assert not any(n["running"] for n in kafka_cli.status()["nodes"])


def _consume(url: str, topic: str, expected: set[str], *, group: str) -> list[str]:
    """Every message id read from ``topic`` by a new group, until all of ``expected``
    arrived and 2 s passed with nothing new (to count late duplicates)."""
    arrivals: list[str] = []
    missing = set(expected)
    with msgsafe.Consumer(url, group=group, **FAST_GROUP) as consumer:
        consumer.subscribe(topic)
        deadline = time.monotonic() + 120
        last = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.poll(max_messages=1000, timeout=0.5)
            for delivery in batch:
                if delivery.message_id is not None:
                    arrivals.append(delivery.message_id)
                    missing.discard(delivery.message_id)
                delivery.ack()
            if batch:
                last = time.monotonic()
            elif not missing and time.monotonic() - last >= 2.0:
                break
    return arrivals

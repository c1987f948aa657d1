"""The failure stories of the Kafka seed, on the session's Apache Kafka cluster, counted.

Every story records the ids sent, receipted and received: lost must be 0, a duplicate
must carry a known id, and each key's messages must arrive in send order (first arrival
of each id). Each story runs on a one-partition topic whose leader is a chosen node, so
"the leader" is one process the test can kill or stop. Figures go to the chaos summary
(``tests/chaos/conftest.py``) and are printed.

The leader-kill story also runs a raw confluent-kafka producer with ``acks=1`` beside
msgsafe, through the same fail-over, and prints what it lost: a figure, not an assertion.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

import msgsafe
from msgsafe.cluster import kafka_admin
from msgsafe.dedup import DedupWindow
from tests.chaos._matrix import (
    RESULTS,
    RETRY,
    CellResult,
    Fault,
    consume_with,
    run_cell,
    stored_during_fault,
)
from tests.support.kafka_lab import LabKafka, all_in_sync, heal, kill_all, restart
from tests.support.kafka_ledger import read_log, start_group_at_zero
from tests.support.ledger import Ledger
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

ROOT = Path(__file__).resolve().parents[2]
FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}
#: How often a wait polls: its conditions ask the cluster (metadata, ISR, a produce).
POLL_S = 0.1


def _follower_node(kafka: LabKafka, *avoid: int) -> int:
    """A node that is none of ``avoid``, preferably not the active controller (its loss
    would add a controller election to the story)."""
    controller = kafka.controller_leader()
    candidates = [n for n in range(kafka.count) if n not in avoid]
    preferred = [n for n in candidates if n != controller]
    return (preferred or candidates)[0]


def _topic(kafka: LabKafka, leader: int, config: dict[str, str] | None = None) -> str:
    """A one-partition topic on every node, led by ``leader`` (its preferred replica)."""
    name = f"seed-{uuid.uuid4().hex[:8]}"
    replicas = [leader] + [n for n in range(kafka.count) if n != leader]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
    # NOTE: confluent-kafka wants the partition count with an assignment (not -1).
    topic = NewTopic(name, 1, replica_assignment=[replicas], config=config or {})
    admin.create_topics([topic], request_timeout=30)[name].result(30)
    wait_until(
        lambda: _leader(kafka, name) == leader, 30, f"{name} led by node {leader}", interval=POLL_S
    )
    return name


def _leader(kafka: LabKafka, topic: str) -> int:
    try:
        return kafka.leader_of(topic, 0)
    except Exception:  # no metadata yet: polled again
        return -1


def _isr(kafka: LabKafka, topic: str) -> list[int]:
    return list(kafka_admin.partitions(kafka.bootstrap, topic)[0].isrs)


def _record(
    fault: str, ledger: Ledger, violations: int, *, recover_s: float, detail: str = ""
) -> CellResult:
    result = CellResult(
        protocol="kafka",
        fault=fault,
        sent=len(ledger.sent),
        confirmed=ledger.statuses.get("confirmed", 0),
        stored=ledger.statuses.get("stored", 0),
        refused=dict(ledger.failures),
        received=sum(ledger.received.values()),
        lost=len(ledger.lost),
        duplicates=ledger.duplicates,
        unknown=len(ledger.unknown),
        order_violations=violations,
        recover_s=recover_s,
        max_send_s=0.0,
        stored_after_heal=0,
        detail=detail,
    )
    RESULTS.append(result)
    print(f"\n{result.line()}")
    return result


class _KeyedSender:
    """msgsafe sends with per-key sequence numbers, a bounded window of futures."""

    def __init__(self, producer: msgsafe.Producer, topic: str, keys: int) -> None:
        self.producer, self.topic, self.keys = producer, topic, keys
        self.ledger = Ledger()
        self.futures: list[Future[msgsafe.Receipt]] = []
        self._counters: collections.Counter[str] = collections.Counter()

    def send(self, i: int) -> None:
        key = f"k{i % self.keys}"
        message_id = msgsafe.new_message_id()
        self.ledger.positions[message_id] = (key, self._counters[key])
        self._counters[key] += 1
        self.ledger.sent.add(message_id)
        self.futures.append(
            self.producer.send_async(self.topic, b"%07d" % i, key=key, message_id=message_id)
        )

    def settle(self, timeout: float = 120.0) -> list[msgsafe.Receipt]:
        """Every future's outcome into the ledger; returns the receipts of this call."""
        receipts = []
        for future in self.futures:
            exc = future.exception(timeout)
            if exc is not None:
                self.ledger.failures[type(exc).__name__] += 1
                continue
            receipt = future.result()
            receipts.append(receipt)
            self.ledger.add_receipt(receipt.message_id, receipt.status)
        self.futures = []
        return receipts

    def check(self, kafka: LabKafka) -> int:
        """Read the log back; returns the per-key order violations."""
        order: list[str] = []
        self.ledger.received.update(
            read_log(
                kafka.url, self.topic, self.ledger.receipted, deadline_s=120, on_id=order.append
            )
        )
        return len(self.ledger.order_violations(order))


# --- the leader SIGKILLed during 50k acks=all sends, and raw acks=1 beside it ---------------

N = 50_000
WINDOW = 5_000
KILL_AT, RESTART_AT = 15_000, 35_000


class _RawAcks1:
    """A plain confluent-kafka producer with acks=1 (no idempotence), as many services
    run it, writing the same id header msgsafe writes, so the log can be counted."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "1",
                "enable.idempotence": False,
                "message.timeout.ms": 30_000,
                "log_level": 0,
            }
        )
        self.sent: list[str] = []
        self.acked: set[str] = set()
        self.failed = 0

    def send(self, i: int) -> None:
        message_id = msgsafe.new_message_id()
        self.sent.append(message_id)

        def report(err: Any, _msg: Any, message_id: str = message_id) -> None:
            if err is None:
                self.acked.add(message_id)
            else:
                self.failed += 1

        while True:
            try:
                self.producer.produce(
                    self.topic,
                    b"%07d" % i,
                    key=f"k{i % 64}",
                    headers=[("msgsafe-id", message_id.encode())],
                    on_delivery=report,
                )
                break
            except BufferError:  # local queue full: serve reports, then try again
                self.producer.poll(0.1)
        self.producer.poll(0)


def test_leader_sigkilled_during_50k_acks_all_sends_then_restarted(
    kafka: LabKafka, tmp_path: Path
) -> None:
    leader = _follower_node(kafka)  # a partition leader that is not the active controller
    ours, theirs = _topic(kafka, leader), _topic(kafka, leader)
    raw = _RawAcks1(kafka.bootstrap, theirs)
    started = time.monotonic()
    killed_at = restarted_at = 0.0
    with msgsafe.Producer(
        kafka.url, outbox=tmp_path / "outbox.db", send_timeout=60, confirm_timeout=10
    ) as producer:
        sender = _KeyedSender(producer, ours, keys=64)
        for i in range(N):
            if i == KILL_AT:
                kafka.kill(leader)
                killed_at = time.monotonic()
            elif i == RESTART_AT:
                restart(kafka, [leader])
                restarted_at = time.monotonic()
            if i >= WINDOW:
                # A bounded window keeps traffic flowing across the kill.
                sender.futures[i - WINDOW].exception(60)
            sender.send(i)
            raw.send(i)
        assert producer.flush(120)
        sender.settle()
        assert producer.drain(120) == 0, "outbox did not drain"
        send_s = time.monotonic() - started
    raw.producer.flush(60)
    new_leader = _leader(kafka, ours)
    wait_until(
        lambda: all_in_sync(kafka.bootstrap, kafka.count), 120, "replicas in sync", interval=POLL_S
    )
    violations = sender.check(kafka)
    in_log = read_log(kafka.url, theirs, raw.acked, deadline_s=120)
    raw_lost = raw.acked - set(in_log)
    ledger = sender.ledger
    _record(
        "seed: leader SIGKILL during 50k acks=all",
        ledger,
        violations,
        recover_s=restarted_at - killed_at,
        detail=f"send+drain {send_s:.1f}s, leader {leader} -> {new_leader}",
    )
    RESULTS.append(
        CellResult(
            protocol="kafka (raw confluent-kafka, acks=1)",
            fault="seed: leader SIGKILL during 50k acks=all",
            sent=len(raw.sent),
            confirmed=len(raw.acked),
            stored=0,
            refused={"delivery error": raw.failed} if raw.failed else {},
            received=sum(in_log.values()),
            lost=len(raw_lost),
            duplicates=sum(c - 1 for c in in_log.values() if c > 1),
            unknown=len(set(in_log) - set(raw.sent)),
            order_violations=0,
            recover_s=restarted_at - killed_at,
            max_send_s=0.0,
            stored_after_heal=0,
            detail="figure only, not asserted",
        )
    )
    print(
        f"[raw acks=1, same fail-over] sent={len(raw.sent)} acked={len(raw.acked)} "
        f"failed={raw.failed} in log={len(in_log)} LOST (acked, not in log)={len(raw_lost)}"
    )
    assert not ledger.failures, ledger.report("seed leader kill")
    assert len(ledger.receipted) == N
    assert not ledger.lost, f"{len(ledger.lost)} receipted messages never arrived"
    assert not ledger.unknown
    assert violations == 0, f"{violations} per-key order violations"


# --- ISR below min.insync.replicas, then 2 of 3 nodes down: stored, then drained ----------


def _probe_acks_all(bootstrap: str, topic: str) -> int:
    """The broker's answer to one acks=all write, unretried: a KafkaError code (0: ok)."""
    probe = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "retries": 0,
            "message.timeout.ms": 5000,
            "log_level": 0,
        }
    )
    outcome: list[Any] = []
    probe.produce(topic, b"probe", on_delivery=lambda err, _m: outcome.append(err))
    probe.flush(10)
    assert outcome, "no delivery report for the probe"
    return 0 if outcome[0] is None else int(outcome[0].code())


def test_not_enough_replicas_then_two_of_three_down_stores_then_drains_in_key_order(
    kafka: LabKafka, tmp_path: Path
) -> None:
    """NOTE: with three combined controller+broker nodes, a second node down also takes
    the controller quorum, which alone may shrink an ISR: the broker then answers acks=all
    writes with time-outs, never NOT_ENOUGH_REPLICAS. So the topic asks for
    ``min.insync.replicas=3``: one node down shrinks the ISR below it and the broker
    itself refuses with NOT_ENOUGH_REPLICAS (probed); then a second node goes down too."""
    leader = _follower_node(kafka)
    topic = _topic(kafka, leader, {"min.insync.replicas": "3"})
    first = _follower_node(kafka, leader)
    second = next(n for n in range(kafka.count) if n not in (leader, first))
    stored_s: dict[str, float] = {}
    with msgsafe.Producer(
        kafka.url,
        outbox=tmp_path / "outbox.db",
        send_timeout=30,
        confirm_timeout=3,
        retry=RETRY,
    ) as producer:
        sender = _KeyedSender(producer, topic, keys=16)
        for i in range(1000):
            sender.send(i)
        before = sender.settle()
        assert all(r.status is msgsafe.Status.CONFIRMED for r in before)

        kafka.kill(first)
        wait_until(
            lambda: len(_isr(kafka, topic)) == 2, 60, "the ISR to shrink to 2", interval=POLL_S
        )
        # The broker refuses once its ISR change is applied; until then (and on a busy
        # machine) the probe may time out instead: asked again until the deadline.
        codes: list[int] = []

        def refused() -> bool:
            codes.append(_probe_acks_all(kafka.bootstrap, topic))
            return codes[-1] == KafkaError.NOT_ENOUGH_REPLICAS

        wait_until(
            refused, 60, "the broker to refuse acks=all with NOT_ENOUGH_REPLICAS", interval=POLL_S
        )
        t = time.monotonic()
        for i in range(1000, 2000):
            sender.send(i)
        during = sender.settle()
        stored_s["ISR 2 < min.insync.replicas 3"] = time.monotonic() - t
        assert all(r.status is msgsafe.Status.STORED for r in during)

        kafka.kill(second)
        t = time.monotonic()
        for i in range(2000, 2500):
            sender.send(i)
        down = sender.settle()
        stored_s["2 of 3 down"] = time.monotonic() - t
        assert all(r.status is msgsafe.Status.STORED for r in down)
        assert producer.pending() >= 1500

        back = time.monotonic()
        heal(kafka)
        for i in range(2500, 3500):  # new sends of each key queue behind its stored ones
            sender.send(i)
        sender.settle()
        assert producer.drain(120) == 0, "outbox did not drain after the nodes came back"
        drained_s = time.monotonic() - back
    violations = sender.check(kafka)
    ledger = sender.ledger
    _record(
        "seed: NOT_ENOUGH_REPLICAS, then 2 of 3 down",
        ledger,
        violations,
        recover_s=drained_s,
        detail="stored in " + ", ".join(f"{k}: {v:.1f}s" for k, v in stored_s.items()),
    )
    assert not ledger.failures, ledger.report("seed NER")
    assert not ledger.lost, f"{len(ledger.lost)} receipted messages never arrived"
    assert not ledger.unknown
    assert violations == 0, f"{violations} per-key order violations"


# --- faults under steady traffic (blocking send(), paced): SIGSTOP, everything down -----

SEND_TIMEOUT = 5.0
OPTIONS: dict[str, object] = {"connect_timeout": 1.0, "confirm_timeout": 3.0}


def _traffic_cell(kafka: LabKafka, topic: str, fault: Fault, outbox: Path) -> CellResult:
    consume = consume_with(
        kafka.url, topic, group=f"seed-{uuid.uuid4().hex[:8]}", options=dict(FAST_GROUP)
    )
    with msgsafe.Producer(
        kafka.url, outbox=outbox, send_timeout=SEND_TIMEOUT, retry=RETRY, **OPTIONS
    ) as producer:
        return run_cell(
            "kafka",
            fault,
            producer,
            topic,
            consume,
            send_timeout=SEND_TIMEOUT,
            check_order=True,
            keys_per_thread=16,
        )


def test_leader_sigstopped_past_its_session_timeout(kafka: LabKafka, tmp_path: Path) -> None:
    """The leader stops answering (SIGSTOP) for 10 s, past the 3 s broker session timeout:
    the controller fences it and a follower in the ISR leads. No send() blocks past
    send_timeout (run_cell checks), nothing receipted is lost."""
    leader = _follower_node(kafka)
    topic = _topic(kafka, leader)
    fault = Fault(
        "seed: leader SIGSTOP 10 s",
        lambda: kafka.pause(leader),
        lambda: kafka.resume(leader),
        10.0,
        recovered=lambda: all_in_sync(kafka.bootstrap, kafka.count),
    )
    _traffic_cell(kafka, topic, fault, tmp_path / "outbox.db")
    assert _leader(kafka, topic) >= 0


def test_every_node_down_while_sends_go_on_then_back(kafka: LabKafka, tmp_path: Path) -> None:
    """All three nodes SIGKILLed for 25 s under steady traffic: every send() ends
    STORED within send_timeout; the nodes come back and the outbox drains in key order."""
    topic = _topic(kafka, _follower_node(kafka))
    fault = Fault(
        "seed: every node down 25 s",
        lambda: kill_all(kafka),
        lambda: heal(kafka),
        25.0,
        expect=stored_during_fault,
    )
    _traffic_cell(kafka, topic, fault, tmp_path / "outbox.db")


# --- a consumer of a group killed mid-batch: the group rebalances ------------------------


def _lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    # A SIGKILL can cut the last line short: only complete lines count.
    text = path.read_text()
    return [line.split()[0] for line in text.splitlines(keepends=True) if line.endswith("\n")]


def test_consumer_killed_mid_batch_group_rebalances_dedup_drops_redeliveries(
    kafka_cluster: LabKafka, tmp_path: Path
) -> None:
    """Member A (a child process) SIGKILLs itself in the middle of a batch: acked, not
    committed. Member B (this process) is in the same group; the group rebalances and B
    takes A's partitions from A's last commit. Nothing is lost, and what A had processed
    comes again (at-least-once). The processing side drops those redeliveries by message
    id: B's consumer (``dedup=True``) drops ids it handed out itself, and the sink both
    members write to keeps a :class:`~msgsafe.dedup.DedupWindow` of the ids processed
    (A's file stands for that shared store), so each id is processed once."""
    kafka = kafka_cluster
    topic = f"seed-group-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=6)
    total, crash_after = 12_000, 2_077
    sent: list[str] = []
    with msgsafe.Producer(kafka.url, outbox=tmp_path / "p.db") as producer:
        futures = [producer.send_async(topic, b"x" * 100, key=f"k{i % 32}") for i in range(total)]
        for future in futures:
            receipt = future.result(60)
            assert receipt.status is msgsafe.Status.CONFIRMED
            sent.append(receipt.message_id)
    group = f"g-{topic}"
    start_group_at_zero(kafka.url, topic, group)
    out = tmp_path / "a.txt"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    b_counts: collections.Counter[str] = collections.Counter()
    sink = DedupWindow()
    dropped_by_sink = 0
    a_seen = 0

    def process(delivery: msgsafe.Delivery) -> None:
        """B's processing: into the sink unless the sink already has the id."""
        nonlocal dropped_by_sink, a_seen
        a_ids = _lines(out)
        for message_id in a_ids[a_seen:]:  # what A processed meanwhile
            sink.record(message_id)
        a_seen = len(a_ids)
        message_id = delivery.message_id
        assert message_id is not None
        b_counts[message_id] += 1
        if sink.seen(message_id):
            dropped_by_sink += 1
        else:
            sink.record(message_id)

    # A starts first and has the whole topic; B joins once A is processing: the group
    # rebalances when B joins and again when A dies (its session times out after 3 s).
    member_a = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.kafka._consumer_child",
            kafka.url,
            topic,
            group,
            str(out),
            str(crash_after),
        ],
        cwd=ROOT,
        env=env,
    )
    wait_until(
        lambda: len(_lines(out)) > 0 or member_a.poll() is not None,
        60,
        "A to process",
        interval=POLL_S,
    )
    with msgsafe.Consumer(kafka.url, group=group, dedup=True, **FAST_GROUP) as member_b:
        member_b.subscribe(topic)
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                for delivery in member_b.poll(max_messages=200, timeout=0.2):
                    process(delivery)
                    delivery.ack()
                if member_a.poll() is not None and set(sent) <= set(_lines(out)) | set(b_counts):
                    break
            # A quiet tail: late redeliveries to B, which dedup must drop.
            tail_until = time.monotonic() + 3.0
            while time.monotonic() < tail_until:
                for delivery in member_b.poll(max_messages=500, timeout=0.2):
                    process(delivery)
                    delivery.ack()
        finally:
            if member_a.poll() is None:
                member_a.send_signal(signal.SIGKILL)
            member_a.wait(30)
        dropped = member_b.duplicates_dropped
    a_ids = _lines(out)
    assert member_a.returncode == -signal.SIGKILL
    everything = collections.Counter(a_ids) + b_counts
    lost = set(sent) - set(everything)
    redelivered = len(set(a_ids) & set(b_counts))
    print(
        f"\n[kafka x seed: consumer killed mid-batch, rebalance] sent={len(sent)} "
        f"member A processed={len(a_ids)} (killed after {crash_after}) member B handed "
        f"out={sum(b_counts.values())} unique={len(everything)} lost={len(lost)} "
        f"A's uncommitted redelivered to B={redelivered} dropped by the sink's dedup="
        f"{dropped_by_sink} dropped by B's consumer dedup={dropped}"
    )
    assert len(a_ids) == crash_after
    assert not lost, f"{len(lost)} sent messages never consumed"
    assert set(everything) <= set(sent)
    assert max(b_counts.values()) == 1, "B handed out an id twice despite dedup"
    # The acks of A's cut batch were never committed: those come again, to B, and the
    # sink drops every one of them by id.
    assert redelivered >= crash_after % 200
    assert dropped_by_sink == redelivered


# --- the leader cut off from its followers by a network partition (ISR shrink) ----------


def test_leader_cut_off_by_a_partition_loses_nothing(tmp_path: Path) -> None:
    """Three nodes, one per network namespace; the client reaches each through a proxy.
    The leader of the topic's partition is cut off from the two other nodes (not from
    the client) for 15 s under steady traffic: the controller, on the majority side,
    fences it and a follower from the ISR leads; the isolated leader cannot shrink its
    ISR alone, so it acknowledges no acks=all write by itself. After the heal it
    rejoins as a follower. No send() blocks past send_timeout, nothing is lost."""
    from tests.support.kafka_lab import NetKafka
    from tests.support.netns import NetLab, netns_or_fail

    netns_or_fail("the partition story")
    seen: dict[str, object] = {}
    with NetLab(3) as lab:
        cluster = NetKafka(lab, tmp_path / "kafka")
        try:
            try:
                cluster.start()
            except Exception as exc:
                pytest.fail(f"cannot start Kafka in network namespaces: {exc}")
            leader = _follower_node(cluster)  # type: ignore[arg-type]
            topic = _topic(cluster, leader)  # type: ignore[arg-type]
            others = [n for n in range(cluster.count) if n != leader]
            majority = ",".join(f"127.0.0.1:{cluster.ports[n]}" for n in others)

            def majority_view() -> tuple[int, list[int]]:
                part = kafka_admin.partitions(majority, topic)[0]
                return int(part.leader), sorted(part.isrs)

            def inject() -> None:
                lab.cut(leader)
                seen["cut"] = time.monotonic()

            def heal_net() -> None:
                # What the majority side says before the heal: a new leader, and the
                # isolated node out of the ISR.
                try:
                    seen["during"] = majority_view()
                finally:
                    lab.heal(leader)

            fault = Fault(
                "seed: leader cut off (network partition) 15 s",
                inject,
                heal_net,
                15.0,
                recovered=lambda: all_in_sync(cluster.bootstrap, cluster.count),
            )
            _traffic_cell(cluster, topic, fault, tmp_path / "outbox.db")  # type: ignore[arg-type]
            new_leader, isr = seen["during"]  # type: ignore[misc]
            print(
                f"[netns partition] leader {leader} cut off; majority side during the cut: "
                f"leader {new_leader}, ISR {isr}; after the heal: {majority_view()}"
            )
            assert new_leader in others, f"no fail-over during the partition: {seen}"
            assert leader not in isr, f"the ISR kept the isolated leader: {isr}"
        finally:
            cluster.stop()

"""A 3-node RabbitMQ cluster across three namespaces, really partitioned.

Node 2 is cut off from nodes 0 and 1 while clients still reach it. Under
``pause_minority`` it must pause and close its client connections; the majority keeps
confirming publishes to a quorum queue; after heal node 2 rejoins and serves every
message. Counts: sent, confirmed, received; lost must be 0.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import pika
import pika.exceptions
import pytest

from msgsafe.testing.faultproxy import FaultProxy
from tests.support.rabbit_lab import AMQP_PORT, NetRabbitCluster
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.slow]

QUEUE = "partition-q"
#: How often a wait polls: its conditions run rabbitmqctl in a namespace (slow, costly).
POLL_S = 0.2


@pytest.fixture(scope="module")
def cluster(net_rabbit: object) -> NetRabbitCluster:
    """The session's namespaced cluster (the chaos partition cell uses it too: three
    Erlang nodes started once, not twice), whole before this module's tests use it."""
    assert isinstance(net_rabbit, NetRabbitCluster)
    expected = {net_rabbit.node(i) for i in range(3)}

    def whole() -> bool:
        try:
            return running_nodes(net_rabbit, 0) == expected
        except (RuntimeError, ValueError):
            return False

    wait_until(whole, 120, "the namespaced cluster to be whole", interval=POLL_S)
    return net_rabbit


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            port,
            # The test thread waits on the cluster without servicing the connection;
            # with heartbeats on, the broker would drop it for that alone.
            heartbeat=0,
            blocked_connection_timeout=10,
            socket_timeout=5,
            connection_attempts=1,
        )
    )


def publish_confirmed(
    channel: pika.adapters.blocking_connection.BlockingChannel, n: int, queue: str = QUEUE
) -> list[str]:
    ids = []
    for _ in range(n):
        mid = str(uuid.uuid4())
        channel.basic_publish(
            "",
            queue,
            mid.encode(),
            pika.BasicProperties(message_id=mid, delivery_mode=2),
            mandatory=True,
        )  # raises unless the broker confirmed (confirm_delivery is on)
        ids.append(mid)
    return ids


def running_nodes(rabbit: NetRabbitCluster, i: int) -> set[str]:
    status = rabbit.cluster_status(i)
    nodes = status.get("running_nodes", [])
    return {str(n) for n in nodes} if isinstance(nodes, list) else set()


def test_cluster_spans_three_namespaces(cluster: NetRabbitCluster) -> None:
    expected = {cluster.node(i) for i in range(3)}
    assert running_nodes(cluster, 0) == expected
    print("running:", sorted(expected))


def test_cut_off_node_pauses_closes_clients_and_rejoins(cluster: NetRabbitCluster) -> None:
    lab = cluster.lab
    doors = [lab.proxy(i, AMQP_PORT) for i in range(3)]
    majority = connect(doors[0].port)
    minority = connect(doors[2].port)
    try:
        ch = majority.channel()
        ch.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        sent = publish_confirmed(ch, 100)

        lab.cut(2)
        cut_at = time.monotonic()

        def minority_closed() -> bool:
            try:
                minority.process_data_events(time_limit=0.2)
            except pika.exceptions.AMQPError:
                return True
            return False

        closed_after = wait_until(
            minority_closed, 60, "node 2 to close its clients", interval=POLL_S
        )
        # The majority keeps taking confirmed publishes while node 2 is cut off.
        sent += publish_confirmed(ch, 100)
        assert not cluster.is_running(2), "node 2 should be paused (pause_minority)"
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            connect(doors[2].port).close()

        lab.heal(2)
        heal_at = time.monotonic()
        expected = {cluster.node(i) for i in range(3)}
        # NOTE: 180 s, not 90: after the heal the paused node must reach its peers over
        # Erlang distribution again and restart its applications; once, under a load
        # of 13 (two suite lanes on two cores), that took more than 90 s.
        wait_until(
            lambda: cluster.is_running(2),
            180,
            "node 2 to resume",
            interval=POLL_S,
            diagnose=lambda: describe(cluster) + "\n" + cluster.log_tail(2),
        )
        wait_until(
            lambda: running_nodes(cluster, 0) == expected, 60, "3 running nodes", interval=POLL_S
        )
        rejoined_after = time.monotonic() - heal_at

        # Every confirmed message is there, read through the node that was cut off.
        received = drain(doors[2].port, QUEUE, len(sent), 60)
        lost = set(sent) - set(received)
        duplicates = len(received) - len(set(received))
        unknown = set(received) - set(sent)
        print(
            f"sent={len(sent)} confirmed={len(sent)} received={len(received)} "
            f"lost={len(lost)} duplicates={duplicates}; node 2 closed clients "
            f"{closed_after:.1f}s after the cut (net_ticktime={cluster.net_ticktime}), "
            f"rejoined {rejoined_after:.1f}s after heal; cut lasted {heal_at - cut_at:.1f}s"
        )
        assert not lost
        assert not unknown
    finally:
        close_all([majority, minority], doors)


def partitioned_nodes(cluster: NetRabbitCluster) -> list[int]:
    """Nodes whose ``cluster_status`` records a partition."""
    return [i for i in range(cluster.lab.n) if cluster.cluster_status(i).get("partitions")]


def describe(cluster: NetRabbitCluster) -> str:
    """What each node thinks of the cluster, for failure messages."""
    lines = []
    for i in range(cluster.lab.n):
        status = cluster.ctl(i, "cluster_status", "--formatter", "json", check=False)
        lines.append(f"node {i}: running={cluster.is_running(i)} status={status.strip()}")
    return "\n".join(lines)


def close_all(conns: list[pika.BlockingConnection], doors: list[FaultProxy]) -> None:
    for conn in conns:
        # An idle BlockingConnection misses heartbeats while the test waits on the
        # cluster, so the broker may already have dropped it.
        with contextlib.suppress(pika.exceptions.AMQPError):
            if conn.is_open:
                conn.close()
    for door in doors:
        door.close()


def drain(port: int, queue: str, expected: int, timeout: float) -> list[str]:
    """Consume (get + ack) until ``expected`` distinct ids arrived or ``timeout``."""
    received: list[str] = []
    conn = connect(port)
    try:
        ch = conn.channel()
        deadline = time.monotonic() + timeout
        while len(set(received)) < expected and time.monotonic() < deadline:
            method, props, _ = ch.basic_get(queue, auto_ack=False)
            if method is None:
                conn.process_data_events(time_limit=0.2)
                continue
            received.append(props.message_id)
            ch.basic_ack(method.delivery_tag)
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            conn.close()
    return received


def test_sigstopped_node_is_declared_down_then_comes_back(cluster: NetRabbitCluster) -> None:
    """The asymmetric case: node 1 is frozen, not cut; the others declare it down."""
    queue = "sigstop-q"
    lab = cluster.lab
    doors = [lab.proxy(i, AMQP_PORT) for i in range(3)]
    conn = connect(doors[0].port)
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        sent = publish_confirmed(ch, 50, queue)
        expected = {cluster.node(i) for i in range(3)}

        cluster.pause(1)
        stopped_at = time.monotonic()
        try:
            down_after = wait_until(
                lambda: cluster.node(1) not in cluster.connected_nodes(0),
                60,
                "nodes 0 and 2 to declare node 1 down",
                interval=POLL_S,
            )
            sent += publish_confirmed(ch, 50, queue)  # majority of the quorum queue: 0, 2
        finally:
            cluster.resume(1)
        resumed_at = time.monotonic()

        def whole() -> bool:
            return cluster.is_running(1) and running_nodes(cluster, 0) == expected

        # NOTE: RabbitMQ 3.10 under pause_minority does not always recover from this by
        # itself: the resumed node may record a partition (it saw the others go away)
        # while reconnected to both, so it is not in a minority and does not pause; it
        # runs as an island until restarted — the asymmetric case of the partitions guide.
        # The documented recovery is to restart the app on the node that recorded it.
        recovery = "automatic"
        try:
            wait_until(whole, 30, "node 1 back in a 3-node cluster", interval=POLL_S)
        except AssertionError:
            islands = partitioned_nodes(cluster)
            assert islands, f"no partition recorded, yet not whole:\n{describe(cluster)}"
            recovery = f"restart_app on {sorted(cluster.node(i) for i in islands)}"
            for i in islands:
                cluster.ctl(i, "stop_app")
                cluster.ctl(i, "start_app")
            wait_until(
                whole,
                90,
                "3 nodes after restarting",
                diagnose=lambda: describe(cluster),
                interval=POLL_S,
            )
        back_after = time.monotonic() - resumed_at
        received = drain(doors[1].port, queue, len(sent), 60)
        lost = set(sent) - set(received)
        print(
            f"sent={len(sent)} confirmed={len(sent)} received={len(received)} "
            f"lost={len(lost)} duplicates={len(received) - len(set(received))}; node 1 "
            f"declared down {down_after:.1f}s after SIGSTOP, stopped "
            f"{resumed_at - stopped_at:.1f}s; recovery: {recovery}, 3 nodes running "
            f"{back_after:.1f}s after SIGCONT"
        )
        assert not lost
        assert not set(received) - set(sent)
    finally:
        close_all([conn], doors)

"""Leadership moved on purpose, with the brokers' own tools: the ``leader`` role of a
nemesis schedule.

A mover has :meth:`~Mover.move` (the window's start: move leadership to node
``target``, or away from the node that leads), :meth:`~Mover.back` (its end: as it was)
and :meth:`~Mover.heal` (the run's end: no node left in a moved state). Each raises
:class:`~msgsafe.cluster.base.ClusterError` when the brokers refuse.

- :class:`KafkaMover`: the destination topic's partitions reassigned by
  ``kafka-reassign-partitions`` so that node ``target`` is every partition's first
  (preferred) replica (only the order changes: no data moves), then a preferred leader
  election (``kafka-leader-election.sh --election-type PREFERRED``'s request): every
  partition is then led by ``target``. Back: the replica lists as the topic was
  created, and a preferred election again.
- :class:`RabbitMover`: RabbitMQ 3.10 has no command that hands a quorum queue's
  leadership to a named node; its maintenance mode (``rabbitmq-upgrade drain``) moves
  the leadership of every quorum queue off the drained node, and ``revive`` ends it. The
  mover drains the node that leads the run's queue at the window's start (the target,
  drawn among one, means "whichever node leads"); back revives it.
- :class:`QpidMover`: Broker-J's BDB HA "transfer mastership": the target node's virtual
  host node ``role`` set to MASTER through the REST API; back: the master before the
  move made master again.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from msgsafe.cluster.base import ClusterError

if TYPE_CHECKING:
    from msgsafe.cluster.kafka import KafkaCluster
    from msgsafe.cluster.qpid import QpidCluster
    from msgsafe.cluster.rabbitmq import RabbitCluster

__all__ = ["LEADER_WAIT_S", "KafkaMover", "Mover", "QpidMover", "RabbitMover"]

#: How long a move waits for the leader it asks for (RabbitMQ: for the queue to have one;
#: Kafka: for the preferred replica to be electable): after a node's pause or restart
#: that takes seconds.
LEADER_WAIT_S = 30.0
_LEADER_POLL_S = 0.5


def _not_available(error: str) -> bool:
    """Kafka's PREFERRED_LEADER_NOT_AVAILABLE (its name, or librdkafka's wording): the
    preferred replica is not (yet) in sync; an election a moment later may succeed."""
    text = error.lower()
    return "preferred_leader_not_available" in text or "preferred leader was not" in text


class Mover(Protocol):
    """What the runner asks of a kind's leadership mover."""

    def move(self, target: int) -> str:
        """Move leadership (see the kind's class); a line saying what moved."""
        ...

    def back(self, target: int) -> str:
        """Undo :meth:`move`; a line saying what moved."""
        ...

    def heal(self) -> None:
        """Leave no node in a moved state (the run's end)."""
        ...


class KafkaMover:
    """Every partition of ``topic`` led by the target node (module doc)."""

    def __init__(self, cluster: KafkaCluster, topic: str, wait: float = LEADER_WAIT_S) -> None:
        self.cluster = cluster
        self.topic = topic
        #: Seconds an election refused for a preferred leader not yet available is retried.
        self.wait = wait
        #: The replica lists as the topic was created: what :meth:`back` restores.
        self.created = cluster.replicas(topic)

    def _lead(self, order: dict[int, list[int]]) -> dict[int, str]:
        """Reassign to ``order`` and elect the preferred leaders; ``{partition: error}``
        of those not elected (after :attr:`wait` seconds for one not yet available).

        NOTE: a long run (kafka seed 1533116067) asked for the election a moment after a
        node's pause ended: "The preferred leader was not available" (not back in the
        ISR yet, which takes seconds). Only that refusal is asked again."""
        if self.cluster.replicas(self.topic) != order:
            self.cluster.reassign(self.topic, order)
        deadline = time.monotonic() + self.wait
        while True:
            refused = self.cluster.elect_preferred(self.topic)
            waiting = all(_not_available(error) for error in refused.values())
            if not refused or not waiting or time.monotonic() >= deadline:
                return refused
            time.sleep(_LEADER_POLL_S)

    def move(self, target: int) -> str:
        order = {p: [target] + [n for n in r if n != target] for p, r in self.created.items()}
        refused = self._lead(order)
        if refused:
            raise ClusterError(f"node {target} not elected for {refused}")
        return f"every partition of {self.topic} led by node {target}"

    def back(self, target: int) -> str:
        refused = self._lead(self.created)
        if refused:
            raise ClusterError(f"the preferred leaders not elected again for {refused}")
        return f"the partitions of {self.topic} back to their preferred leaders"

    def heal(self) -> None:
        self.back(-1)


class RabbitMover:
    """The node leading ``queue`` drained (maintenance mode), then revived (module doc)."""

    def __init__(self, cluster: RabbitCluster, queue: str) -> None:
        self.cluster = cluster
        self.queue = queue
        #: Nodes this mover drained and has not revived yet.
        self.drained: set[int] = set()

    def _tool(self, tool: str, node: int, *args: str, timeout: float = 60.0) -> str:
        from msgsafe.cluster._rabbit_node import CTL

        member = self.cluster.members[node]
        try:
            done = subprocess.run(
                [str(Path(CTL).parent / tool), "-n", member.name, *args],
                env=self.cluster.env(node),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{tool} {args[0]} on {member.name} timed out") from exc
        if done.returncode != 0:
            text = (done.stderr or done.stdout).strip().splitlines()
            raise ClusterError(f"{tool} {args[0]} on {member.name} failed: {' '.join(text[-2:])}")
        return done.stdout

    def leader(self, wait: float = LEADER_WAIT_S) -> int:
        """The index of the node that leads the queue (its quorum status, asked of any
        running node), waiting up to ``wait`` seconds for one to be elected.

        NOTE: a long run (rabbitmq seed 571915487) found no leader 7 times in 29 moves,
        each within seconds of a node's pause or kill ending: the queue's members were
        still electing one, and every node said so."""
        deadline = time.monotonic() + wait
        while True:
            try:
                return self._leader_now()
            except ClusterError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(_LEADER_POLL_S)

    def _leader_now(self) -> int:
        names = {m.name: i for i, m in enumerate(self.cluster.members)}
        errors: list[str] = []
        for node in range(len(names)):
            if not self.cluster.is_running(node):
                continue
            try:
                out = self._tool(
                    "rabbitmq-queues", node, "quorum_status", self.queue, "--formatter", "json"
                )
                rows = json.loads(out)
            except (ClusterError, ValueError) as exc:
                errors.append(str(exc))
                continue
            for row in rows if isinstance(rows, list) else []:
                if str(row.get("Raft State", "")).lower() == "leader":
                    return names[str(row.get("Node Name"))]
        said = "; ".join(errors) or "every running node names none"
        raise ClusterError(f"no leader of {self.queue!r} found: {said}")

    def move(self, target: int) -> str:
        node = self.leader()
        self.drained.add(node)
        self._tool("rabbitmq-upgrade", node, "drain", timeout=120.0)
        return f"node {node}, the leader of {self.queue}, drained"

    def back(self, target: int) -> str:
        revived = sorted(self.drained)
        for node in revived:
            self._tool("rabbitmq-upgrade", node, "revive", timeout=120.0)
            self.drained.discard(node)
        return f"node(s) {revived} revived"

    def heal(self) -> None:
        self.back(-1)


class QpidMover:
    """Mastership of the BDB HA group transferred to the target node (module doc)."""

    def __init__(self, cluster: QpidCluster) -> None:
        self.cluster = cluster
        #: The master before the last move: where :meth:`back` hands it again.
        self.before: int | None = None

    def move(self, target: int) -> str:
        self.before = self.cluster.master()
        self.cluster.transfer_master(target)
        return f"node {target} master (was {self.before})"

    def back(self, target: int) -> str:
        before, self.before = self.before, None
        if before is None or before == target:
            return "no move to undo"
        self.cluster.transfer_master(before)
        return f"node {before} master again"

    def heal(self) -> None:
        self.before = None  # any master will do once the group is whole

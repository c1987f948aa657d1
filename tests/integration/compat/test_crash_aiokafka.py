"""The asyncio drop-ins (``msgsafe.compat.aiokafka.AIOKafkaProducer`` and
``msgsafe.compat.confluent_kafka.AIOProducer``) on the session's three-node Kafka
cluster, counted: the node leading partition 0 is SIGKILLed once a third of the events
are acknowledged, then, at two thirds reported, every node still running is frozen
(SIGSTOP) and the cluster is down for a while before all come back.

Every future must report success (confirmed, or stored in the outbox), and every event
must be in the topic once the outbox left at exit is forwarded: nothing lost, nothing
failed, duplicates only of known ids.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat._kafka_config import translate_config
from tests.integration.compat.legacy import HERE, Run, run_script, script_env
from tests.integration.compat.test_legacy_kafka import _received
from tests.support.kafka_lab import heal

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SCRIPT = HERE / "aio_crash_producer.py"
COUNT = 3000
#: Seconds every node stays down (the fault's length, not a wait for a condition).
ALL_DOWN_S = 6.0
#: Longest wait for the outbox left at exit to be forwarded (a cluster just back).
FORWARD_S = 180.0


def _forward_leftovers(data_dir: Path, bootstrap: str) -> int:
    """Forward what the script left in its outbox (the next producer's job); returns
    how many messages it held."""
    left = 0
    url = translate_config({"bootstrap.servers": bootstrap}).url
    for path in data_dir.glob("**/outbox/*.sqlite3"):
        with msgsafe.Producer(url, outbox=str(path)) as producer:
            left += producer.pending()
            assert producer.drain(FORWARD_S) == 0, "the outbox could not forward its messages"
    return left


@pytest.mark.parametrize("kind", ["aiokafka", "confluent-aio"])
def test_leader_kill_then_whole_cluster_down_loses_nothing(
    kind: str, kafka: KafkaCluster, tmp_path: Path
) -> None:
    topic = f"aio-crash-{kind}-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=3)
    data_dir = tmp_path / "data"
    killed: list[int] = []
    back = threading.Event()

    def kill_leader(_pid: int) -> str:
        node = kafka.leader_of(topic, 0)
        kafka.kill(node)
        killed.append(node)
        return f"kafka node {node} (leader of {topic}/0)"

    def bring_back() -> None:
        time.sleep(ALL_DOWN_S)  # the outage itself
        heal(kafka)
        back.set()

    def all_down() -> None:
        # NOTE: the nodes still running are frozen (SIGSTOP), not killed: no broker
        # answers, as with a whole-cluster outage, and they come back reliably on a
        # loaded machine (a KRaft cluster restarted from three SIGKILLs did not).
        for node, info in enumerate(kafka.nodes()):
            if info.running and info.role != "paused":
                kafka.pause(node)
        threading.Thread(target=bring_back, daemon=True).start()

    run = run_script(
        Run(kind, COUNT),
        SCRIPT,
        [kind, kafka.bootstrap, topic, str(COUNT)],
        env=script_env(data_dir),
        log=tmp_path / f"{kind}.stderr",
        kill=kill_leader,
        restart=all_down,
    )
    print(run.summary())
    assert back.wait(300), "the cluster did not come back"
    run.left_in_outbox = _forward_leftovers(data_dir, kafka.bootstrap)
    run.received = _received(kafka, topic, set(range(COUNT)), limit_s=120.0)
    print(run.summary())
    assert run.killed and run.restarted_at, "the faults were not injected during the run"
    assert run.returncode == 0, run.stderr_tail
    assert not run.failed, f"failed futures: {sorted(run.failed)[:20]}"
    assert len(run.acknowledged) == COUNT, "a future never resolved"
    assert not run.lost, f"lost {len(run.lost)}: {sorted(run.lost)[:20]}"
    assert not run.unknown

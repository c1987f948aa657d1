"""Exactly-once effects through ``Consumer.run(inbox=...)`` on the 3-node Kafka cluster,
counted.

2,000 keyed messages over 40 keys on a topic of 3 partitions, replication 3,
``min.insync.replicas=2`` (2% poison that always raises, 5% failing on their first
attempt). The consumer service (:mod:`tests.support.inbox_consumer`: one member of a
group, four workers, a SQLite inbox, retries, a dead-letter topic) writes one effect row
per message through the inbox's transaction; it is SIGKILLed three times mid-run, each
time with a poison message between its attempts, and started again; the broker leading
a partition of the topic is SIGKILLed under the last one and restarted. Kafka keeps no
delivery count, so ``delivery.attempt`` is the inbox's: no message may meet the same
attempt number twice across the kills. Then (:mod:`tests.support.inbox_story`): every
non-poison message's effect applied exactly once, no poison message with an effect,
every poison message on the dead-letter topic with its attempts, per-key order of
effects kept, and SIGTERM ends the service with exit 0 within its deadline, leaving the
group empty with its offsets at the end of every partition.

The control run (not in the suite): ``INBOX_STORY_NO_ID_CHECK=1`` in the environment of
this test makes the service skip the inbox's id check; it then fails on effects applied
twice, so the kills do land between a commit and its acknowledgement.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.message import new_message_id
from tests.support.inbox_consumer import MAX_ATTEMPTS
from tests.support.inbox_story import InboxStory
from tests.support.kafka_ledger import start_group_at_zero

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(600)]

PARTITIONS = 3
#: Effect rows after which the running service is SIGKILLed (and started again).
KILL_AT = (300, 800, 1300)
#: Effect rows after which the broker leading partition 0 is SIGKILLed.
BROKER_KILL_AT = 1500


def _group(cluster: KafkaCluster, group: str) -> tuple[str, int]:
    """The group's state and member count, as its coordinator says."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(10)
    return str(described.state.name), len(described.members)


def _lag(cluster: KafkaCluster, topic: str, group: str) -> dict[int, int]:
    """Per partition: the records after the group's committed offset."""
    reader = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        parts = [confluent_kafka.TopicPartition(topic, p) for p in range(PARTITIONS)]
        return {
            tp.partition: reader.get_watermark_offsets(tp, timeout=10)[1] - tp.offset
            for tp in reader.committed(parts, timeout=10)
        }
    finally:
        reader.close()


def test_effects_once_through_kills_of_the_consumer_and_a_broker(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    topic, dlq = f"inbox-{new_message_id()}", f"inbox-dlq-{new_message_id()}"
    group = f"inbox-{new_message_id()}"
    for name in (topic, dlq):
        kafka.create_topic(name, PARTITIONS, 3, {"min.insync.replicas": "2"})
    story = InboxStory(
        url=kafka.url,
        queue=topic,
        dlq=dlq,
        dir=tmp_path,
        count=2000,
        group=group,
        # Retries 0.3 s apart: a kill finds a poison message between its attempts.
        retry_initial=0.3,
    )
    story.send()
    start_group_at_zero(kafka.url, topic, group)
    poison = story.poison

    def poison_between_attempts(n: int) -> bool:
        last = dict(story.calls(n))  # each id's latest attempt in service n
        return any(last[m] < MAX_ATTEMPTS for m in poison & set(last))

    started = time.monotonic()
    for n, threshold in enumerate(KILL_AT):
        story.kill_when(
            n,
            lambda n=n, t=threshold: story.applied() >= t and poison_between_attempts(n),
            f"{threshold} effects and a poison message between attempts",
        )

    last = len(KILL_AT)
    with story.running(last) as final:
        story.wait_applied(final, last, BROKER_KILL_AT)
        broker = kafka.leader_of(topic, 0)
        kafka.kill(broker)
        story.wait_all_handled(final, last, 180)
        kafka.restart(broker)
        kafka.wait_in_sync(topic)
        dead = story.read_dead_letters(120)
        stopping = time.monotonic()
        stats = story.stop(final, last, 40)
        stop_s = time.monotonic() - stopping
    run_s = time.monotonic() - started

    tally = story.tally(dead)
    # The attempt numbers each message met, in every process: the inbox's count goes on
    # across the kills, so none is met twice.
    met: dict[str, list[int]] = defaultdict(list)
    services: dict[str, set[int]] = defaultdict(set)
    for n in range(last + 1):
        for message_id, attempt in story.calls(n):
            met[message_id].append(attempt)
            services[message_id].add(n)
    met_twice = {m: seq for m, seq in met.items() if len(seq) != len(set(seq))}
    across = {m for m in poison if len(services[m]) > 1}
    state, members = _group(kafka, group)
    lag = _lag(kafka, topic, group)
    attempts = sorted({a for _, a in dead})
    print(
        f"\n[kafka inbox kills] {tally.line()} dead_letter_attempts={attempts} "
        f"poison_tried_by_2+_services={len(across)} attempt_met_twice={len(met_twice)} "
        f"broker_killed={broker} group={state}/{members} lag={sum(lag.values())} "
        f"sigterm_exit_s={stop_s:.1f} run_s={run_s:.0f} last_service={stats}"
    )
    tally.check()
    assert met_twice == {}
    assert across  # the kills found poison messages between attempts
    assert (state, members) == ("EMPTY", 0)  # SIGTERM left the group
    assert lag == dict.fromkeys(range(PARTITIONS), 0)  # everything committed

"""Exactly-once effects through ``Consumer.run(inbox=...)`` on the real cluster, counted.

1,000 keyed messages on a quorum queue (2% poison that always raises, 5% failing on
their first attempt). A consumer service (:mod:`tests.support.inbox_consumer`: four
workers, a SQLite inbox, retries, a dead-letter queue) writes one effect row per message
through the inbox's transaction; it is SIGKILLed three times mid-run and started again,
and a broker node is killed under the last one. Then (:mod:`tests.support.inbox_story`):
every non-poison message's effect applied exactly once, no poison message with an
effect, every poison message on the dead-letter queue with its attempts, per-key order
of effects kept, and SIGTERM ends the service with exit 0 within its deadline, leaving
nothing in the queue.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from msgsafe.cluster.rabbitmq import RabbitCluster
from tests.support.inbox_story import InboxStory
from tests.support.rabbit_queues import declare_quorum

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(600)]

#: Effect rows at which the running service is SIGKILLed (and started again).
KILL_AT = (150, 400, 650)


def test_effects_once_through_kills_of_the_consumer_and_a_node(
    rabbit: RabbitCluster, tmp_path: Path
) -> None:
    story = InboxStory(
        url=rabbit.cluster_url(),
        queue=declare_quorum(rabbit.node_url(0), f"inbox-{uuid.uuid4().hex[:8]}"),
        dlq=declare_quorum(rabbit.node_url(0), f"inbox-dlq-{uuid.uuid4().hex[:8]}"),
        dir=tmp_path,
        count=1000,
    )
    story.send()
    for n, threshold in enumerate(KILL_AT):
        story.kill_at(n, threshold)
    rabbit.kill(1)  # the last service meets a node down too

    last = len(KILL_AT)
    with story.running(last) as final:
        story.wait_all_handled(final, last, 240)
        rabbit.restart(1)
        dead = story.read_dead_letters(120)
        stats = story.stop(final, last, 40)

    tally = story.tally(dead)
    print(tally.line(), f"last service: {stats}")
    tally.check()
    assert story.left_in_queue() == 0  # nothing left unacknowledged

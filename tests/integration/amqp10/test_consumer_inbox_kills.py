"""Exactly-once effects through ``Consumer.run(inbox=...)`` on the Artemis pair, counted.

The inbox story of ``tests/integration/rabbitmq/test_consumer_inbox_kills.py`` on the
session's ActiveMQ Artemis live/backup pair over AMQP 1.0: 2,000 keyed messages over 40
keys on an auto-created anycast queue (2% poison that always raises, 5% failing on
their first attempt). The consumer service (:mod:`tests.support.inbox_consumer`: four
workers, a SQLite inbox, retries, a dead-letter address) is SIGKILLed three times
mid-run and started again; under the last one the live primary is SIGKILLed (the backup
takes over), then restarted once every effect is in (fail-back). Then
(:mod:`tests.support.inbox_story`): every non-poison message's effect applied exactly
once, no poison message with an effect, every poison message on the dead-letter address
with its attempt count, per-key order kept, the service followed the fail-over, and
SIGTERM ends it with exit 0 within its deadline, leaving nothing in the queue.

NOTE: the poison here raises; a handler that crashes its process instead may not reach
``max_attempts`` on Artemis, which does not always count a delivery lost with its
consumer's connection in the delivery-count (see docs/evidence/reliability.md).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from msgsafe.cluster.artemis import ArtemisCluster
from tests.support.inbox_story import InboxStory

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(900)]

#: Effect rows at which the running service is SIGKILLed (and started again).
KILL_AT = (300, 800, 1300)
#: Effect rows at which the live primary is SIGKILLed under the last service.
PRIMARY_KILLED_AT = 1600


def test_effects_once_through_consumer_kills_and_a_fail_over(
    artemis_pair: ArtemisCluster, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    story = InboxStory(
        url=artemis_pair.url,
        queue=f"inbox.{suffix}",
        dlq=f"inbox.dlq.{suffix}",
        dir=tmp_path,
        count=2000,
    )
    story.send()
    for n, threshold in enumerate(KILL_AT):
        story.kill_at(n, threshold)

    last = len(KILL_AT)
    with story.running(last) as final:
        story.wait_applied(final, last, PRIMARY_KILLED_AT)
        artemis_pair.kill(0)  # the backup takes over under the running service
        story.wait_all_handled(final, last, 300)
        artemis_pair.restart(0)  # fail-back: the service follows the primary again
        dead = story.read_dead_letters(120)
        stats = story.stop(final, last, 40)

    tally = story.tally(dead)
    print(tally.line(), f"last service: {stats}")
    tally.check()
    assert stats["failovers"] >= 1, "the primary's kill did not reach the service"
    assert story.left_in_queue() == 0  # nothing left unacknowledged

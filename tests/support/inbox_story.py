"""The counted inbox story's parts, shared by its runs (one consumer on a SQLite inbox,
a fleet on a PostgreSQL one): the keyed messages sent (2% poison, 5% failing once), the
dead-letter queue read back, and the check of the effect rows the consumers committed
(``tests/integration/rabbitmq/_inbox_consumer.py`` writes them)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from msgsafe import Consumer, Producer
from msgsafe.consuming.dead_letter import DLQ_ATTEMPTS, DLQ_MESSAGE_ID
from tests.support.commands import ROOT
from tests.support.waiting import wait_until

#: How many times the story's consumers call the handler before dead-lettering.
MAX_ATTEMPTS = 3


def kind(i: int) -> str:
    """What the ``i``-th message is: ``poison`` (always raises), ``flaky`` (raises on its
    first attempt) or ``ok``."""
    return "poison" if i % 50 == 7 else "flaky" if i % 20 == 3 else "ok"


@dataclass(frozen=True)
class Sent:
    """The messages of one run: ``ids`` in send order, the poison ones among them."""

    ids: list[str]
    poison: set[str]

    @property
    def to_apply(self) -> int:
        """How many messages' effects are to be applied (every one but the poison)."""
        return len(self.ids) - len(self.poison)


def send(url: str, queue: str, count: int, keys: int) -> Sent:
    """``count`` messages ``<kind>:<i>`` on ``queue``, key ``k<i % keys>``, confirmed."""
    with Producer(url, outbox=False) as producer:
        ids = [
            producer.send(queue, f"{kind(i)}:{i}".encode(), key=f"k{i % keys}").message_id
            for i in range(count)
        ]
    return Sent(ids, {m for i, m in enumerate(ids) if kind(i) == "poison"})


def start_consumer(
    url: str, queue: str, dlq: str, inbox: str, outbox: Path, log: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """The story's consumer service (``_inbox_consumer``) as a child process, its output
    appended to ``log``; ``outbox`` holds its dead letters until they are confirmed."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.rabbitmq._inbox_consumer",
                url,
                queue,
                dlq,
                inbox,
                str(outbox),
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def read_dead_letters(
    url: str, dlq: str, sent: Sent, diagnose: Callable[[], str] = str
) -> list[tuple[str, int]]:
    """Every dead letter on ``dlq`` as (its message id, its attempts), read until each
    poison message of ``sent`` is there."""
    dead: list[tuple[str, int]] = []
    with Consumer(url).subscribe(dlq) as reader:
        wait_until(
            lambda: (
                dead.extend(
                    (d.headers[DLQ_MESSAGE_ID], int(d.headers[DLQ_ATTEMPTS]))
                    for d in reader.poll(0.5, max_messages=100)
                )
                or {m for m, _ in dead} >= sent.poison
            ),
            120,
            "every poison message on the dead-letter queue",
            diagnose=lambda: f"{len({m for m, _ in dead})} of {len(sent.poison)}\n{diagnose()}",
        )
    return dead


def check_effects(
    sent: Sent, effects: Sequence[tuple[str, str, bytes]], dead: list[tuple[str, int]]
) -> tuple[str, dict[str, list[int]]]:
    """Assert each non-poison message's effect applied exactly once (``effects``: message
    id, key, body, in commit order), none of a poison message or of an unknown id, and
    every poison message dead-lettered after its attempts. Returns the counts in one
    line, and each key's message numbers in effect order (for a run to check order)."""
    per_id = Counter(e[0] for e in effects)
    applied_twice = {m: n for m, n in per_id.items() if n > 1}
    missing = set(sent.ids) - sent.poison - set(per_id)
    poisoned = sent.poison & set(per_id)
    unknown = set(per_id) - set(sent.ids)
    dead_ids = Counter(m for m, _ in dead)
    summary = (
        f"sent={len(sent.ids)} effects={len(effects)} applied_twice={len(applied_twice)} "
        f"missing={len(missing)} poison_with_effect={len(poisoned)} "
        f"dead_lettered={len(dead_ids)} dead_letter_copies={sum(dead_ids.values())}"
    )
    assert applied_twice == {}, summary
    assert missing == set(), summary
    assert poisoned == set(), summary
    assert unknown == set(), summary
    assert set(dead_ids) == sent.poison, summary  # each there; copies carry its id
    assert all(attempts >= MAX_ATTEMPTS for _, attempts in dead), dead
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, key, body in effects:
        by_key[key].append(int(body.split(b":")[1]))
    return summary, by_key

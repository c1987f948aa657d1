"""A consumer service for the inbox story (:mod:`tests.support.inbox_story`):
``Consumer.run`` with an inbox (``sqlite:…`` or ``postgresql://…``), retries and a
dead-letter destination; the handler writes one effect row per message through ``tx``
(``effects``: message id, key, body and this process's pid; made by the test). Poison
messages always raise; "flaky" ones raise on their first attempt. Runs until SIGTERM
(then prints its stats as one JSON line and exits 0) or until SIGKILLed by the test.
The same service for every broker: only the URL differs. Logs warnings, and the inbox's
retries (``msgsafe.inbox`` at INFO), to stderr.

    python -m tests.support.inbox_consumer URL QUEUE DLQ INBOX OUTBOX [--calls FILE]
        [--group GROUP] [--retry-initial S]

``--calls`` appends ``message_id attempt`` to FILE at the start of every handler call
(which attempt numbers each process met); ``--group`` joins a consumer group (Kafka,
with a short session: a SIGKILLed member holds its partitions until it times out);
``--retry-initial`` sets the first retry's backoff (default 0.01 s). With
``INBOX_STORY_NO_ID_CHECK=1`` in its environment the service hands every call to the
inbox under a fresh id: the control run, showing what the id check prevents.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any, TextIO, TypeVar

from msgsafe import Consumer, Delivery, Producer, RetryPolicy
from msgsafe.inbox import open_inbox
from msgsafe.ports import InboxStore

MAX_ATTEMPTS = 3
#: The line the service prints last, before its stats as JSON.
STATS = "stats "

_R = TypeVar("_R")


class _NoIdCheck:
    """The control run's inbox: every call under a fresh id, so a message committed
    before its acknowledgement is applied again when it is redelivered."""

    def __init__(self, inbox: InboxStore) -> None:
        self._inbox = inbox

    def process(
        self, message_id: str, work: Callable[[Any], _R], *, source: str, attempt: int = 1
    ) -> Any:
        return self._inbox.process(uuid.uuid4().hex, work, source=source, attempt=attempt)

    def handled(self, message_ids: Sequence[str]) -> set[str]:
        return set()

    def record_attempt(self, message_id: str, *, source: str) -> int:
        return self._inbox.record_attempt(message_id, source=source)

    def prune(self, *, older_than_s: float) -> int:
        return 0

    def close(self) -> None:
        self._inbox.close()


def main(
    url: str,
    queue: str,
    dlq: str,
    inbox_url: str,
    outbox: str,
    *,
    calls: TextIO | None = None,
    group: str | None = None,
    retry_initial: float = 0.01,
) -> int:
    mark = "?" if inbox_url.startswith("sqlite:") else "%s"
    insert = (
        f"INSERT INTO effects (message_id, key, body, pid) VALUES ({mark}, {mark}, {mark}, {mark})"
    )
    pid = os.getpid()

    def handler(d: Delivery, tx: Any) -> None:
        if calls is not None:
            calls.write(f"{d.message_id} {d.attempt}\n")
        tx.execute(insert, (d.message_id, (d.key or b"").decode(), d.body, pid))
        if d.body.startswith(b"poison") or (d.body.startswith(b"flaky") and d.attempt == 1):
            raise RuntimeError(f"cannot handle {d.body!r} (attempt {d.attempt})")

    options: dict[str, Any] = {}
    if group is not None:
        options = {"group": group, "session_timeout_ms": 3000, "heartbeat_interval_ms": 500}
    inbox = open_inbox(inbox_url)
    if os.environ.get("INBOX_STORY_NO_ID_CHECK") == "1":
        inbox = _NoIdCheck(inbox)
    # Warnings, and the inbox's retries through a database fail-over, for the test to read.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("msgsafe.inbox").setLevel(logging.INFO)
    # The dead letters' own outbox: one a killed process left is forwarded by the next.
    with Producer(url, outbox=outbox) as dead_letters, closing(inbox):
        consumer = Consumer(url, **options).subscribe(queue)
        print("running", flush=True)
        consumer.run(
            handler,
            inbox=inbox,
            concurrency=4,
            prefetch=16,
            retry=RetryPolicy(initial=retry_initial, max_attempts=MAX_ATTEMPTS, jitter=False),
            dead_letter=dlq,
            dead_letter_producer=dead_letters,
            stop_timeout=20,
        )
    stats = consumer.stats()
    figures = {
        "handled": stats.handled,
        "skipped": stats.skipped,
        "retried": stats.retried,
        "dead_lettered": stats.dead_lettered,
        "failovers": sum(stats.failovers.values()),
    }
    print(STATS + json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("url", "queue", "dlq", "inbox", "outbox"):
        parser.add_argument(name)
    parser.add_argument("--calls")
    parser.add_argument("--group")
    parser.add_argument("--retry-initial", type=float, default=0.01)
    args = parser.parse_args()
    with open(args.calls or os.devnull, "a", buffering=1) as calls:
        sys.exit(
            main(
                args.url,
                args.queue,
                args.dlq,
                args.inbox,
                args.outbox,
                calls=calls if args.calls else None,
                group=args.group,
                retry_initial=args.retry_initial,
            )
        )

"""A consumer service for the inbox story (:mod:`tests.support.inbox_story`):
``Consumer.run`` with an inbox, retries and a dead-letter destination; the handler
writes one effect row per message through ``tx`` (``effects``: message id, key, body and
this process's pid). Poison messages always raise; "flaky" ones raise on their first
attempt. Runs until SIGTERM (then prints its stats as one JSON line and exits 0) or
until SIGKILLed by the test; logs warnings, and the inbox's retries (``msgsafe.inbox``
at INFO), to stderr. The same service for every broker: only the URL differs.

    python -m tests.support.inbox_consumer URL QUEUE DLQ INBOX OUTBOX

``INBOX`` is the path of a SQLite database or a ``postgresql://`` inbox URL.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from msgsafe import Consumer, Delivery, Producer, RetryPolicy

MAX_ATTEMPTS = 3
#: The line the service prints last, before its stats as JSON.
STATS = "stats "


def main(url: str, queue: str, dlq: str, inbox: str, outbox: str) -> int:
    if not inbox.startswith(("postgresql://", "postgres://")):
        inbox = f"sqlite://{inbox}"
    mark = "?" if inbox.startswith("sqlite:") else "%s"
    insert = f"INSERT INTO effects (message_id, key, body, pid) VALUES ({', '.join([mark] * 4)})"
    pid = os.getpid()

    def handler(d: Delivery, tx: Any) -> None:
        tx.execute(insert, (d.message_id, (d.key or b"").decode(), d.body, pid))
        if d.body.startswith(b"poison") or (d.body.startswith(b"flaky") and d.attempt == 1):
            raise RuntimeError(f"cannot handle {d.body!r} (attempt {d.attempt})")

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("msgsafe.inbox").setLevel(logging.INFO)
    # The dead letters' own outbox: one a killed process left is forwarded by the next.
    with Producer(url, outbox=outbox) as dead_letters:
        consumer = Consumer(url).subscribe(queue)
        print("running", flush=True)
        consumer.run(
            handler,
            inbox=inbox,
            concurrency=4,
            prefetch=16,
            retry=RetryPolicy(initial=0.01, max_attempts=MAX_ATTEMPTS, jitter=False),
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
    sys.exit(main(*sys.argv[1:6]))

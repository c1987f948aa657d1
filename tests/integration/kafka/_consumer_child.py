"""A consumer process for the kill -9 test: receives in batches, appends each processed
id to a file (flushed, so it survives SIGKILL of this process), then acks it.

    python -m tests.integration.kafka._consumer_child URL TOPIC GROUP OUTFILE [CRASH_AFTER]

With CRASH_AFTER the process SIGKILLs itself right after recording that many messages:
in the middle of a batch, with acks given but not yet committed.
"""

from __future__ import annotations

import os
import signal
import sys

from msgsafe.adapters.kafka import open_receiver
from msgsafe.endpoints import parse_url


def main(argv: list[str]) -> None:
    url, topic, group, outfile = argv[:4]
    crash_after = int(argv[4]) if len(argv) > 4 else None
    recorded = 0
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    receiver = open_receiver(
        parse_url(url), {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}, group=group
    )
    receiver.subscribe(topic)
    with open(outfile, "a", buffering=1) as out:
        while not stop:
            for delivery in receiver.receive(max_messages=200, timeout=0.5):
                # "Processing": record it, then acknowledge. A kill between the two is
                # exactly the case at-least-once must redeliver.
                out.write(f"{delivery.message_id} {int(delivery.redelivered)}\n")
                delivery.ack()
                recorded += 1
                if recorded == crash_after:
                    os.kill(os.getpid(), signal.SIGKILL)
    receiver.close()


if __name__ == "__main__":
    main(sys.argv[1:])

"""A broker outage: sends keep succeeding (STORED), then the outbox drains.

Run:  python3 examples/outbox_outage.py [URL]

With the default ``memory://examples-outage`` the outage is simulated with
``msgsafe.testing.MemoryBroker.down()``; with a real broker URL the example asks you to
stop the broker (press Enter), and start it again (press Enter).
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path

import msgsafe
from msgsafe.testing import MemoryBroker

DEFAULT_URL = "memory://examples-outage"
COUNT = 10


def outage_starts(url: str) -> None:
    if url.startswith("memory://"):
        # Every publish now fails with ConnectError, as if the broker were unreachable.
        MemoryBroker.named(url.removeprefix("memory://")).down()
    else:
        input("stop the broker now, then press Enter ")


def outage_ends(url: str) -> None:
    if url.startswith("memory://"):
        MemoryBroker.named(url.removeprefix("memory://")).up()
    else:
        input("start the broker again, then press Enter ")


def main(url: str = DEFAULT_URL) -> int:
    destination = f"outage-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        # The outbox is a SQLite file: a STORED message survives a crash of this process
        # and is forwarded by the next producer opened on the same file.
        with msgsafe.Producer(url, outbox=Path(tmp) / "outbox.db", send_timeout=10) as producer:
            receipts = [producer.send(destination, b"before the outage")]

            outage_starts(url)
            for n in range(COUNT):
                # No exception, no retry loop in the application: send() returns once
                # the message is fsync'd to the outbox.
                receipts.append(producer.send(destination, f"during {n}".encode(), key="k"))
            print(f"pending during the outage: {producer.pending()}")

            outage_ends(url)
            # The forwarder would deliver them by itself with backoff; drain() pushes
            # now and returns how many are still waiting.
            left = producer.drain(timeout=30)
            print(f"pending after drain: {left}")

        statuses = Counter(r.status.name for r in receipts)
        print("receipts: " + ", ".join(f"{name} {n}" for name, n in sorted(statuses.items())))

    if url.startswith("memory://"):
        # Everything accepted reached the broker: nothing lost.
        broker = MemoryBroker.named(url.removeprefix("memory://"))
        delivered = set(broker.ids(destination))
        lost = [r.message_id for r in receipts if r.message_id not in delivered]
        print(f"on the broker: {len(delivered)} · lost {len(lost)}")
        return 1 if lost or left else 0
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URL))

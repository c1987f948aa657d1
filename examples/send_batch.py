"""Many messages at once: ``Producer.send_batch`` with the same promise as ``send``.

Run:  python3 examples/send_batch.py [URL] [DESTINATION]

A batch goes to the adapter in one call and comes back as one ``BatchReceipt``: every
message in it was confirmed by the broker or stored in the outbox. A message that could
be neither (here: one the broker rejects) makes the call raise ``BatchFailed``, which
names exactly those messages; all the others are safe, and the caller resends only the
named ones. With the default ``memory://examples-batch`` the rejection is simulated with
``msgsafe.testing.MemoryBroker``; with a real broker URL that step is left out.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import msgsafe
from msgsafe.errors import BatchFailed
from msgsafe.testing import MemoryBroker

DEFAULT_URL = "memory://examples-batch"
COUNT = 10_000


def main(url: str = DEFAULT_URL, destination: str = "events") -> int:
    bodies = [b'{"n": %d}' % n for n in range(COUNT)]
    keys = [f"user-{n % 16}" for n in range(COUNT)]
    with (
        tempfile.TemporaryDirectory() as tmp,
        msgsafe.Producer(url, outbox=Path(tmp) / "outbox.db") as producer,
    ):
        receipt = producer.send_batch(destination, bodies, keys=keys)
        print(f"batch of {len(receipt)}: confirmed {receipt.confirmed}, stored {receipt.stored}")

        if url.startswith("memory://"):
            # The broker turns down the next two messages for good.
            MemoryBroker.named(url.removeprefix("memory://")).reject_next(2)
            try:
                producer.send_batch(destination, [b"a", b"b", b"c", b"d"])
            except BatchFailed as failed:
                safe = failed.receipt
                assert isinstance(safe, msgsafe.message.BatchReceipt)
                print(f"failed {len(failed.errors)}, safe {len(safe)}")
                for message_id, error in failed.errors.items():
                    print(f"  {message_id}: {type(error).__name__}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

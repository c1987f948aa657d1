"""asyncio: many sends in flight at once with ``msgsafe.AsyncProducer``.

Run:  python3 examples/async_producer.py [URL]

``await producer.send(...)`` returns when the message is safe (CONFIRMED or STORED),
just like the blocking ``Producer.send``; the broker I/O runs on the producer's own
thread, so the event loop is never blocked. ``asyncio.gather`` keeps many sends in
flight; ``return_exceptions=True`` lets one failed send not hide the others' receipts.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import msgsafe

DEFAULT_URL = "memory://examples-async"
COUNT = 500


async def main(url: str = DEFAULT_URL) -> int:
    destination = f"async-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        async with msgsafe.AsyncProducer(url, outbox=Path(tmp) / "outbox.db") as producer:
            started = time.perf_counter()
            results = await asyncio.gather(
                *(
                    # The key keeps the order per user; different users go in parallel.
                    producer.send(destination, f"event {n}".encode(), key=f"user-{n % 8}")
                    for n in range(COUNT)
                ),
                return_exceptions=True,
            )
            elapsed = time.perf_counter() - started

    failed = [r for r in results if isinstance(r, BaseException)]
    receipts = [r for r in results if isinstance(r, msgsafe.Receipt)]
    statuses = Counter(r.status.name for r in receipts)
    print(f"sent {COUNT} in {elapsed:.2f}s")
    print("receipts: " + ", ".join(f"{name} {n}" for name, n in sorted(statuses.items())))
    for exc in failed:
        # Each error says which message it was about: resend it with the same id.
        print(f"failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    print(f"failed {len(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URL)))

"""Child process of the kill -9 test: sends through a refusing broker into the outbox and
prints every id that got a receipt, one line each, as soon as it has it.

Run as ``python -m tests.integration.outbox._kill_child OUTBOX_PATH``.
"""

from __future__ import annotations

import sys
import threading

from msgsafe import Producer, Status
from msgsafe.testing import MemoryBroker


def main(path: str) -> None:
    broker = MemoryBroker.install(MemoryBroker("kill9"))
    broker.refuse_writes("the broker refuses for hours")
    out_lock = threading.Lock()

    def report(kind: str, message_id: str, status: Status) -> None:
        if status is not Status.STORED:  # the broker refuses: nothing may be confirmed
            raise SystemExit(f"unexpected status {status}")
        with out_lock:
            sys.stdout.write(f"{kind} {message_id}\n")
            sys.stdout.flush()

    producer = Producer("memory://kill9", outbox=path, send_timeout=60)

    def sync_sender(n: int) -> None:
        key = f"t{n}"
        i = 0
        while True:
            receipt = producer.send("q", b"%d-%d" % (n, i) * 10, key=key)
            report(key, receipt.message_id, receipt.status)
            i += 1

    def async_sender() -> None:
        while True:
            futures = [producer.send_async("q", b"x" * 100) for _ in range(50)]
            for future in futures:
                receipt = future.result()
                report("-", receipt.message_id, receipt.status)

    threads = [threading.Thread(target=sync_sender, args=(n,), daemon=True) for n in range(2)]
    threads += [threading.Thread(target=async_sender, daemon=True) for _ in range(2)]
    with out_lock:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main(sys.argv[1])

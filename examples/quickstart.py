"""Quickstart: send three messages, read them back once each, acknowledge them.

Run:  python3 examples/quickstart.py [URL]

URL defaults to ``memory://examples`` (an in-process broker, so this runs anywhere);
pass ``kafka://127.0.0.1:9092`` or ``amqp://guest:guest@127.0.0.1:5672/%2F?declare=quorum``
(``declare=`` makes the producer create the queue) to use a real broker; over AMQP 1.0
to RabbitMQ, ``amqp10://guest:guest@127.0.0.1:5672?declare=quorum`` (the queue is then
addressed ``/amq/queue/NAME``: a bare address would be a transient queue, which the
producer refuses). The outbox lives in a temporary directory so the example leaves
nothing behind.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgsafe

DEFAULT_URL = "memory://examples"


def main(url: str = DEFAULT_URL) -> int:
    # A fresh destination per run, so old messages on a real broker do not show up.
    destination = f"quickstart-{uuid.uuid4().hex[:8]}"
    if url.startswith("amqp10"):
        # RabbitMQ's AMQP 1.0 plugin: an existing (here: declared) durable queue.
        destination = f"/amq/queue/{destination}"
    with tempfile.TemporaryDirectory() as tmp:
        outbox = Path(tmp) / "outbox.db"

        with msgsafe.Producer(url, outbox=outbox) as producer:
            sent = []
            for n in range(3):
                receipt = producer.send(destination, f"order {n}".encode(), key="customer-7")
                # CONFIRMED: the broker has it. STORED: it is in the outbox and will be
                # forwarded. Either way the message is safe.
                print(f"sent {receipt.message_id} {receipt.status.name}")
                sent.append(receipt.message_id)

            # Resend the first message with the same id, as a retry after a timeout
            # would: the consumer's dedup drops the copy.
            again = producer.send(destination, b"order 0", key="customer-7", message_id=sent[0])
            print(f"resent {again.message_id} {again.status.name}")

        # A new Kafka group starts at the beginning of the topic (auto_offset_reset=
        # earliest), so consuming after sending sees everything.
        with msgsafe.Consumer(url, group="quickstart", dedup=True) as consumer:
            consumer.subscribe(destination)
            received: list[str] = []
            deadline = time.monotonic() + 30.0
            while len(received) < len(sent):
                if time.monotonic() > deadline:
                    print("timed out waiting for messages", file=sys.stderr)
                    return 1
                # NOTE: poll() may return an empty list before its timeout when every
                # message in the batch was a duplicate it dropped, so loop on a deadline.
                for delivery in consumer.poll(1.0, max_messages=10):
                    print(f"received {delivery.message_id} {delivery.body.decode()}")
                    received.append(delivery.message_id or "")
                    delivery.ack()  # processed: the broker may forget it now

            # The copy arrives after the originals (same key, so same partition or queue);
            # poll a little longer so the consumer sees it and drops it.
            deadline = time.monotonic() + 10.0
            while consumer.duplicates_dropped == 0 and time.monotonic() < deadline:
                for delivery in consumer.poll(1.0, max_messages=10):
                    received.append(delivery.message_id or "")  # never a copy: dedup
                    delivery.ack()
            print(
                f"sent {len(sent)} · received {len(received)} · "
                f"duplicates dropped {consumer.duplicates_dropped}"
            )
    return 0 if sorted(received) == sorted(sent) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URL))

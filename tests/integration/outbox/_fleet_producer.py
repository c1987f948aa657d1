"""Child process of the fleet tests: one producer of a fleet, storing into a shared
PostgreSQL outbox while its broker is unreachable. Prints ``ready``, then for each
message ``sent ID KEY N`` before ``send()`` (N: its position in its key) and ``stored
ID`` once ``send()`` reported it STORED, until COUNT messages or until killed.

Run as ``python -m tests.integration.outbox._fleet_producer STORE_URL BROKER_URL QUEUE
NAME KEYS COUNT``: keys are ``NAME-0`` .. ``NAME-(KEYS-1)``, used in turn.

The tests read those lines into their ledger with :func:`record_line`, and count the
rows left in the shared table with :func:`rows_waiting`.
"""

from __future__ import annotations

import sys

import psycopg

from msgsafe import Producer, Status
from msgsafe.message_ids import new_message_id
from tests.support.ledger import Ledger


def record_line(ledger: Ledger, line: str) -> bool:
    """Put one line of this child's output into ``ledger`` (``sent``: the id with its
    key position; ``stored``: a STORED receipt); True for a ``stored`` line."""
    parts = line.split()
    if parts and parts[0] == "sent":
        ledger.add_sent(parts[1])
        with ledger.lock:
            ledger.positions[parts[1]] = (parts[2], int(parts[3]))
    elif parts and parts[0] == "stored":
        ledger.add_receipt(parts[1], Status.STORED)
        return True
    return False


def rows_waiting(url: str, table: str) -> int:
    """The rows in the shared outbox ``table`` (asked of ``url``)."""
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else -1


def main(store: str, broker: str, queue: str, name: str, keys: int, count: int) -> None:
    producer = Producer(broker, outbox=store, send_timeout=60, forward=False)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    positions = [0] * keys
    for i in range(count):
        k = i % keys
        message_id = new_message_id()
        sys.stdout.write(f"sent {message_id} {name}-{k} {positions[k]}\n")
        sys.stdout.flush()
        receipt = producer.send(
            queue, f"{name}-{i}".encode(), key=f"{name}-{k}", message_id=message_id
        )
        if receipt.status is not Status.STORED:  # the broker is unreachable
            raise SystemExit(f"unexpected status {receipt.status}")
        sys.stdout.write(f"stored {message_id}\n")
        sys.stdout.flush()
        positions[k] += 1
    producer.close(10)
    sys.stdout.write("done\n")
    sys.stdout.flush()


if __name__ == "__main__":
    store, broker, queue, name = sys.argv[1:5]
    main(store, broker, queue, name, int(sys.argv[5]), int(sys.argv[6]))

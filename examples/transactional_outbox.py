"""The transactional outbox: a message joins your database transaction.

Run:  DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test \
        python3 examples/transactional_outbox.py [URL]

The order row and the message about it are written in ONE PostgreSQL transaction:
if it commits, both exist and the producer's forwarder publishes the message; if it
rolls back, neither exists and nothing is ever published. There is no window where
the order is saved but the event is lost (or the event is sent for an order that was
never saved). Needs ``pip install 'msgsafe[postgres]'``.
"""

from __future__ import annotations

import os
import sys
import uuid

import psycopg

import msgsafe
from msgsafe.outbox import PostgresOutbox
from msgsafe.testing import MemoryBroker

DEFAULT_URL = "memory://examples-tx"
DEFAULT_CONNINFO = "postgresql://postgres@127.0.0.1:5432/test"


class OrderRejected(Exception):
    """The business rule that makes the example roll back."""


def place_order(
    producer: msgsafe.Producer, conn: psycopg.Connection, order_id: str, amount: int
) -> msgsafe.Receipt:
    """Save an order and its ``order-placed`` event atomically."""
    with conn.transaction():
        conn.execute("INSERT INTO example_orders (id, amount) VALUES (%s, %s)", (order_id, amount))
        receipt = producer.send(
            "order-placed",
            f'{{"id": "{order_id}", "amount": {amount}}}'.encode(),
            key=order_id,
            transaction=conn,
        )
        if amount <= 0:
            # Raising inside the block rolls back the order AND the message.
            raise OrderRejected(f"order {order_id}: amount must be positive")
    # NOTE: a transactional send returns STORED as soon as the row is written; it is
    # only durable (and published) because the transaction above committed.
    return receipt


def main(url: str = DEFAULT_URL, conninfo: str | None = None) -> int:
    conninfo = conninfo or os.environ.get("DATABASE_URL", DEFAULT_CONNINFO)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS example_orders (id text PRIMARY KEY, amount int)")

        # One outbox table per application; the producer forwards its rows to `url`.
        outbox = PostgresOutbox(conninfo, table="example_outbox", target=url)
        with msgsafe.Producer(url, outbox=outbox) as producer:  # closes the store too
            good, bad = f"o-{uuid.uuid4().hex[:8]}", f"o-{uuid.uuid4().hex[:8]}"

            committed = place_order(producer, conn, good, 42)
            print(f"committed {good}: receipt {committed.status.name} {committed.message_id}")
            try:
                place_order(producer, conn, bad, 0)
            except OrderRejected as exc:
                print(f"rolled back {bad}: {exc}")

            left = producer.drain(timeout=30)
            print(f"pending after drain: {left}")

        saved = {row[0] for row in conn.execute("SELECT id FROM example_orders")}
        print(f"orders saved: {good in saved} (committed) · {bad in saved} (rolled back)")

    if url.startswith("memory://"):
        published = MemoryBroker.named(url.removeprefix("memory://")).messages("order-placed")
        bodies = [m.body.decode() for m in published]
        print(f"published for the committed order: {sum(good in b for b in bodies)}")
        print(f"published for the rolled-back order: {sum(bad in b for b in bodies)}")
        if sum(good in b for b in bodies) != 1 or any(bad in b for b in bodies):
            return 1
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URL))

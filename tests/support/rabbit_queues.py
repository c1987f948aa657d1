"""Declaring the quorum queues tests publish to (through pika: RabbitMQ 3.10's AMQP 1.0
plugin cannot declare queues, and a test should not depend on msgsafe to make its own
destination)."""

from __future__ import annotations

import pika


def declare_quorum(url: str, name: str) -> str:
    """Declare the durable quorum queue ``name`` through the AMQP 0-9-1 ``url``; return
    ``name``."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()
    return name

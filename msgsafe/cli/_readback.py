"""Where the CLI's checking consumers (verify, demo) start reading their own run.

A loss checker must never miss a record of its run: on Kafka its new group starts
every partition at offset 0 (see :mod:`msgsafe.adapters.kafka.positions` for why not
``auto.offset.reset``) and skips other runs' records by their headers. Queues and
AMQP 1.0 addresses need nothing: a consumer reads what the queue holds.
"""

from __future__ import annotations

from msgsafe.adapters import adapter_module
from msgsafe.endpoints import parse_url, traits

__all__ = ["start_at_beginning"]


def start_at_beginning(url: str, destination: str, group: str) -> None:
    """Make the new consumer group ``group`` read ``destination`` from its beginning.

    Raises :class:`~msgsafe.errors.ConnectError` when the broker could not be asked.
    """
    parsed = parse_url(url)
    if traits(parsed.protocol).log:
        adapter_module(parsed.protocol).start_group_at_beginning(parsed, destination, group)

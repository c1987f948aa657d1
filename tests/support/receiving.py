"""Receiving a known number of messages in a test: all of them, then nothing more."""

from __future__ import annotations

from msgsafe import Consumer, Delivery
from tests.support.waiting import wait_until


def receive_exactly(
    consumer: Consumer, count: int, what: str, *, within: float = 30.0
) -> list[Delivery]:
    """The ``count`` deliveries ``consumer`` receives within ``within`` seconds (failing
    the test naming ``what`` when fewer come), after which a poll finds nothing more.
    They are returned unsettled."""
    got: list[Delivery] = []
    wait_until(
        lambda: got.extend(consumer.poll(0.5, max_messages=100)) or len(got) >= count,
        within,
        f"{count} {what}",
    )
    assert len(got) == count, f"{len(got)} {what}, not {count}"
    assert consumer.poll(1.0, max_messages=100) == [], f"more {what} than {count}"
    return got

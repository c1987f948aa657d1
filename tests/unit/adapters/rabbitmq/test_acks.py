"""The RabbitMQ receiver's batched acknowledgements: a settled prefix of the channel's
delivery tags goes in one ``basic.ack`` (``multiple``), a tag beyond an unsettled one
alone, and no acknowledgement ever covers a delivery that was not settled. The I/O
thread's part is driven here directly with a channel that records its frames (no
broker: what is checked is which tags each frame covers, which a broker shows only as a
closed channel)."""

from __future__ import annotations

import random
import threading
from collections import deque
from typing import Any

from msgsafe.adapters.rabbitmq.receiver import RabbitReceiver
from msgsafe.message import Outcome


class _Channel:
    is_open = True

    def __init__(self) -> None:
        self.frames: list[tuple[str, int, bool]] = []

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.frames.append(("ack", tag, multiple))

    def basic_nack(self, tag: int, requeue: bool = True) -> None:
        self.frames.append(("nack", tag, False))

    def basic_reject(self, tag: int, requeue: bool = False) -> None:
        self.frames.append(("reject", tag, False))


class _Io:
    """The I/O thread: counts the wake-ups asked for (the test runs their work)."""

    def __init__(self) -> None:
        self.wakes = 0

    def call(self, fn: Any) -> bool:
        self.wakes += 1
        return True


def _receiver(channel: _Channel, tags: int) -> Any:
    """The receiver's I/O-thread state for one channel that delivered tags 1..tags."""
    receiver: Any = RabbitReceiver.__new__(RabbitReceiver)
    receiver._channel = channel
    receiver._generation = 1
    receiver._settles = []
    receiver._settles_lock = threading.Lock()
    receiver._outstanding = deque(range(1, tags + 1))
    receiver._acked_alone = set()
    receiver._io = _Io()
    return receiver


def _covered(frames: list[tuple[str, int, bool]]) -> list[int]:
    """Every tag the frames settled, in the broker's reading (a multiple ack settles
    every tag up to its own that is not settled yet)."""
    done: list[int] = []
    for _kind, tag, multiple in frames:
        if multiple:
            done.extend(t for t in range(1, tag + 1) if t not in done)
        else:
            assert tag not in done, f"tag {tag} settled twice"
            done.append(tag)
    return done


def test_a_settled_prefix_goes_in_one_multiple_ack() -> None:
    channel = _Channel()
    receiver = _receiver(channel, 10)
    for tag in (3, 1, 2, 5):
        receiver._settle(1, tag, Outcome.ACCEPT)
    receiver._settle_io()
    assert channel.frames == [("ack", 3, True), ("ack", 5, False)]
    assert receiver._io.wakes == 1  # one wake-up for the burst
    receiver._settle(1, 4, Outcome.ACCEPT)
    receiver._settle(1, 6, Outcome.REQUEUE)
    receiver._settle_io()
    # 4 ends the prefix (5 was acknowledged alone, 6 given back): one ack of 4 alone.
    assert channel.frames[2:] == [("nack", 6, False), ("ack", 4, True)]


def test_no_acknowledgement_covers_an_unsettled_delivery() -> None:
    rng = random.Random(53)
    for _ in range(50):
        channel = _Channel()
        receiver = _receiver(channel, 200)
        order = list(range(1, 201))
        rng.shuffle(order)
        settled: set[int] = set()
        for start in range(0, 200, 17):
            for tag in order[start : start + 17]:
                outcome = rng.choice([Outcome.ACCEPT] * 8 + [Outcome.REQUEUE, Outcome.REJECT])
                receiver._settle(1, tag, outcome)
                settled.add(tag)
            receiver._settle_io()
            covered = _covered(channel.frames)
            assert set(covered) <= settled
        assert sorted(_covered(channel.frames)) == list(range(1, 201))


def test_settles_of_an_old_channel_are_dropped() -> None:
    channel = _Channel()
    receiver = _receiver(channel, 3)
    receiver._settle(0, 1, Outcome.ACCEPT)  # came on the channel before this one
    receiver._settle_io()
    assert channel.frames == []

"""Dropped wrapper producers wait to be closed on a few threads; a new producer waits
while too many do, as the real client's drop frees one before the next is made."""

from __future__ import annotations

import threading

import pytest

from msgsafe.compat import confluent_kafka as wrapper
from tests.support.waiting import wait_until


def test_a_new_producer_waits_while_too_many_dropped_ones_are_being_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unblock = threading.Event()
    closings: list[int] = []

    def slow_close(producer: object, fast: object, timeout: float) -> None:
        closings.append(1)
        unblock.wait(30)

    monkeypatch.setattr(wrapper, "_close_quietly", slow_close)
    releases = wrapper._Releases(workers=1, grace=0.0, backlog=1)
    assert releases.hand(None, None) and releases.hand(None, None)
    wait_until(lambda: closings, 10, "the first closing began")

    made = threading.Event()

    def make() -> None:
        releases.make_room(30)
        made.set()

    maker = threading.Thread(target=make)
    maker.start()
    # One closing and one queued: above the backlog of 1, so the maker waits for them.
    assert not made.wait(0.5)
    unblock.set()
    wait_until(made.is_set, 10, "the maker went on once the closings ended")
    maker.join(10)
    assert len(closings) == 2


def test_a_release_thread_never_waits_for_itself() -> None:
    releases = wrapper._Releases(workers=1, grace=0.0, backlog=0)
    done = threading.Event()
    releases._closing = 5  # as if five were being closed

    def on_a_release_thread() -> None:
        releases.make_room(30)
        done.set()

    thread = threading.Thread(target=on_a_release_thread, name=wrapper._RELEASE_THREAD)
    thread.start()
    thread.join(10)
    assert done.is_set()

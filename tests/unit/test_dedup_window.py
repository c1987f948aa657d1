"""The dedup window remembers at least its capacity of the latest ids, at most twice
that, the oldest forgotten first; an id seen again is kept as recent."""

from __future__ import annotations

import pytest

from msgsafe.dedup import DedupWindow


def test_the_window_keeps_the_latest_ids_and_drops_the_oldest_generation() -> None:
    window = DedupWindow(capacity=4)
    for n in range(4):
        window.record(f"id-{n}")
    # The newer generation filled up: it became the older one, all still remembered.
    assert all(window.seen(f"id-{n}") for n in range(4))
    for n in range(4, 8):
        window.record(f"id-{n}")
    assert len(window) <= 8
    # At least the last `capacity` ids are remembered; those seen again are kept too.
    assert all(window.seen(f"id-{n}") for n in range(4, 8))
    for n in range(8, 16):
        window.record(f"id-{n}")
    assert not window.seen("id-0") and not window.seen("id-7")
    assert all(window.seen(f"id-{n}") for n in range(12, 16))
    assert not window.seen("never")


def test_an_id_seen_again_stays_in_the_window() -> None:
    window = DedupWindow(capacity=2)
    window.record("kept")
    window.record("x")  # the newer generation is full: "kept" is in the older now
    assert window.seen("kept")  # copied into the newer
    window.record("y")
    window.record("z")  # the older generation ("x") dropped
    assert window.seen("kept")  # recorded before "x", which is gone
    assert not window.seen("x")


def test_the_window_refuses_a_capacity_below_one() -> None:
    with pytest.raises(ValueError):
        DedupWindow(0)

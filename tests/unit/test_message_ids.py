"""Message ids: RFC 9562 UUIDv7 text, unique, monotonic within a thread, fresh after fork."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

import msgsafe
from msgsafe.message import Envelope, new_message_id, new_message_ids
from msgsafe.testing import MemoryBroker


def test_ids_are_uuid7_and_round_trip() -> None:
    before_ms = time.time_ns() // 1_000_000
    ids = [new_message_id() for _ in range(5000)]
    after_ms = time.time_ns() // 1_000_000
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text
        # The counter may run a few ms ahead of the clock, never behind it.
        assert before_ms <= parsed.int >> 80 <= after_ms + len(ids) // 4096 + 1


def test_ids_are_unique_and_monotonic_across_threads() -> None:
    per_thread: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out.extend(new_message_id() for _ in range(20_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [text for out in per_thread for text in out]
    assert len(set(every)) == len(every)
    for out in per_thread:
        assert out == sorted(out)


def test_random_bits_vary() -> None:
    # RFC 9562 §6.2 method 2: each pool of ids draws fresh random bits, and within a
    # pool the low bits count up from a random start.
    tails = {new_message_id()[19:] for _ in range(2000)}
    assert len(tails) == 2000
    assert {tail[0] for tail in tails} <= set("89ab")
    pools = {new_message_ids(3)[0][19:23] for _ in range(400)}
    assert len(pools) > 300  # 14 random bits per pool: few collisions in 400 draws
    assert {pool[0] for pool in pools} == set("89ab")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_repeat_the_parents_ids() -> None:
    new_message_id()  # the parent holds unused random digits now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read)
        os.write(write, "".join(new_message_id()[19:] for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = "".join(new_message_id()[19:] for _ in range(50))
    assert len(child) == len(parent)
    assert child != parent


def test_build_fast_path_matches_the_checked_path() -> None:
    fast = Envelope.build("q", b"x", key="k")
    checked = Envelope.build("q", bytearray(b"x"), key=b"k", headers={})
    assert (fast.destination, fast.body, fast.key, dict(fast.headers)) == (
        checked.destination,
        checked.body,
        checked.key,
        dict(checked.headers),
    )
    with pytest.raises(msgsafe.errors.InvalidMessage):
        Envelope.build("", b"x")
    with pytest.raises(msgsafe.errors.InvalidMessage):
        Envelope.build("q", b"x", key=1)  # type: ignore[arg-type]


def test_receipt_future_cannot_be_cancelled_and_flush_waits_for_it(
    memory_broker: MemoryBroker,
) -> None:
    memory_broker.delay_confirms(0.2)
    with msgsafe.Producer(f"memory://{memory_broker.name}", outbox=False) as producer:
        future = producer.send_async("q", b"x")
        assert future.cancel() is False
        assert producer.flush(5)
        assert future.done()
        assert future.result().status is msgsafe.Status.CONFIRMED


def test_light_future_behaves_as_a_future() -> None:
    import asyncio
    import concurrent.futures

    from msgsafe._futures import LightFuture

    waiting: LightFuture[int] = LightFuture()
    with pytest.raises(concurrent.futures.TimeoutError):
        waiting.result(0.01)
    seen: list[int] = []
    waiting.add_done_callback(lambda f: seen.append(f.result()))
    threading.Timer(0.05, waiting.set_result, args=(7,)).start()
    done, _ = concurrent.futures.wait([waiting], timeout=5)
    assert done == {waiting}
    assert waiting.result(0) == 7 and seen == [7]

    failing: LightFuture[int] = LightFuture()
    threading.Timer(0.05, failing.set_exception, args=(ValueError("x"),)).start()
    assert list(concurrent.futures.as_completed([failing], timeout=5)) == [failing]
    assert isinstance(failing.exception(0), ValueError)

    async def wrapped() -> int:
        later: LightFuture[int] = LightFuture()
        threading.Timer(0.05, later.set_result, args=(3,)).start()
        return await asyncio.wrap_future(later)

    assert asyncio.run(wrapped()) == 3


def test_single_and_bulk_ids_of_a_thread_stay_in_order() -> None:
    # Many interleavings within one millisecond: a single id after a bulk call must not
    # come from the thread's older pool.
    ids: list[str] = []
    for n in range(2000):
        ids.append(new_message_id())
        if n % 3 == 0:
            ids.extend(new_message_ids(1 + n % 5))
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)

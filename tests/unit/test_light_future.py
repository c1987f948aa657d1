"""LightFuture behaves as a stock Future while making its condition and lists lazily."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from concurrent.futures import Future, InvalidStateError

import pytest

from msgsafe._futures import LightFuture
from msgsafe.ports import PublishFuture


def test_a_future_resolved_before_anyone_asks_makes_no_condition_or_lists() -> None:
    future: LightFuture[int] = LightFuture()
    future.set_result(5)
    assert future.done() and future.result() == 5 and future.exception() is None
    # Only the lock and the state: no Condition, no waiter or callback list.
    assert set(vars(future)) == {"_mutex", "_state", "_result"}


def test_an_exception_is_raised_by_result_and_returned_by_exception() -> None:
    future: LightFuture[int] = LightFuture()
    error = ValueError("no")
    future.set_exception(error)
    assert future.exception() is error
    with pytest.raises(ValueError, match="no"):
        future.result()
    assert "raised ValueError" in repr(future)


def test_resolving_twice_is_refused_like_a_stock_future() -> None:
    future: LightFuture[int] = LightFuture()
    future.set_result(1)
    with pytest.raises(InvalidStateError):
        future.set_result(2)
    with pytest.raises(InvalidStateError):
        future.set_exception(ValueError())
    assert future.result() == 1


def _wait_for(future: LightFuture[int], start: threading.Barrier, got: list[int]) -> None:
    start.wait()
    got.append(future.result(timeout=10))


def test_every_thread_blocked_in_result_wakes_when_it_resolves() -> None:
    # Many rounds so a waiter registering at the moment of resolution is exercised: the
    # waiter either sees the result at once or is woken; none times out.
    for _ in range(200):
        future: LightFuture[int] = LightFuture()
        got: list[int] = []
        start = threading.Barrier(5)
        threads = [threading.Thread(target=_wait_for, args=(future, start, got)) for _ in range(4)]
        for t in threads:
            t.start()
        start.wait()
        future.set_result(9)
        for t in threads:
            t.join(10)
        assert got == [9, 9, 9, 9]


def test_result_times_out_while_pending() -> None:
    future: LightFuture[int] = LightFuture()
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0.01)
    with pytest.raises(concurrent.futures.TimeoutError):
        future.exception(timeout=0.01)
    future.set_result(3)
    assert future.result(timeout=0) == 3


def test_a_thread_blocked_in_result_sleeps_on_a_lock_of_its_own() -> None:
    # No Condition is made for it, and its lock leaves the waiter list once it is awake
    # (timed out, or resolved).
    late: LightFuture[int] = LightFuture()
    with pytest.raises(concurrent.futures.TimeoutError):
        late.result(timeout=0.01)
    assert late._made_waiters == []
    future: LightFuture[int] = LightFuture()
    started = threading.Event()

    def resolve_soon() -> None:
        started.wait(10)
        future.set_result(4)

    thread = threading.Thread(target=resolve_soon)
    thread.start()
    started.set()
    assert future.result(timeout=10) == 4
    thread.join(10)
    assert future._made_waiters == [] and "_made_condition" not in vars(future)


def test_a_cancel_wakes_a_thread_blocked_in_result() -> None:
    future: LightFuture[int] = LightFuture()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            future.result(timeout=10)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    while not future._made_waiters:  # the waiter is asleep (or about to be)
        time.sleep(0.001)
    assert future.cancel()
    thread.join(5)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], concurrent.futures.CancelledError)


def test_wait_and_as_completed_see_resolution_from_another_thread() -> None:
    futures: list[LightFuture[int]] = [LightFuture() for _ in range(20)]
    pending_first = futures[10:]
    for n, f in enumerate(futures[:10]):
        f.set_result(n)

    def resolve() -> None:
        for n, f in enumerate(pending_first):
            if n % 2:
                f.set_exception(KeyError(n))
            else:
                f.set_result(n)

    threading.Timer(0.05, resolve).start()
    done, not_done = concurrent.futures.wait(futures, timeout=10)
    assert done == set(futures) and not not_done
    completed = list(concurrent.futures.as_completed(futures, timeout=10))
    assert sorted(map(id, completed)) == sorted(map(id, futures))


def test_callbacks_run_once_in_order_before_or_after_resolution(
    caplog: pytest.LogCaptureFixture,
) -> None:
    future: LightFuture[str] = LightFuture()
    seen: list[str] = []

    def broken(_f: Future[str]) -> None:
        raise RuntimeError("callback failed")

    future.add_done_callback(lambda f: seen.append("first " + f.result()))
    future.add_done_callback(broken)
    future.add_done_callback(lambda f: seen.append("second " + f.result()))
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        future.set_result("x")
    future.add_done_callback(lambda f: seen.append("late " + f.result()))
    assert seen == ["first x", "second x", "late x"]
    assert "callback failed" in caplog.text


def test_a_cancelled_publish_future_refuses_its_outcome_quietly() -> None:
    future = PublishFuture()
    assert future.cancel() and future.cancelled() and future.done()
    future(None)  # the transport's report after the caller gave up: no error
    with pytest.raises(concurrent.futures.CancelledError):
        future.result(timeout=0)
    with pytest.raises(InvalidStateError):
        future.set_result(None)


def _cancel_at(future: PublishFuture, start: threading.Barrier) -> None:
    start.wait()
    future.cancel()


def test_a_cancel_racing_a_resolution_leaves_one_outcome() -> None:
    for _ in range(300):
        future = PublishFuture()
        outcomes: list[bool] = []
        future.add_done_callback(lambda f, seen=outcomes: seen.append(f.cancelled()))
        start = threading.Barrier(2)
        t = threading.Thread(target=_cancel_at, args=(future, start))
        t.start()
        start.wait()
        future(None)
        t.join(10)
        assert outcomes == [future.cancelled()]


def test_the_stock_future_still_has_the_state_light_future_stands_in_for() -> None:
    # LightFuture does not run Future.__init__: it replaces these attributes with lazily
    # made ones. A Python whose Future keeps other state needs LightFuture revisited.
    assert set(vars(Future())) == {
        "_condition",
        "_state",
        "_result",
        "_exception",
        "_waiters",
        "_done_callbacks",
    }

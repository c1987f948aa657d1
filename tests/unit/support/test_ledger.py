"""The shared test helpers every reliability test leans on: the loss ledger counts what
it must (a ledger that under-counted would let every such test pass), waiting fails
with what it waited for, and the command runner keeps what a child said."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from msgsafe.errors import Refused, Rejected
from msgsafe.message import Status, new_receipt
from tests.support.commands import run_python
from tests.support.ledger import Ledger
from tests.support.waiting import wait_until


def test_lost_unknown_and_duplicates_are_counted_per_id() -> None:
    ledger = Ledger(sent={"a", "b", "c"}, receipted={"a", "b"})
    for message_id in ["a", "a", "a", "x"]:
        ledger.add_received(message_id)
    assert ledger.lost == {"b"}
    assert ledger.unknown == {"x"}
    assert ledger.duplicates == 2
    counts = ledger.counts()
    assert (counts["received"], counts["unique"], counts["lost"]) == (4, 2, 1)


def test_track_records_receipts_and_failures_of_futures() -> None:
    ledger = Ledger()
    futures: list[Future[object]] = [Future() for _ in range(4)]
    for message_id, future in zip("abcd", futures, strict=True):
        ledger.track(message_id, future)
    assert ledger.unresolved() == 4
    futures[0].set_result(new_receipt("a", Status.STORED, "q"))
    futures[1].set_result(None)  # a transport's future: the broker confirmed
    futures[2].set_exception(Refused("no"))
    futures[3].set_exception(Rejected("never"))
    assert ledger.receipted == {"a", "b"} and ledger.resolved() == 4
    assert ledger.counts()["stored"] == 1 and ledger.counts()["confirmed"] == 1
    assert ledger.counts()["transient"] == 1 and ledger.failures == {"Refused": 1, "Rejected": 1}
    assert [type(e) for e in ledger.permanent] == [Rejected]
    ledger.add_receipt("c")  # sent again, receipted this time: no longer failed
    assert set(ledger.failed) == {"d"}


def test_order_violations_count_first_arrivals_only() -> None:
    ledger = Ledger(positions={"a": ("k", 0), "b": ("k", 1), "c": ("k", 2), "z": ("j", 0)})
    assert ledger.order_violations(["a", "b", "a", "c", "z"]) == []
    assert ledger.order_violations(["b", "a", "c"]) == ["k 0 after 1"]
    assert ledger.order_violations(["b", "a", "c"], among={"b", "c"}) == []


def test_wait_until_returns_the_time_and_fails_with_what_it_waited_for() -> None:
    calls: list[int] = []
    assert wait_until(lambda: calls.append(1) or len(calls) >= 3, 5, "three calls") >= 0
    with pytest.raises(AssertionError, match=r"not within 0.1 s: never\nstate: x"):
        wait_until(lambda: False, 0.1, "never", diagnose=lambda: "state: x")


def test_run_python_keeps_the_exit_code_and_both_outputs() -> None:
    run = run_python(
        "-c", "import sys; print(sys.stdin.read() + 'out'); sys.exit(3)", label="child", stdin="in-"
    )
    assert (run.code, run.lines()) == (3, ["in-out"])
    assert run.stderr == "" and run.seconds > 0

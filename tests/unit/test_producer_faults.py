"""Under every fault the memory broker injects, each send() ends CONFIRMED or raises a
typed msgsafe error: every id is accounted for, none silently dropped."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from msgsafe import Producer, Status
from msgsafe.errors import (
    ConfirmTimeout,
    ConnectError,
    ConnectionLost,
    MsgsafeError,
    PermanentError,
    Refused,
    Rejected,
    TransientError,
)
from msgsafe.testing import MemoryBroker

FAULTS: dict[str, tuple[Callable[[MemoryBroker], None], type[MsgsafeError]]] = {
    "refuse": (lambda b: b.refuse_writes(), Refused),
    "reject": (lambda b: b.reject_next(1), Rejected),
    "drop_before_confirm": (lambda b: b.drop_before_confirm(1), ConnectionLost),
    "drop_after_confirm": (lambda b: b.drop_after_confirm(1), ConnectionLost),
    "down": (lambda b: b.down(), ConnectError),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_raises_its_typed_error(memory_broker: MemoryBroker, fault: str) -> None:
    inject, expected = FAULTS[fault]
    with Producer(f"memory://{memory_broker.name}", outbox=False) as p:
        inject(memory_broker)
        with pytest.raises(expected) as info:
            p.send("q", b"x", message_id="m-1")
        assert info.value.message_id == "m-1"
        assert info.value.endpoint == f"memory://{memory_broker.name}"


def test_late_confirm_is_a_confirm_timeout_and_a_possible_duplicate(
    memory_broker: MemoryBroker,
) -> None:
    with Producer(f"memory://{memory_broker.name}", outbox=False, confirm_timeout=0.2) as p:
        memory_broker.delay_confirms(5)
        with pytest.raises(ConfirmTimeout) as info:
            p.send("q", b"x")
        assert info.value.maybe_delivered
        assert memory_broker.ids("q") == [info.value.message_id]  # the broker does hold it
        memory_broker.delay_confirms(0.05)
        assert p.send("q", b"y").status is Status.CONFIRMED


def test_random_fault_storm_accounts_for_every_id(memory_broker: MemoryBroker) -> None:
    """1000 sends while faults come and go: each id is CONFIRMED (and then on the broker)
    or got a typed error; errors that say the broker cannot have acted really left
    nothing behind."""
    rng = random.Random(7)
    confirmed: set[str] = set()
    failed_clean: set[str] = set()  # the broker cannot have acted
    failed_maybe: set[str] = set()  # it may have
    permanent: set[str] = set()
    with Producer(f"memory://{memory_broker.name}", outbox=False, confirm_timeout=0.05) as p:
        for i in range(1000):
            roll = rng.random()
            if roll < 0.05:
                memory_broker.refuse_writes()
            elif roll < 0.10:
                memory_broker.accept_writes()
            elif roll < 0.13:
                memory_broker.down()
            elif roll < 0.18:
                memory_broker.up()
            elif roll < 0.21:
                memory_broker.drop_before_confirm()
            elif roll < 0.24:
                memory_broker.drop_after_confirm()
            elif roll < 0.26:
                memory_broker.reject_next()
            elif roll < 0.27:
                memory_broker.delay_confirms(0.2)
            elif roll < 0.30:
                memory_broker.delay_confirms(0)
            mid = f"m-{i}"
            try:
                receipt = p.send("q", b"x", message_id=mid)
            except TransientError as exc:
                assert exc.message_id == mid
                (failed_maybe if exc.maybe_delivered else failed_clean).add(mid)
            except PermanentError as exc:
                assert exc.message_id == mid
                permanent.add(mid)
            else:
                assert receipt.status is Status.CONFIRMED
                confirmed.add(mid)
    on_broker = set(memory_broker.ids("q"))
    total = len(confirmed) + len(failed_clean) + len(failed_maybe) + len(permanent)
    print(
        f"confirmed={len(confirmed)} transient={len(failed_clean)} "
        f"maybe_delivered={len(failed_maybe)} permanent={len(permanent)}"
    )
    assert total == 1000
    assert confirmed <= on_broker, "a confirmed message is missing from the broker"
    assert not (failed_clean & on_broker), "an error claimed nothing was stored, but it was"
    assert not (permanent & on_broker)
    assert on_broker <= confirmed | failed_maybe
    assert min(len(confirmed), len(failed_clean), len(failed_maybe), len(permanent)) > 0

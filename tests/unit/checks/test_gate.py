"""The producer's destination checks on the memory broker (whose guarantee a test sets):
below ``require=`` nothing is sent, the caller owns the message; what is stored while the
broker could not be asked is checked before it is forwarded; the answer is on every
receipt; a durable-only destination warns once."""

from __future__ import annotations

import asyncio
import logging
import pickle
from pathlib import Path

import pytest

from msgsafe import AsyncProducer, Guarantee, Producer, Status
from msgsafe.checks import DestinationReport
from msgsafe.checks.gate import DestinationGate
from msgsafe.errors import ConfigurationError, ConnectError, UnsafeDestination
from msgsafe.testing import MemoryBroker
from tests.support.waiting import wait_until


def test_a_destination_below_require_is_refused_and_nothing_is_sent(
    memory_broker: MemoryBroker,
) -> None:
    memory_broker.set_guarantee("q", Guarantee.NONE)
    with Producer(f"memory://{memory_broker.name}", outbox=False) as producer:
        with pytest.raises(UnsafeDestination) as caught:
            producer.send("q", b"x", message_id="m-1")
        with pytest.raises(UnsafeDestination):
            producer.send_batch("q", [b"a", b"b"])
        with pytest.raises(UnsafeDestination):
            producer.send_async("q", b"x")
    error = caught.value
    assert (error.message_id, error.destination, error.guarantee, error.required) == (
        "m-1",
        "q",
        "none",
        "durable",
    )
    assert error.fix and "set_guarantee" in error.fix
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.destination, copy.guarantee, copy.required, copy.fix) == (
        "q",
        "none",
        "durable",
        error.fix,
    )
    assert memory_broker.publish_attempts == 0 and memory_broker.count("q") == 0


@pytest.mark.parametrize(
    ("require", "guarantee", "allowed"),
    [
        ("any", Guarantee.NONE, True),
        ("durable", Guarantee.NONE, False),
        ("durable", Guarantee.UNKNOWN, True),
        ("durable", Guarantee.DURABLE, True),
        ("replicated", Guarantee.UNKNOWN, False),
        ("replicated", Guarantee.DURABLE, False),
        ("replicated", Guarantee.REPLICATED, True),
    ],
)
def test_require_levels(
    memory_broker: MemoryBroker, require: str, guarantee: Guarantee, allowed: bool
) -> None:
    memory_broker.set_guarantee("q", guarantee)
    with Producer(f"memory://{memory_broker.name}", outbox=False, require=require) as producer:
        if allowed:
            receipt = producer.send("q", b"x")
            assert (receipt.status, receipt.guarantee) == (Status.CONFIRMED, guarantee)
            assert producer.send_batch("q", [b"a"]).guarantee is guarantee
        else:
            with pytest.raises(UnsafeDestination):
                producer.send("q", b"x")
            assert memory_broker.count("q") == 0


def test_a_bad_require_is_a_configuration_error(memory_broker: MemoryBroker) -> None:
    with pytest.raises(ConfigurationError, match="require"):
        Producer(f"memory://{memory_broker.name}", outbox=False, require="safe")
    with pytest.raises(ConfigurationError, match="check_every"):
        Producer(f"memory://{memory_broker.name}", outbox=False, check_every=0)


def test_below_replicated_warns_once_per_destination(
    memory_broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    memory_broker.set_guarantee("q", Guarantee.DURABLE)
    caplog.set_level(logging.WARNING, logger="msgsafe.checks")
    with Producer(f"memory://{memory_broker.name}", outbox=False) as producer:
        for _ in range(50):
            producer.send("q", b"x")
        producer.send("other", b"x")
    warnings = [r for r in caplog.records if r.name == "msgsafe.checks"]
    assert len(warnings) == 1 and "q" in warnings[0].getMessage()


def test_the_check_runs_once_per_destination_not_per_message(memory_broker: MemoryBroker) -> None:
    calls: list[str] = []

    def inspect(destination: str) -> DestinationReport:
        calls.append(destination)
        return DestinationReport(destination, Guarantee.REPLICATED)

    gate = DestinationGate(inspect)
    for _ in range(100):
        gate.admit("a")
        gate.admit("b")
    assert calls == ["a", "b"]


def test_a_refresh_sees_a_destination_that_became_unsafe(memory_broker: MemoryBroker) -> None:
    with Producer(f"memory://{memory_broker.name}", outbox=False, check_every=0.2) as producer:
        assert producer.send("q", b"x").guarantee is Guarantee.REPLICATED
        memory_broker.set_guarantee("q", Guarantee.NONE)

        def refused() -> bool:
            try:
                producer.send("q", b"x")
            except UnsafeDestination:
                return True
            return False

        wait_until(refused, 10.0, "the refreshed check refuses the destination")


def test_an_unreachable_broker_without_outbox_raises_connect_error(
    memory_broker: MemoryBroker,
) -> None:
    memory_broker.down()
    with (
        Producer(f"memory://{memory_broker.name}", outbox=False) as producer,
        pytest.raises(ConnectError) as caught,
    ):
        producer.send("q", b"x", message_id="m-2")
    assert caught.value.message_id == "m-2"


def test_stored_unchecked_then_forwarded_once_checked(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    memory_broker.down()
    with Producer(f"memory://{memory_broker.name}", outbox=tmp_path / "o.db") as producer:
        receipts = [producer.send("q", b"x") for _ in range(5)]
        assert {(r.status, r.guarantee) for r in receipts} == {(Status.STORED, Guarantee.UNKNOWN)}
        memory_broker.up()
        assert producer.drain(10.0) == 0
    assert sorted(memory_broker.ids("q")) == sorted(r.message_id for r in receipts)


def test_stored_messages_for_an_unsafe_destination_are_quarantined_not_sent(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    memory_broker.down()
    with Producer(f"memory://{memory_broker.name}", outbox=tmp_path / "o.db") as producer:
        stored = [producer.send("q", b"x", key="k").message_id for _ in range(5)]
        fine = producer.send("ok", b"y").message_id
        memory_broker.set_guarantee("q", Guarantee.NONE)
        memory_broker.up()
        wait_until(lambda: producer.drain(1.0) == 0, 10.0, "the outbox drains or quarantines")
        outbox = producer.outbox
        assert outbox is not None
        assert outbox.stats().quarantined == len(stored)
    assert memory_broker.count("q") == 0
    assert memory_broker.ids("ok") == [fine]


def test_async_producer_checks_off_the_loop(memory_broker: MemoryBroker) -> None:
    memory_broker.set_guarantee("q", Guarantee.NONE)

    async def main() -> None:
        async with AsyncProducer(f"memory://{memory_broker.name}", outbox=False) as producer:
            with pytest.raises(UnsafeDestination):
                await producer.send("q", b"x")
            receipt = await producer.send("fine", b"x")
            assert receipt.guarantee is Guarantee.REPLICATED

    asyncio.run(main())
    assert memory_broker.count("q") == 0


def test_a_failover_checks_every_destination_again_in_the_background() -> None:
    calls: list[str] = []

    def inspect(destination: str) -> DestinationReport:
        calls.append(destination)
        return DestinationReport(destination, Guarantee.REPLICATED)

    gate = DestinationGate(inspect)
    gate.admit("a")
    gate.failover("h1:5672", "h2:5672", "connection lost")
    assert gate.admit("a") is Guarantee.REPLICATED  # the last answer serves meanwhile
    wait_until(lambda: calls == ["a", "a"], 5.0, "the check after the fail-over")
    wait_until(lambda: gate.admitted["a"] > 0.0, 5.0, "the refreshed answer")


def test_a_broker_reachable_again_ends_the_remembered_failure() -> None:
    """A check that could not reach the broker is remembered for a while (sends go to the
    outbox without asking again); a broker reachable again ends that at once."""
    calls: list[str] = []
    down = True

    def inspect(destination: str) -> DestinationReport:
        calls.append(destination)
        if down:
            raise ConnectError("connection refused")
        return DestinationReport(destination, Guarantee.REPLICATED)

    gate = DestinationGate(inspect)
    for _ in range(2):
        with pytest.raises(ConnectError):
            gate.admit("a")
    assert calls == ["a"]  # the second send did not ask again
    down = False
    gate.reachable("kafka://h1:9092")
    assert gate.admit("a") is Guarantee.REPLICATED
    assert calls == ["a", "a"]


def test_a_fresh_admit_checks_again_at_once() -> None:
    """The outbox's probe (paced by its own backoff) checks whenever it probes; a send
    within the second after a failed check is refused without asking."""
    calls: list[str] = []

    def inspect(destination: str) -> DestinationReport:
        calls.append(destination)
        raise ConnectError("connection refused")

    gate = DestinationGate(inspect)
    for fresh in (False, False, True, True):
        with pytest.raises(ConnectError):
            gate.admit("a", fresh=fresh)
    assert calls == ["a", "a", "a"]


def test_a_fresh_check_under_way_holds_up_no_send_the_last_failure_answers() -> None:
    """The outbox's probe checks while the broker is down; the sends meanwhile are
    answered by the last failure at once, not after that check."""
    import threading

    entered = threading.Event()
    release = threading.Event()
    calls: list[str] = []

    def inspect(destination: str) -> DestinationReport:
        calls.append(destination)
        if len(calls) > 1:  # the probe's check: under way until released
            entered.set()
            release.wait(30)
        raise ConnectError("connection refused")

    gate = DestinationGate(inspect)
    with pytest.raises(ConnectError):
        gate.admit("a")

    def probe() -> None:
        with pytest.raises(ConnectError):
            gate.admit("a", fresh=True)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        assert entered.wait(10), "the probe's check did not start"
        answered: list[BaseException] = []

        def send() -> None:
            try:
                gate.admit("a")
            except ConnectError as exc:
                answered.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        sender.join(10)
        assert not sender.is_alive(), "a send waited for the probe's check"
        assert len(answered) == 1
    finally:
        release.set()
        prober.join(10)
    assert calls == ["a", "a"]

"""The fast path's state machine (msgsafe.fastpath): fast while the broker answers,
resting after a failure, fast again only after a safe confirm with nothing stored; and
the one place where what it could not deliver goes to the outbox."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from msgsafe.errors import OutboxError, UnsafeDestination
from msgsafe.fastpath import FastPath, store_refused
from msgsafe.message import Envelope
from msgsafe.outbox.sqlite import SqliteOutbox


class Safe:
    """The safe path as the fast path sees it: a check per destination, a backlog."""

    def __init__(self) -> None:
        self.backlog = 0
        self.checked: list[str] = []
        self.pending_asked = 0

    def guarantee(self, destination: str) -> str:
        self.checked.append(destination)
        if destination == "refused":
            raise UnsafeDestination("below require")
        return f"guarantee of {destination}"

    def pending(self) -> int:
        self.pending_asked += 1
        return self.backlog


def test_a_failure_makes_it_rest_and_a_refusal_does_not() -> None:
    path = FastPath(Safe())
    assert not path.resting
    path.refused()
    assert not path.resting
    path.failed()
    assert path.resting


def test_it_opens_again_only_after_a_safe_confirm_with_an_empty_backlog() -> None:
    safe = Safe()
    path = FastPath(safe, resting=True)
    safe.backlog = 3
    path.confirmed_safe()
    assert path.resting  # something is stored that a fast send could overtake
    safe.backlog = 0
    path.confirmed_safe()
    assert not path.resting


def test_an_open_path_does_not_ask_for_the_backlog() -> None:
    safe = Safe()
    path = FastPath(safe)
    for _ in range(3):
        path.confirmed_safe()
    assert safe.pending_asked == 0 and not path.resting


def test_the_check_is_asked_once_and_a_refusal_is_not_remembered() -> None:
    safe = Safe()
    path = FastPath(safe)
    assert path.guarantee("q") == path.guarantee("q") == "guarantee of q"
    for _ in range(2):
        with pytest.raises(UnsafeDestination):
            path.guarantee("refused")
    assert safe.checked == ["q", "refused", "refused"]


def test_fast_confirms_are_counted() -> None:
    path = FastPath(Safe())
    for _ in range(5):
        path.confirmed()
    assert path.accepted == 5


def test_refused_messages_are_stored_in_send_order(tmp_path: Path) -> None:
    store = SqliteOutbox(tmp_path / "outbox.db")
    try:
        sent = [Envelope.build("t", f"m{i}".encode(), key=b"k") for i in range(5)]
        assert store_refused(store, sent) is None
        rows = store.claim(limit=10, lease_s=30.0)
        assert [row.message_id for row in rows] == [e.message_id for e in sent]
    finally:
        store.close()


def test_without_an_outbox_or_with_a_failing_one_each_message_gets_the_error() -> None:
    sent = [Envelope.build("t", b"x")]
    assert isinstance(store_refused(None, sent), OutboxError)

    class Broken:
        def put(self, envelopes: Sequence[Envelope]) -> None:
            raise OSError("disk full")

    error = store_refused(Broken(), sent)  # type: ignore[arg-type]
    assert isinstance(error, OutboxError) and "disk full" in str(error)


# --- a model: nothing lost, nothing reordered per key, whatever the broker does ----------


@dataclass
class Model:
    """A broker that is up or down, the safe path's outbox in front of it (a send of any
    key queues behind what the outbox holds, as the producer's per-key order does for
    its key), and a publisher that tries the fast path first."""

    path_type: type[FastPath] = FastPath
    up: bool = True
    delivered: list[tuple[int, int]] = field(default_factory=list)
    outbox: deque[tuple[int, int]] = field(default_factory=deque)
    fast: int = 0

    def __post_init__(self) -> None:
        self.path = self.path_type(self)  # type: ignore[arg-type]

    # the safe path (SafePath)
    def guarantee(self, destination: str) -> str:
        return "g"

    def pending(self) -> int:
        return len(self.outbox)

    def safe_send(self, message: tuple[int, int]) -> bool:
        if self.up and not any(stored[0] == message[0] for stored in self.outbox):
            self.delivered.append(message)
            return True
        self.outbox.append(message)
        return False

    def drain(self, up_to: int) -> None:
        while self.up and self.outbox and up_to:
            self.delivered.append(self.outbox.popleft())
            up_to -= 1

    # the wrapper's publish
    def publish(self, message: tuple[int, int]) -> None:
        if not self.path.resting:
            if self.up:
                self.delivered.append(message)
                self.path.confirmed()
                self.fast += 1
                return
            self.path.failed()
        if self.safe_send(message):
            self.path.confirmed_safe()


def _run(model: Model, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    sent: list[tuple[int, int]] = []
    counts = [0] * 4
    for _ in range(2000):
        roll = rng.random()
        if roll < 0.02:
            model.up = not model.up
        elif roll < 0.1:
            model.drain(rng.randint(1, 5))
        else:
            key = rng.randrange(4)
            counts[key] += 1
            message = (key, counts[key])
            sent.append(message)
            model.publish(message)
    model.up = True
    model.drain(len(model.outbox))
    return sent


@pytest.mark.parametrize("seed", range(20))
def test_no_message_is_lost_or_reordered_per_key_across_transitions(seed: int) -> None:
    model = Model()
    sent = _run(model, seed)
    assert sorted(model.delivered) == sorted(sent)  # every id, once
    for key in range(4):
        assert [n for k, n in model.delivered if k == key] == [n for k, n in sent if k == key]
    assert model.fast > 0  # the fast path was used, and opened again after outages


class Hasty(FastPath):
    """Opens again on any safe confirm, the backlog not asked."""

    __slots__ = ()

    def confirmed_safe(self) -> None:
        self.resting = False


def test_the_model_sees_a_path_that_opens_with_a_backlog() -> None:
    reordered = 0
    for seed in range(20):
        model = Model(path_type=Hasty)
        sent = _run(model, seed)
        for key in range(4):
            got = [n for k, n in model.delivered if k == key]
            reordered += got != [n for k, n in sent if k == key]
    assert reordered


def test_a_path_that_holds_messages_switches_before_it_rests() -> None:
    """switch() leaves the fast path once (sends park while switching); switched() ends
    the switch with the path resting; reopen() opens it only then."""
    path = FastPath(Safe())
    assert path.switch()
    assert path.resting and path.switching
    assert not path.switch()  # a second failure joins the switch under way
    assert not path.reopen()  # nothing reopens a path still emptying its messages
    path.confirmed_safe()
    assert path.resting
    path.switched()
    assert path.resting and not path.switching
    assert path.reopen()
    assert not path.resting


def test_a_hold_keeps_it_resting_and_shut_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("msgsafe.fastpath.time.monotonic", lambda: now[0])
    path = FastPath(Safe(), resting=True)
    path.hold(2.0)
    path.hold(1.0)  # a shorter hold does not shorten the longer one
    now[0] = 101.5
    assert not path.may_reopen(now[0]) and not path.reopen()
    path.confirmed_safe()
    assert path.resting
    now[0] = 102.5
    assert path.reopen()
    path.shut()
    now[0] = 1e9
    assert path.resting and not path.reopen()
    path.confirmed_safe()
    assert path.resting

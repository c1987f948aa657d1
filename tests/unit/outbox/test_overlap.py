"""Overlapping rounds: the claim that follows a key past the caller's rows in flight, and
the forwarder's rule that a key released in a round stops in the round behind it."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from itertools import pairwise

from msgsafe.errors import OutboxError, Refused
from msgsafe.message import Batch, Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox
from msgsafe.ports import BatchReport, TransportCapabilities
from tests.support.clock import Clock


def keyed(n: int, keys: int) -> list[Envelope]:
    return [Envelope.build("q", b"m%d" % i, key=f"k{i % keys}") for i in range(n)]


def ids_of(envelopes: Sequence[Envelope], key: bytes | None = None) -> list[str]:
    return [e.message_id for e in envelopes if key is None or e.key == key]


def test_a_claim_follows_a_key_only_past_every_held_row_of_it(store: SqliteOutbox) -> None:
    sent = keyed(40, keys=2)
    store.put(sent)
    k0, k1 = ids_of(sent, b"k0"), ids_of(sent, b"k1")
    first = store.claim(limit=10, lease_s=30)
    assert ids_of(first) == ids_of(sent[:10])
    # Not followed: a held key gives nothing (the prefix rule).
    assert store.claim(limit=10, lease_s=30) == []
    # Followed with every held row of the key: its next rows, in order; k1 stays.
    second = store.claim_rows(limit=4, lease_s=30, follow={b"k0": 5})
    assert ids_of(second) == k0[5:9]
    # A count that is not every held row of the key (another holder): not followed.
    assert list(store.claim_rows(limit=4, lease_s=30, follow={b"k0": 5, b"k1": 4})) == []
    # k0[2:5] released while k0[5:9] is held: a gap before held rows; following k0
    # past it would send k0[9] before the released k0[2]. k1 is followed.
    store.release([(i, "failed") for i in k0[2:5]], retry_at=0.0)
    assert ids_of(store.claim_rows(limit=4, lease_s=30, follow={b"k0": 6, b"k1": 5})) == k1[5:9]


def test_a_gap_before_held_rows_stops_the_key(store: SqliteOutbox) -> None:
    sent = keyed(20, keys=1)
    store.put(sent)
    k0 = ids_of(sent)
    store.claim(limit=5, lease_s=30)
    store.claim_rows(limit=5, lease_s=30, follow={b"k0": 5})  # k0[5:10] in flight too
    store.release([(i, "failed") for i in k0[2:5]], retry_at=0.0)
    # Seven rows held (k0[0:2] and k0[5:10]) and the caller names all seven: the count
    # matches, but k0[2:5] wait unheld before k0[5:10]; nothing of k0 may go out.
    assert list(store.claim_rows(limit=5, lease_s=30, follow={b"k0": 7})) == []


class OrderedTransport:
    """A transport that keeps order across rounds (``ordered_rounds``) and answers at
    once: message ``fail`` is refused on its first attempt, everything else confirmed.
    ``log`` is every publish with its outcome, in publish order."""

    capabilities = TransportCapabilities(ordered_rounds=True)

    def __init__(self, fail: str) -> None:
        self.fail = fail
        self.log: list[tuple[Envelope, bool]] = []

    @property
    def target(self) -> str:
        return "ordered://"

    def publish(self, envelope: Envelope) -> Future[None]:
        future: Future[None] = Future()
        refused = envelope.message_id == self.fail
        self.fail = "" if refused else self.fail
        self.log.append((envelope, not refused))
        if refused:
            future.set_exception(Refused("partition leader moved"))
        else:
            future.set_result(None)
        return future

    def close(self, timeout: float | None = None) -> None:
        pass


def test_a_round_claimed_behind_a_failure_is_not_published(
    store: SqliteOutbox, clock: Clock
) -> None:
    """Round 2 is claimed before round 1 is settled. Round 1 fails k0's 3rd message
    (and leaves its later messages unsent): k0's and k1's messages in round 2 must not
    reach the broker before the messages of round 1 that are re-sent (what a Kafka
    leader SIGSTOPped showed while round 2 was published behind round 1's failure). A
    consumer keeps the first copy of each id, so the order that counts is that of first
    arrivals; and a message may only be removed once every earlier message of its key
    was confirmed before it was sent."""
    sent = keyed(80, keys=2)
    store.put(sent)
    k0 = ids_of(sent, b"k0")
    transport = OrderedTransport(fail=k0[2])
    fwd = Forwarder(store, transport, batch=20, clock=clock, rng=lambda: 0.0)
    fwd._limit = 20  # rounds of 20 from the start: round 2 follows both keys
    removed: list[str] = []
    real_delivered = store.delivered

    def delivered(message_ids: list[str]) -> None:
        removed.extend(message_ids)
        real_delivered(message_ids)

    store.delivered = delivered  # type: ignore[method-assign]
    for _ in range(200):
        if fwd.step() == 0 and store.pending() == 0:
            break
        clock.now += fwd.next_attempt_in() + 0.001
    assert store.pending() == 0
    assert set(removed) == {e.message_id for e in sent}  # lost: 0
    # Every removed message's last publish came after a confirmed publish of every
    # earlier message of its key.
    for key in (b"k0", b"k1"):
        order = ids_of(sent, key)
        confirmed_at: dict[str, int] = {}
        last_sent: dict[str, int] = {}
        for position, (env, ok) in enumerate(transport.log):
            if env.key != key:
                continue
            last_sent[env.message_id] = position
            if ok:
                confirmed_at.setdefault(env.message_id, position)
        for before, after in pairwise(order):
            assert confirmed_at[before] < last_sent[after], (key, before, after)
            # First arrivals in key order.
            assert confirmed_at[before] < confirmed_at[after], (key, before, after)
    # The case under test happened: round 2 (k0[10:20], k1[10:20]) was claimed while
    # round 1 was in flight, and released with round 1's 16 (k0[2], 5th of its round,
    # refused, the 15 behind it not attempted).
    assert fwd.stats().retried == 16 + 20


def test_without_overlap_the_store_is_settled_after_each_step(
    store: SqliteOutbox, clock: Clock
) -> None:
    """A transport that does not keep order across rounds: every step settles its own
    round (the prefix rule alone)."""
    store.put(keyed(30, keys=3))
    transport = OrderedTransport(fail="")
    transport.capabilities = TransportCapabilities(ordered_rounds=False)
    fwd = Forwarder(store, transport, batch=10, clock=clock)
    fwd._limit = 10
    assert fwd.step() == 10
    assert store.pending() == 20


def test_an_overlapping_forwarder_settles_its_round_in_flight_on_the_next_step(
    store: SqliteOutbox, clock: Clock
) -> None:
    store.put(keyed(30, keys=3))
    transport = OrderedTransport(fail="")
    fwd = Forwarder(store, transport, batch=10, clock=clock)
    fwd._limit = 10
    assert fwd.step() == 10
    assert store.pending() == 30  # in flight, not settled yet
    assert fwd.stats().delivered == 0
    assert fwd.step() == 10
    # The first settled once the second was claimed; its removal commits while the
    # second is published, and is waited for before the next claim.
    assert fwd.stats().delivered == 10
    assert fwd.step() == 10
    assert store.pending() in (10, 20)
    while fwd.step():
        pass
    assert store.pending() == 0
    assert fwd.stats().delivered == 30


def test_a_removal_that_fails_behind_the_next_round_is_retried_before_the_next_claim(
    store: SqliteOutbox, clock: Clock
) -> None:
    """With overlapping rounds a settled round's removal commits on its own thread while
    the next round is published. When it fails (a full disk), its rows stay leased (not
    sent again), the error is reported, and the removal is retried before the next
    claim: every message is published once and the store ends empty."""
    sent = keyed(30, keys=3)
    store.put(sent)
    transport = OrderedTransport(fail="")
    fwd = Forwarder(store, transport, batch=10, clock=clock)
    fwd._limit = 10
    real_delivered = store.delivered
    failures = [OutboxError("disk full")]
    attempts: list[list[str]] = []

    def delivered(message_ids: list[str]) -> None:
        attempts.append(list(message_ids))
        if failures:
            raise failures.pop()
        real_delivered(message_ids)

    store.delivered = delivered  # type: ignore[method-assign]
    assert fwd.step() == 10  # round 1 in flight
    assert fwd.step() == 10  # round 1 settled, its removal fails while round 2 goes out
    assert fwd.step() == 10  # the failure is seen before this claim, and retried
    assert fwd.last_error is not None and "disk full" in fwd.last_error
    assert attempts[0] == attempts[1] == ids_of(sent[:10])
    while fwd.step():
        pass
    assert store.pending() == 0
    assert [env.message_id for env, _ in transport.log] == ids_of(sent)  # each once, in order


class ConfirmingBatchTransport(OrderedTransport):
    """The batch seam, confirming at once; a tombstone comes through ``publish``."""

    capabilities = TransportCapabilities(batch=True, ordered_rounds=True)

    def __init__(self) -> None:
        super().__init__(fail="")
        self.batches: list[Batch] = []

    def publish_batch(self, batch: Batch, report: BatchReport) -> None:
        self.batches.append(batch)
        self.log.extend((batch.envelope(i), True) for i in range(len(batch)))
        report.confirmed(len(batch))


def test_claimed_rows_go_out_as_they_were_put(store: SqliteOutbox, clock: Clock) -> None:
    """The forwarder reads claimed rows as columns: headers, tombstones, destinations
    and keys must still reach the transport exactly as put, in order."""
    sent = [
        Envelope.build("q", b"a", key="k"),
        Envelope.build("q", b"b", key="k"),
        Envelope.build("q", b"c", key="k", headers={"h": "1"}),
        Envelope.build("q", None, key="k", headers={"h": "1"}),
        Envelope.build("q", None, key="k"),
        Envelope.build("r", b"d"),
        Envelope.build("q", b"e", key="j", headers={"h": "2"}),
        Envelope.build("q", b"f", key="k"),
    ]
    store.put(sent)
    transport = ConfirmingBatchTransport()
    fwd = Forwarder(store, transport, clock=clock)
    while fwd.step():
        pass
    assert store.pending() == 0

    def fields(env: Envelope) -> tuple[object, ...]:
        headers = dict(env.headers)
        return (env.message_id, env.destination, env.key, env.body, headers, env.tombstone)

    assert [fields(env) for env, _ in transport.log] == [fields(env) for env in sent]
    assert len(transport.batches) >= 3  # the runs really went through the batch seam

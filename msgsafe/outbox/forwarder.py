"""The forwarder: a component that wraps a store and a transport and delivers what the
store holds, in key order, without hammering a broker that refuses.

One round (:meth:`Forwarder.step`) claims a batch, publishes it and settles every row:

- confirmed -> ``delivered``;
- :class:`~msgsafe.errors.TransientError` -> released, and the forwarder backs off with
  a jittered, capped wait (:class:`~msgsafe.retry.RetryPolicy`): while the broker refuses
  it sends one probe message per backoff period, and returns to full batches as soon as
  a probe is confirmed;
- :class:`~msgsafe.errors.PermanentError` -> quarantined with the error text, except the
  errors about the connection rather than the message (a refused login, a certificate
  that fails verification, a port of another protocol): those keep every message
  waiting, are logged once as an ERROR, and back off like a refusal until the
  configuration is fixed.

What is the message's own fault and what is not decides between the two. A name its
protocol cannot carry (:class:`~msgsafe.errors.InvalidDestination`: a queue name over
255 bytes, say, stored by a version that did not check names before storing) is the
message's: no fix of the configuration sends it, so it is quarantined with the reason
(it is a :class:`~msgsafe.errors.ConfigurationError` too, for receivers; the permanent
class decides). Any other :class:`~msgsafe.errors.ConfigurationError` met while
forwarding (settings a renewed client refuses, a check that cannot run) is about the
configuration, shared by every message: they all keep waiting, with one ERROR, like a
refused login. The ``admit`` hook (see :class:`Forwarder`) is where a caller checks
names before publishing, so that a stored name is judged by the protocol's rules even
where the transport would not refuse it itself.

Order, pipelined: every message of a claimed batch is published at once, in claim
order, so many messages of one key are in flight together on the transport's ordered
channel, partition or link (a transport keeps the order of what it is handed and fails
what is queued behind a failure). The answers are settled in claim order: a key stops at
its first failure (transient, or no answer before the lease deadline), and that message
and every later one of its key are released, to be re-sent from there even if the broker
confirmed some of them (a duplicate of a known id, never a message overtaking its
predecessor). A permanent error quarantines the message and its key goes on. Other keys
are not held back by a failing one: what they had confirmed is delivered. A transport
that fails a publish at once (the broker refuses) stops the round: nothing more is
published, the rest is released. Memory is bounded by ``batch`` messages and, after
the first round, by ``batch_bytes`` of them (the next claim's size follows the last
round's mean message size): rows stream from the store a batch at a time however large
the backlog. A round grows (doubling from 500) up to ``batch`` while it is answered
within a quarter of the lease, and halves when it is not. Rounds are large by default
because each ends with a wait for its last answer (Kafka's linger and ``acks=all`` round
trip): 500 a round drained 13k msg/s on Kafka where 10,000 a round drained 76k. Once
a round is published nothing more joins it, so on a transport that batches by waiting
(it declares ``hurry``: Kafka's ``linger.ms``) the forwarder hurries the round's tail
out rather than wait out the linger once a round.

Overlapping rounds: on a transport that keeps the order of what it is handed across
rounds (it declares ``ordered_rounds``: Kafka, one partition per key, idempotent
producer; RabbitMQ, one channel; AMQP 1.0, one link per address) and a store whose
claim can follow keys (it declares ``claim_rows``: SQLite; both records are
:mod:`msgsafe.ports`' capabilities, read once), a round stays in flight when its step
ends: the next step claims the next round while the broker answers it,
then settles it and publishes the next, so that the forwarder does not idle for each
round's last answer. Such a claim continues a key past
its rows in flight (see :mod:`msgsafe.outbox._claims`). A round is published only
once the round ahead of it is settled, and not at all when something failed there
(a key stopped, or the broker refused): one of its rows of a failed key would reach a
consumer before the message it follows, which is re-sent later, and a refusing broker
gets one probe per backoff period. Such a round is released whole and claimed again,
in queue order from the first failure, once nothing is in flight. That rule is what
makes a transport whose failures do not fail what follows them (a RabbitMQ nack, an
AMQP 1.0 ``released``) safe to overlap: nothing of the next round is on the wire
before every answer of the last is in. The removal of a settled round commits on a
thread of its own while the next round is handed over (:class:`_Removal`), and is
waited for before the next claim.

A paused forwarder: on a store whose leases carry epochs (it declares ``renew``: the
PostgreSQL outbox, see :mod:`msgsafe.outbox._pg_leases`), a claim that grew older than
half its lease before being published (the process was stopped in between) is renewed
first; one the store reports lost (another forwarder took its rows over) is dropped,
neither published nor settled, and the next step claims again. The store fences the
settling of every round the same way, so a round that was on the wire during the pause
deletes or releases nothing another forwarder holds.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from msgsafe._callbacks import call_logged
from msgsafe.errors import (
    AuthenticationError,
    ConfigurationError,
    MsgsafeError,
    PermanentError,
    ProtocolMismatch,
)
from msgsafe.message import Envelope
from msgsafe.outbox._round import UNSENT, PublishBatch, Round
from msgsafe.outbox._rows import ClaimedRows, column
from msgsafe.ports import (
    BatchTransport,
    CountingStore,
    HurryingTransport,
    NotifyingStore,
    OutboxStore,
    ReleasingStore,
    RenewingStore,
    RowClaimingStore,
    Transport,
    store_capabilities,
    transport_capabilities,
)
from msgsafe.retry import Backoff, RetryPolicy

__all__ = ["Forwarder", "ForwarderStats"]

log = logging.getLogger("msgsafe.outbox")
#: Permanent for a send, but about the connection, not the message: never quarantined.
_NOT_THE_MESSAGE = (AuthenticationError, ProtocolMismatch)

#: The first claim's size, before any message size is known (batch_bytes holds for
#: messages up to 16 KiB).
_FIRST_LIMIT = 500

#: The default backoff's cap: the longest wait between probes of a refusing broker.
#: Half a second, so that the first stored message is confirmed within a second of the
#: broker's return (bench_recovery's "first confirm"), at two connection attempts a
#: second per producer while it refuses.
_PROBE_CAP_S = 0.5

#: How often an idle forwarder looks for rows whose retry time has come.
_IDLE_POLL_S = 1.0
#: Seconds of a claim's lease unless the caller or the store says otherwise.
_LEASE_S = 30.0


@dataclass(frozen=True, slots=True)
class ForwarderStats:
    """The store's snapshot plus what this forwarder did since it was created."""

    depth: int  #: messages waiting in the store
    bytes: int  #: their payload bytes
    oldest_age_s: float | None  #: age of the oldest waiting message
    quarantined: int  #: messages in quarantine
    delivered: int  #: confirmed by the broker through this forwarder
    retried: int  #: transient failures (released for a later retry)
    refusing: bool  #: the broker refuses at the moment (probing only)
    last_error: str | None  #: the last error seen, for operators
    #: The store's file is no longer at its path: ``depth`` messages are at risk
    #: (:attr:`msgsafe.ports.OutboxStats.gone`).
    gone: bool = False


@dataclass(slots=True)
class _Flight:
    """A published round, until its answers are settled."""

    round: Round
    started: float  #: time.monotonic() when it was published
    keys: dict[bytes, int]  #: its messages per key (what the next claim may follow)


@dataclass(slots=True)
class _Settling:
    """What one round's answers, settled in claim order, come to."""

    delivered: list[str] = field(default_factory=list)
    releases: list[tuple[Envelope, str]] = field(default_factory=list)
    stopped_keys: set[bytes] = field(default_factory=set)  # stopped at their first failure
    stopped: bool = False  # a transient error: back off after this round
    answered: bool = False  # the broker answered at least one message


class _Removal:
    """A settled round's removal (``store.delivered``), committing on its own thread
    while the forwarder publishes the round behind it: with overlapping rounds the
    wire would otherwise idle for it (a few µs a message on SQLite), once per round.
    The forwarder waits for it before its next claim, so that the claim sees those
    rows gone (a claim that follows keys counts the rows held of each). Safe to commit
    late: the answers it records are already known; should the process die first,
    the messages are sent again (duplicates of known ids, after their first arrival)."""

    __slots__ = ("_done", "_error", "action")

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action
        self._error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, name="msgsafe-outbox-removal", daemon=True).start()

    def _run(self) -> None:
        try:
            self.action()
        except BaseException as exc:  # handed to the forwarder's thread by result()
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> MsgsafeError | None:
        """Wait for the removal: None, or the store's error (anything else raises)."""
        self._done.wait()
        error = self._error
        if error is None or isinstance(error, MsgsafeError):
            return error
        raise error


class Forwarder:
    """Delivers an outbox through a transport from a background daemon thread.

    ``start()`` starts the thread; ``wake()`` hints that rows were added; ``drain()``
    pushes everything now; ``stop()`` ends the thread (the store and transport stay open:
    their owner closes them). ``step()`` runs one round in the calling thread, for tests
    that control time through ``clock`` (epoch seconds), ``rng`` and ``sleep``.

    ``on_quarantine(envelope, error_text)`` is called (from the forwarder's thread) for
    every message moved to the quarantine.

    ``admit(destination)`` (the producer's: the protocol's name rules, see
    :func:`msgsafe.adapters.destination_check`, then the destination check of
    :mod:`msgsafe.checks.gate`) runs before a destination's messages are published: its
    :class:`~msgsafe.errors.InvalidDestination` or
    :class:`~msgsafe.errors.UnsafeDestination` quarantines them, a transient error (the
    broker cannot be reached to check) releases the round as a refusal does.

    ``on_answered()`` is called (from the forwarder's thread) each time the broker
    answers a whole round: the producer ends its refusal pause, so that new sends try
    the broker again at once rather than at the pause's end (a round can be answered
    within the half second that the outage's last send paused sending for).

    ``lease_s`` is how long a claim keeps its rows from other claimers (default 30 s,
    or the store's :attr:`~msgsafe.ports.StoreCapabilities.lease_s`); a store that caps
    leases shorter times the rounds by its cap.
    """

    def __init__(
        self,
        store: OutboxStore,
        transport: Transport,
        *,
        policy: RetryPolicy | None = None,
        batch: int = 10_000,
        batch_bytes: int = 8 << 20,
        lease_s: float | None = None,
        on_quarantine: Callable[[Envelope, str], None] | None = None,
        admit: Callable[[str], object] | None = None,
        on_answered: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if batch < 1 or batch_bytes < 1 or (lease_s is not None and lease_s <= 0):
            raise ConfigurationError("batch and batch_bytes must be >= 1 and lease_s > 0")
        self._store = store
        self._transport = transport
        # NOTE: capped at _PROBE_CAP_S: while the broker refuses, a probe is one message
        # (and at most one connection attempt) per period, no load worth sparing; a
        # longer cap is how long an outage outlasts the broker's return for every key.
        self._policy = policy or RetryPolicy(initial=0.2, maximum=_PROBE_CAP_S)
        self._batch = batch
        self._batch_bytes = batch_bytes
        #: The next claim's size: ``batch``, or fewer when messages are large.
        self._limit = min(batch, _FIRST_LIMIT)
        caps = store_capabilities(store)
        # NOTE: rows come back to other claimers when the store's lease ends, whatever
        # this forwarder asked for: its rounds are timed by the lease it gets.
        if lease_s is None:
            lease_s = _LEASE_S if caps.lease_s is None else caps.lease_s
        self._lease_s = lease_s if caps.lease_s is None else min(lease_s, caps.lease_s)
        self._on_quarantine = on_quarantine
        self._admit = admit
        self._on_answered = on_answered
        self._clock = clock
        self._backoff = Backoff(self._policy, clock=clock, rng=rng)
        self._wake = threading.Event()
        #: Set by reachable() on another thread: the next step probes at once.
        self._reachable = False
        self._sleep = sleep or self._interruptible_sleep
        self._step_lock = threading.Lock()
        self._progress = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._delivered = 0
        self._retried = 0
        self._last_error: str | None = None
        #: The ERROR for a refused connection was logged (until the next confirm).
        self._refusal_logged = False
        self._unsettled: list[Callable[[], None]] = []
        # What the store and the transport declare (msgsafe.ports), read once: each seam
        # is bound when its flag promises it, None otherwise.
        transport_caps = transport_capabilities(transport)
        #: The store, where its claim needs no envelope per row and can follow keys.
        self._row_claims: RowClaimingStore | None = (
            cast(RowClaimingStore, store) if caps.claim_rows else None
        )
        #: The store, where it releases many rows in one write.
        self._releases: ReleasingStore | None = (
            cast(ReleasingStore, store) if caps.release else None
        )
        #: The store, where it renews a claim's lease fenced by the claim's epoch.
        self._renewing: RenewingStore | None = cast(RenewingStore, store) if caps.renew else None
        #: The store's cheap count of waiting rows.
        self._pending: Callable[[], int] | None = (
            cast(CountingStore, store).pending if caps.pending else None
        )
        #: The store's wake-ups when any process puts rows, subscribed to by start().
        self._listen: Callable[[Callable[[], None]], None] | None = (
            cast(NotifyingStore, store).listen if caps.notify else None
        )
        #: The transport's batch seam: a round's runs go out as batches (see _round).
        self._publish_batch: PublishBatch | None = (
            cast(BatchTransport, transport).publish_batch if transport_caps.batch else None
        )
        #: The transport's way to stop lingering: a round's last messages go out at once.
        self._hurry: Callable[[Future[Any], float], None] | None = (
            cast(HurryingTransport, transport).hurry if transport_caps.hurry else None
        )
        # Overlapping rounds (see the module docstring): both sides must say they can.
        self._overlap = transport_caps.ordered_rounds and caps.claim_rows
        #: The round published and not settled yet (overlapping rounds only).
        self._flight: _Flight | None = None
        #: The removal of the last round settled, committing while the next is published.
        self._removal: _Removal | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread (once). On a store that declares ``notify``, the
        first start also has the store wake the thread whenever any process puts rows
        (:class:`~msgsafe.ports.NotifyingStore`; it polls once a second besides)."""
        if self._thread is not None:
            return
        if self._listen is not None:
            listen, self._listen = self._listen, None  # once: the store keeps it until closed
            listen(self.wake)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="msgsafe-forwarder", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """New rows exist: look now instead of at the next poll."""
        self._wake.set()

    # --- the transport's connection events (msgsafe._observer) ---------------------------

    def reachable(self, endpoint: str) -> None:
        """A broker answers again: probe now, not at the end of the current backoff.
        Called on the transport's I/O thread; the forwarder's thread cuts its own
        backoff (see _step)."""
        self._reachable = True
        self._wake.set()

    def failover(self, previous: str, endpoint: str, reason: str) -> None:
        """Nothing to do: a round in flight on the old connection is answered (or
        fails) by the transport."""

    def redirect(self, previous: str, endpoint: str, reason: str) -> None:
        """As :meth:`failover`."""

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread after its current round. Idempotent."""
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None

    # --- the work -------------------------------------------------------------------------------

    def drain(self, timeout: float | None = None) -> int:
        """Push everything now, for up to ``timeout`` seconds (None: until empty or the
        forwarder is stopped); returns how many messages remain. The current backoff is
        cut short, but a refusing broker still gets only one probe per backoff period."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else deadline - time.monotonic()

        self._backoff.not_before = 0.0
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._wake.set()
            with self._progress:
                while True:
                    remaining = self.pending()
                    rest = left()
                    if remaining == 0 or (rest is not None and rest <= 0) or self._stopping:
                        return remaining
                    self._progress.wait(0.05 if rest is None else min(rest, 0.05))
        while True:
            claimed = self.step()
            remaining = self.pending()
            rest = left()
            if remaining == 0 or (rest is not None and rest <= 0):
                return remaining
            if claimed == 0:
                pause = self._backoff.remaining() or 0.01
                self._sleep(pause if rest is None else min(pause, rest))

    def pending(self) -> int:
        """How many messages wait in the store."""
        if self._pending is not None:
            return self._pending()
        return self._store.stats().depth

    def step(self) -> int:
        """One round: claim a batch (one probe while the broker refuses), publish, settle.
        Returns how many messages were claimed. With overlapping rounds (see the module
        docstring) the round settled is the one published by the previous step, and
        the one published here stays in flight until the next step (a step that
        claims nothing settles it)."""
        with self._step_lock:
            claimed = self._step()
        with self._progress:
            self._progress.notify_all()
        return claimed

    def _step(self) -> int:
        self._removed()
        if self._reachable:
            self._reachable = False
            self._backoff.not_before = 0.0
        if not self._backoff.ready():
            self._land()
            return 0
        if not self._settle_backlog():
            self._land()
            self._backoff.failure()
            return 0
        limit = 1 if self._backoff.failures else self._limit
        ahead = self._flight
        asked = time.monotonic()
        try:
            envelopes: Sequence[Envelope]
            if self._row_claims is None:
                envelopes = self._store.claim(limit=limit, lease_s=self._lease_s)
            else:
                follow = None
                if ahead is not None:
                    follow = ahead.keys
                envelopes = self._row_claims.claim_rows(
                    limit=limit, lease_s=self._lease_s, follow=follow
                )
        except MsgsafeError as exc:
            self._land()
            self._note_error(f"claim failed: {exc}")
            self._backoff.failure()
            return 0
        self._flight = None
        # The round ahead is settled before this one is published: its answers came
        # while this one was claimed.
        if ahead is not None:
            self._finish(ahead, behind=bool(envelopes))
        if envelopes and not self._still_held(envelopes, asked):
            return len(envelopes)
        if envelopes:
            keys = Counter(column(envelopes, "key"))
            keys.pop(None, None)
            rnd = Round(envelopes, _NOT_THE_MESSAGE)
            flight = _Flight(rnd, time.monotonic(), cast(dict[bytes, int], keys))
            if ahead is not None and self._backoff.failures:
                # Claimed while the round ahead failed (any failure there, keyed or not,
                # is a backoff failure: see _finish): a row here of a key that failed
                # there would reach a consumer before the message it follows (re-sent
                # later), and a broker that refused gets one probe per backoff period.
                # Nothing is published; every row is released, to be claimed again in
                # queue order from the first failure.
                rnd.withhold()
                self._finish(flight)
                return len(envelopes)
            rnd.publish(self._transport, self._admit, self._publish_batch)
            if self._overlap and not self._backoff.failures:
                self._flight = flight
            else:
                self._finish(flight)
        return len(envelopes)

    def _still_held(self, envelopes: Sequence[Envelope], asked: float) -> bool:
        """False when the claim asked at ``asked`` (time.monotonic()) was lost: it grew
        older than half its lease before being published (the process was paused, or
        the round ahead took that long) and the store, asked to renew it, found that
        another claimer took some of its rows over. The store has given the claim up
        (and logged it); nothing of it is published or settled here. A store that
        cannot answer counts as lost too: the rows come back when the lease runs out."""
        store = self._renewing
        if store is None or time.monotonic() - asked <= self._lease_s / 2:
            return True
        try:
            return store.renew(column(envelopes, "message_id"), lease_s=self._lease_s)
        except MsgsafeError as exc:
            self._note_error(f"lease renewal failed: {exc}")
            self._backoff.failure()
            return False

    def _land(self) -> None:
        """Settle the round in flight, if any."""
        flight, self._flight = self._flight, None
        if flight is not None:
            self._finish(flight)
        self._removed()

    def _removed(self) -> None:
        """Wait for the removal committing in the background, if any; when it failed, it
        joins the updates retried before the next claim (its rows stay leased)."""
        removal, self._removal = self._removal, None
        if removal is not None:
            error = removal.result()
            if error is not None:
                self._note_error(f"outbox update failed: {error}")
                self._unsettled.append(removal.action)

    def next_attempt_in(self) -> float:
        """Seconds until the broker is tried again (0 unless it refused recently)."""
        return self._backoff.remaining()

    @property
    def last_error(self) -> str | None:
        """The last error seen (publish, claim or store), or None."""
        return self._last_error

    def stats(self) -> ForwarderStats:
        """The store's depth, bytes, oldest age and quarantine, and this forwarder's counts."""
        snap = self._store.stats()
        return ForwarderStats(
            depth=snap.depth,
            bytes=snap.bytes,
            oldest_age_s=snap.oldest_age_s,
            quarantined=snap.quarantined,
            delivered=self._delivered,
            retried=self._retried,
            refusing=self._backoff.failures > 0,
            last_error=self._last_error,
            gone=snap.gone,
        )

    # --- internals ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            try:
                claimed = self.step()
            except Exception as exc:  # the forwarder thread must survive anything
                log.exception("outbox forwarder round failed")
                self._note_error(f"{type(exc).__name__}: {exc}")
                claimed = 0
            if self._stopping:
                break
            if claimed:
                continue
            pause = self._backoff.remaining() if self._backoff.failures else _IDLE_POLL_S
            self._wake.wait(max(pause, 0.001))
            self._wake.clear()
        with self._step_lock:
            try:
                self._land()
            except Exception as exc:  # as above: the thread ends quietly
                log.exception("outbox forwarder round failed")
                self._note_error(f"{type(exc).__name__}: {exc}")
        with self._progress:
            self._progress.notify_all()

    def _interruptible_sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _finish(self, flight: _Flight, *, behind: bool = False) -> None:
        """Wait for the answers of ``flight`` and settle them; a key stopped in it (a
        failure, and what was released behind it) counts as a backoff failure.
        ``behind``: a round is published next, and the removal of what ``flight``
        delivered commits while it is (see :class:`_Removal`)."""
        rnd = flight.round
        envelopes = rnd.envelopes
        # NOTE: the contract says every answer comes within confirm_timeout; a transport
        # that breaks it must not keep rows leased forever: what is unanswered at the
        # lease deadline is released (a late confirm only makes a duplicate).
        deadline = flight.started + self._lease_s * 0.9
        if self._hurry is not None and not rnd.answered.done():
            # Nothing more joins this round: its tail must not wait out the transport's
            # linger (Kafka's linger.ms, once a round: an eighth of a drain's time).
            self._hurry(rnd.answered, max(0.0, deadline - time.monotonic()))
        if not rnd.wait(deadline - time.monotonic()):
            self._note_error("publish futures unresolved at the lease deadline")
        outcomes = rnd.outcomes()
        out = _Settling()
        if outcomes.count(None) == len(outcomes):
            # Every message confirmed (the usual round): no settling one by one.
            out.answered = True
            out.delivered = column(envelopes, "message_id")
        else:
            for env, outcome in zip(envelopes, outcomes, strict=True):
                self._settle_one(out, env, outcome)
        if out.delivered:
            delivered = out.delivered
            self._delivered += len(delivered)
            if behind:
                self._removal = _Removal(partial(self._store.delivered, delivered))
            else:
                self._settle(lambda: self._store.delivered(delivered))
        if out.releases:
            self._retried += len(out.releases)
            # The rows are ready again at once, so that drain() can really push everything
            # now; the backoff lives here, in the forwarder (one probe per period).
            self._release(out.releases, self._clock())
        if out.stopped:
            self._backoff.failure()
        elif out.answered:
            if self._on_answered is not None:
                call_logged(log, "on_answered", self._on_answered)
            self._backoff.success()
            self._refusal_logged = False
        self._limit = self._next_limit(envelopes, time.monotonic() - flight.started)

    def _next_limit(self, envelopes: Sequence[Envelope], took: float) -> int:
        # Sized after the last round: within batch_bytes at its mean message size, and
        # answered well within the lease (a slow broker gets smaller rounds, instead of
        # rounds released unanswered at the lease deadline and sent again whole).
        if isinstance(envelopes, ClaimedRows) and not any(envelopes.headers_text()):
            # Envelope.size without an envelope (C loops): no headers to count.
            total = sum(map(len, column(envelopes, "body"))) + sum(
                map(len, filter(None, column(envelopes, "key")))
            )
        else:
            total = sum(env.size for env in envelopes)
        mean = max(1, total // len(envelopes))
        if took > self._lease_s / 4:
            paced = len(envelopes) // 2
        else:
            paced = 2 * len(envelopes) if len(envelopes) >= self._limit else self._limit
        return max(1, min(self._batch, self._batch_bytes // mean, paced))

    def _settle_one(self, out: _Settling, env: Envelope, exc: BaseException | None) -> None:
        """Settle one answer, in claim order (see the module docstring)."""
        key = env.key
        if key is not None and key in out.stopped_keys:
            out.releases.append((env, "re-sent after an earlier message of its key failed"))
            return
        if exc is UNSENT:
            out.releases.append((env, str(exc)))
            if key is not None:
                # Not sent: the key's later messages, in this round or one behind it,
                # must not go out before this one.
                out.stopped_keys.add(key)
            return
        if exc is None:
            out.answered = True
            out.delivered.append(env.message_id)
            return
        if isinstance(exc, PermanentError) and not isinstance(exc, _NOT_THE_MESSAGE):
            out.answered = True
            self._quarantine(env, exc)
            return
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, _NOT_THE_MESSAGE):
            self._waits_for_fix(exc, "the broker refused the connection")
        elif isinstance(exc, ConfigurationError):
            self._waits_for_fix(exc, "the client refused the configuration")
        else:
            self._note_error(text)
        out.stopped = True
        out.releases.append((env, text))
        if key is not None:
            out.stopped_keys.add(key)

    def _quarantine(self, env: Envelope, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        self._note_error(text)
        log.warning("outbox message %s quarantined: %s", env.message_id, text)
        self._settle(lambda: self._store.failed(env.message_id, error=text, retry_at=None))
        if self._on_quarantine is not None:
            call_logged(log, "the on_quarantine callback", self._on_quarantine, env, text)

    def _release(self, releases: Sequence[tuple[Envelope, str]], retry_at: float) -> None:
        many = self._releases
        if many is not None:
            items = [(env.message_id, text) for env, text in releases]
            self._settle(lambda: many.release(items, retry_at=retry_at))
            return
        for env, text in releases:
            self._settle(partial(self._store.failed, env.message_id, error=text, retry_at=retry_at))

    def _settle(self, action: Callable[[], None]) -> None:
        # A store error here (a full disk) must not keep rows leased until the lease runs
        # out: the update is kept and retried before the next claim. Should the process
        # die first, the rows are sent again — a duplicate at worst, never a loss.
        try:
            action()
        except MsgsafeError as exc:  # OutboxError, or ClosedError while shutting down
            self._note_error(f"outbox update failed: {exc}")
            self._unsettled.append(action)

    def _settle_backlog(self) -> bool:
        """Apply the store updates that failed earlier, in order; False if one still fails."""
        while self._unsettled:
            try:
                self._unsettled[0]()
            except MsgsafeError as exc:
                self._note_error(f"outbox update failed: {exc}")
                return False
            self._unsettled.pop(0)
        return True

    def _waits_for_fix(self, exc: MsgsafeError, cause: str) -> None:
        """Not the message's fault (a refused connection, ``cause`` says which, or a
        configuration error: a name the protocol refuses is InvalidDestination, the
        message's own, quarantined): every message waits for the fix."""
        text = f"{type(exc).__name__}: {exc}"
        self._note_error(text)
        if not self._refusal_logged:
            # One line per state change; the backoff keeps probing, at its capped pace.
            self._refusal_logged = True
            log.error(
                "outbox forwarding waits: %s (%s); every message stays in the outbox until "
                "the configuration is fixed",
                cause,
                text,
            )

    def _note_error(self, text: str) -> None:
        self._last_error = text

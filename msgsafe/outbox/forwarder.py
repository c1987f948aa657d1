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

Order: for a key, at most one message is in flight; the next one of that key is
published only after its predecessor was confirmed (or quarantined). Keyless messages
and different keys are pipelined freely. Memory is bounded by ``batch``: rows stream
from the store a batch at a time however large the backlog.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

from msgsafe._callbacks import call_logged
from msgsafe.errors import (
    AuthenticationError,
    ConfigurationError,
    ConfirmTimeout,
    MsgsafeError,
    PermanentError,
    ProtocolMismatch,
)
from msgsafe.message import Envelope
from msgsafe.ports import OutboxStore, Transport
from msgsafe.retry import Backoff, RetryPolicy

__all__ = ["Forwarder", "ForwarderStats"]

log = logging.getLogger("msgsafe.outbox")
#: Permanent for a send, but about the connection, not the message: never quarantined.
_NOT_THE_MESSAGE = (AuthenticationError, ProtocolMismatch)

#: How often an idle forwarder looks for rows whose retry time has come.
_IDLE_POLL_S = 1.0


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


@dataclass(slots=True)
class _Round:
    """Bookkeeping of one claimed batch."""

    done: queue.SimpleQueue[tuple[Envelope, Future[None]]]
    waiting: dict[bytes, deque[Envelope]]  # keyed messages behind the one in flight
    flying: dict[str, Envelope]  # published, not yet answered
    stopped: bool = False  # a transient error: publish nothing more this round


class Forwarder:
    """Delivers an outbox through a transport from a background daemon thread.

    ``start()`` starts the thread; ``wake()`` hints that rows were added; ``drain()``
    pushes everything now; ``stop()`` ends the thread (the store and transport stay open:
    their owner closes them). ``step()`` runs one round in the calling thread, for tests
    that control time through ``clock`` (epoch seconds), ``rng`` and ``sleep``.

    ``on_quarantine(envelope, error_text)`` is called (from the forwarder's thread) for
    every message moved to the quarantine.
    """

    def __init__(
        self,
        store: OutboxStore,
        transport: Transport,
        *,
        policy: RetryPolicy | None = None,
        batch: int = 500,
        lease_s: float = 30.0,
        on_quarantine: Callable[[Envelope, str], None] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if batch < 1 or lease_s <= 0:
            raise ConfigurationError("batch must be >= 1 and lease_s > 0")
        self._store = store
        self._transport = transport
        self._policy = policy or RetryPolicy(initial=0.2, maximum=30.0)
        self._batch = batch
        self._lease_s = lease_s
        self._on_quarantine = on_quarantine
        self._clock = clock
        self._backoff = Backoff(self._policy, clock=clock, rng=rng)
        self._wake = threading.Event()
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

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread (once)."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="msgsafe-forwarder", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """New rows exist: look now instead of at the next poll."""
        self._wake.set()

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
        count = getattr(self._store, "pending", None)
        if callable(count):
            return int(count())
        return self._store.stats().depth

    def step(self) -> int:
        """One round: claim a batch (one probe while the broker refuses), publish, settle.
        Returns how many messages were claimed."""
        with self._step_lock:
            if not self._backoff.ready():
                return 0
            if not self._settle_backlog():
                self._backoff.failure()
                return 0
            limit = 1 if self._backoff.failures else self._batch
            try:
                envelopes = self._store.claim(limit=limit, lease_s=self._lease_s)
            except MsgsafeError as exc:
                self._note_error(f"claim failed: {exc}")
                self._backoff.failure()
                return 0
            if envelopes:
                self._forward(envelopes)
        with self._progress:
            self._progress.notify_all()
        return len(envelopes)

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
        with self._progress:
            self._progress.notify_all()

    def _interruptible_sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _forward(self, envelopes: Sequence[Envelope]) -> None:
        rnd = _Round(done=queue.SimpleQueue(), waiting={}, flying={})
        delivered: list[str] = []
        releases: list[tuple[Envelope, str]] = []
        answered = False
        for env in envelopes:
            if env.key is None:
                self._launch(rnd, env)
            elif env.key in rnd.waiting:
                rnd.waiting[env.key].append(env)
            else:
                rnd.waiting[env.key] = deque()
                self._launch(rnd, env)
        deadline = time.monotonic() + self._lease_s * 0.9
        while rnd.flying:
            try:
                env, future = rnd.done.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                # NOTE: the contract says every future resolves within confirm_timeout; a
                # transport that breaks it must not keep rows leased forever. Whatever is
                # still unanswered is released (a late confirm only makes a duplicate).
                self._note_error("publish futures unresolved at the lease deadline")
                rnd.stopped = True
                releases.extend(
                    (e, "no confirm before the lease deadline") for e in rnd.flying.values()
                )
                rnd.flying.clear()
                break
            del rnd.flying[env.message_id]
            exc = future.exception()
            if exc is None:
                answered = True
                delivered.append(env.message_id)
                self._next_of_key(rnd, env)
            elif isinstance(exc, _NOT_THE_MESSAGE):
                self._connection_refused(exc)
                rnd.stopped = True
                releases.append((env, f"{type(exc).__name__}: {exc}"))
            elif isinstance(exc, PermanentError):
                answered = True
                self._quarantine(env, exc)
                self._next_of_key(rnd, env)
            else:
                self._note_error(f"{type(exc).__name__}: {exc}")
                rnd.stopped = True
                releases.append((env, f"{type(exc).__name__}: {exc}"))
        for rest in rnd.waiting.values():
            releases.extend((env, "not attempted: the broker refused") for env in rest)
        if delivered:
            self._delivered += len(delivered)
            self._settle(lambda: self._store.delivered(delivered))
        if rnd.stopped:
            self._retried += len(releases)
            # The backoff lives here, in the forwarder (one probe per period); the rows
            # are ready again at once so that drain() can really push everything now.
            self._backoff.failure()
            self._release(releases, self._clock())
        elif answered:
            self._backoff.success()
            self._refusal_logged = False

    def _launch(self, rnd: _Round, env: Envelope) -> None:
        try:
            future = self._transport.publish(env)
        except MsgsafeError as exc:
            future = Future()
            future.set_exception(exc)
        except Exception as exc:  # a transport bug must not kill the round
            future = Future()
            future.set_exception(ConfirmTimeout(f"publish raised {type(exc).__name__}: {exc}"))
        rnd.flying[env.message_id] = env
        done = rnd.done

        def report(f: Future[None]) -> None:
            done.put((env, f))

        future.add_done_callback(report)

    def _next_of_key(self, rnd: _Round, env: Envelope) -> None:
        # The next message of a key goes out only once its predecessor is settled; after a
        # transient error nothing more is published this round (the rest is released).
        if env.key is None or rnd.stopped:
            return
        rest = rnd.waiting.get(env.key)
        if not rest:
            rnd.waiting.pop(env.key, None)
            return
        self._launch(rnd, rest.popleft())

    def _quarantine(self, env: Envelope, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        self._note_error(text)
        log.warning("outbox message %s quarantined: %s", env.message_id, text)
        self._settle(lambda: self._store.failed(env.message_id, error=text, retry_at=None))
        if self._on_quarantine is not None:
            call_logged(log, "the on_quarantine callback", self._on_quarantine, env, text)

    def _release(self, releases: Sequence[tuple[Envelope, str]], retry_at: float) -> None:
        many = getattr(self._store, "release", None)
        if callable(many):
            items = [(env.message_id, text) for env, text in releases]
            self._settle(lambda: many(items, retry_at=retry_at))
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

    def _connection_refused(self, exc: MsgsafeError) -> None:
        text = f"{type(exc).__name__}: {exc}"
        self._note_error(text)
        if not self._refusal_logged:
            # One line per state change; the backoff keeps probing, at its capped pace.
            self._refusal_logged = True
            log.error(
                "outbox forwarding waits: the broker refused the connection (%s); every "
                "message stays in the outbox until the configuration is fixed",
                text,
            )

    def _note_error(self, text: str) -> None:
        self._last_error = text

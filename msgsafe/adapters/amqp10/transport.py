"""The AMQP 1.0 publishing transport (python-qpid-proton).

:class:`Amqp10Transport` is what callers see: the window (``max_in_flight``) and the
checks made before sending. :class:`Sends` is what its :class:`~msgsafe.adapters.amqp10.
_connection.Engine` keeps across connections: every unresolved send (queued, or
transferred and unsettled) with its deadline, one sender link per address, and the
outcomes that resolve them. After a fail-over every unsettled send is transferred again
with the same ``message_id`` (a possible duplicate the consumer recognises, never a
loss), before anything queued later for the same address.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from proton import Delivery as ProtonDelivery

from msgsafe.adapters._config import size_error
from msgsafe.adapters.amqp10._connection import Engine, EngineClient, log
from msgsafe.adapters.amqp10._errors import detach_error, is_not_found, rejected_error
from msgsafe.adapters.amqp10._wire import encode_envelope, send_bytes
from msgsafe.adapters.amqp10.config import Amqp10Options
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import (
    ClosedError,
    ConfirmTimeout,
    ConnectError,
    ConnectionLost,
    MsgsafeError,
    Refused,
)
from msgsafe.message import Envelope
from msgsafe.ports import TransportCapabilities

__all__ = ["Amqp10Transport", "Sends"]

#: Seconds a connection that answered ``amqp:not-found`` must stay up before the address
#: is asked for once more and a second refusal is final (see :meth:`Sends.detached`).
_RECHECK_S = 2.0

_TERMINAL = (
    ProtonDelivery.ACCEPTED,
    ProtonDelivery.REJECTED,
    ProtonDelivery.RELEASED,
    ProtonDelivery.MODIFIED,
)


class Amqp10Transport(EngineClient):
    """Publishes durable messages over AMQP 1.0 with unsettled sends (at-least-once).

    Implements :class:`msgsafe.ports.Transport`. Each envelope is sent as a durable
    message with ``message-id`` = ``envelope.message_id`` and the application properties
    ``msgsafe-id`` (the same id) and ``msgsafe-key`` (the key, binary) next to the
    envelope's headers. Outcomes map as:

    - ``accepted`` -> the future resolves (CONFIRMED);
    - ``rejected`` -> :class:`~msgsafe.errors.Rejected` with the broker's condition
      (permanent);
    - ``released`` / ``modified`` -> :class:`~msgsafe.errors.Refused` (transient);
    - link detached after sending -> :class:`~msgsafe.errors.ConnectionLost`;
    - no outcome within ``confirm_timeout`` -> :class:`~msgsafe.errors.ConfirmTimeout`
      (or ``ConnectionLost`` / ``ConnectError`` when no connection held).

    A lost connection is not an error by itself: the transport fails over to the next
    candidate (URL hosts and the broker's ``failover-server-list``) and resends every
    unsettled envelope with its id; only the deadline fails a future.
    ``max_in_flight`` bounds unresolved sends: ``publish`` waits for room up to
    ``confirm_timeout`` and then fails the future with ``Refused``.
    """

    #: ``publish`` only (see msgsafe.ports): no callback or batch seam, no linger, no
    #: null body (an AMQP 1.0 message sent here always has a data section).
    #: ordered_rounds: one sender link per address carries transfers in the order they
    #: are handed over, across calls, and after a fail-over every unsettled transfer
    #: goes again before anything queued later. Each transfer is settled on its own
    #: (a released one does not fail those behind it); the forwarder allows for that:
    #: it only claims its next round while a round is answered, publishes it once every
    #: outcome of that round is in, and releases it unsent when one of them failed
    #: (msgsafe.outbox.forwarder).
    capabilities = TransportCapabilities(ordered_rounds=True)

    def __init__(self, url: BrokerUrl, options: Amqp10Options) -> None:
        self._url = url
        self._options = options
        self._limit = options.max_in_flight
        self._size_limit = options.size_limit
        # Wake a blocked publish only when a quarter of the window is free again: one
        # wake-up per burst instead of one per confirm.
        self._low_water = max(0, options.max_in_flight - max(1, options.max_in_flight // 4))
        self._in_flight = 0
        self._waiting = 0
        self._room = threading.Condition(threading.Lock())
        self._closed = False
        self._sends = Sends()
        self._engine = Engine(url, options, self._sends, role="sender")

    def publish(self, envelope: Envelope) -> Future[None]:
        """Send ``envelope``; the future resolves when the broker accepted it."""
        future: Future[None] = Future()
        if self._closed:
            future.set_exception(
                ClosedError(
                    "the transport is closed", endpoint=self.target, message_id=envelope.message_id
                )
            )
            return future
        too_large = size_error(envelope, self._size_limit, self.target)
        if too_large is not None:
            future.set_exception(too_large)
            return future
        # One deadline from the call: waiting for room spends the same confirm_timeout.
        deadline = time.monotonic() + self._options.confirm_timeout
        if not self._acquire(deadline):
            future.set_exception(
                Refused(
                    f"{self._options.max_in_flight} messages in flight for "
                    f"{self._options.confirm_timeout}s: the broker is not confirming",
                    endpoint=self.target,
                    message_id=envelope.message_id,
                )
            )
            return future
        future.add_done_callback(self._done)
        self._sends.publish(envelope, future, deadline)
        return future

    def _acquire(self, deadline: float) -> bool:
        with self._room:
            if self._in_flight >= self._limit:
                self._waiting += 1
                try:
                    if not self._room.wait_for(
                        lambda: self._in_flight < self._limit, deadline - time.monotonic()
                    ):
                        return False
                finally:
                    self._waiting -= 1
            self._in_flight += 1
            return True

    def _done(self, future: Future[None]) -> None:
        with self._room:
            self._in_flight -= 1
            if self._waiting and self._in_flight <= self._low_water:
                self._room.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for outstanding outcomes, then fail the rest and disconnect."""
        if self._closed:
            return
        self._closed = True
        self._sends.wait_idle(timeout)
        self._engine.shutdown(timeout)

    def __enter__(self) -> Amqp10Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Amqp10Transport({self.target!r})"


@dataclass(eq=False, slots=True)
class _Outgoing:
    seq: int
    envelope: Envelope
    future: Future[None]
    deadline: float
    generation: int = 0  #: connection generation it was last transferred on; 0: never
    tag: str | None = None
    done: bool = False


class Sends:
    """The unresolved sends of one transport: the :class:`~msgsafe.adapters.amqp10.
    _connection.Side` of a sender engine.

    ``publish`` is called from any thread (a lock-free hand-over); everything else runs
    on the engine's container thread.
    """

    #: The engine whose connection the sends go over (set by :meth:`bind`).
    engine: Engine

    def __init__(self) -> None:
        #: Sends handed over by publish(): (envelope, future, deadline). deque.append and
        #: popleft are atomic, so the hot path takes no lock beyond the wake-up flag.
        self._incoming: collections.deque[tuple[Envelope, Future[None], float]] = (
            collections.deque()
        )
        self._idle = threading.Condition()
        # container thread only
        self._seq = itertools.count(1)
        self._tags = itertools.count(1)
        self._links: dict[str, Any] = {}
        self._queues: dict[str, collections.deque[_Outgoing]] = {}
        self._inflight: dict[str, _Outgoing] = {}
        self._outstanding: dict[int, _Outgoing] = {}
        #: (deadline, seq) of every unresolved send; resolved ones are skipped lazily.
        self._deadlines: list[tuple[float, int]] = []
        #: Addresses refused with not-found, held (not attached) until the verdict, with
        #: the connection generation that refused them.
        self._held: dict[str, int] = {}
        #: Addresses asked for again on a connection that stayed up after refusing them.
        self._rechecked: set[str] = set()

    # --- any thread ----------------------------------------------------------------------

    def publish(self, envelope: Envelope, future: Future[None], deadline: float) -> None:
        """Queue ``envelope``; ``future`` resolves with its outcome by ``deadline``
        (``time.monotonic()`` seconds)."""
        engine = self.engine
        if engine.stopped:
            _set_exception(future, _closed(engine, envelope))
            return
        self._incoming.append((envelope, future, deadline))
        if engine.stopped:  # the thread ended between the check and the append
            self._fail_incoming()
            return
        engine.wake()

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no send is unresolved; False when ``timeout`` passed first."""
        with self._idle:
            return self._idle.wait_for(
                lambda: not self._outstanding and not self._incoming, timeout
            )

    def _fail_incoming(self) -> None:
        # Hand-overs that will never be taken: popleft is atomic, so each fails once
        # even when publish() and the container thread's exit race.
        while True:
            try:
                envelope, future, _ = self._incoming.popleft()
            except IndexError:
                return
            _set_exception(future, _closed(self.engine, envelope))

    # --- the Side protocol (container thread) -------------------------------------------

    def bind(self, engine: Engine) -> None:
        self.engine = engine

    def opened(self) -> None:
        self._pump()

    def lost(self) -> int:
        """Session resume: unsettled sends go back in front of their queues, in send order."""
        self._links.clear()
        self._held.clear()
        self._rechecked.clear()
        resend = sorted(self._inflight.values(), key=lambda o: o.seq, reverse=True)
        self._inflight.clear()
        for out in resend:
            out.tag = None
            if not out.done:
                self._queues.setdefault(out.envelope.destination, collections.deque()).appendleft(
                    out
                )
        return len(resend)

    def woken(self) -> None:
        incoming = self._incoming
        while incoming:
            self._enqueue(*incoming.popleft())
        self._pump()

    def delivery(self, dlv: Any) -> None:
        if dlv.updated:
            self._outcome(dlv)

    def flow(self, link: Any) -> None:
        if link.is_sender and link.credit > 0:
            self._pump()

    def detached(self, link: Any, condition: Any) -> None:
        """The broker detached a sender link: what was transferred on it fails
        (transient); what is queued behind it fails too, so that per-key order holds in
        the outbox, unless the refusal is ``amqp:not-found`` from a connection not yet
        known to be healthy.

        A not-found is permanent (:class:`~msgsafe.errors.Unroutable`) only when a
        healthy connection says it: a Broker-J master just resumed after a pause still
        calls itself master, refuses new addresses with not-found, then steps down. So
        the first not-found for an address holds its queue; if the connection is lost
        within ``_RECHECK_S`` the queue is sent to the next candidate (or times out as a
        transient error: STORED); if the connection stays up, the address is asked for
        once more and a second not-found is final.
        """
        address = link.target.address
        if self._links.get(address) == link:
            del self._links[address]
        # Transferred and unsettled on this link: the broker may hold them.
        sent = [out for out in self._inflight.values() if out.envelope.destination == address]
        engine = self.engine
        if is_not_found(condition) and address not in self._rechecked:
            generation = engine.generation
            self._held[address] = generation
            log.info(
                "%s answered not-found for %r: asking again in %.1fs if the connection holds",
                engine.history[-1] if engine.history else engine.target,
                address,
                _RECHECK_S,
            )
            engine.schedule(_RECHECK_S, lambda: self._recheck(address, generation))
            queued: Any = ()
        else:
            self._rechecked.discard(address)
            queued = self._queues.pop(address, None) or ()
        for outs, was_sent in ((sent, True), (queued, False)):
            for out in outs:
                error = detach_error(
                    condition,
                    endpoint=self.engine.target,
                    message_id=out.envelope.message_id,
                    sent=was_sent,
                )
                self._resolve(out, error)

    def _recheck(self, address: str, generation: int) -> None:
        if self._held.get(address) != generation:
            return  # the connection was lost meanwhile: lost() released the queue
        del self._held[address]
        engine = self.engine
        if generation == engine.generation and engine.opened:
            self._rechecked.add(address)
            self._pump()

    def tick(self, now: float) -> None:
        if self.engine.all_failed and self._outstanding:
            # Every host failed its latest attempt: waiting out the deadline helps no
            # one, the outbox is the faster home (fail fast, first send included).
            for waiting in list(self._outstanding.values()):
                self._resolve(waiting, self._unreachable_error(waiting))
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, seq = heapq.heappop(deadlines)
            out = self._outstanding.get(seq)
            if out is not None:
                self._resolve(out, self._timeout_error(out))
        if not self._outstanding:
            deadlines.clear()

    def fail_all(self, error: MsgsafeError) -> None:
        for out in list(self._outstanding.values()):
            self._resolve(out, error.with_id(out.envelope.message_id))

    def closing(self) -> None:
        for out in list(self._outstanding.values()):
            self._resolve(
                out,
                ConnectionLost(
                    "closed before the broker confirmed",
                    endpoint=self.engine.target,
                    message_id=out.envelope.message_id,
                ),
            )

    def stopped(self) -> None:
        err = ClosedError("the AMQP 1.0 connection thread has stopped", endpoint=self.engine.target)
        for out in list(self._outstanding.values()):
            self._resolve(out, err)
        self._fail_incoming()

    # --- sending -------------------------------------------------------------------------

    def _enqueue(self, envelope: Envelope, future: Future[None], deadline: float) -> None:
        engine = self.engine
        if engine.fatal is not None:
            _set_exception(future, engine.fatal.with_id(envelope.message_id))
            return
        if engine.closing:
            _set_exception(future, _closed(engine, envelope))
            return
        if engine.all_failed:
            _set_exception(future, self._unreachable_error(_Outgoing(0, envelope, future, 0.0)))
            return
        out = _Outgoing(next(self._seq), envelope, future, deadline)
        self._outstanding[out.seq] = out
        heapq.heappush(self._deadlines, (deadline, out.seq))
        self._queues.setdefault(envelope.destination, collections.deque()).append(out)

    def _pump(self) -> None:
        engine = self.engine
        if not engine.opened or engine.conn is None:
            return
        for address, queue in self._queues.items():
            if not queue or address in self._held:
                continue
            link = self._links.get(address)
            if link is None:
                self._links[address] = engine.open_sender(address)
                continue
            credit = link.credit
            while queue and credit > 0:
                out = queue.popleft()
                if out.done:
                    continue
                self._transfer(link, out)
                credit -= 1

    def _transfer(self, link: Any, out: _Outgoing) -> None:
        tag = str(next(self._tags))
        send_bytes(link, tag, encode_envelope(out.envelope))
        out.tag = tag
        out.generation = self.engine.generation
        self._inflight[tag] = out

    def _outcome(self, dlv: Any) -> None:
        state = dlv.remote_state
        settled = dlv.settled
        out = self._inflight.pop(dlv.tag, None)
        if settled or state in _TERMINAL:
            dlv.settle()
        if out is None:
            return
        target = self.engine.target
        error: MsgsafeError | None
        mid = out.envelope.message_id
        if state == ProtonDelivery.ACCEPTED:
            error = None
        elif state == ProtonDelivery.REJECTED:
            error = rejected_error(dlv.remote.condition, endpoint=target, message_id=mid)
        elif state in (ProtonDelivery.RELEASED, ProtonDelivery.MODIFIED):
            # NOTE: both mean the broker did not take the message (RabbitMQ: no route,
            # queue limit; Qpid: no consumer for a non-durable address): transient.
            outcome = "modified" if state == ProtonDelivery.MODIFIED else "released"
            error = Refused(f"the broker {outcome} the message", endpoint=target, message_id=mid)
        elif settled:
            error = ConnectionLost(
                "the broker settled the message without an outcome",
                endpoint=target,
                message_id=mid,
            )
        else:  # a non-terminal state (e.g. received): keep waiting for the outcome
            self._inflight[dlv.tag] = out
            return
        self._resolve(out, error)

    def _timeout_error(self, out: _Outgoing) -> MsgsafeError:
        engine = self.engine
        timeout = engine.options.confirm_timeout
        mid = out.envelope.message_id
        if out.generation and out.tag is not None and out.generation == engine.generation:
            return ConfirmTimeout(
                f"no outcome within {timeout}s", endpoint=engine.target, message_id=mid
            )
        if out.generation:
            return ConnectionLost(
                "the connection was lost after sending and no candidate took over in time",
                endpoint=engine.target,
                message_id=mid,
            )
        if engine.opened:
            link = self._links.get(out.envelope.destination)
            unanswered = link is not None and link.state & link.REMOTE_UNINIT
            return Refused(
                f"the broker {'did not attach the link' if unanswered else 'gave no credit'} "
                f"within {timeout}s",
                endpoint=engine.target,
                message_id=mid,
            )
        return ConnectError(
            f"no broker reachable within {timeout}s", endpoint=engine.target, message_id=mid
        )

    def _unreachable_error(self, out: _Outgoing) -> MsgsafeError:
        engine = self.engine
        mid = out.envelope.message_id
        if out.generation:
            return ConnectionLost(
                "the connection was lost after sending and every host has failed since",
                endpoint=engine.target,
                message_id=mid,
            )
        return ConnectError(
            f"no broker reachable ({engine.last_failure or 'every host failed'})",
            endpoint=engine.target,
            message_id=mid,
        )

    def _resolve(self, out: _Outgoing, error: MsgsafeError | None) -> None:
        if out.done:
            return
        out.done = True
        outstanding = self._outstanding
        outstanding.pop(out.seq, None)
        if not outstanding and not self._incoming:
            with self._idle:
                self._idle.notify_all()
        if out.tag is not None:
            self._inflight.pop(out.tag, None)
        if error is None:
            with contextlib.suppress(InvalidStateError):
                out.future.set_result(None)
        else:
            _set_exception(out.future, error)


def _closed(engine: Engine, envelope: Envelope) -> ClosedError:
    return ClosedError(
        "the transport is closed", endpoint=engine.target, message_id=envelope.message_id
    )


def _set_exception(future: Future[None], error: BaseException) -> None:
    with contextlib.suppress(InvalidStateError):
        future.set_exception(error)

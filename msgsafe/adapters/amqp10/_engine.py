"""The proton ``Container`` thread behind a transport or a receiver.

One :class:`Engine` owns one AMQP 1.0 connection at a time on its own thread and
everything that must survive the loss of that connection:

- the endpoint rotation (the URL's hosts merged with the broker-advertised
  ``failover-server-list``, see :mod:`msgsafe.endpoints`);
- every unresolved send (queued, or transferred and unsettled) with its deadline;
- every subscription (address and credit window).

After an unexpected disconnect it dials the next candidate and *resumes the session*:
each subscription is attached again, every unsettled send is transferred again with
the same ``message_id`` (a possible duplicate the consumer recognises, never a loss),
before anything queued later for the same address.

Deliveries received on a connection that has since died cannot be settled on the new
one (AMQP delivery state belongs to the link): settling them is a no-op, logged at
debug level, and the broker redelivers them because they were never settled. A
delivery is therefore never acknowledged twice; it may be *received* twice.

Threading: callers hand work to the container thread through :meth:`Engine.call`
(a deque and one ``EventInjector`` wake-up per batch); every attribute below
``# container thread only`` is touched by that thread alone.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from proton import Delivery as ProtonDelivery
from proton import Message, SSLDomain
from proton.handlers import EndpointStateHandler, MessagingHandler
from proton.reactor import ApplicationEvent, AtLeastOnce, Container, EventInjector, Handler

from msgsafe.adapters.amqp10._codec import encode_message
from msgsafe.adapters.amqp10._errors import (
    AUTH_CONDITIONS,
    condition_text,
    connection_error,
    detach_error,
    rejected_error,
)
from msgsafe.adapters.amqp10._failover import parse_failover_list
from msgsafe.adapters.amqp10._wire import send_bytes
from msgsafe.adapters.amqp10.config import Amqp10Options
from msgsafe.endpoints import BrokerUrl, Endpoint, EndpointList
from msgsafe.errors import (
    ClosedError,
    ConfirmTimeout,
    ConnectError,
    ConnectionLost,
    MsgsafeError,
    Refused,
)
from msgsafe.message import MESSAGE_ID_HEADER, Delivery, Envelope, Outcome
from msgsafe.retry import RetryPolicy

__all__ = ["KEY_HEADER", "Engine"]

#: Application property that carries the envelope's key.
KEY_HEADER = "msgsafe-key"

_log = logging.getLogger("msgsafe.adapters.amqp10")
_TICK_S = 0.05
_WAKE = "msgsafe_wake"
_TERMINAL = (
    ProtonDelivery.ACCEPTED,
    ProtonDelivery.REJECTED,
    ProtonDelivery.RELEASED,
    ProtonDelivery.MODIFIED,
)


@dataclass(eq=False, slots=True)
class _Outgoing:
    seq: int
    envelope: Envelope
    future: Future[None]
    deadline: float
    generation: int = 0  #: connection generation it was last transferred on; 0: never
    tag: str | None = None
    done: bool = False


@dataclass(eq=False, slots=True)
class _Subscription:
    address: str
    link: Any = None


@dataclass(slots=True)
class _Inbox:
    lock: threading.Condition = field(default_factory=threading.Condition)
    items: collections.deque[tuple[int, Delivery]] = field(default_factory=collections.deque)


class _Call(Handler):
    """A proton timer handler that runs one callable on the container thread."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn = fn

    def on_timer_task(self, event: Any) -> None:
        self._fn()


class Engine(MessagingHandler):
    """One AMQP 1.0 connection with fail-over and session resume, on its own thread."""

    def __init__(self, url: BrokerUrl, options: Amqp10Options, *, role: str) -> None:
        super().__init__(
            prefetch=0, auto_accept=False, auto_settle=False, peer_close_is_error=False
        )
        # Deliveries are handled in on_delivery below; proton's per-delivery helper
        # handlers would dispatch every disposition three more times.
        handlers: list[Any] = list(self.handlers)  # type: ignore[arg-type]
        self.handlers = [h for h in handlers if isinstance(h, EndpointStateHandler)]
        self.target = url.redacted()
        self._sends = role == "sender"
        self._url = url
        self._opts = options
        self._endpoints = EndpointList(
            url.endpoints,
            policy=RetryPolicy(
                initial=options.reconnect_initial, maximum=options.reconnect_maximum
            ),
            merge=options.merge_policy,
            allow=options.allows,
        )
        self._ssl_domain = self._make_ssl_domain() if url.tls else None
        self._lock = threading.Lock()
        self._commands: collections.deque[Callable[[], None]] = collections.deque()
        #: Sends handed over by publish(): (envelope, future, deadline). deque.append and
        #: popleft are atomic, so the hot path takes no lock beyond the wake-up flag.
        self._incoming: collections.deque[tuple[Envelope, Future[None], float]] = (
            collections.deque()
        )
        self._wake_pending = False
        self._stopped = False
        self._injector = EventInjector()
        self._container = Container(self)
        self._container.container_id = f"msgsafe-{role}-{uuid.uuid4()}"
        self._container.selectable(self._injector)
        self._inbox = _Inbox()
        self._idle = threading.Condition()
        self.connected = threading.Event()
        #: Endpoints connected to, in order (diagnostics and tests).
        self.history: list[Endpoint] = []
        # container thread only
        self._conn: Any = None
        self._current: Endpoint | None = None
        self._generation = 0
        self._opened = False
        self._closing = False
        self._fatal: MsgsafeError | None = None
        self._seq = itertools.count(1)
        self._tags = itertools.count(1)
        self._links: dict[str, Any] = {}
        self._queues: dict[str, collections.deque[_Outgoing]] = {}
        self._inflight: dict[str, _Outgoing] = {}
        self._outstanding: dict[int, _Outgoing] = {}
        #: (deadline, seq) of every unresolved send; resolved ones are skipped lazily.
        self._deadlines: list[tuple[float, int]] = []
        self._subs: dict[str, _Subscription] = {}
        self._reported_refusals = 0
        self._thread = threading.Thread(
            target=self._run, name=f"msgsafe-amqp10-{role}", daemon=True
        )
        self._thread.start()

    # --- thread hand-over --------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._container.run()
        except Exception:  # the loop must not die silently: fail what waits on it
            _log.exception("AMQP 1.0 container thread failed")
        finally:
            with self._lock:
                self._stopped = True
                left = list(self._commands)
                self._commands.clear()
            err = ClosedError("the AMQP 1.0 connection thread has stopped", endpoint=self.target)
            for out in list(self._outstanding.values()):
                self._resolve(out, err)
            self._fail_incoming()
            del left

    def _fail_incoming(self) -> None:
        # Hand-overs that will never be taken: popleft is atomic, so each fails once
        # even when publish() and this thread's exit race.
        while True:
            try:
                envelope, future, _ = self._incoming.popleft()
            except IndexError:
                return
            _set_exception(
                future,
                ClosedError(
                    "the transport is closed", endpoint=self.target, message_id=envelope.message_id
                ),
            )

    def call(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the container thread soon; False when the thread has stopped."""
        with self._lock:
            if self._stopped:
                return False
            self._commands.append(fn)
        self._wake()
        return True

    def _wake(self) -> None:
        # Unlocked fast path: a stale True still means the container has yet to clear the
        # flag, and it drains the queues only after clearing it, so nothing is stranded.
        if self._wake_pending:
            return
        with self._lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        self._injector.trigger(ApplicationEvent(_WAKE))

    def on_msgsafe_wake(self, event: Any) -> None:
        with self._lock:
            self._wake_pending = False
            batch = self._commands
            self._commands = collections.deque()
        for fn in batch:
            fn()
        self._take_incoming()
        self._pump()

    def _take_incoming(self) -> None:
        incoming = self._incoming
        while incoming:
            self._enqueue(*incoming.popleft())

    # --- connecting --------------------------------------------------------------------

    def _make_ssl_domain(self) -> Any:
        opts = self._opts
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        if opts.tls_ca_file:
            domain.set_trusted_ca_db(opts.tls_ca_file)
        if opts.tls_cert_file and opts.tls_key_file:
            domain.set_credentials(opts.tls_cert_file, opts.tls_key_file, None)
        if opts.tls_verify:
            domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, opts.tls_ca_file)
        else:
            domain.set_peer_authentication(SSLDomain.ANONYMOUS_PEER)
        return domain

    def on_start(self, event: Any) -> None:
        event.container.schedule(_TICK_S, _Call(self._tick))
        self._connect_next()

    def _connect_next(self) -> None:
        if self._closing or self._fatal is not None:
            return
        endpoint, wait = self._endpoints.next()
        if wait > 0:
            gen = self._generation
            self._container.schedule(wait, _Call(lambda: self._dial_if(gen, endpoint)))
        else:
            self._dial(endpoint)

    def _dial_if(self, generation: int, endpoint: Endpoint) -> None:
        if generation == self._generation and self._conn is None:
            self._dial(endpoint)

    def _dial(self, endpoint: Endpoint) -> None:
        if self._closing or self._fatal is not None:
            return
        opts = self._opts
        self._generation += 1
        self._current = endpoint
        self._opened = False
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        scheme = "amqps" if endpoint.tls else "amqp"
        user = self._url.username
        mechs = opts.sasl_mechanisms or ("PLAIN" if user else "ANONYMOUS")
        _log.debug("connecting to %s (%s)", endpoint, "TLS" if endpoint.tls else "plain")
        # NOTE: proton's own reconnect is off: it knows nothing of advertised candidates,
        # and the session resume below must see every disconnect.
        self._conn = self._container.connect(
            url=f"{scheme}://{host}:{endpoint.port}",
            reconnect=False,
            heartbeat=opts.heartbeat or None,
            ssl_domain=self._ssl_domain,
            sasl_enabled=True,
            allowed_mechs=mechs,
            allow_insecure_mechs=opts.sasl_allow_insecure,
            user=user,
            password=self._url.password.reveal() if self._url.password else None,
            virtual_host=opts.virtual_host,
        )
        gen = self._generation
        self._container.schedule(opts.connect_timeout, _Call(lambda: self._connect_timeout(gen)))

    def _connect_timeout(self, generation: int) -> None:
        if generation != self._generation or self._opened or self._conn is None:
            return
        _log.warning("connecting to %s timed out", self._current)
        conn = self._conn
        self._lost(conn, None)
        transport = conn.transport
        if transport is not None:
            transport.close_tail()
            transport.close_head()

    def on_connection_opened(self, event: Any) -> None:
        if event.connection != self._conn or self._current is None:
            return
        current = self._current
        self._opened = True
        self.history.append(current)
        _log.info("connected to %s", current)
        self._merge_candidates(event.connection.remote_properties, current)
        for sub in self._subs.values():
            self._attach_receiver(sub)
        self.connected.set()
        self._pump()

    def _merge_candidates(self, properties: Any, current: Endpoint) -> None:
        candidates = parse_failover_list(properties, current=current)
        if not candidates:
            return
        # NOTE: as Qpid JMS, REPLACE keeps the host we are connected to next to the
        # advertised ones, so a cluster that lists only "the others" is still complete.
        accepted = self._endpoints.advertise([*candidates, current])
        refused = self._endpoints.refused[self._reported_refusals :]
        self._reported_refusals = len(self._endpoints.refused)
        for endpoint in refused:
            if endpoint == current:
                continue
            if self._url.tls and not endpoint.tls:
                _log.warning(
                    "not following advertised candidate %s from %s: plain TCP would "
                    "downgrade this TLS connection",
                    endpoint,
                    current,
                )
            else:
                _log.warning(
                    "not following advertised candidate %s from %s: outside failover_allow",
                    endpoint,
                    current,
                )
        if accepted:
            _log.info(
                "fail-over candidates from %s: %s",
                current,
                ", ".join(str(e) for e in self._endpoints.endpoints),
            )

    def on_link_opened(self, event: Any) -> None:
        # NOTE: the breaker closes only once the broker attaches a link: a member that
        # opens and then refuses (a Qpid group without quorum) keeps backing off.
        if event.connection == self._conn and self._current is not None:
            self._endpoints.succeeded(self._current)

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        if event.connection != self._conn:
            return
        name = str(condition.name) if condition is not None and condition.name else ""
        if name in AUTH_CONDITIONS:
            self._fail_fatal(connection_error(condition, endpoint=self.target))
        else:
            _log.info("transport to %s failed: %s", self._current, condition_text(condition))

    def on_connection_error(self, event: Any) -> None:
        condition = event.connection.remote_condition
        name = str(condition.name) if condition is not None and condition.name else ""
        if name in AUTH_CONDITIONS and event.connection == self._conn:
            self._fail_fatal(connection_error(condition, endpoint=self.target))
        self._lost(event.connection, condition)

    def on_connection_closing(self, event: Any) -> None:
        self._lost(event.connection, None)

    def on_session_error(self, event: Any) -> None:
        event.connection.close()
        self._lost(event.connection, event.session.remote_condition)

    def on_disconnected(self, event: Any) -> None:
        self._lost(event.connection, None)

    def on_connection_closed(self, event: Any) -> None:
        if self._closing:
            self._container.stop()

    def _lost(self, conn: Any, condition: Any) -> None:
        """The connection ``conn`` is gone: requeue its unsettled sends and dial again."""
        if conn is None or conn != self._conn:
            return
        endpoint = self._current
        was_open = self._opened
        self._conn = None
        self._opened = False
        self._links.clear()
        self.connected.clear()
        for sub in self._subs.values():
            sub.link = None
        self._drop_inbox_before(self._generation + 1)
        if endpoint is not None:
            self._endpoints.failed(endpoint)
        # Session resume: unsettled sends go back in front of their queues, in send order.
        resend = sorted(self._inflight.values(), key=lambda o: o.seq, reverse=True)
        self._inflight.clear()
        for out in resend:
            out.tag = None
            if not out.done:
                self._queues.setdefault(out.envelope.destination, collections.deque()).appendleft(
                    out
                )
        if was_open:
            _log.warning(
                "connection to %s lost (%s); %d unsettled send(s) to resend, failing over",
                endpoint,
                condition_text(condition) or "disconnected",
                len(resend),
            )
        if not self._closing:
            self._connect_next()

    def _fail_fatal(self, error: MsgsafeError) -> None:
        _log.error("giving up on %s: %s", self.target, error)
        self._fatal = error
        for out in list(self._outstanding.values()):
            self._resolve(out, error.with_id(out.envelope.message_id))
        self.connected.clear()

    # --- publishing ----------------------------------------------------------------------

    def publish(self, envelope: Envelope, future: Future[None], deadline: float) -> None:
        """Queue ``envelope``; ``future`` resolves with its outcome by ``deadline``
        (``time.monotonic()`` seconds)."""
        if self._stopped:
            _set_exception(
                future,
                ClosedError(
                    "the transport is closed", endpoint=self.target, message_id=envelope.message_id
                ),
            )
            return
        self._incoming.append((envelope, future, deadline))
        if self._stopped:  # the thread ended between the check and the append
            self._fail_incoming()
            return
        self._wake()

    def _enqueue(self, envelope: Envelope, future: Future[None], deadline: float) -> None:
        if self._fatal is not None:
            _set_exception(future, self._fatal.with_id(envelope.message_id))
            return
        if self._closing:
            _set_exception(
                future,
                ClosedError(
                    "the transport is closed", endpoint=self.target, message_id=envelope.message_id
                ),
            )
            return
        out = _Outgoing(next(self._seq), envelope, future, deadline)
        self._outstanding[out.seq] = out
        heapq.heappush(self._deadlines, (deadline, out.seq))
        self._queues.setdefault(envelope.destination, collections.deque()).append(out)

    def _pump(self) -> None:
        if not self._opened or self._conn is None:
            return
        for address, queue in self._queues.items():
            if not queue:
                continue
            link = self._links.get(address)
            if link is None:
                self._links[address] = self._container.create_sender(
                    self._conn, address, options=AtLeastOnce()
                )
                continue
            credit = link.credit
            while queue and credit > 0:
                out = queue.popleft()
                if out.done:
                    continue
                self._transfer(link, out)
                credit -= 1

    def _transfer(self, link: Any, out: _Outgoing) -> None:
        env = out.envelope
        properties: dict[str, str | bytes] = dict(env.headers)
        properties[MESSAGE_ID_HEADER] = env.message_id
        if env.key is not None:
            properties[KEY_HEADER] = env.key
        tag = str(next(self._tags))
        send_bytes(link, tag, encode_message(env.message_id, env.body, properties))
        out.tag = tag
        out.generation = self._generation
        self._inflight[tag] = out

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if link.is_sender and link.credit > 0:
            self._pump()

    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        # NOTE: an engine either publishes or consumes (one role per connection), so the
        # role tells the link's direction without wrapping dlv.link for every event.
        if self._sends:
            if dlv.updated:
                self._outcome(dlv)
        elif dlv.aborted:
            dlv.settle()
        elif dlv.readable and not dlv.partial:
            self._incoming_message(dlv)

    def _outcome(self, dlv: Any) -> None:
        state = dlv.remote_state
        settled = dlv.settled
        out = self._inflight.pop(dlv.tag, None)
        if settled or state in _TERMINAL:
            dlv.settle()
        if out is None:
            return
        error: MsgsafeError | None
        mid = out.envelope.message_id
        if state == ProtonDelivery.ACCEPTED:
            error = None
        elif state == ProtonDelivery.REJECTED:
            error = rejected_error(dlv.remote.condition, endpoint=self.target, message_id=mid)
        elif state in (ProtonDelivery.RELEASED, ProtonDelivery.MODIFIED):
            # NOTE: both mean the broker did not take the message (RabbitMQ: no route,
            # queue limit; Qpid: no consumer for a non-durable address): transient.
            outcome = "modified" if state == ProtonDelivery.MODIFIED else "released"
            error = Refused(
                f"the broker {outcome} the message", endpoint=self.target, message_id=mid
            )
        elif settled:
            error = ConnectionLost(
                "the broker settled the message without an outcome",
                endpoint=self.target,
                message_id=mid,
            )
        else:  # a non-terminal state (e.g. received): keep waiting for the outcome
            self._inflight[dlv.tag] = out
            return
        self._resolve(out, error)

    def on_link_error(self, event: Any) -> None:
        link = event.link
        condition = link.remote_condition
        _log.warning("%s detached link %r: %s", self._current, link.name, condition_text(condition))
        if link.is_sender:
            self._sender_detached(link, condition)
        else:
            self._receiver_detached(link)

    def on_link_closing(self, event: Any) -> None:
        link = event.link
        if link.is_sender:
            self._sender_detached(link, None)
        else:
            self._receiver_detached(link)

    def _sender_detached(self, link: Any, condition: Any) -> None:
        address = link.target.address
        if self._links.get(address) == link:
            del self._links[address]
        # Transferred and unsettled on this link: the broker may hold them.
        for tag, out in list(self._inflight.items()):
            if out.envelope.destination == address:
                del self._inflight[tag]
                self._resolve(
                    out,
                    detach_error(
                        condition,
                        endpoint=self.target,
                        message_id=out.envelope.message_id,
                        sent=True,
                    ),
                )
        # Queued behind them: refused now, so that per-key order holds in the outbox.
        queue = self._queues.pop(address, None)
        for out in queue or ():
            self._resolve(
                out,
                detach_error(
                    condition, endpoint=self.target, message_id=out.envelope.message_id, sent=False
                ),
            )

    def _tick(self) -> None:
        now = time.monotonic()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, seq = heapq.heappop(deadlines)
            out = self._outstanding.get(seq)
            if out is not None:
                self._resolve(out, self._timeout_error(out))
        if not self._outstanding:
            deadlines.clear()
        if not self._closing:
            self._container.schedule(_TICK_S, _Call(self._tick))

    def _timeout_error(self, out: _Outgoing) -> MsgsafeError:
        mid = out.envelope.message_id
        if out.generation and out.tag is not None and out.generation == self._generation:
            return ConfirmTimeout(
                f"no outcome within {self._opts.confirm_timeout}s",
                endpoint=self.target,
                message_id=mid,
            )
        if out.generation:
            return ConnectionLost(
                "the connection was lost after sending and no candidate took over in time",
                endpoint=self.target,
                message_id=mid,
            )
        if self._opened:
            return Refused(
                f"the broker gave no credit within {self._opts.confirm_timeout}s",
                endpoint=self.target,
                message_id=mid,
            )
        return ConnectError(
            f"no broker reachable within {self._opts.confirm_timeout}s",
            endpoint=self.target,
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

    # --- consuming -----------------------------------------------------------------------

    def subscribe(self, address: str) -> None:
        """Consume from ``address`` now and after every fail-over."""

        def add() -> None:
            if address in self._subs:
                return
            sub = _Subscription(address)
            self._subs[address] = sub
            if self._opened:
                self._attach_receiver(sub)

        if not self.call(add):
            raise ClosedError("the receiver is closed", endpoint=self.target)

    def _attach_receiver(self, sub: _Subscription) -> None:
        link = self._container.create_receiver(self._conn, sub.address, options=AtLeastOnce())
        link.flow(self._opts.credit)
        sub.link = link

    def _receiver_detached(self, link: Any) -> None:
        for sub in self._subs.values():
            if sub.link == link:
                sub.link = None
                # NOTE: RabbitMQ detaches consumers of a deleted queue; re-attach after a
                # pause rather than spin.
                self._container.schedule(
                    self._opts.reconnect_maximum, _Call(self._reattach_later(sub))
                )

    def _reattach_later(self, sub: _Subscription) -> Callable[[], None]:
        generation = self._generation

        def reattach() -> None:
            if generation == self._generation and self._opened and sub.link is None:
                self._attach_receiver(sub)

        return reattach

    def _incoming_message(self, dlv: Any) -> None:
        link = dlv.link
        message = Message()
        message.decode(link.recv(dlv.pending))
        link.advance()
        if not link.state & link.LOCAL_ACTIVE:
            # Arrived while we close the link: give it back at once.
            dlv.update(ProtonDelivery.RELEASED)
            dlv.settle()
            return
        address = link.source.address or ""
        generation = self._generation
        raw_properties: dict[Any, Any] = message.properties or {}
        properties: dict[str, object] = {str(k): v for k, v in raw_properties.items()}
        key_raw = properties.pop(KEY_HEADER, None)
        header_id = properties.pop(MESSAGE_ID_HEADER, None)
        native_id = message.id
        message_id = str(native_id) if native_id is not None else None
        if message_id is None and isinstance(header_id, str):
            message_id = header_id
        body = _body_bytes(message.body)
        # NOTE: proton decodes AMQP binary as memoryview; the key goes out as binary.
        key: bytes | None = None
        if isinstance(key_raw, (bytes, bytearray, memoryview)):
            key = bytes(key_raw)
        elif isinstance(key_raw, str):
            key = key_raw.encode()
        headers = {str(k): v for k, v in properties.items() if isinstance(v, str)}

        def settle(outcome: Outcome) -> None:
            self.call(lambda: self._settle(generation, dlv, outcome))

        delivery = Delivery(
            body=body,
            destination=address,
            message_id=message_id,
            settle=settle,
            key=key,
            headers=headers,
            # NOTE: RabbitMQ's AMQP 1.0 plugin marks a redelivery by clearing
            # first-acquirer and leaves delivery-count at 0; other peers count.
            redelivered=bool(message.delivery_count) or not message.first_acquirer,
        )
        with self._inbox.lock:
            self._inbox.items.append((generation, delivery))
            self._inbox.lock.notify()

    def _settle(self, generation: int, dlv: Any, outcome: Outcome) -> None:
        if generation != self._generation or not self._opened:
            # NOTE: the link this came on is gone; the broker redelivers what was never
            # settled, so the ack becomes a no-op instead of a second acknowledgement.
            _log.debug("settle after fail-over ignored; the broker redelivers it")
            return
        state = {
            Outcome.ACCEPT: ProtonDelivery.ACCEPTED,
            Outcome.REQUEUE: ProtonDelivery.RELEASED,
            Outcome.REJECT: ProtonDelivery.REJECTED,
        }[outcome]
        dlv.update(state)
        dlv.settle()
        link = dlv.link
        if link.state & link.LOCAL_ACTIVE:
            link.flow(1)

    def take(self, max_messages: int, timeout: float | None) -> list[Delivery]:
        """Up to ``max_messages`` received deliveries, waiting at most ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._inbox.lock:
            while not self._inbox.items:
                if self._stopped:
                    raise ClosedError("the receiver is closed", endpoint=self.target)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                self._inbox.lock.wait(remaining if remaining is not None else 0.5)
            batch: list[Delivery] = []
            while self._inbox.items and len(batch) < max_messages:
                batch.append(self._inbox.items.popleft()[1])
            return batch

    def _drop_inbox_before(self, generation: int) -> None:
        # Not yet handed out and unsettleable now: the broker redelivers them anyway.
        with self._inbox.lock:
            kept = [(g, d) for g, d in self._inbox.items if g >= generation]
            self._inbox.items = collections.deque(kept)

    # --- lifecycle -----------------------------------------------------------------------

    def shutdown(self, timeout: float | None) -> None:
        """Fail what is left with ConnectionLost, release unhanded deliveries, stop."""

        def stop() -> None:
            self._closing = True
            with self._inbox.lock:
                items = list(self._inbox.items)
                self._inbox.items.clear()
            for generation, delivery in items:
                if generation == self._generation and delivery.settled is None:
                    delivery.nack(requeue=True)
            with self._lock:
                batch = self._commands
                self._commands = collections.deque()
            for fn in batch:
                fn()
            for out in list(self._outstanding.values()):
                self._resolve(
                    out,
                    ConnectionLost(
                        "closed before the broker confirmed",
                        endpoint=self.target,
                        message_id=out.envelope.message_id,
                    ),
                )
            if self._conn is not None:
                # A clean close lets the broker release our unsettled deliveries at once;
                # on_connection_closed stops the loop, the timer below if the peer is mute.
                self._conn.close()
                self._container.schedule(1.0, _Call(self._container.stop))
            else:
                self._container.stop()
            self._injector.close()

        if self.call(stop):
            self._thread.join(timeout if timeout is not None else 10.0)
        if not self._thread.is_alive():
            # NOTE: proton's EventInjector never closes its wake-up pipe; a process that
            # opens many transports would run out of file descriptors.
            for fd in self._injector.pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)
        with self._inbox.lock:
            self._inbox.lock.notify_all()

    def queued(self) -> int:
        """Unresolved sends (approximate; for diagnostics)."""
        return len(self._outstanding) + len(self._incoming)

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no send is unresolved; False when ``timeout`` passed first."""
        with self._idle:
            return self._idle.wait_for(
                lambda: not self._outstanding and not self._incoming, timeout
            )


def _body_bytes(body: object) -> bytes:
    # NOTE: proton decodes a data section as memoryview; other AMQP clients may send an
    # amqp-value string (JMS TextMessage) or none at all.
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    if body is None:
        return b""
    return str(body).encode()


def _set_exception(future: Future[None], error: BaseException) -> None:
    with contextlib.suppress(InvalidStateError):
        future.set_exception(error)

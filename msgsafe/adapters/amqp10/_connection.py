"""The proton ``Container`` thread that owns the connection and fails over.

One :class:`Engine` owns one AMQP 1.0 connection at a time on its own thread, and the
endpoint rotation that outlives it: the URL's hosts merged with the broker-advertised
``failover-server-list`` (see :mod:`msgsafe.endpoints` and
:mod:`~msgsafe.adapters.amqp10._failover`). After an unexpected disconnect it dials the
next candidate and lets its :class:`Side` *resume the session*.

The engine was split from what flows over the connection because the two change for
different reasons: connecting, TLS, SASL, fail-over and the thread are the same for
publishing and consuming, while the state that must survive a lost connection is not.
That state lives in the side an engine serves, one per engine (one role per
connection): the unresolved sends of a transport
(:class:`~msgsafe.adapters.amqp10.transport.Sends`: resent with the same
``message_id``, before anything queued later for the same address) or the
subscriptions of a receiver (:class:`~msgsafe.adapters.amqp10.receiver.Subscriptions`:
attached again; deliveries of the dead connection are never settled twice).

Threading: callers hand work to the container thread through :meth:`Engine.call` (a
deque and one ``EventInjector`` wake-up per batch) or their side's own hand-over queue
and :meth:`Engine.wake`; every attribute below ``# container thread only`` is touched by
that thread alone, and every :class:`Side` method but :meth:`Side.stopped` runs on it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from proton import Endpoint as ProtonEndpoint
from proton import SSLDomain, symbol
from proton.handlers import EndpointStateHandler, MessagingHandler
from proton.reactor import (
    ApplicationEvent,
    AtLeastOnce,
    Container,
    EventInjector,
    Handler,
)

from msgsafe.adapters.amqp10._errors import (
    AUTH_CONDITIONS,
    TimedOut,
    condition_text,
    connection_error,
    failure_cause,
    unfixable,
)
from msgsafe.adapters.amqp10._failover import Redirects, parse_failover_list
from msgsafe.adapters.amqp10._wire import Capability
from msgsafe.adapters.amqp10.config import Amqp10Options
from msgsafe.endpoints import BrokerUrl, Endpoint, EndpointList
from msgsafe.errors import MsgsafeError
from msgsafe.retry import RetryPolicy

__all__ = ["LOGIN_GRACE_S", "Engine", "EngineClient", "Side", "log", "ssl_domain"]

log = logging.getLogger("msgsafe.adapters.amqp10")
_TICK_S = 0.05
#: Seconds an endpoint that accepted TCP but sent nothing within ``connect_timeout`` (a
#: paused process) is tried only when no other candidate is due: 5 s after its first
#: timeout, doubling up to 30 s while it stays silent. NOTE: not 30 s at once: an
#: Artemis live paused for less than its backup's failure check is, once resumed, the
#: only node that serves (the backup keeps refusing); a 30 s hold kept every send STORED
#: for 30 s after the resume (measured in the chaos matrix). And no doubling while every
#: other endpoint has failed too since the last open connection: then the silent one is
#: the only hope, and is dialed again every 5 s (``msgsafe nemesis artemis``: a primary
#: cut off one way while its backup was killed kept its sends STORED ~30 s after the heal).
_MUTE_S = (5.0, 30.0)
#: Seconds more a peer that already answered (its SASL frames) gets to finish the login:
#: a broker may delay a refused login on purpose (RabbitMQ's AMQP 1.0 plugin: 3 s).
LOGIN_GRACE_S = 5.0
#: Seconds at least a broker gets to answer an attach, however short ``confirm_timeout``:
#: one slow to attach (a Broker-J group creating a queue's store under load) is not given
#: up for it, and dialing it again would only add to its load.
ATTACH_TIMEOUT_MIN_S = 5.0
_WAKE = "msgsafe_wake"


class Side(Protocol):
    """What flows over an engine's connection: one per engine, called on its thread."""

    def bind(self, engine: Engine) -> None:
        """The engine this side serves (called once, before its thread starts)."""

    def opened(self) -> None:
        """A connection is open: attach links, resend what is unsettled."""

    def lost(self) -> int:
        """The connection is gone (the engine dials the next candidate); returns how
        many unsettled sends wait to be resent (for the log)."""

    def woken(self) -> None:
        """Commands ran after a wake-up: take the callers' hand-overs, send."""

    def delivery(self, dlv: Any) -> None:
        """A delivery changed (an outcome came, or a message arrived)."""

    def flow(self, link: Any) -> None:
        """The peer gave ``link`` credit."""

    def detached(self, link: Any, condition: Any) -> None:
        """The peer detached ``link`` (``condition`` None: closed without an error)."""

    def tick(self, now: float) -> None:
        """Every ``_TICK_S`` seconds: deadlines."""

    def fail_all(self, error: MsgsafeError) -> None:
        """The peer refused for good (e.g. the login): fail what waits with ``error``."""

    def closing(self) -> None:
        """Shutdown began: give back or fail what is left (runs before the commands
        still queued, so settlements it queues are sent)."""

    def stopped(self) -> None:
        """The container thread ended (runs on that thread, last): fail what remains."""


class _Call(Handler):
    """A proton timer handler that runs one callable on the container thread."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn = fn

    def on_timer_task(self, event: Any) -> None:
        self._fn()


class Engine(MessagingHandler):
    """One AMQP 1.0 connection with fail-over, on its own thread, serving ``side``."""

    def __init__(self, url: BrokerUrl, options: Amqp10Options, side: Side, *, role: str) -> None:
        super().__init__(
            prefetch=0, auto_accept=False, auto_settle=False, peer_close_is_error=False
        )
        # Deliveries are handled in on_delivery below; proton's per-delivery helper
        # handlers would dispatch every disposition three more times.
        handlers: list[Any] = list(self.handlers)  # type: ignore[arg-type]
        self.handlers = [h for h in handlers if isinstance(h, EndpointStateHandler)]
        self.target = url.redacted()
        self.options = options
        self._side = side
        self._url = url
        self._endpoints = EndpointList(
            url.endpoints,
            policy=RetryPolicy(
                initial=options.reconnect_initial, maximum=options.reconnect_maximum
            ),
            merge=options.merge_policy,
            allow=options.allows,
        )
        self._ssl_domain = ssl_domain(options) if url.tls else None
        self._lock = threading.Lock()
        self._commands: collections.deque[Callable[[], None]] = collections.deque()
        self._wake_pending = False
        self._stopped = False
        self._injector = EventInjector()
        self.container = Container(self)
        self.container.container_id = f"msgsafe-{role}-{uuid.uuid4()}"
        self.container.selectable(self._injector)
        self.connected = threading.Event()
        #: Endpoints connected to, in order (diagnostics and tests).
        self.history: list[Endpoint] = []
        # container thread only
        #: The proton connection, while one is being opened or is open.
        self.conn: Any = None
        #: Counts connections dialed: state of an older one is stale.
        self.generation = 0
        #: True while ``conn`` is open.
        self.opened = False
        #: The serving peer marks a redelivery by clearing ``first-acquirer`` (RabbitMQ's
        #: plugin), not by counting ``delivery-count`` (Artemis, Broker-J): set per open.
        self.first_acquirer_marks = False
        #: True once shutdown began.
        self.closing = False
        #: The permanent error that ended all attempts (bad credentials), if any.
        self.fatal: MsgsafeError | None = None
        self._current: Endpoint | None = None
        self._reported_refusals = 0
        #: Endpoints that timed out connecting, and until when they are passed over.
        self._mute: dict[Endpoint, float] = {}
        self._mute_hold: dict[Endpoint, float] = {}
        #: Endpoints whose latest attempt failed since the last open connection.
        self._failed: set[Endpoint] = set()
        self._redirects = Redirects(options.allows)
        #: Attempts that failed before opening since the last open connection (or start).
        self._failures = 0
        #: The latest failed attempt, in a few words (error messages name the cause).
        self.last_failure = ""
        self.link_options: list[Any] = [AtLeastOnce()]
        if options.address_capability:
            self.link_options.append(Capability(options.address_capability))
        side.bind(self)
        self._thread = threading.Thread(
            target=self._run, name=f"msgsafe-amqp10-{role}", daemon=True
        )
        self._thread.start()

    # --- thread hand-over --------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        """True once the container thread ended (nothing handed over runs any more)."""
        return self._stopped

    @property
    def all_failed(self) -> bool:
        """True when every endpoint of the rotation (the URL's and those a peer advertised)
        failed its latest attempt and none opened since: nothing is worth waiting for,
        sends fail (to the outbox) at once. An advertised backup not tried yet is worth
        waiting for: the URL may name only the node that just died."""
        return not self.opened and self._failures >= len(self._endpoints.endpoints)

    def _run(self) -> None:
        try:
            self.container.run()
        except Exception:  # the loop must not die silently: fail what waits on it
            log.exception("AMQP 1.0 container thread failed")
        finally:
            with self._lock:
                self._stopped = True
                self._commands.clear()
            self._side.stopped()

    def call(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the container thread soon; False when the thread has stopped."""
        with self._lock:
            if self._stopped:
                return False
            self._commands.append(fn)
        self.wake()
        return True

    def wake(self) -> None:
        """Have the container thread run the commands and :meth:`Side.woken` soon."""
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
        self._run_commands()
        self._side.woken()

    def _run_commands(self) -> None:
        with self._lock:
            batch = self._commands
            self._commands = collections.deque()
        for fn in batch:
            fn()

    def link_name(self, address: str) -> str:
        """The name of a link to ``address`` on the current connection (container thread).

        NOTE: proton's default (container id and address) is the same on every
        connection: Broker-J hands a link whose name is still attached on the previous
        connection over from it ("link stealing"), and once, with that connection dying,
        the new attach was never answered. A name of each connection's own never asks
        for a link another connection holds."""
        return f"{self.container.container_id}-{address}-{self.generation}"

    def schedule(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the container thread in ``delay`` seconds."""
        self.container.schedule(delay, _Call(fn))

    def open_sender(self, address: str) -> Any:
        """Attach a sender link to ``address`` on the open connection (container thread).
        An attach unanswered for :attr:`attach_timeout` gives the connection up."""
        link = self.container.create_sender(
            self.conn, address, name=self.link_name(address), options=self.link_options
        )
        self._watch_attach(link)
        return link

    def open_receiver(self, address: str) -> Any:
        """Attach a receiver link from ``address``, as :meth:`open_sender` (container
        thread); credit is the caller's to give."""
        link = self.container.create_receiver(
            self.conn, address, name=self.link_name(address), options=self.link_options
        )
        self._watch_attach(link)
        return link

    def _watch_attach(self, link: Any) -> None:
        # NOTE: a broker that keeps the connection alive (heartbeats) but never answers an
        # attach would stall every send and receive on that link for as long as the
        # connection lives: the sends time out into the outbox, and the outbox's retries
        # queue behind the same silent link. Broker-J did it once to a link whose name was
        # still attached on a dying connection. Past ``confirm_timeout`` (the wait a send
        # gets for its outcome, which the attach is part of; ATTACH_TIMEOUT_MIN_S at
        # least) the connection is given up and the next candidate is dialed.
        generation = self.generation
        self.schedule(self.attach_timeout, lambda: self._attach_deadline(link, generation))

    @property
    def attach_timeout(self) -> float:
        """Seconds a link's attach may go unanswered before the connection is given up."""
        return max(self.options.confirm_timeout, ATTACH_TIMEOUT_MIN_S)

    def _attach_deadline(self, link: Any, generation: int) -> None:
        conn = self.conn
        if (
            generation != self.generation
            or conn is None
            or self.closing
            or not link.state & ProtonEndpoint.REMOTE_UNINIT
            or link.state & ProtonEndpoint.LOCAL_CLOSED
        ):
            return
        log.warning(
            "%s did not answer the attach of %r within %.1fs: dialing again",
            self._current,
            link.name,
            self.attach_timeout,
        )
        self._hold_current()
        self._abandon(conn, TimedOut(f"no answer to the attach of {link.name!r}"))

    # --- connecting --------------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        self.schedule(_TICK_S, self._tick)
        self._connect_next()

    def _connect_next(self) -> None:
        if self.closing or self.fatal is not None:
            return
        redirect = self._redirects.take()
        if redirect is not None:
            self._dial(*redirect)
            return
        picked = self._next_endpoint()
        if picked is None:
            gen = self.generation
            self.schedule(self.options.reconnect_initial, lambda: self._connect_next_if(gen))
            return
        endpoint, wait = picked
        if wait > 0:
            gen = self.generation
            self.schedule(wait, lambda: self._dial_if(gen, endpoint))
        else:
            self._dial(endpoint)

    def _next_endpoint(self) -> tuple[Endpoint, float] | None:
        """The rotation's next endpoint, passing over muted ones while another is left
        (None: those others are backing off; ask again shortly). A paused node would
        otherwise cost ``connect_timeout`` on every pass."""
        now = time.monotonic()
        rotation = self._endpoints.endpoints
        choice = self._endpoints.next()
        for _ in range(len(rotation)):
            if self._mute.get(choice[0], 0.0) <= now:
                return choice
            choice = self._endpoints.next()
        if all(self._mute.get(e, 0.0) > now for e in rotation):
            return choice
        return None

    def _connect_next_if(self, generation: int) -> None:
        if generation == self.generation and self.conn is None:
            self._connect_next()

    def _dial_if(self, generation: int, endpoint: Endpoint) -> None:
        if generation == self.generation and self.conn is None:
            self._dial(endpoint)

    def _dial(self, endpoint: Endpoint, hostname: str | None = None) -> None:
        if self.closing or self.fatal is not None:
            return
        opts = self.options
        self.generation += 1
        self._current = endpoint
        self.opened = False
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        scheme = "amqps" if endpoint.tls else "amqp"
        user = self._url.username
        mechs = opts.sasl_mechanisms or ("PLAIN" if user else "ANONYMOUS")
        log.debug("connecting to %s (%s)", endpoint, "TLS" if endpoint.tls else "plain")
        # NOTE: proton's own reconnect is off: it knows nothing of advertised candidates,
        # and the session resume below must see every disconnect.
        self.conn = self.container.connect(
            url=f"{scheme}://{host}:{endpoint.port}",
            reconnect=False,
            heartbeat=opts.heartbeat or None,
            ssl_domain=self._ssl_domain,
            sasl_enabled=True,
            allowed_mechs=mechs,
            allow_insecure_mechs=opts.sasl_allow_insecure,
            user=user,
            password=self._url.password.reveal() if self._url.password else None,
            virtual_host=hostname or opts.virtual_host,
        )
        gen = self.generation
        self.schedule(opts.connect_timeout, lambda: self._connect_timeout(gen))

    def _connect_timeout(self, generation: int, *, graced: bool = False) -> None:
        if generation != self.generation or self.opened or self.conn is None:
            return
        conn = self.conn
        if not graced and conn.transport is not None and conn.transport.frames_input > 0:
            # The peer is an AMQP 1.0 broker and alive (it sent its SASL mechanisms):
            # wait for its verdict on the login rather than call it an outage.
            self.schedule(LOGIN_GRACE_S, lambda: self._connect_timeout(generation, graced=True))
            return
        self._hold_current()
        self._abandon(conn, TimedOut())

    def _hold_current(self) -> None:
        """Pass the current endpoint over for a while: it accepted TCP and went silent."""
        if self._current is None:
            return
        current = self._current
        others = [e for e in self._endpoints.endpoints if e != current]
        if others and self._failed.issuperset(others):
            hold = _MUTE_S[0]  # no other endpoint serves either (see _MUTE_S)
        else:
            hold = min(_MUTE_S[1], 2 * self._mute_hold.get(current, _MUTE_S[0] / 2))
        self._mute_hold[current] = hold
        self._mute[current] = time.monotonic() + hold

    def _abandon(self, conn: Any, condition: Any) -> None:
        """Give ``conn`` up without waiting for the peer: the side keeps what must survive
        and the next candidate is dialed; the socket is closed under it."""
        self._lost(conn, condition)
        transport = conn.transport
        if transport is not None:
            transport.close_tail()
            transport.close_head()

    def on_connection_opened(self, event: Any) -> None:
        conn = event.connection
        if conn != self.conn or self._current is None:
            return
        current = self._current
        if conn.state & ProtonEndpoint.REMOTE_CLOSED:
            # NOTE: a Broker-J replica (or a node of a group without quorum) sends its open
            # and, in the same read, a close (amqp:connection:forced, "Virtual host ... is
            # not active"): it does not serve, so it is neither "connected" nor in the
            # history; on_disconnected fails over.
            log.info(
                "%s closed the connection it had just opened: %s",
                current,
                condition_text(conn.remote_condition) or "no condition given",
            )
            return
        self.opened = True
        self._mute.pop(current, None)
        self._mute_hold.pop(current, None)
        self._failures = 0
        self._failed.clear()
        self.history.append(current)
        log.info("connected to %s", current)
        properties = event.connection.remote_properties
        product = str((properties or {}).get(symbol("product"), ""))
        self.first_acquirer_marks = product.lower() == "rabbitmq"
        self._merge_candidates(properties, current)
        self._side.opened()
        self.connected.set()

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
                log.warning(
                    "not following advertised candidate %s from %s: plain TCP would "
                    "downgrade this TLS connection",
                    endpoint,
                    current,
                )
            else:
                log.warning(
                    "not following advertised candidate %s from %s: outside failover_allow",
                    endpoint,
                    current,
                )
        if accepted:
            log.info(
                "fail-over candidates from %s: %s",
                current,
                ", ".join(str(e) for e in self._endpoints.endpoints),
            )

    def on_link_opened(self, event: Any) -> None:
        # NOTE: the breaker closes only once the broker attaches a link: a member that
        # opens and then refuses (a Qpid group without quorum) keeps backing off.
        if event.connection == self.conn and self._current is not None:
            self._endpoints.succeeded(self._current)
            self._redirects.served()

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        if event.connection != self.conn:
            return
        if self.fatal is not None:
            return
        name = str(condition.name) if condition is not None and condition.name else ""
        mismatch = unfixable(condition, self.target, self._current)
        if name in AUTH_CONDITIONS:
            self._fail_fatal(connection_error(condition, endpoint=self.target))
        elif mismatch is not None:
            self._fail_fatal(mismatch)
        else:
            log.info("transport to %s failed: %s", self._current, condition_text(condition))

    def on_connection_error(self, event: Any) -> None:
        condition = event.connection.remote_condition
        name = str(condition.name) if condition is not None and condition.name else ""
        if name in AUTH_CONDITIONS and event.connection == self.conn:
            self._fail_fatal(connection_error(condition, endpoint=self.target))
        self._lost(event.connection, condition)

    def on_connection_closing(self, event: Any) -> None:
        self._lost(event.connection, None)

    def on_session_error(self, event: Any) -> None:
        event.connection.close()
        self._lost(event.connection, event.session.remote_condition)

    def on_disconnected(self, event: Any) -> None:
        # NOTE: proton's MessagingHandler swallows a close with amqp:connection:forced (it
        # then waits for the transport to go): the broker's reason is read here.
        conn = event.connection
        condition = conn.remote_condition if conn is not None else None
        if condition is None and event.transport is not None:
            condition = event.transport.condition
        self._lost(conn, condition)

    def on_connection_closed(self, event: Any) -> None:
        if self.closing:
            self.container.stop()

    def _lost(self, conn: Any, condition: Any) -> None:
        """The connection ``conn`` is gone: the side keeps what must survive, then the
        next candidate is dialed."""
        if conn is None or conn != self.conn:
            return
        endpoint = self._current
        was_open = self.opened
        if not was_open and self.fatal is None:
            # NOTE: proton may report the peer's close before the transport error that
            # tells the peer spoke another protocol (a Kafka port closes at once).
            mismatch = unfixable(condition, self.target, self._current)
            if mismatch is not None:
                self._fail_fatal(mismatch)
        self.conn = None
        self.opened = False
        self.connected.clear()
        if endpoint is not None:
            self._endpoints.failed(endpoint)
        resend = self._side.lost()
        redirected = self._redirects.pending or self._redirects.follow(condition, endpoint)
        if was_open:
            log.warning(
                "connection to %s lost (%s); %d unsettled send(s) to resend, failing over",
                endpoint,
                condition_text(condition) or "disconnected",
                resend,
            )
        elif not redirected:
            # One WARNING per outage (the first failed attempt), the retries at DEBUG.
            self._failures += 1
            if endpoint is not None:
                self._failed.add(endpoint)
            self.last_failure = f"cannot connect to {endpoint}: {failure_cause(condition)}"
            log.log(
                logging.WARNING if self._failures == 1 else logging.DEBUG,
                "cannot connect to %s: %s",
                endpoint,
                failure_cause(condition),
            )
            if self.all_failed:
                self._side.tick(time.monotonic())
        if not self.closing:
            self._connect_next()

    def _fail_fatal(self, error: MsgsafeError) -> None:
        log.error("giving up on %s: %s", self.target, error)
        self.fatal = error
        self._side.fail_all(error)
        self.connected.clear()

    # --- what flows over the connection: the side's ------------------------------------

    def on_link_flow(self, event: Any) -> None:
        self._side.flow(event.link)

    def on_delivery(self, event: Any) -> None:
        self._side.delivery(event.delivery)

    def on_link_error(self, event: Any) -> None:
        link = event.link
        condition = link.remote_condition
        log.warning("%s detached link %r: %s", self._current, link.name, condition_text(condition))
        conn = link.connection
        if conn == self.conn and self._redirects.follow(condition, self._current):
            # amqp:link:redirect: the whole session moves to the node named (same
            # addresses); what is queued or unsettled is kept and resent there.
            conn.close()
            self._lost(conn, condition)
            return
        self._side.detached(link, condition)

    def on_link_closing(self, event: Any) -> None:
        self._side.detached(event.link, None)

    def _tick(self) -> None:
        self._side.tick(time.monotonic())
        if not self.closing:
            self.schedule(_TICK_S, self._tick)

    # --- lifecycle -----------------------------------------------------------------------

    def shutdown(self, timeout: float | None) -> None:
        """Let the side give back or fail what is left, close the connection, stop the
        thread (waiting at most ``timeout`` seconds; None: 10)."""

        def stop() -> None:
            self.closing = True
            self._side.closing()
            self._run_commands()
            if self.conn is not None:
                # A clean close lets the broker release our unsettled deliveries at once;
                # on_connection_closed stops the loop, the timer below if the peer is mute.
                self.conn.close()
                self.schedule(1.0, self.container.stop)
            else:
                self.container.stop()
            self._injector.close()

        if self.call(stop):
            self._thread.join(timeout if timeout is not None else 10.0)
        if not self._thread.is_alive():
            # NOTE: proton's EventInjector never closes its wake-up pipe; a process that
            # opens many transports would run out of file descriptors.
            for fd in self._injector.pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)


class EngineClient:
    """What a transport and a receiver both show of the engine they own."""

    _engine: Engine

    @property
    def target(self) -> str:
        """The redacted URL (no credentials)."""
        return self._engine.target

    @property
    def history(self) -> tuple[Endpoint, ...]:
        """The endpoints connected to, in order (newest last)."""
        return tuple(self._engine.history)

    def wait_connected(self, timeout: float) -> bool:
        """True once a connection is open (for start-up checks and tests)."""
        return self._engine.connected.wait(timeout)


def ssl_domain(opts: Amqp10Options) -> Any:
    """proton's client TLS settings from the options: the CA, a client certificate, and
    the peer's name verified unless ``tls_verify`` is off. The destination checks
    (:mod:`msgsafe.adapters.amqp10.check`) connect with the same."""
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
